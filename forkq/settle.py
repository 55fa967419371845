"""The master decides what becomes of the job a gone processor child was holding.

The caller guarantees the child is reaped, so nothing else touches its
in-flight list. By the :class:`Gone` record's ``cause``:

- ``"exit"`` — the child stopped as told (graceful stop, retired by a reload,
  recycled) or was killed at the end of a graceful stop: its job, if any, goes
  back unchanged to the front of its queue (:func:`forkq.fetch.requeue`).
- ``"crash"`` — the child died on its own (a signal, a non-zero exit) or was
  killed for being unresponsive or over its memory ceiling. The job's kill count
  (``forkq:kills:<jid>``, kept 7 days; death.lua, which restarts a counter holding
  anything else) goes up by one. Below :data:`KILL_LIMIT`
  the job is requeued unchanged; at the limit it goes to the dead set with a
  :class:`~forkq.errors.JobKilledError` naming the reason (the poison pill).
- ``"timeout"`` — the master killed the child because job ``jid`` overran its
  timeout: if the held job is that one it fails with
  :class:`~forkq.errors.JobTimeoutError` through the retry policy (retry set,
  then dead); a different job is requeued.

Whatever the cause, a held job that is no job (:class:`~forkq.errors.MalformedJobError`)
goes to the dead set with its bytes kept, as a processor buries it.

A Redis error propagates; the caller retries the whole settlement later (a
crash may then be counted twice).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import redis

from forkq import fetch, keys, retry
from forkq import payload as payloads
from forkq.connection import raw as raw_of
from forkq.connection import text
from forkq.errors import JobKilledError, JobTimeoutError, MalformedJobError
from forkq.registry import Registry
from forkq.scripts import source

KILL_LIMIT = 3


@dataclass(frozen=True)
class Gone:
    """A child that is gone, and why."""

    inflight_key: str
    cause: str  # "exit" | "crash" | "timeout"
    how: str  # "killed by signal SIGKILL", "exited with status 1", ...
    timeout_jid: str = ""
    timeout: float = 0.0


@dataclass(frozen=True)
class Settled:
    """What happened to the held job: ``outcome`` is requeued, retry, dead or drop."""

    outcome: str
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
    """Settle the job held in ``gone.inflight_key``; None when it held none.

    A held job that is no job (:class:`MalformedJobError`) goes to the dead set with its
    bytes kept, whatever the cause, as a processor buries it."""
    held = client.lrange(gone.inflight_key, 0, 1)
    if len(held) < 2:
        fetch.requeue(client, gone.inflight_key, unregister=True)
        return None
    raw = raw_of(held[1])
    try:
        payload = payloads.decode(raw)
    except MalformedJobError as exc:
        queue = keys.queue_name(text(held[0]))
        return _file(client, gone, retry.unrunnable(raw, queue, exc, now), raw, str(exc))
    if gone.cause == "exit":
        return _requeue(client, gone, raw)
    if gone.cause == "timeout" and payloads.jid(payload) == gone.timeout_jid:
        error = JobTimeoutError(f"the job ran longer than its timeout of {gone.timeout:g}s; "
                                "its processor was killed")
        spec = registry.find(payload["class"])
        failure = retry.plan(payload, error, max_retries=max_retries, rng=rng, now=now,
                             retry_in=spec.options.retry_in if spec else None)
        return _file(client, gone, failure, raw, str(error))
    if gone.cause == "crash":
        kills = _count_kill(client, payloads.kill_key_id(payload, raw))
        if kills >= KILL_LIMIT:
            message = (f"its processor died {kills} times while running it "
                       f"(last: {gone.how})")
            retry.record_error(payload, retry.error_class_name(JobKilledError()), message, now)
            return _file(client, gone, retry.bury(payload, now), raw, message)
        return _requeue(client, gone, raw, f"{kills} of {KILL_LIMIT} deaths")
    return _requeue(client, gone, raw)


def _requeue(client: redis.Redis, gone: Gone, raw: bytes, detail: str = "") -> Settled:
    fetch.requeue(client, gone.inflight_key, unregister=True)
    return Settled("requeued", raw, detail)


def _file(
    client: redis.Redis, gone: Gone, failure: retry.Failure, raw: bytes, detail: str
) -> Settled:
    retry.file(client, gone.inflight_key, failure, held=raw)
    client.srem(keys.INFLIGHT_REGISTRY, gone.inflight_key)
    return Settled(failure.mode, raw, detail)


def _count_kill(client: redis.Redis, jid: str) -> int:
    """One more death of the job ``jid`` (death.lua); its deaths so far."""
    script = client.register_script(source("death"))
    return int(script(keys=[keys.kills(jid)], args=[keys.KILLS_TTL]))
