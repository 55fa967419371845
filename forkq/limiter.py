"""Rate and concurrency limiters shared by every process on the Redis, inside jobs and out.

::

    stripe = forkq.limiter.window("stripe", 50, 1.0)   # 50 per sliding second
    with stripe:
        charge(card)

Four kinds, each a context manager (``with limit:``) built once and used many times,
from any thread:

- :func:`window` ``(name, count, seconds)``: at most ``count`` entries in any sliding
  window of ``seconds``;
- :func:`bucket` ``(name, count, per)``: at most ``count`` entries per calendar
  ``"second"``, ``"minute"``, ``"hour"`` or ``"day"`` (UTC);
- :func:`leaky` ``(name, size, seconds)``: a leaky bucket of ``size`` drops that drains in
  ``seconds``: bursts up to ``size``, then ``size / seconds`` per second;
- :func:`concurrent` ``(name, count, lock_timeout=...)``: at most ``count`` holders at once;
  a slot is freed when its block ends, when the master reaps a forkq processor that died
  holding it (:func:`release_held`), or after ``lock_timeout`` seconds at the latest.

Entering waits up to ``wait_timeout`` seconds for room (default :data:`WAIT_TIMEOUT`), on
the server's clock, sleeping until room is likely (a concurrent limiter looks again at
least every 0.1 s), then raises :class:`~forkq.errors.OverLimit`. Inside a job, an
``OverLimit`` that escapes the job reschedules it (Sidekiq Enterprise's backoff, counted in
the payload's ``overrated``; :mod:`forkq.daemon.children.failures`) instead of failing it,
up to :data:`MAX_OVERRATED` times; outside a job it is the caller's to handle. An entry of
``window``, ``bucket`` or ``leaky`` is spent when it is admitted: leaving the block gives
nothing back.

Keys: ``forkq:limiter:<kind>:<name>`` (a bucket's: ``…:<period index>``) and, for a
processor holding concurrent slots, ``forkq:limiter:held:<identity>:<pid>``; every key
expires by itself. Each try is one round trip (``limiter.lua``).
"""

from __future__ import annotations

import secrets
import threading
import time
from types import TracebackType

import redis

from forkq import client as clients
from forkq.errors import OverLimit
from forkq.scripts import script

WAIT_TIMEOUT = 5.0
"""Seconds a limiter waits for room by default before raising OverLimit."""

MAX_OVERRATED = 20
"""Times an over-limit job is rescheduled before its OverLimit counts as a failure."""

PERIODS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}

PREFIX = "forkq:limiter:"
HELD_PREFIX = "forkq:limiter:held:"

_holder = ""
"""This process's holder name (``<identity>:<pid>``) when it is a forkq processor: the
concurrent slots it takes are listed under it for its master to free if it dies."""


def set_holder(holder: str) -> None:
    """Name this process as a holder of concurrent slots (a processor child, at its start)."""
    global _holder
    _holder = holder


def held_key(holder: str) -> str:
    """The set of the concurrent slots ``holder`` holds."""
    return HELD_PREFIX + holder


def release_held(client: redis.Redis, holder: str) -> int:
    """Free the concurrent slots a dead process held (its master, at the reap); how many."""
    return int(script(client, "release_held")(keys=[held_key(holder)]))


