"""One job, from its fetched bytes to its outcome: decode, look up, server middleware, body.

Called by each lane of a processor (:mod:`forkq.daemon.children.processor`); the
caller keeps the bookkeeping: acknowledge a job that completed, file the failure of one
that did not. A coroutine job (``async def``) is run to its end by the caller's runner
(:mod:`forkq.daemon.children.coroutines`) inside the middleware, as a plain body is.

A unique job held until its start (``unique_until: start``, :mod:`forkq.unique`) has its
lock released just before its body runs.

Contract of :func:`run`: it returns None when the job completed, :class:`Completed` when it
completed and its workflow takes what it returned (a chain's step, a chord's member: the
value as JSON, which the acknowledgement carries; a value JSON cannot carry fails the job
with a ``TypeError``), else the :class:`~forkq.daemon.children.failures.Failure` to file: a
job that cannot run (malformed, unknown class) is buried; an exception of any kind from
the middleware or the body (``BaseException``: the one boundary where a job's failure
lands) goes through the retry
policy; its line in the log is followed by its traceback (:data:`FAILURE_LEVELS`), from
the application's first frame on (forkq's own frames before it are left out but at
``log_level: debug``: :data:`~forkq.daemon.logs.JOB_FAILURE`).
``show`` is told the running job (the heartbeat's ``job`` entry) before the body
runs and None after. Each run through the middleware is counted in ``Runs.metrics`` (its
queue, class, time and outcome; no I/O), which the heartbeat writes to Redis; a job that
cannot run is not (as in Sidekiq, whose metrics are a server middleware).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

from forkq import keys, results, unique
from forkq import payload as payloads
from forkq.daemon import logs
from forkq.daemon.children import coroutines, failures
from forkq.daemon.children.fetch import Fetched
from forkq.errors import JobCancelledError, JobError
from forkq.metrics.recorder import Recorder, job_class
from forkq.middleware import JobContext, ServerChain, reset_current, set_current
from forkq.registry import JobSpec, Registry
from forkq.scripts import script
from forkq.wording import duration

log = logging.getLogger(__name__)

FAILURE_LEVELS = {"retry": logging.WARNING, "dead": logging.ERROR, "drop": logging.ERROR}
"""A failed job's line, followed by its traceback: WARNING while it will be retried, ERROR
when it will not run again (dead, or dropped: ``retry: false`` / ``dead: false``)."""

Show = Callable[[dict[str, Any] | None], None]

VALUE_FIELDS = ("chain", "chord")
"""A job whose payload has one of these fields gives its workflow what it returned."""


class Completed(NamedTuple):
    """A job that completed, and what it returned as JSON, for its workflow."""

    value: str


@dataclass(frozen=True)
class Runs:
    """What every job of one processor runs with."""

    registry: Registry
    middleware: ServerChain
    coroutine_runner: coroutines.Runner
    max_retries: int
    job_timeout: float  # the ``job_timeout`` setting, for jobs without their own
    rng: random.Random
    redis: Any  # the processor's client: results of jobs with ``result_ttl``
    metrics: Recorder | None = None  # the heartbeat's: counts each run


def run(fetched: Fetched, runs: Runs, show: Show) -> failures.Failure | Completed | None:
    """Run the job ``fetched``; None (or :class:`Completed`) when it completed, else the
    failure to file."""
    now = time.time()
    try:
        payload = payloads.decode(fetched.raw)
        spec = runs.registry.lookup(payload["class"])
    except JobError as exc:
        log.error("queue %s: %s; moved to the dead set", fetched.queue, exc)
        return failures.unrunnable(fetched.raw, fetched.queue, exc, now)
    if "expires_at" in payload and _expired(fetched, runs, payload, now):
        return None  # acknowledged as done: never started
    context = JobContext(payload["class"], payloads.jid(payload), fetched.queue, payload,
                         payload["args"])
    log.info("%s jid=%s start", context.name, context.jid,
             extra={"jid": context.jid, "job": context.name, "queue": fetched.queue})
    if payload.get(unique.UNTIL) == "start":  # a dict lookup per job: no call
        _release_lock(context, runs, fetched.raw)
    own = timeout_of(payload)
    limit = own or runs.job_timeout
    keep = payloads.result_ttl(payload)
    show({"queue": fetched.queue, "payload": fetched.raw, "run_at": int(now), "started": now,
          "class": context.name, "jid": context.jid,
          "timeout": _kill_after(spec, own, limit)})
    started = time.monotonic()
    token = set_current(context)
    try:
        value = runs.middleware.run(context, functools.partial(_perform, spec, payload, runs,
                                                               limit))
    except BaseException as exc:  # noqa: BLE001 - the one boundary where a job failure lands
        return _failed(fetched, runs, context, spec=spec, exc=exc, started=started)
    finally:
        reset_current(token)
        show(None)
    if context.cancel_seen:  # it returned after seeing its cancellation: cancelled
        return _failed(fetched, runs, context, spec=spec, exc=None, started=started)
    carried = None
    if VALUE_FIELDS[0] in payload or VALUE_FIELDS[1] in payload:
        try:
            carried = Completed(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError, RecursionError) as exc:
            error = TypeError(f"the job's return value cannot go to its workflow as JSON: {exc}")
            return _failed(fetched, runs, context, spec=spec, exc=error, started=started)
    elapsed = time.monotonic() - started
    if runs.metrics is not None:
        runs.metrics.record(fetched.queue, job_class(payload), elapsed, failed=False)
    if log.isEnabledFor(logging.INFO):  # the duration's wording costs a job more than its line
        log.info("%s jid=%s done: %s", context.name, context.jid, duration(elapsed),
                 extra={"jid": context.jid, "job": context.name, "queue": fetched.queue,
                        "duration": elapsed, "outcome": "done"})
    if keep:
        _keep(context, lambda: results.store_value(runs.redis, context.jid, value, keep))
    return carried


def _perform(spec: JobSpec, payload: payloads.Payload, runs: Runs, limit: float) -> Any:
    """Call the job's body; when it returns an awaitable (an ``async def`` body), run it to
    its end on the processor's event loop, cancelled at ``limit`` seconds."""
    value = spec.call(payload)
    if value is not None and inspect.isawaitable(value):
        return runs.coroutine_runner(value, limit)
    return value


