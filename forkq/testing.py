"""Testing modes for an application's own test suite: jobs pushed without any Redis.

What ``Sidekiq::Testing`` is to Sidekiq (Celery's eager mode, RQ's ``is_async=False``,
Dramatiq's ``StubBroker``). Two modes, each on for a block and restored after it:

- :func:`fake`: every push, from any client (``perform_async``, ``perform_in`` /
  ``perform_at``, ``Client.push`` / ``push_bulk``), is kept in memory in push order;
  :meth:`Fake.jobs` and :meth:`Fake.scheduled` show the payloads, :meth:`Fake.clear` drops
  them, :meth:`Fake.drain` runs them here, through the server middleware as the daemon
  does, jobs pushed by the jobs it runs included; scheduled jobs (``perform_in`` /
  ``perform_at`` / ``at`` in the future) only with ``include_scheduled=True``.
- :func:`inline`: every push runs its jobs at once, here, through the server middleware,
  before the push returns; scheduled jobs too (as Sidekiq's inline mode and Celery's eager
  mode do).

What stays as in production: client middleware runs; each payload is encoded with the
client's own encoder and decoded again before anything is kept or run, so an argument
production cannot carry (a datetime, a set, NaN) raises the same TypeError/ValueError at
the push, and the job gets what the daemon would hand it (a tuple arrives as a list);
only registered jobs run (an unknown name raises :class:`~forkq.errors.UnknownJobError`).
A job's exception propagates to the test, unchanged: no retry, no dead set, no
``job_timeout`` here. A coroutine job (``async def``) runs to completion on a fresh
asyncio event loop (in a thread of its own when the caller is inside a running loop, as
an async test is).

Workflows run in the modes (:mod:`forkq.testing_workflows`): a ``with forkq.batch()``
block's jobs are kept (fake) or run (inline) when it ends, and its callbacks fire;
a chain's next step is pushed when a step ends (inline runs a whole chain before
``perform_async`` returns; fake runs it step by step in ``drain()``); a chord's body gets
the values in order; :func:`forkq.batch_status`, :func:`forkq.chain_status` answer from
the mode and :func:`forkq.progress` reports land in :attr:`Mode.progress`. A job that
raises is not retried here: it dies for its batch and its chain.

:func:`forkq.result` answers from the mode (:attr:`Mode.results`) without waiting: the value
a job with ``result_ttl`` returned when it ran here (its JSON round trip), else
:class:`~forkq.errors.ResultTimeoutError` at once.

The mode is process-global (every thread's pushes), switched by
:func:`forkq.client.divert`, which only this module calls. Modes nest: leaving one
restores the one that was on before it; they must be left in the reverse order. A daemon
never imports this module, so its pushes always go to Redis.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from forkq import client as clients
from forkq import payload as payloads
from forkq import unique
from forkq.errors import ForkqError, JobFailedError, ResultTimeoutError
from forkq.middleware import SERVER, JobContext, ServerChain, running
from forkq.registry import REGISTRY, Registry
from forkq.testing_workflows import Ledger

DRAIN_LIMIT = 10_000
"""How many jobs one :meth:`Fake.drain` runs before it decides that a job keeps
re-enqueuing itself (pass ``limit=`` to change it)."""

M = TypeVar("M", bound="Mode")

_modes: list[Mode] = []  # the modes on, innermost last: the last one takes the pushes


class DrainLimitError(ForkqError):
    """:meth:`Fake.drain` ran its ``limit`` of jobs and more were still waiting."""


def active() -> Mode | None:
    """The testing mode on now (the innermost), or None: pushes go to Redis."""
    return _modes[-1] if _modes else None


class Mode:
    """A testing mode: on between :meth:`start` and :meth:`stop`, or inside ``with``."""

    def __init__(self, *, registry: Registry = REGISTRY,
                 middleware: ServerChain = SERVER) -> None:
        self.registry = registry
        self.middleware = middleware
        self.cancelled: set[str] = set()
        """Jids for which :func:`forkq.cancel_requested` answers True while this mode is on
        (what ``forkq cancel`` would make a running job see); empty at first."""
        self.limiter_entries: dict[str, int] = {}
        """How many entries each limiter (by name) admitted while this mode is on: in a
        testing mode a limiter built without ``client=`` touches no Redis and admits every
        entry at once, unless its name is in :attr:`over_limit`."""
        self.over_limit: set[str] = set()
        """Names of the limiters whose entries raise :class:`~forkq.errors.OverLimit` at
        once while this mode is on (to test what the code does when a limit is reached)."""
        self.workflows = Ledger(self._receive)
        """The batches and chains pushed while this mode is on (:mod:`forkq.testing_workflows`):
        their callbacks fire and their steps follow as in production."""
        self.progress: dict[str, dict[str, Any]] = {}
        """What :func:`forkq.progress` last reported of each job (by jid) run in this mode."""
        self.results: dict[str, Any] = {}
        """What :func:`forkq.result` answers: the JSON round trip of the value each job with
        ``result_ttl`` returned when it ran in this mode (a value JSON cannot carry is kept
        as the :class:`~forkq.errors.JobFailedError` production would raise)."""

    def start(self: M) -> M:
        """Switch this mode on for the whole process; returns it."""
        if self in _modes:
            raise RuntimeError(f"{self!r} is already on")
        _modes.append(self)
        clients.divert(_DIVERSION)
        return self

    def stop(self) -> None:
        """Switch this mode off: the mode on before it (or Redis) takes pushes again."""
        if not _modes or _modes[-1] is not self:
            raise RuntimeError(f"{self!r} is not the innermost testing mode on: leave modes "
                               "in the reverse order of entering them")
        _modes.pop()
        if not _modes:
            clients.divert(None)

    def __enter__(self: M) -> M:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _receive(self, jobs: list[tuple[payloads.Payload, float | None]], now: float
                 ) -> set[str]:
        """Take the jobs of one push (see :class:`forkq.client.Diversion`); the jids of
        the unique jobs dropped."""
        raise NotImplementedError

    def _run(self, payload: payloads.Payload) -> Any:
        """Run one job as a processor does: look its ``class`` up in the registry, then call
        it through the server middleware (a coroutine is run to completion inside the
        chain), :func:`forkq.current_job` telling it. The job's exception propagates."""
        spec = self.registry.lookup(payload["class"])
        context = JobContext(payload["class"], payloads.jid(payload),
                             payloads.text_field(payload, "queue") or "default", payload,
                             payload["args"])
        try:
            with running(context):
                value = self.middleware.run(context, lambda: _complete(spec.call(payload)))
        except BaseException:
            self.workflows.failed(payload)
            raise
        if payloads.result_ttl(payload):
            self.results[context.jid] = _kept(context.jid, value)
        self.workflows.done(payload, value)
        return value


