"""Redis refusals (the server answered "no") as opposed to outages (it did not answer).

An outage (connection refused, reset, timed out) is waited out and logged once
(:mod:`forkq.daemon.outage`). A refusal is the server answering a command with an error: a
key of the wrong type (``WRONGTYPE``), ``maxmemory`` reached with ``noeviction`` (``OOM``),
an ACL that forbids the command (``NOPERM``), or a forkq script that refused to write
because a target key has the wrong type. A refusal is about one key or one step, not about
Redis: the caller names the key, leaves the job where it was, reports it (at most once a
minute per subject, :class:`Recurring`) and goes on with everything else. A read-only
replica (``READONLY``) is not a refusal: forkq's connections turn it into
:class:`forkq.connection.MasterLost`, an outage (a failover), before it gets here.

forkq's Lua scripts check the type of every key they will write before their first
write (Redis does not roll back a script's earlier writes when a later command
fails) and refuse with an error reply of the form::

    WRONGTYPE forkq: key 'queue:default' holds a string, not a list

which :func:`describe` passes through unchanged, so the log names the key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

T = TypeVar("T")

REPORT_INTERVAL = 60.0


def is_refusal(exc: BaseException) -> bool:
    """True when Redis answered with an error reply (it is up, but refused this step)."""
    return isinstance(exc, redis.ResponseError)


WHY: dict[type[redis.ResponseError], str] = {
    redis.exceptions.OutOfMemoryError: "Redis is at maxmemory with the noeviction policy and "
                                       "refuses writes that grow it; waiting until it has room",
    redis.exceptions.ReadOnlyError: "this Redis is a read-only replica; point redis_url at "
                                    "the master",
    redis.exceptions.NoPermissionError: "the ACL user may not run this command or touch this "
                                        "key",
}


def describe(exc: BaseException, key: str | None = None) -> str:
    """One line for a refusal; Redis's own ``WRONGTYPE`` text gains the key it was about, and
    ``OOM``, ``READONLY`` and ``NOPERM`` say what they mean for forkq."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if key is not None and text.startswith("WRONGTYPE") and "forkq:" not in text:
        return f"WRONGTYPE: key {key!r} holds the wrong kind of value"
    why = next((why for kind, why in WHY.items() if isinstance(exc, kind)), "")
    return f"{text} ({why})" if why else text


class Recurring:
    """A problem that may come back on every turn of a loop, logged at most once per
    ``interval`` seconds for each subject (a key, a step), and once more when it clears.

    ``clock`` is injectable for unit tests (monotonic seconds).
    """

    def __init__(self, log: logging.Logger, interval: float = REPORT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}  # subject -> when last logged

    @property
    def subjects(self) -> list[str]:
        """The subjects whose problem has not cleared yet."""
        return list(self._last)

    def report(self, subject: str, message: str, *args: object,
               level: int = logging.ERROR) -> bool:
        """Log ``message % args`` unless ``subject`` was logged less than ``interval`` ago;
        True when it was logged."""
        now = self._clock()
        last = self._last.get(subject)
        if last is not None and now - last < self._interval:
            return False
        self._last[subject] = now
        self._log.log(level, message, *args)
        return True

    def clear(self, subject: str, message: str = "", *args: object) -> bool:
        """The problem of ``subject`` is gone: forget it, logging ``message`` (at INFO) if
        it had been reported. True when it had been."""
        if self._last.pop(subject, None) is None:
            return False
        if message:
            self._log.info(message, *args)
        return True

    def skip_refused(self, subject: str, doing: str, step: Callable[[], T]) -> T | None:
        """Run one item's Redis ``step``: a refusal (a key of the wrong type) is reported as
        ``doing: subject left as it is: why`` (once per interval) and gives None, so a
        loop over many items goes on; a success clears ``subject``."""
        try:
            result = step()
        except redis.ResponseError as exc:
            self.report(subject, "%s: %s left as it is: %s", doing, subject, describe(exc))
            return None
        self.clear(subject)
        return result

