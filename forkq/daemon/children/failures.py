"""Failures, Sidekiq's way: the pure retry policy and filing a failure into retry or dead.

Policy (job_retry.rb): the first failure sets ``failed_at`` and ``retry_count: 0``;
later ones set ``retried_at`` and add one to ``retry_count``. ``retry: true``
allows ``max_retries`` (25) retries, an int N allows N, ``0`` sends the job to
the dead set at once, ``false`` drops it (counted as failed, kept nowhere).
``dead: false`` never buries. A payload with ``retry_for`` (seconds; Sidekiq 7.1.3+)
also goes to the dead set once ``failed_at + retry_for`` has passed. The delay is
``count**4 + 15 + rand(10)*(count+1)`` seconds; a job's ``retry_in(count, exc)`` that returns
a number above 0 replaces ``count**4 + 15`` (the jitter is still added, as in Sidekiq's
``delay_for``); 0 or less, anything other than a number, or an error keeps the default; it
may also return ``"kill"`` (to the dead set now) or ``"discard"`` (dropped).
Rules by exception come first: an exception of the job's ``discard_on`` classes drops the
job, and with ``retry_on`` given an exception of no class in it goes to the dead set at once
(:class:`~forkq.registry.RetryRules`). The
queue becomes ``retry_queue`` when the payload has one. ``error_backtrace`` is
``base64(zlib(JSON(lines)))`` with Ruby's 60-column MIME lines.

Keys: ``retry``, ``dead`` (trimmed to 10,000 entries / 180 days), ``stat:*``, and
``forkq:cancels`` (a cancelled job's request is withdrawn as it is filed).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import random
import time
import traceback
import zlib
from dataclasses import dataclass, replace
from typing import Any, Literal

from forkq import keys
from forkq import payload as payloads
from forkq.errors import JobCancelledError, OverLimit
from forkq.limiter import MAX_OVERRATED
from forkq.registry import RetryRules
from forkq.scripts import script

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 10_000
MAX_DELAY = 10 * 365 * 24 * 3600.0  # a retry is never scheduled more than 10 years ahead


Mode = Literal["retry", "dead", "drop", "reschedule"]


DEFAULT_RULES = RetryRules()
"""A job's rules when it sets none (an unregistered class's, for one)."""


@dataclass(frozen=True)
class Failure:
    """Where a failed job goes."""

    mode: Mode
    payload: str
    score: float
    withdraw: str = ""  # a cancelled job's jid: its request (forkq:cancels) is carried out


def backoff(count: int, rng: random.Random, base: float | None = None) -> float:
    """Seconds until retry number ``count`` (0-based), as Sidekiq 6.4's ``delay_for``: ``base``
    when it is above 0, else ``count**4 + 15``; plus the jitter ``rand(10) * (count + 1)``."""
    jitter = rng.randrange(10) * (count + 1)
    if base is not None and base > 0:
        return base + jitter
    return count**4 + 15 + jitter


def allowed_retries(retry: bool | int, max_retries: int) -> int | None:
    """How many retries the ``retry`` option allows; None means drop on failure."""
    if retry is True:
        return max_retries
    if retry is False:
        return None
    return max(retry, 0)


def retry_option(payload: payloads.Payload, registered: bool | int) -> bool | int:
    """The payload's ``retry`` (true, false or an integer); ``registered``, the job's own
    option, when the field is absent, null or of another type (Sidekiq's job_retry.rb
    takes the job class's option for a nil ``retry`` too)."""
    value = payload.get("retry")
    return value if isinstance(value, (bool, int)) else registered


def error_class_name(exc: BaseException) -> str:
    """``ValueError`` for builtins, ``module.Class`` otherwise."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def error_message(exc: BaseException) -> str:
    """``str(exc)`` as valid UTF-8 (lone surrogates, as ``os.fsdecode`` makes of a non-UTF-8
    file name, become U+FFFD, as Ruby's ``scrub``); a ``__str__`` that raises gives a stand-in,
    so a failure is always filed."""
    try:
        message = str(exc)
    except Exception as inner:  # noqa: BLE001 - application code: any error is possible
        return f"(the message could not be read: {type(inner).__name__})"
    try:
        message.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in message)
    return message


def backtrace_lines(exc: BaseException) -> list[str]:
    """Ruby-style lines (``file:line:in `func'``), innermost first."""
    frames = traceback.extract_tb(exc.__traceback__)
    return [f"{f.filename}:{f.lineno}:in `{f.name}'" for f in reversed(frames)]


def compress_backtrace(lines: list[str]) -> str:
    """Sidekiq's ``Base64.encode64(Zlib::Deflate.deflate(JSON.generate(lines)))``."""
    data = base64.b64encode(zlib.compress(json.dumps(lines, separators=(",", ":")).encode()))
    text = data.decode()
    return "".join(text[i : i + 60] + "\n" for i in range(0, len(text), 60))


def record_error(payload: payloads.Payload, error_class: str, message: str, now: float) -> int:
    """Add Sidekiq's error fields to ``payload``; returns the new ``retry_count``.

    Fields of the wrong type count as absent (:mod:`forkq.payload`): a ``queue`` that is
    no string becomes "default", a ``retry_count`` that is no integer starts over."""
    payload["queue"] = (payloads.text_field(payload, "retry_queue")
                        or payloads.text_field(payload, "queue") or "default")
    payload["error_message"] = message[:MESSAGE_LIMIT]  # as error_message() made it
    payload["error_class"] = error_class
    count = payloads.int_field(payload, "retry_count")
    if count is not None:
        payload["retried_at"] = now
        payload["retry_count"] = count + 1
    else:
        payload["failed_at"] = now
        payload["retry_count"] = 0
    return int(payload["retry_count"])


def plan(
    payload: payloads.Payload,
    exc: BaseException,
    *,
    max_retries: int,
    rng: random.Random,
    now: float,
    rules: RetryRules = DEFAULT_RULES,
) -> Failure:
    """Decide where a job that raised ``exc`` goes and rewrite its payload accordingly,
    by the job's ``rules``."""
    if isinstance(exc, OverLimit):
        over = rescheduled(payload, rng, now)
        if over is not None:
            return over
    allowed = allowed_retries(retry_option(payload, rules.retry), max_retries)
    count = record_error(payload, error_class_name(exc), error_message(exc), now)
    limit = payloads.backtrace_limit(payload)
    if limit is not None:
        lines = backtrace_lines(exc)
        payload["error_backtrace"] = compress_backtrace(lines if limit < 0 else lines[:limit])
    if isinstance(exc, JobCancelledError):  # never retried, whatever the job's options
        return replace(bury(payload, now), withdraw=payloads.jid(payload))
    if allowed is None or isinstance(exc, rules.discard_on):
        return Failure("drop", payloads.encode(payload), now)
    if rules.retry_on is not None and not isinstance(exc, rules.retry_on):
        return bury(payload, now)
    if count < allowed and not _window_closed(payload, now):
        base = _base_delay(rules.retry_in, count, exc)
        if base == "discard":
            return Failure("drop", payloads.encode(payload), now)
        if base != "kill":
            return Failure("retry", payloads.encode(payload), _due(now, count, rng, base))
    return bury(payload, now)


def rescheduled(payload: payloads.Payload, rng: random.Random, now: float) -> Failure | None:
    """A job whose limiter had no room (:class:`~forkq.errors.OverLimit` escaped it) goes
    back to ``schedule`` with ``overrated`` one higher, due in Sidekiq Enterprise's default
    backoff, ``300 * overrated + rand(300) + 1`` seconds: not a failure, no retry spent.
    None once it was rescheduled :data:`~forkq.limiter.MAX_OVERRATED` times (then the
    OverLimit is a failure like any other)."""
    overrated = payloads.int_field(payload, "overrated") or 0
    if not 0 <= overrated < MAX_OVERRATED:
        return None
    payload["overrated"] = overrated + 1
    delay = 300 * (overrated + 1) + rng.randrange(300) + 1
    return Failure("reschedule", payloads.encode(payload), now + delay)


def _due(now: float, count: int, rng: random.Random, base: float | None) -> float:
    """When retry ``count`` is due: ``now`` + :func:`backoff`, capped at :data:`MAX_DELAY`
    (a huge ``retry_count`` or ``retry_in`` must still give a finite, writable score)."""
    if count > MAX_DELAY or (base is not None and base > MAX_DELAY):
        return now + MAX_DELAY
    return now + min(backoff(count, rng, base), MAX_DELAY)


def _window_closed(payload: payloads.Payload, now: float) -> bool:
    """Sidekiq 7.1.3+'s ``retry_for`` (seconds): no retry once ``failed_at + retry_for`` has
    passed, whatever the count allows. ``failed_at`` may be float seconds or 8.x milliseconds."""
    window = payloads.number_field(payload, "retry_for")
    failed_at = payloads.epoch_seconds(payload.get("failed_at"))
    if window is None or failed_at is None:
        return False
    return failed_at + window < now


def _base_delay(retry_in: Any, count: int, exc: BaseException
                ) -> float | Literal["kill", "discard"] | None:
    """The job's own base delay, ``"kill"`` / ``"discard"``, or None for the default;
    application errors are contained."""
    if retry_in is None:
        return None
    try:
        value = retry_in(count, exc)
    except Exception:  # a faulty retry_in must not lose the failure
        log.exception("retry_in failed; using the default delay")
        return None
    if value in ("kill", "discard"):
        return value  # type: ignore[no-any-return]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        delay = float(value)
    except OverflowError:  # an int beyond float range
        return None
    return delay if math.isfinite(delay) else None


def unrunnable(raw: bytes, queue: str, exc: BaseException, now: float) -> Failure:
    """The dead-set filing of a job that cannot run (malformed, unknown class): the payload
    of :func:`forkq.payload.unrunnable` (raw bytes kept) with ``forkq.<Error>`` and the reason."""
    payload = payloads.unrunnable(raw, queue, now)
    record_error(payload, f"forkq.{type(exc).__name__}", error_message(exc), now)
    return bury(payload, now)


def bury(payload: payloads.Payload, now: float) -> Failure:
    """The dead set, unless the payload says ``dead: false``."""
    mode: Mode = "drop" if payload.get("dead") is False else "dead"
    return Failure(mode, payloads.encode(payload), now)


def file(redis_client: Any, inflight_key: str, failure: Failure, *, held: bytes) -> bool:
    """Atomically release the in-flight job ``held`` and file ``failure`` (fail.lua): into
    its set, or into ``forkq:unfiled`` while that set holds another type (logged; the
    leader files it later, :mod:`forkq.daemon.children.unfiled`); a cancelled job's request
    is withdrawn in the same step.

    False (nothing filed) when the in-flight list no longer holds ``held``: the leader's
    orphan sweep requeued it while this process was cut off from Redis."""
    date = keys.utc_date(time.time())
    lua = script(redis_client, "fail")
    target = {"retry": keys.RETRY, "reschedule": keys.SCHEDULE}.get(failure.mode, keys.DEAD)
    result = lua(
        keys=[
            inflight_key,
            target,
            keys.STAT_PROCESSED,
            keys.daily(keys.STAT_PROCESSED, date),
            keys.STAT_FAILED,
            keys.daily(keys.STAT_FAILED, date),
            keys.UNFILED,
            keys.CANCELS,
        ],
        args=[
            failure.mode,
            failure.payload,
            repr(failure.score),
            keys.DAILY_STAT_TTL,
            repr(failure.score - keys.DEAD_TIMEOUT),
            keys.DEAD_MAX_JOBS,
            held,
            failure.withdraw,
        ],
    )
    if result == b"parked":
        log.warning("%r holds another type: the failure waits in %r until it is mended: %s",
                    target, keys.UNFILED, failure.payload[:200])
    return bool(result != b"gone")