class _ToTheInnermostMode:
    """The client's diversion while any mode is on: the innermost mode takes the pushes and
    answers :func:`forkq.cancel_requested`."""

    def push(self, jobs: list[tuple[payloads.Payload, float | None]], now: float) -> set[str]:
        return _modes[-1]._receive(jobs, now)

    def cancel_requested(self, jid: str) -> bool:
        return jid in _modes[-1].cancelled

    def enter_limiter(self, name: str) -> bool:
        mode = _modes[-1]
        if name in mode.over_limit:
            return False
        mode.limiter_entries[name] = mode.limiter_entries.get(name, 0) + 1
        return True

    def commit_batch(self, batch: Any) -> None:
        _modes[-1].workflows.commit(batch)

    def push_chain(self, run: Any) -> None:
        _modes[-1].workflows.push_chain(run)

    def batch_status(self, bid: str) -> Any:
        return _modes[-1].workflows.batch_status(bid)

    def chain_status(self, cid: str) -> Any:
        return _modes[-1].workflows.chain_status(cid)

    def progress(self, jid: str, report: dict[str, Any]) -> None:
        _modes[-1].progress[jid] = report

    def result(self, jid: str) -> Any:
        found = _modes[-1].results.get(jid, _MISSING)
        if found is _MISSING:
            raise ResultTimeoutError(f"no result for job {jid}: in a testing mode a job's result "
                                     "exists once the job ran (drain() it in fake mode)")
        if isinstance(found, JobFailedError):
            raise found
        return found


_MISSING = object()


