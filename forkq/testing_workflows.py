"""Batches and chains in the testing modes (:mod:`forkq.testing`): the bookkeeping that
workflow.lua does in Redis, kept in memory for a mode.

The same rules as production (:mod:`forkq.batches`, :mod:`forkq.canvas`): a member counts
once, when it first succeeds; ``complete`` fires when every pending member has failed,
``success`` when none is pending, ``death`` at a member's first death; a child batch
counts in its parent; a chain's step pushes the next one with its value; a chord's body
gets its members' values in order. What differs is the testing modes' own rule: a job that
raises is not retried, so it counts as dead for its batch and its chain (the exception
still reaches the test). Callbacks and next steps are pushed as any push in the mode is:
fake mode keeps them for ``drain()``, inline mode runs them at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from forkq import batches as batch_model
from forkq import canvas
from forkq import client as clients
from forkq import payload as payloads
from forkq import signature as signatures


@dataclass
class _Batch:
    description: str
    parent: str | None
    chord: bool
    callbacks: dict[str, signatures.Signature]
    pending: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    total: int = 0
    order: list[str] = field(default_factory=list)
    results: dict[str, Any] = field(default_factory=dict)
    fired: dict[str, float] = field(default_factory=dict)
    committed: bool = False
    created_at: float = field(default_factory=time.time)


@dataclass
class _Chain:
    steps: tuple[signatures.Signature, ...]
    bid: str | None
    step: int = 1
    state: str = "running"
    failed_step: int | None = None
    jids: dict[int, str] = field(default_factory=dict)


Push = list[tuple[payloads.Payload, float | None]]


class Ledger:
    """One testing mode's batches and chains; ``receive`` takes the jobs of a push (the
    mode's own: kept in fake mode, run in inline mode)."""

    def __init__(self, receive: Any) -> None:
        self._receive = receive
        self.batches: dict[str, _Batch] = {}
        self.chains: dict[str, _Chain] = {}

    # -- pushing ---------------------------------------------------------------------------

    def commit(self, batch: batch_model.Batch) -> None:
        """Push a batch built in a ``with forkq.batch()`` block: every member is registered
        before any job is pushed (inline mode runs them as they are pushed)."""
        pushes: list[Any] = []
        self._register(batch, None, pushes)
        for made in batch.batches():
            self.batches[made.bid].committed = True
        for push in pushes:
            push()
        for made in reversed(list(batch.batches())):
            self._settle(made.bid)

    def _register(self, batch: batch_model.Batch, parent: str | None, pushes: list[Any]
                  ) -> None:
        record = self.batches.get(batch.bid)
        if batch.reopened and record is None:
            raise ValueError(f"forkq:batch:{batch.bid} does not exist (never made, or "
                             "expired)")
        if record is None:
            record = self.batches[batch.bid] = _Batch(batch.description, parent, batch.chord,
                                                      dict(batch.callbacks))
        for entry in batch._entries:
            if isinstance(entry, batch_model.Batch):
                self._join(record, entry.bid)
                self._register(entry, batch.bid, pushes)
            elif isinstance(entry, canvas._ChainRun):
                self._join(record, entry.cid)
                self.chains[entry.cid] = _Chain(entry.steps, batch.bid)
                pushes.append(lambda run=entry: self._push_step(run.cid, 1, None))
            else:
                jobs: Push = entry.jobs
                for payload, _ in jobs:
                    payload[batch_model.FIELD] = batch.bid
                    if record.chord:
                        payload[batch_model.CHORD] = True
                    self._join(record, str(payload["jid"]))
                pushes.append(lambda jobs=jobs: self._receive(jobs, time.time()))

    @staticmethod
    def _join(record: _Batch, member: str) -> None:
        record.pending.add(member)
        record.order.append(member)
        record.total += 1

    def push_chain(self, run: Any) -> None:
        """Push a chain's first step (:meth:`forkq.canvas.Chain.perform_async`)."""
        self.chains[run.cid] = _Chain(run.steps, None)
        self._push_step(run.cid, 1, None)

    def _push_step(self, cid: str, step: int, value: Any) -> None:
        chain = self.chains[cid]
        sig = chain.steps[step - 1]
        item = sig.item(before=() if step == 1 else (value,))
        item.update({canvas.FIELD: cid, canvas.STEP: step})
        chain.step = step
        jid = clients.default().push(item)
        if jid is not None:
            chain.jids[step] = jid

    # -- a job's end -----------------------------------------------------------------------

    def done(self, payload: payloads.Payload, value: Any) -> None:
        """A job ran to its end, returning ``value``."""
        bid, jid = payload.get(batch_model.FIELD), payload.get("jid")
        if isinstance(bid, str) and isinstance(jid, str):
            self._succeeded(bid, jid, value)
        chain = self._current_chain(payload)
        if chain is None:
            return
        cid, record = chain
        if record.step < len(record.steps):
            self._push_step(cid, record.step + 1, value)
            return
        record.state, record.step = "succeeded", len(record.steps) + 1
        if record.bid is not None:
            self._succeeded(record.bid, cid, value)

    def failed(self, payload: payloads.Payload) -> None:
        """A job raised: in a testing mode it is not retried (it dies)."""
        bid, jid = payload.get(batch_model.FIELD), payload.get("jid")
        if isinstance(bid, str) and isinstance(jid, str):
            self._failed(bid, jid, dead=True)
        chain = self._current_chain(payload)
        if chain is not None:
            cid, record = chain
            record.state, record.failed_step = "failed", record.step
            if record.bid is not None:
                self._failed(record.bid, cid, dead=True)

    def _current_chain(self, payload: payloads.Payload) -> tuple[str, _Chain] | None:
        cid, step = payload.get(canvas.FIELD), payload.get(canvas.STEP)
        record = self.chains.get(cid) if isinstance(cid, str) else None
        if record is None or record.step != step or record.state != "running":
            return None
        return str(cid), record

    def _succeeded(self, bid: str, member: str, value: Any) -> None:
        record = self.batches.get(bid)
        if record is None or member not in record.pending:
            return
        record.pending.discard(member)
        record.failed.discard(member)
        if record.chord:
            record.results[member] = value
        self._settle(bid)

    def _failed(self, bid: str, member: str, *, dead: bool) -> None:
        record = self.batches.get(bid)
        if record is None or member not in record.pending:
            return
        record.failed.add(member)
        if dead:
            walk: str | None = bid
            while walk is not None and walk in self.batches:
                self._fire(walk, "death")
                walk = self.batches[walk].parent
        self._settle(bid)

    def _settle(self, bid: str) -> None:
        record = self.batches[bid]
        if not record.committed or len(record.pending) > len(record.failed):
            return
        if self._fire(bid, "complete") and record.pending and record.parent is not None:
            self._failed(record.parent, bid, dead=False)
        if not record.pending and self._fire(bid, "success") and record.parent is not None:
            self._succeeded(record.parent, bid, None)

    def _fire(self, bid: str, event: str) -> bool:
        record = self.batches[bid]
        if event in record.fired:
            return False
        record.fired[event] = time.time()
        sig = record.callbacks.get(event)
        if sig is not None:
            first = ([record.results.get(member) for member in record.order]
                     if record.chord and event == "success" else self._status(bid))
            clients.default().push(sig.item(before=(first,)))
        return True

    def _status(self, bid: str) -> dict[str, Any]:
        record = self.batches[bid]
        return {"bid": bid, "total": record.total, "pending": len(record.pending),
                "failures": len(record.failed),
                "succeeded": record.total - len(record.pending),
                "complete": "complete" in record.fired, "description": record.description}

    # -- reading ---------------------------------------------------------------------------

    def batch_status(self, bid: str) -> batch_model.BatchStatus | None:
        """What :func:`forkq.batch_status` answers in the mode."""
        record = self.batches.get(bid)
        if record is None:
            return None
        return batch_model.BatchStatus(bid, record.description, record.total,
                                       len(record.pending), len(record.failed),
                                       record.created_at, record.parent, dict(record.fired))

    def chain_status(self, cid: str) -> canvas.ChainStatus | None:
        """What :func:`forkq.chain_status` answers in the mode."""
        record = self.chains.get(cid)
        if record is None:
            return None
        steps = [(sig.name, record.jids.get(i, "")) for i, sig in
                 enumerate(record.steps, start=1)]
        return canvas.ChainStatus(cid, record.state, record.step, steps, record.failed_step,
                                  record.bid)
