"""A Redis outage as one process sees it: logged once when it starts, once when it ends.

Sidekiq's words: ``Redis unavailable: <error>`` then ``Redis is online, N sec
downtime``. The master, the processors and the scheduler each keep one
:class:`Outage` and report every Redis call's success or failure to it.

A refusal (Redis answered with an error: a key of the wrong type, ``OOM`` at
maxmemory, ``NOPERM``; :mod:`forkq.daemon.refusal`) is no outage: Redis is up, one step
is refused. It is logged as ``Redis refused <step>: <error>``, at most once a minute
for each distinct error, and neither starts nor ends an outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from forkq.daemon.refusal import Recurring, describe, is_refusal

T = TypeVar("T")


class Outage:
    """Tracks whether this process's Redis calls are failing, and since when (monotonic)."""

    def __init__(self, log: logging.Logger, consequence: str = "") -> None:
        self._log = log
        self._consequence = consequence
        self.since: float | None = None
        self._refusals = Recurring(log)

    def refused(self, exc: Exception, step: str = "a step") -> None:
        """Redis answered ``step`` with an error: log it (once a minute per error)."""
        text = describe(exc)
        self._refusals.report(text, "Redis refused %s: %s", step, text)

    def failed(self, exc: Exception, step: str = "a step") -> float:
        """A call failed: log it if it is the first; seconds the outage has lasted (0 for a
        refusal, which is reported as itself and starts no outage)."""
        if is_refusal(exc):
            self.refused(exc, step)
            return 0.0
        now = time.monotonic()
        if self.since is None:
            self.since = now
            self._log.error("Redis unavailable: %s%s", exc, self._consequence)
        return now - self.since

    def succeeded(self) -> bool:
        """A call succeeded: True (and the downtime logged) if that ends an outage."""
        if self.since is None:
            return False
        self._log.warning("Redis is online, %.1f sec downtime", time.monotonic() - self.since)
        self.since = None
        return True

    def guard(self, step: Callable[[], T], on_recovery: Callable[[], None] | None = None,
              name: str = "a step") -> T | None:
        """Run ``step``; None on a Redis error (reported to :meth:`failed`). When it ends an
        outage, ``on_recovery`` runs first (each caller's own reaction). A refusal neither
        starts nor ends an outage."""
        try:
            result = step()
        except redis.RedisError as exc:
            self.failed(exc, name)
            return None
        if self.succeeded() and on_recovery is not None:
            on_recovery()
        return result