def _failed(fetched: Fetched, runs: Runs, context: JobContext, *, spec: JobSpec,
            exc: BaseException | None, started: float) -> failures.Failure:
    """The failure to file for a job that raised ``exc``, or that returned (None) after it
    saw its cancellation; logged, counted, and its result stored when it is final."""
    elapsed = time.monotonic() - started
    cancelled = _cancelled(context, runs, exc)
    error = cancelled or exc
    assert error is not None  # exc is None only for a job that saw its cancellation
    failure = failures.plan(payloads.decode(fetched.raw), error, max_retries=runs.max_retries,
                            rng=runs.rng, now=time.time(), rules=spec.options.rules())
    if failure.mode == "reschedule":  # a limiter had no room: not a failure
        log.info("%s jid=%s over limit: %s; rescheduled", context.name, context.jid,
                 failures.error_message(error),
                 extra=_fields(context, elapsed=elapsed, outcome="reschedule"))
        if runs.metrics is not None:
            runs.metrics.note(fetched.queue, job_class(context.payload), "overrated")
        return failure
    _count(runs, fetched.queue, context.payload, elapsed, failed=True)
    if failure.mode == "drop" and runs.metrics is not None:
        runs.metrics.note(fetched.queue, job_class(context.payload), "discarded")
    level = logging.WARNING if cancelled else FAILURE_LEVELS[failure.mode]
    trace = None if exc is None or isinstance(exc, JobCancelledError) else exc
    outcome = "cancelled" if cancelled else failure.mode
    log.log(level, "%s jid=%s fail: %s: %s: %s -> %s", context.name, context.jid,
            duration(elapsed), failures.error_class_name(error), failures.error_message(error),
            failure.mode, exc_info=trace,
            extra={**logs.JOB_FAILURE, **_fields(context, elapsed=elapsed, outcome=outcome)})
    keep = payloads.result_ttl(context.payload)
    if keep and failure.mode != "retry":
        message = (failures.error_class_name(error), failures.error_message(error))
        _keep(context, lambda: results.store_failure(runs.redis, context.jid, *message, keep))
    return failure