def _kept(jid: str, value: Any) -> Any:
    """``value`` as :func:`forkq.result` would give it back (a JSON round trip), or the
    failure production keeps for a value JSON cannot carry."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        return JobFailedError(jid, "TypeError",
                              f"the job's return value cannot be stored as JSON: {exc}")


_DIVERSION = _ToTheInnermostMode()


@dataclass(frozen=True)
class _Entry:
    """A job kept by fake mode: its encoded bytes, as the client would have sent them."""

    raw: bytes
    name: str
    queue: str
    at: float | None  # None: queued; else scheduled for this epoch
    digest: str | None = None  # a unique job's (forkq.unique): one waits per digest

    def payload(self) -> payloads.Payload:
        """A fresh decoded copy (what the daemon would run), with ``at`` when scheduled."""
        payload = payloads.decode(self.raw)
        if self.at is not None:
            payload["at"] = self.at
        return payload


class Fake(Mode):
    """Fake mode: pushes are kept here, in push order, until drained or cleared.

    ``job`` in the methods below is a job (an ``@job`` function or a ``Job`` subclass) or
    its wire name; ``queue`` a queue name; both None: every job."""

    def __init__(self, *, registry: Registry = REGISTRY,
                 middleware: ServerChain = SERVER) -> None:
        super().__init__(registry=registry, middleware=middleware)
        self._queued: list[_Entry] = []
        self._scheduled: list[_Entry] = []  # in push order; drained in order of ``at``
        self._lock = threading.Lock()

    def jobs(self, job: Any = None, *, queue: str | None = None) -> list[payloads.Payload]:
        """The queued jobs' payloads (fresh copies), oldest first."""
        wanted = _selector(job, queue)
        with self._lock:
            return [entry.payload() for entry in self._queued if wanted(entry)]

    def scheduled(self, job: Any = None, *, queue: str | None = None) -> list[payloads.Payload]:
        """The scheduled jobs' payloads, each with its ``at`` (epoch seconds), soonest first."""
        wanted = _selector(job, queue)
        with self._lock:
            entries = [entry for entry in self._scheduled if wanted(entry)]
        return [entry.payload() for entry in sorted(entries, key=_at_of)]

    def clear(self, job: Any = None, *, queue: str | None = None) -> int:
        """Drop the matching jobs, queued and scheduled; how many were dropped."""
        wanted = _selector(job, queue)
        with self._lock:
            before = len(self._queued) + len(self._scheduled)
            self._queued = [entry for entry in self._queued if not wanted(entry)]
            self._scheduled = [entry for entry in self._scheduled if not wanted(entry)]
            return before - len(self._queued) - len(self._scheduled)

    def drain(self, job: Any = None, *, queue: str | None = None,
              include_scheduled: bool = False, limit: int = DRAIN_LIMIT) -> int:
        """Run the matching queued jobs, oldest first, until none is left, those the jobs
        push included; with ``include_scheduled``, then the scheduled ones as if their time
        had come, soonest first. A job whose ``expires_at`` has passed is dropped without
        running, as the daemon does. Returns how many ran.

        Each job leaves the queue before it runs: when one raises, the exception
        propagates, the jobs before it have run and the others are still here. More than
        ``limit`` jobs to run raises :class:`DrainLimitError` (a job that pushes itself
        again would otherwise never let the drain end). RuntimeError when this mode is not
        on: the jobs' own pushes would go elsewhere (to Redis)."""
        if self not in _modes:
            raise RuntimeError(f"{self!r} is off: drain() runs jobs only while its fake mode "
                               "is on (inside its with block, or between start and stop)")
        wanted, ran = _selector(job, queue), 0
        while (entry := self._take(wanted, include_scheduled, room=ran < limit)) is not None:
            payload = entry.payload()
            if entry.at is not None:  # moved to its queue now, as the scheduler does
                del payload["at"]
                payload["enqueued_at"] = time.time()
            if payloads.expired(payload, time.time()) is not None:
                continue  # its expires_at passed: dropped unrun, as the daemon does
            ran += 1
            self._run(payload)
        return ran

    def _take(self, wanted: Callable[[_Entry], bool], include_scheduled: bool, *,
              room: bool) -> _Entry | None:
        """Remove and return the next job to run (None: none left); DrainLimitError if
        there is one and no ``room``."""
        with self._lock:
            pools = [self._queued] + ([self._scheduled] if include_scheduled else [])
            for pool in pools:
                matching = [i for i, entry in enumerate(pool) if wanted(entry)]
                if not matching:
                    continue
                if not room:
                    raise DrainLimitError(
                        "drain ran its limit of jobs and more are waiting: does a job push "
                        "itself again? (drain(limit=...) to allow more)")
                first = matching[0] if pool is self._queued else min(
                    matching, key=lambda i: _at_of(pool[i]))
                return pool.pop(first)
        return None

    def _receive(self, jobs: list[tuple[payloads.Payload, float | None]], now: float
                 ) -> set[str]:
        """Keep a push's jobs: every one encoded first (nothing kept if one cannot be).
        A unique job (``unique_for``) is dropped while one of the same digest waits here,
        queued or scheduled: its lock is held until it is drained or cleared."""
        entries = [_encoded(payload, at, now) for payload, at in jobs]
        dropped: set[str] = set()
        with self._lock:
            waiting = {entry.digest for entry in self._queued + self._scheduled}
            for entry, (payload, _) in zip(entries, jobs, strict=True):
                if entry.digest is not None and entry.digest in waiting:
                    dropped.add(payload["jid"])
                    continue
                waiting.add(entry.digest)
                (self._queued if entry.at is None else self._scheduled).append(entry)
        return dropped

    def __repr__(self) -> str:
        return (f"<forkq.testing.Fake: {len(self._queued)} queued, "
                f"{len(self._scheduled)} scheduled>")


