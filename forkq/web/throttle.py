"""Failed logins per client address: :class:`Throttle`.

Policy: an address whose password checks failed :attr:`Throttle.limit` times (5) within
:attr:`Throttle.window` seconds (60) of its first counted failure is refused every further
password check (the login form, ``Authorization: Bearer`` or Basic) until that window ends:
the dashboard answers 429 with ``Retry-After``. A correct password neither counts nor clears
the count (knowing one password must not buy guesses at the other); a session cookie is no
password check and is never refused.

Memory is bounded: at most :attr:`Throttle.capacity` addresses are remembered; when the
table is full, addresses whose window has ended go first, then the oldest window. The clock
is injectable (``time.monotonic`` by default) so the policy is tested without waiting.
Thread-safe: the threaded server checks from many threads.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

LIMIT = 5
WINDOW = 60.0
CAPACITY = 10_000


def client_address(environ: Mapping[str, Any]) -> str:
    """The address a request came from: ``REMOTE_ADDR`` (behind a reverse proxy, the
    proxy's; a forwarded-for header is not trusted, anyone can send one)."""
    return str(environ.get("REMOTE_ADDR") or "")


class Throttle:
    """The failed-login counts of the addresses seen lately (see the module doc)."""

    def __init__(self, *, limit: int = LIMIT, window: float = WINDOW, capacity: int = CAPACITY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or window <= 0 or capacity < 1:
            raise ValueError("throttle: limit, window and capacity must be positive")
        self.limit, self.window, self.capacity = limit, window, capacity
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: OrderedDict[str, tuple[float, int]] = OrderedDict()  # oldest start first

    def retry_after(self, address: str) -> int:
        """Whole seconds until ``address`` may try a password again; 0 when it may now."""
        with self._lock:
            now = self._clock()
            found = self._current(address, now)
            if found is None or found[1] < self.limit:
                return 0
            return max(1, math.ceil(found[0] + self.window - now))

    def failed(self, address: str) -> None:
        """Count one failed password check from ``address``."""
        with self._lock:
            now = self._clock()
            found = self._current(address, now)
            if found is None:
                self._make_room(now)
                self._failures[address] = (now, 1)
            else:
                self._failures[address] = (found[0], found[1] + 1)

    def __len__(self) -> int:
        return len(self._failures)

    def _current(self, address: str, now: float) -> tuple[float, int] | None:
        """The address's (window start, failures) while its window lasts; an ended one is
        forgotten."""
        found = self._failures.get(address)
        if found is not None and now - found[0] >= self.window:
            del self._failures[address]
            return None
        return found

    def _make_room(self, now: float) -> None:
        """Forget ended windows (the oldest are first), then the oldest while full."""
        while self._failures:
            oldest, (start, _) = next(iter(self._failures.items()))
            if now - start < self.window and len(self._failures) < self.capacity:
                return
            del self._failures[oldest]
