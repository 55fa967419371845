"""The master decides what becomes of the job a gone processor child was holding.

The caller guarantees the child is reaped, so nothing else touches its
in-flight list. By the :class:`Gone` record's ``cause``:

- ``"exit"`` — the child stopped as told (graceful stop, retired by a reload,
  recycled) or was killed at the end of a graceful stop: its job, if any, goes
  back unchanged to the front of its queue.
- ``"crash"`` — the child died on its own (a signal, a non-zero exit) or was
  killed for being unresponsive or over its memory ceiling: the job's death is
  counted and it is requeued, or buried at the poison-pill limit
  (:mod:`forkq.daemon.held_jobs`, the same step the leader takes for a dead daemon).
- ``"cancel"`` — the master killed the child because job ``timeout_jid``, which it ran, was
  cancelled (:mod:`forkq.daemon.master.cancels`): if the held job is that one it goes to
  ``dead`` with :class:`~forkq.errors.JobCancelledError`, never retried, and the request
  is withdrawn; any other job goes back unchanged.
- ``"timeout"`` — the master killed the child because job ``jid`` overran its
  timeout: if the held job is that one it fails with
  :class:`~forkq.errors.JobTimeoutError` through the retry policy (retry set,
  then dead); a different job is requeued.

Jobs the child held behind the one it ran (a batch, not started) always go back unchanged,
in order, to the front of their queues, and their deaths are never counted. Jobs of the
batch it completed (``done``, read from its slot's shared progress) are acknowledged
first, so they do not run again.

A child running several jobs at once (``async_concurrency``) has one list per lane
(:attr:`Gone.lanes`), each settled the same way: every job it was running is requeued, and
after a crash each one's death counts.

Whatever the cause, a held job that is no job (:class:`~forkq.errors.MalformedJobError`)
goes to the dead set with its bytes kept, as a processor buries it.

A job killed for its timeout or its cancellation is also counted where its processor would
have counted it (:mod:`forkq.metrics.recorder`: Sidekiq's per-class metrics and forkq's
per queue and class, as one failed run lasting from its start to the kill), as ``fail.lua``
counts it in ``stat:failed``: the metrics of a class agree with the totals. Best effort: a
refused or lost write is logged, and the settlement stands.

A Redis error propagates and changes nothing; the caller retries the whole settlement later.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace
from typing import Literal

import redis

from forkq import keys, limiter
from forkq import payload as payloads
from forkq.daemon import held_jobs
from forkq.daemon.children import failures
from forkq.daemon.children.fetch import Done
from forkq.errors import JobCancelledError, JobTimeoutError, MalformedJobError
from forkq.metrics.recorder import Recorder, check_replies, job_class, queue_writes
from forkq.registry import Registry, RetryRules
from forkq.wording import counted

log = logging.getLogger(__name__)

Cause = Literal["exit", "crash", "timeout", "cancel"]


@dataclass(frozen=True)
class Gone:
    """A child that is gone, and why."""

    inflight_key: str
    cause: Cause
    how: str  # "killed by signal SIGKILL", "exited with status 1", ...
    timeout_jid: str = ""  # the job it was killed for (cause "timeout" or "cancel")
    timeout: float = 0.0
    started: float = 0.0  # epoch the job it was killed for started (its heartbeat's), or 0
    done: Done = held_jobs.NOTHING_DONE  # what it completed of a batch (its slot's Progress)
    lanes: tuple[str, ...] = ()  # the in-flight lists of its lanes (async_concurrency > 1)
    process: bool = True  # the child's own record (False: one of its lanes')

    def each_list(self) -> list[Gone]:
        """One record per in-flight list to settle: its own, then each lane's."""
        return [self, *(replace(self, inflight_key=key, done=held_jobs.NOTHING_DONE, lanes=(),
                                process=False) for key in self.lanes)]


@dataclass(frozen=True)
class Settled:
    """What happened to the held job."""

    outcome: failures.Mode | held_jobs.Outcome
    job: bytes
    detail: str = ""


def settle(
    client: redis.Redis,
    gone: Gone,
    *,
    registry: Registry,
    max_retries: int,
    rng: random.Random,
    now: float,
) -> Settled | None:
    """Settle the job held in ``gone.inflight_key``; None when it held none. The child's
    own record also frees the concurrent-limiter slots it held (:mod:`forkq.limiter`)."""
    if gone.process:
        freed = limiter.release_held(client, gone.inflight_key.removeprefix(keys.INFLIGHT_PREFIX))
        if freed:
            log.info("freed %s that %s held", counted(freed, "limiter slot"), gone.inflight_key)
    held = held_jobs.read(client, gone.inflight_key, gone.done)
    killed_for = _kill_failure(held, gone, registry, max_retries, rng, now)
    if killed_for is not None:
        failure, detail = killed_for
        # a cancelled job's request is withdrawn by the same script (Failure.withdraw)
        failures.file(client, gone.inflight_key, failure, held=held.job or b"")
        behind = held_jobs.reread(client, gone.inflight_key)  # held, not started: back
        held_jobs.give_back(client, gone.inflight_key, behind, count=False, how=gone.how, now=now)
        _count_killed(client, held, gone, now)
        return Settled(failure.mode, held.job or b"", detail)
    back = held_jobs.give_back(client, gone.inflight_key, held, count=gone.cause == "crash",
                               how=gone.how, now=now)
    if back.outcome == "empty":
        return None
    detail = f"{back.deaths} of {held_jobs.KILL_LIMIT} deaths" if back.deaths else ""
    return Settled(back.outcome, back.job, detail)


def _count_killed(client: redis.Redis, held: held_jobs.Held, gone: Gone, now: float) -> None:
    """Count the run of a job killed for its timeout or cancellation in the job metrics, as
    its processor counts a failed run (its counts die with it)."""
    metrics = Recorder()
    seconds = max(now - gone.started, 0.0) if gone.started else 0.0
    metrics.record(held.queue, job_class(payloads.decode(held.job or b"")), seconds,
                   failed=True)
    pipe = client.pipeline(transaction=False)
    touched = queue_writes(pipe, metrics.drain(), now)
    try:
        replies = pipe.execute(raise_on_error=False)
    except redis.RedisError as exc:
        log.warning("the killed job's run was not counted in the job metrics: %s", exc)
        return
    check_replies(touched, replies)


def _kill_failure(held: held_jobs.Held, gone: Gone, registry: Registry, max_retries: int,
                  rng: random.Random, now: float) -> tuple[failures.Failure, str] | None:
    """The failure to file when ``gone`` was killed for the job it still held: overrunning
    its timeout (retry policy), or cancelled (dead, never retried)."""
    if gone.cause not in ("timeout", "cancel") or held.job is None:
        return None
    try:
        payload = payloads.decode(held.job)
    except MalformedJobError:
        return None  # give_back buries it
    if payloads.jid(payload) != gone.timeout_jid:
        return None
    error: Exception = JobCancelledError(
        "the job was cancelled while it ran; its processor was killed")
    if gone.cause == "timeout":
        error = JobTimeoutError(f"the job ran longer than its timeout of {gone.timeout:g}s; "
                                "its processor was killed")
    spec = registry.find(payload["class"])
    failure = failures.plan(payload, error, max_retries=max_retries, rng=rng, now=now,
                            rules=spec.options.rules() if spec else RetryRules())
    return failure, str(error)