class Limiter:
    """One limiter (build it with :func:`window`, :func:`bucket`, :func:`leaky` or
    :func:`concurrent`); ``with limiter:`` enters it."""

    def __init__(self, kind: str, name: str, count: float, seconds: float, *,
                 wait_timeout: float, client: clients.Client | None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a limiter's name must be a non-empty string, got {name!r}")
        for label, value, least in (("count", count, 0), ("seconds", seconds, 0),
                                    ("wait_timeout", wait_timeout, -1)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    least < value < float("inf")):
                kind_of = "positive" if least == 0 else "non-negative"
                raise ValueError(f"limiter {name!r}: {label} must be a {kind_of} number, "
                                 f"got {value!r}")
        self.kind, self.name = kind, name
        self.count, self.seconds, self.wait_timeout = count, seconds, wait_timeout
        self.key = f"{PREFIX}{kind}:{name}"
        self._client = client
        self._held = threading.local()  # per thread: the tokens of the slots it holds

    def __repr__(self) -> str:
        return f"<forkq.limiter.{self.kind} {self.name!r} {self.count:g}/{self.seconds:g}s>"

    def __enter__(self) -> Limiter:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()

    def acquire(self) -> None:
        """Wait up to ``wait_timeout`` for room; OverLimit when none came. In a testing
        mode (:mod:`forkq.testing`) a limiter built without a client asks the mode instead
        of Redis, which answers at once."""
        diversion = clients.diverted() if self._client is None else None
        if diversion is not None:
            if not diversion.enter_limiter(self.name):
                raise self._over()
            self._held.admitted_at = time.time()
            return
        deadline = time.monotonic() + self.wait_timeout
        token = secrets.token_hex(8)
        while True:
            wait_ms, now_ms = self._try(self.kind, token)
            if wait_ms == 0:
                self._held.admitted_at = now_ms / 1000
                if self.kind == "concurrent":
                    self._tokens().append(token)
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._over()
            time.sleep(min(wait_ms / 1000, left))

    def _over(self) -> OverLimit:
        return OverLimit(f"limiter {self.name!r} ({self.kind}, {self.count:g} per "
                         f"{self.seconds:g} s) had no room within {self.wait_timeout:g} s",
                         limiter=self.name)

    def release(self) -> None:
        """Free the slot this thread took (a concurrent limiter; the others keep nothing)."""
        tokens = self._tokens()
        if self.kind == "concurrent" and tokens:
            self._try("release", tokens.pop())

    @property
    def admitted_at(self) -> float | None:
        """When this thread's last entry was admitted, in epoch seconds by the server's
        clock (the one every limit is kept by); None before its first."""
        return getattr(self._held, "admitted_at", None)

    def _tokens(self) -> list[str]:
        tokens: list[str] | None = getattr(self._held, "tokens", None)
        if tokens is None:
            tokens = self._held.tokens = []
        return tokens

    def _try(self, kind: str, token: str) -> tuple[int, int]:
        """One try (limiter.lua): milliseconds to wait (0: admitted), the server's time."""
        redis_client = (self._client or clients.default()).redis
        holders = held_key(_holder) if _holder and self.kind == "concurrent" else ""
        wait_ms, now_ms = script(redis_client, "limiter")(
            keys=[self.key, holders], args=[kind, self.count, self.seconds, token])
        return int(wait_ms), int(now_ms)


def window(name: str, count: int, seconds: float, *, wait_timeout: float = WAIT_TIMEOUT,
           client: clients.Client | None = None) -> Limiter:
    """At most ``count`` entries in any sliding window of ``seconds``."""
    return Limiter("window", name, count, seconds, wait_timeout=wait_timeout, client=client)


def bucket(name: str, count: int, per: str, *, wait_timeout: float = WAIT_TIMEOUT,
           client: clients.Client | None = None) -> Limiter:
    """At most ``count`` entries per calendar ``per``: "second", "minute", "hour", "day"."""
    if per not in PERIODS:
        raise ValueError(f"limiter {name!r}: per must be one of {', '.join(PERIODS)}, "
                         f"got {per!r}")
    return Limiter("bucket", name, count, PERIODS[per], wait_timeout=wait_timeout,
                   client=client)


def leaky(name: str, size: int, seconds: float, *, wait_timeout: float = WAIT_TIMEOUT,
          client: clients.Client | None = None) -> Limiter:
    """A leaky bucket of ``size`` drops that drains in ``seconds``."""
    return Limiter("leaky", name, size, seconds, wait_timeout=wait_timeout, client=client)


def concurrent(name: str, count: int, *, lock_timeout: float = 30.0,
               wait_timeout: float = WAIT_TIMEOUT,
               client: clients.Client | None = None) -> Limiter:
    """At most ``count`` holders at once; a slot lasts ``lock_timeout`` seconds at most."""
    return Limiter("concurrent", name, count, lock_timeout, wait_timeout=wait_timeout,
                   client=client)