class Inline(Mode):
    """Inline mode: a push runs its jobs at once (scheduled ones too), before it returns;
    a job's exception comes out of the push."""

    def _receive(self, jobs: list[tuple[payloads.Payload, float | None]], now: float
                 ) -> set[str]:
        """Run a push's jobs in order, every one encoded first (none runs if one cannot
        be). A unique job is never dropped: the one before it has run when its push
        returned, releasing its lock."""
        entries = [_encoded(payload, None, now) for payload, _ in jobs]
        for entry in entries:
            self._run(entry.payload())
        return set()

    def __repr__(self) -> str:
        return "<forkq.testing.Inline>"


def fake(*, registry: Registry = REGISTRY, middleware: ServerChain = SERVER) -> Fake:
    """Fake mode, not yet on: ``with fake() as queues:``, or ``queues = fake().start()``
    then ``queues.stop()``. ``registry`` and ``middleware``: what :meth:`Fake.drain` runs
    jobs with (the daemon's defaults: ``@job``'s registry, ``forkq.server_middleware``)."""
    return Fake(registry=registry, middleware=middleware)


def inline(*, registry: Registry = REGISTRY, middleware: ServerChain = SERVER) -> Inline:
    """Inline mode, not yet on: ``with inline():``, or ``mode = inline().start()`` then
    ``mode.stop()``; ``registry`` and ``middleware`` as for :func:`fake`."""
    return Inline(registry=registry, middleware=middleware)


def _encoded(payload: payloads.Payload, at: float | None, now: float) -> _Entry:
    """The job as the client would send it: ``enqueued_at`` when it is due now, encoded by
    the client's encoder (its TypeError/ValueError for what JSON cannot carry)."""
    scheduled = at is not None and at > now
    if not scheduled:
        payload["enqueued_at"] = now
    digest = None
    if unique.FOR in payload:  # the payload the daemon would see carries its lock's digest
        unique.check(payload)
        digest = payload[unique.DIGEST] = unique.digest(payload["class"], payload["queue"],
                                                        payload["args"])
    return _Entry(payloads.encode_bytes(payload), payload["class"], payload["queue"],
                  at if scheduled else None, digest)


def _selector(job: Any, queue: str | None) -> Callable[[_Entry], bool]:
    """Whether a kept job is of ``job`` (any, if None) and in ``queue`` (any, if None)."""
    name = None if job is None else _wire_name(job)
    return lambda entry: (name is None or entry.name == name) and (
        queue is None or entry.queue == queue)


def _wire_name(job: Any) -> str:
    """The wire name of ``job``: a name, an ``@job`` function or a ``Job`` subclass."""
    if isinstance(job, str):
        return job
    for attribute in ("job_name", "name"):
        name = getattr(job, attribute, None)
        if isinstance(name, str):
            return name
    raise TypeError(f"expected a job (an @job function or a Job subclass) or its wire name, "
                    f"got {job!r}")


def _at_of(entry: _Entry) -> float:
    return entry.at if entry.at is not None else 0.0


def _complete(result: Any) -> Any:
    """A job's return value, a coroutine run to completion (on a fresh event loop; in a
    thread of its own when this thread is inside a running loop, where asyncio.run would
    refuse)."""
    if not inspect.iscoroutine(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(result)
    return _run_in_thread(result)


def _run_in_thread(coroutine: Any) -> Any:
    """asyncio.run(coroutine) in a new thread, waited for; its exception re-raised here."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as exc:  # noqa: BLE001 - carried to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="forkq.testing coroutine job")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
