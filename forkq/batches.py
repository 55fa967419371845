"""Batches: jobs pushed together, with callbacks that fire exactly once (Sidekiq Pro's model).

    with forkq.batch(on_success=notify.s(user_id), on_complete=summarize.s(),
                     on_death=alert.s(), description="import 2026-11") as b:
        for row in rows:
            import_row.perform_async(row)
    forkq.batch_status(b.bid).pending

Every job pushed inside the block, by any client in this thread or task (a running job's
too), joins the batch: its payload gains ``"bid"`` (as Sidekiq Pro writes it). Nothing is
pushed until the block ends: then the batch's record, its members and their jobs are
written in one transaction, with the commit last (commit.lua); an exception in the block
pushes nothing. A ``with forkq.batch(...)`` inside another one makes a **child batch**: one
member of its parent, committed with it; a child that completes with failures counts as a
failure of its parent, its success as a success. ``forkq.batch(bid)`` **reopens** a batch to
add jobs: from a job of that batch (which keeps the batch from completing until it
returns) it is always safe; jobs added to a batch that has already succeeded run, but fire
nothing again. A reopened batch is committed when its own block ends, also inside another
batch's block (it is nobody's child).

Events, each fired once, in the same Lua step that acknowledges or files the job that
causes it (workflow.lua; never from the client):

- ``complete``: every member has run at least once (its last run succeeded or failed);
- ``success``: every member has succeeded (a job after its retries, a child batch when it
  succeeded, a chain when its last step did);
- ``death``: a member died for the first time (went to the dead set, was dropped, or was
  buried after its processors died; the batch's parents hear of it too).

A callback is a signature (:mod:`forkq.signature`) pushed with the batch's status (a dict:
``bid``, ``total``, ``pending``, ``failures``, ``succeeded``, ``complete``,
``description``) as its first argument: ``notify.s(user_id)`` runs ``notify(status,
user_id)``. A member that died and is retried by hand and then succeeds completes the
batch's success. A member counts once, however often it runs (it leaves the pending set
once). Batch data is kept 30 days from the creation and 24 hours once the batch succeeded
(:data:`forkq.keys.WORKFLOW_TTL`).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import redis

from forkq import client as clients
from forkq import keys, scripts
from forkq import payload as payloads
from forkq import signature as signatures
from forkq.connection import text
from forkq.errors import EnqueueError

EVENTS = ("complete", "success", "death")
FIELD = "bid"
"""The payload field naming a job's batch (Sidekiq Pro's)."""
CHORD = "chord"
"""The payload field of a chord's member: its acknowledgement carries what it returned."""

_CHUNK = 10_000  # members per SADD / RPUSH


@dataclass
class _Jobs:
    client: clients.Client
    jobs: list[tuple[payloads.Payload, float | None]]


