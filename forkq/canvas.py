"""Chains, groups and chords: Celery's canvas on forkq's batches.

    chain(fetch.s(url), parse.s(), store.s()).perform_async()    # the chain's id
    group(resize.s(1), resize.s(2)).perform_async()              # a batch: its bid
    chord(group(price.s(a), price.s(b)), total.s()).perform_async()

- **chain**: the steps run one after the other; each step's return value is the first
  argument of the next (``parse(<what fetch returned>)``). The next step is pushed by the
  Lua step that acknowledges the one before (workflow.lua), once. A step that fails is
  retried as any job; once it dies (dead set, or dropped) the chain stops there: the rest
  never run, and :func:`chain_status` says ``failed`` at that step.
- **group**: its members (signatures or chains) run in parallel as one batch
  (:mod:`forkq.batches`); ``perform_async`` returns its bid.
- **chord**: a group whose callback runs once, when every member succeeded, with the list
  of their return values in the group's order as its first argument (``total([a, b])``;
  a chain member gives its last step's value). The values wait in the batch's record, and
  go with it (:data:`forkq.keys.WORKFLOW_TTL`).

Inside a ``with forkq.batch()`` block, a chain is one member of the batch (it succeeds
with its last step) and a group or chord is a child batch. A step's return value must be
JSON-native, or the step fails with a ``TypeError``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from forkq import batches, keys
from forkq import client as clients
from forkq import payload as payloads
from forkq import signature as signatures
from forkq.connection import text

FIELD = "chain"
STEP = "chain_step"


@dataclass(frozen=True)
class Chain:
    """Steps to run in order, each given the value of the one before."""

    steps: tuple[signatures.Signature, ...]

    def perform_async(self, *, client: clients.Client | None = None) -> str:
        """Push the chain's first step (its record with the rest); the chain's id."""
        run = _ChainRun(payloads.new_jid(), self.steps)
        taker = clients.OPEN_BATCH.get()
        if isinstance(taker, batches.Batch):
            taker.add(run)
            return run.cid
        diversion = clients.diverted()
        if diversion is not None:  # a testing mode runs it (forkq.testing)
            diversion.push_chain(run)
            return run.cid
        client = client or clients.default()
        now = time.time()
        _, commands = run.commands(client, now)
        batches.transact(client, commands, [run.cid], f"chain {run.cid}")
        return run.cid


@dataclass(frozen=True)
class _ChainRun:
    """One push of a chain: its id and steps."""

    cid: str
    steps: tuple[signatures.Signature, ...]

    def commands(self, client: clients.Client, now: float, *, bid: str = ""
                 ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The chain's member id (for a batch) and the commands that push it."""
        record: dict[str, Any] = {"n": len(self.steps), "step": 1, "state": "running",
                                  "created_at": repr(now)}
        if bid:
            record["bid"] = bid
        first = None
        for index, sig in enumerate(self.steps, start=1):
            extra = {FIELD: self.cid, STEP: index}
            record[f"class:{index}"] = sig.name
            if index == 1:
                first = signatures.payload_of(client, sig, now, extra=extra)
                made = None if first is None else (str(first["jid"]), b"")
            else:
                made = signatures.template(client, sig, now, extra=extra)
                if made is not None:
                    record[f"s:{index}"] = made[1]
            if made is None:
                raise ValueError(f"a client middleware stopped step {index} of the chain "
                                 f"({sig!r}): the chain is not pushed")
            record[f"jid:{index}"] = made[0]
        assert first is not None
        pushes, _ = client.commands([(first, None)], now)
        key = keys.chain(self.cid)
        return [self.cid], [("HSET", key, *[part for pair in record.items() for part in pair]),
                            ("EXPIRE", key, keys.WORKFLOW_TTL), *pushes]


def chain(*steps: signatures.Signature) -> Chain:
    """A chain of ``steps`` (at least one signature)."""
    if not steps:
        raise ValueError("a chain needs at least one step")
    return Chain(tuple(signatures.check(step, "a chain's step") for step in steps))


@dataclass(frozen=True)
class Group:
    """Members (signatures or chains) run in parallel as one batch."""

    members: tuple[signatures.Signature | Chain, ...]

    def perform_async(self, *, client: clients.Client | None = None,
                      description: str = "") -> str:
        """Push the group as a batch; its bid."""
        return _push(batches.Batch(client=client, description=description), self.members)


def group(*members: signatures.Signature | Chain) -> Group:
    """A group of ``members`` (signatures or chains)."""
    for member in members:
        if not isinstance(member, Chain):
            signatures.check(member, "a group's member")
    return Group(tuple(members))


@dataclass(frozen=True)
class Chord:
    """A group and the callback that takes its members' values, in order."""

    header: Group
    body: signatures.Signature

    def perform_async(self, *, client: clients.Client | None = None,
                      description: str = "") -> str:
        """Push the chord as a batch whose success calls the body; its bid."""
        batch = batches.Batch(on_success=self.body, client=client, description=description)
        batch.chord = True
        return _push(batch, self.header.members)


def chord(header: Group | list[Any] | tuple[Any, ...], body: signatures.Signature) -> Chord:
    """A chord: ``header`` (a group, or a list of its members) then ``body``."""
    if not isinstance(header, Group):
        header = group(*header)
    return Chord(header, signatures.check(body, "a chord's body"))


def _push(batch: batches.Batch, members: tuple[signatures.Signature | Chain, ...]) -> str:
    with batch:
        for member in members:
            if isinstance(member, Chain):
                member.perform_async()
            else:
                (batch._client or clients.default()).push(member.item())
    return batch.bid


@dataclass(frozen=True)
class ChainStatus:
    """What :func:`chain_status` reads of a chain."""

    cid: str
    state: str  # running, succeeded, failed
    step: int  # the step running (steps + 1 once it succeeded)
    steps: list[tuple[str, str]]  # each step's job name and jid
    failed_step: int | None = None
    bid: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"cid": self.cid, "state": self.state, "step": self.step,
                "steps": [{"class": name, "jid": jid} for name, jid in self.steps],
                "failed_step": self.failed_step, "bid": self.bid}


def chain_status(cid: str, *, client: clients.Client | None = None) -> ChainStatus | None:
    """The status of chain ``cid``, or None when there is none (never made, or expired)."""
    diversion = clients.diverted()
    if diversion is not None:
        found_here: ChainStatus | None = diversion.chain_status(cid)
        return found_here
    found = (client or clients.default()).redis.hgetall(keys.chain(cid))
    record = {text(k): text(v) for k, v in found.items()} if isinstance(found, dict) else {}
    if not record:
        return None
    count = min(whole(record.get("n")), len(record))  # each step has fields: n is bounded
    steps = [(record.get(f"class:{i}", "?"), record.get(f"jid:{i}", "")) for i in
             range(1, count + 1)]
    failed = whole(record.get("failed_step")) or None
    return ChainStatus(cid, record.get("state", "running"), whole(record.get("step")), steps,
                       failed, record.get("bid"))


def whole(value: bytes | str | None) -> int:
    """A record's field as a whole number (0 for none, or anything else)."""
    try:
        return int(text(value)) if value is not None else 0
    except ValueError:
        return 0