def _fields(context: JobContext, *, elapsed: float | None = None, outcome: str | None = None
            ) -> dict[str, Any]:
    """The ``extra=`` of a line about the job (:data:`~forkq.daemon.logs.JOB_FIELDS`):
    what the JSON log format writes of it."""
    fields: dict[str, Any] = {"jid": context.jid, "job": context.name, "queue": context.queue}
    if elapsed is not None:
        fields["duration"] = elapsed
    if outcome is not None:
        fields["outcome"] = outcome
    return fields


def _cancelled(context: JobContext, runs: Runs, exc: BaseException | None
               ) -> JobCancelledError | None:
    """The error a job is filed with when it ended while its cancellation stood: it saw the
    request (:func:`forkq.cancel_requested`) and then returned or raised, or it failed while
    the request stood (one round trip, on failures only: a job that completes without
    looking is done, and the master withdraws the request). None otherwise."""
    if isinstance(exc, JobCancelledError):
        return exc
    if not context.cancel_seen and (exc is None or not _standing(runs.redis, context.jid)):
        return None
    ended = "returned" if exc is None else (
        f"raised {failures.error_class_name(exc)}: {failures.error_message(exc)}")
    error = JobCancelledError(f"the job was cancelled while it ran, and {ended}")
    return error.with_traceback(exc.__traceback__) if exc is not None else error


def _standing(client: Any, jid: str) -> bool:
    """Whether the request to cancel ``jid`` stands (a Redis error: as far as we know, no)."""
    try:
        return client.zscore(keys.CANCELS, jid) is not None
    except redis.RedisError:
        return False


def _count(runs: Runs, queue: str, payload: payloads.Payload, seconds: float, *,
           failed: bool) -> None:
    if runs.metrics is not None:
        runs.metrics.record(queue, job_class(payload), seconds, failed=failed)


def _expired(fetched: Fetched, runs: Runs, payload: payloads.Payload, now: float) -> bool:
    """Whether the job's ``expires_at`` has passed (Sidekiq Pro's expiring jobs): then it
    is logged and counted, not run."""
    late = payloads.expired(payload, now)
    if late is None:
        return False
    log.info("%s jid=%s expired %s ago: not run", payload["class"], payloads.jid(payload),
             duration(late), extra={"jid": payloads.jid(payload), "job": payload["class"],
                                    "queue": fetched.queue, "outcome": "expired"})
    if runs.metrics is not None:
        runs.metrics.note(fetched.queue, job_class(payload), "expired")
    return True


def _release_lock(context: JobContext, runs: Runs, raw: bytes) -> None:
    """Release the lock of a unique job that holds it until it starts (unlock.lua); a
    refusal or an outage is logged, and the job runs (its lock expires with its TTL)."""
    try:
        script(runs.redis, "unlock")(args=[raw])
    except redis.RedisError as exc:
        log.warning("%s jid=%s: its unique lock was not released at its start: %s",
                    context.name, context.jid, exc, extra=_fields(context))


def _keep(context: JobContext, store: Callable[[], str | None]) -> None:
    """Store a job's result; a refusal or an outage is logged, and the job stays done."""
    try:
        problem = store()
    except redis.RedisError as exc:
        log.warning("%s jid=%s: its result was not stored: %s", context.name, context.jid, exc,
                    extra=_fields(context))
        return
    if problem:
        log.warning("%s jid=%s: %s", context.name, context.jid, problem, extra=_fields(context))


def timeout_of(payload: payloads.Payload) -> float:
    """The job's own ``timeout`` option in seconds (0 = use ``job_timeout``)."""
    value = payloads.number_field(payload, "timeout")
    return value if value is not None and value > 0 else 0.0


def _kill_after(spec: JobSpec, own: float, limit: float) -> float:
    """The heartbeat's ``timeout``, after which the master kills the child: the job's
    ``own`` timeout (0 = the ``job_timeout`` setting); a coroutine job is cancelled on its
    loop at its ``limit``, so the master's kill only backs that up,
    :data:`~coroutines.KILL_GRACE` seconds later."""
    if spec.is_coroutine and limit:
        return limit + coroutines.KILL_GRACE
    return own