class Batch:
    """A batch being built: ``with forkq.batch(...) as b`` (see the module's doc)."""

    def __init__(self, bid: str | None = None, *, on_success: Any = None,
                 on_complete: Any = None, on_death: Any = None, description: str = "",
                 client: clients.Client | None = None) -> None:
        if bid is not None and (not isinstance(bid, str) or not bid):
            raise TypeError(f"a batch's bid must be a non-empty string, got {bid!r}")
        if not isinstance(description, str):
            raise TypeError(f"a batch's description must be a string, got {description!r}")
        self.callbacks = {event: signatures.check(sig, f"on_{event}") for event, sig in
                          (("success", on_success), ("complete", on_complete),
                           ("death", on_death)) if sig is not None}
        if bid is not None and self.callbacks:
            raise TypeError("a reopened batch keeps its callbacks: give none")
        self.bid = bid or payloads.new_jid()
        self.reopened = bid is not None
        self.description = description
        self.chord = False  # a chord's group (forkq.canvas): its members' values are kept
        self._client = client
        self._entries: list[Any] = []  # _Jobs, child Batch, or a chain (forkq.canvas)
        self._token: contextvars.Token[clients.BatchTaker | None] | None = None
        self._parent: Batch | None = None

    # -- the block -----------------------------------------------------------------------

    def __enter__(self) -> Batch:
        outer = clients.OPEN_BATCH.get()  # a reopened batch is nobody's child: it commits
        self._parent = outer if isinstance(outer, Batch) and not self.reopened else None
        self._token = clients.OPEN_BATCH.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        assert self._token is not None
        clients.OPEN_BATCH.reset(self._token)
        self._token = None
        if kind is not None:
            return  # nothing was pushed: the jobs kept here are dropped
        if self._parent is not None:
            self._parent.add(self)
        else:
            self.commit()

    def take(self, client: clients.Client, jobs: list[tuple[payloads.Payload, float | None]]
             ) -> None:
        """Keep the jobs of a push made inside the block (:class:`forkq.client.BatchTaker`)."""
        self._entries.append(_Jobs(client, jobs))

    def add(self, member: Any) -> None:
        """Add a member that is no job: a child batch, a chain (:mod:`forkq.canvas`)."""
        if isinstance(member, Batch):
            member._parent = self
        self._entries.append(member)

    # -- the commit ----------------------------------------------------------------------

    def commit(self) -> None:
        """Push the batch: its record, members and jobs in one transaction, committed last.
        Raises :class:`EnqueueError` when Redis refused (nothing pushed, unless it says
        so), ValueError for a reopened batch that does not exist."""
        diversion = clients.diverted()
        if diversion is not None:  # a testing mode keeps its batches (forkq.testing)
            diversion.commit_batch(self)
            return
        client = self._client or self._first_client() or clients.default()
        now = time.time()
        commands = self.commands(client, now, parent=None)
        jids = [str(payload["jid"]) for batch in self.batches() for entry in batch._entries
                if isinstance(entry, _Jobs) for payload, _ in entry.jobs]
        transact(client, commands, jids, f"batch {self.bid}",
                 must_exist=[keys.batch(batch.bid) for batch in self.batches()
                             if batch.reopened])

    def _first_client(self) -> clients.Client | None:
        return next((entry.client for entry in self._entries if isinstance(entry, _Jobs)), None)

    def batches(self) -> Iterator[Batch]:
        """This batch and its children, depth first."""
        yield self
        for entry in self._entries:
            if isinstance(entry, Batch):
                yield from entry.batches()

    def commands(self, client: clients.Client, now: float, *, parent: str | None
                 ) -> list[tuple[Any, ...]]:
        """The commands that write this batch (its record unless reopened, its members,
        their jobs, its children's) and commit it, in order."""
        meta = keys.batch(self.bid)
        commands: list[tuple[Any, ...]] = []
        if not self.reopened:
            record = self._record(client, now, parent)
            commands += [("HSET", meta, *[part for pair in record.items() for part in pair]),
                         ("EXPIRE", meta, keys.WORKFLOW_TTL),
                         ("ZADD", keys.BATCHES, now, self.bid),
                         ("HINCRBY", keys.BATCH_STATS, "created", 1)]
        order: list[str] = []
        for entry in self._entries:
            members, pushes = self._entry_commands(entry, client, now)
            order += members
            plain = [member for member in members if not _scripted(pushes, member)]
            commands += _register(meta, plain)
            commands += pushes
        if self.chord and order:
            commands += [("RPUSH", f"{meta}:order", *order[i:i + _CHUNK])
                         for i in range(0, len(order), _CHUNK)]
            commands.append(("EXPIRE", f"{meta}:order", keys.WORKFLOW_TTL))
        commands += [("EXPIRE", f"{meta}:pending", keys.WORKFLOW_TTL),
                     ("EVALSHA", _commit_sha(), 0, self.bid)]
        return commands

    def _record(self, client: clients.Client, now: float, parent: str | None
                ) -> dict[str, Any]:
        record: dict[str, Any] = {"created_at": repr(now), "description": self.description,
                                  "total": 0}
        if parent is not None:
            record["parent"] = parent
        if self.chord:
            record["chord"] = "1"
        for event, sig in self.callbacks.items():
            made = signatures.template(client, sig, now)
            if made is not None:
                record[f"cbjid:{event}"], record[f"cb:{event}"] = made
        return record

    def _entry_commands(self, entry: Any, client: clients.Client, now: float
                        ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """One entry's members (in order) and the commands that push them."""
        if isinstance(entry, Batch):
            return [entry.bid], entry.commands(client, now, parent=self.bid)
        if isinstance(entry, _Jobs):
            for payload, _ in entry.jobs:
                payload[FIELD] = self.bid
                if self.chord:
                    payload[CHORD] = True
            pushes, _ = entry.client.commands(entry.jobs, now, bid=self.bid)
            return [str(payload["jid"]) for payload, _ in entry.jobs], pushes
        chain: tuple[list[str], list[tuple[Any, ...]]] = entry.commands(client, now, bid=self.bid)
        return chain  # a chain (forkq.canvas): its id is the member


def transact(client: clients.Client, commands: list[tuple[Any, ...]], jids: list[str],
             what: str, *, must_exist: list[str] | None = None) -> None:
    """Run ``commands`` in one transaction (MULTI / EXEC); ``jids`` are the jobs they push.

    First, in one round trip: the scripts they run are loaded (a NOSCRIPT inside the
    transaction would leave the rest done), the keys ``must_exist`` (a reopened batch) are
    checked (ValueError) and the queues and ``schedule`` they push to hold lists / a
    sorted set (a refusal inside it would leave members that never run): else
    :class:`EnqueueError`, nothing pushed. A refusal inside the transaction raises it
    too, naming the jobs as enqueued (the other commands ran)."""
    must_exist = must_exist or []
    targets = sorted({command[1] for command in commands if command[0] == "LPUSH"}
                     | {keys.SCHEDULE})
    try:
        with client.redis.pipeline(transaction=False) as pipe:
            pipe.script_load(scripts.source("commit"))
            pipe.script_load(scripts.source("push"))
            for target in targets:
                pipe.type(target)
            for key in must_exist:
                pipe.exists(key)
            found = pipe.execute()
    except redis.RedisError as exc:
        raise EnqueueError(f"{what} not pushed: {exc}", enqueued=[], not_enqueued=jids,
                           unknown=[]) from exc
    for target, kind in zip(targets, found[2:2 + len(targets)], strict=True):
        wanted = "zset" if target == keys.SCHEDULE else "list"
        if text(kind) not in ("none", wanted):
            raise EnqueueError(f"{what} not pushed: key {target!r} holds a {text(kind)}, "
                               f"not a {wanted}", enqueued=[], not_enqueued=jids, unknown=[])
    for key, exists in zip(must_exist, found[2 + len(targets):], strict=True):
        if not exists:
            raise ValueError(f"{key} does not exist (never made, or expired)")
    try:
        with client.redis.pipeline(transaction=True) as pipe:
            for command in commands:
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]
            results = pipe.execute(raise_on_error=False)
    except redis.RedisError as exc:
        raise EnqueueError(f"{what} not pushed (or unknown): {exc}", enqueued=[],
                           not_enqueued=[], unknown=jids) from exc
    refused = [result for result in results if isinstance(result, Exception)]
    if refused:
        raise EnqueueError(f"{what}: Redis refused {len(refused)} of its commands: "
                           f"{refused[0]}", enqueued=jids, not_enqueued=[],
                           unknown=[]) from refused[0]


def _scripted(pushes: list[tuple[Any, ...]], member: str) -> bool:
    """Whether ``member`` is a job that push.lua pushes (it registers itself there: a unique
    job whose lock is held is no member)."""
    return any(command[0] == "EVALSHA" and command[1] == clients.push_sha()
               and command[6] == member for command in pushes)


def _register(meta: str, members: list[str]) -> list[tuple[Any, ...]]:
    """The commands that make ``members`` pending members of the batch ``meta``."""
    if not members:
        return []
    return [*[("SADD", f"{meta}:pending", *members[i:i + _CHUNK])
              for i in range(0, len(members), _CHUNK)],
            ("HINCRBY", meta, "total", len(members))]


@functools.cache
def _commit_sha() -> str:
    return hashlib.sha1(scripts.source("commit").encode()).hexdigest()


def batch(bid: str | None = None, *, on_success: Any = None, on_complete: Any = None,
          on_death: Any = None, description: str = "",
          client: clients.Client | None = None) -> Batch:
    """A new batch (or batch ``bid`` reopened), to use as ``with forkq.batch(...) as b``."""
    return Batch(bid, on_success=on_success, on_complete=on_complete, on_death=on_death,
                 description=description, client=client)


def current() -> str | None:
    """The bid of the batch of the job running in this thread or task, or None."""
    from forkq.middleware import current_job

    context = current_job()
    bid = context.payload.get(FIELD) if context is not None else None
    return bid if isinstance(bid, str) else None


@dataclass(frozen=True)
class BatchStatus:
    """What :func:`status` reads of a batch."""

    bid: str
    description: str
    total: int
    pending: int
    failures: int
    created_at: float | None
    parent: str | None = None
    fired: dict[str, float] = field(default_factory=dict)  # event -> when it fired
    callbacks: dict[str, str] = field(default_factory=dict)  # event -> the callback's jid

    @property
    def succeeded(self) -> int:
        return self.total - self.pending

    @property
    def complete(self) -> bool:
        return "complete" in self.fired

    @property
    def success(self) -> bool:
        return "success" in self.fired

    @property
    def progress(self) -> float:
        """The share of members that succeeded, 0.0 to 1.0 (1.0 for an empty batch)."""
        return self.succeeded / self.total if self.total else 1.0

    def as_dict(self) -> dict[str, Any]:
        return {"bid": self.bid, "description": self.description, "total": self.total,
                "pending": self.pending, "failures": self.failures,
                "succeeded": self.succeeded, "complete": self.complete,
                "success": self.success, "progress": self.progress,
                "created_at": self.created_at, "parent": self.parent, "fired": self.fired,
                "callbacks": self.callbacks}


def status(bid: str, *, client: clients.Client | None = None) -> BatchStatus | None:
    """The status of batch ``bid``, or None when there is none (never made, or expired)."""
    diversion = clients.diverted()
    if diversion is not None:
        found_here: BatchStatus | None = diversion.batch_status(bid)
        return found_here
    found = read(client or clients.default(), [bid])
    return found[0] if found else None


def read(client: clients.Client, bids: list[str]) -> list[BatchStatus]:
    """The statuses of the batches ``bids`` that exist, in that order (one round trip)."""
    with client.redis.pipeline(transaction=False) as pipe:
        for bid in bids:
            meta = keys.batch(bid)
            pipe.hgetall(meta)
            pipe.scard(f"{meta}:pending")
            pipe.scard(f"{meta}:failed")
        found = pipe.execute(raise_on_error=False)
    statuses = []
    for index, bid in enumerate(bids):
        record, pending, failed = found[3 * index:3 * index + 3]
        if not isinstance(record, dict) or not record:
            continue
        fields = {text(k): text(v) for k, v in record.items()}
        total = _count(fields.get("total"))
        # a set of another type counts nothing (workflow.lua leaves such a batch alone)
        statuses.append(_status(bid, fields, pending if isinstance(pending, int) else total,
                                failed if isinstance(failed, int) else 0))
    return statuses


def _status(bid: str, record: dict[str, str], pending: int, failed: int) -> BatchStatus:
    fired = {event: _number(record.get(f"{event}_at")) for event in EVENTS
             if f"{event}_at" in record}
    return BatchStatus(bid, record.get("description", ""), _count(record.get("total")),
                       pending, failed, _number(record.get("created_at")) or None,
                       record.get("parent"), {k: v for k, v in fired.items()},
                       {event: record[f"cbjid:{event}"] for event in EVENTS
                        if f"cbjid:{event}" in record})


def _number(text: str | None) -> float:
    """A field as a finite number (0.0 for none, or anything else)."""
    try:
        value = float(text) if text is not None else 0.0
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


def _count(text: str | None) -> int:
    """A field as a count (0 for anything that is none)."""
    value = _number(text)
    return int(value) if 0 <= value < 2**63 else 0



def recent(client: clients.Client, limit: int = 100) -> list[BatchStatus]:
    """The newest ``limit`` batches (by creation), newest first; entries of
    ``forkq:batches`` whose batch has expired are dropped from it here. A ``forkq:batches``
    of another type lists none (redis.ResponseError names it)."""
    newest: list[Any] = client.redis.execute_command(  # type: ignore[no-untyped-call]
        "ZRANGE", keys.BATCHES, 0, max(limit, 1) - 1, "REV")  # the ACL of docs/redis.md
    bids = [text(bid) for bid in newest]
    found = read(client, bids)
    missing = sorted(set(bids) - {status.bid for status in found})
    if missing:  # expired, or a record of another type (left alone, still listed as none)
        with client.redis.pipeline(transaction=False) as pipe:
            for bid in missing:
                pipe.exists(keys.batch(bid))
            gone = [bid for bid, there in zip(missing, pipe.execute(), strict=True) if not there]
        if gone:
            client.redis.zrem(keys.BATCHES, *gone)
    return found


@dataclass(frozen=True)
class Members:
    """Some members of a batch: pending ones (not succeeded yet) and, among them, the
    failed ones; at most ``limit`` of each, and whether there were more."""

    pending: list[str]
    failed: list[str]
    more: bool


def members(client: clients.Client, bid: str, limit: int = 100) -> Members:
    """Up to ``limit`` pending and failed members of batch ``bid`` (SSCAN: bounded work)."""
    meta = keys.batch(bid)
    found: dict[str, list[str]] = {}
    more = False
    for name in ("failed", "pending"):
        cursor, seen = 0, []
        while True:
            cursor, chunk = client.redis.sscan(f"{meta}:{name}", cursor, count=limit)
            seen += [text(member) for member in chunk]
            if not cursor or len(seen) >= limit:
                break
        more = more or len(seen) > limit or bool(cursor)
        found[name] = sorted(seen)[:limit]
    return Members(found["pending"], found["failed"], more)
