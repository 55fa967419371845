"""Reporting a metrics key that cannot be read or written (the wrong type, a value that does
not parse): logged, at most once a minute per key, and skipped; never raised.

The one piece of module state: when each key was last reported (bounded to
:data:`MAX_SUBJECTS` keys), so a reader called per request does not log per request.
"""

from __future__ import annotations

import logging
import threading
import time

INTERVAL = 60.0
MAX_SUBJECTS = 1000

_last: dict[str, float] = {}
_lock = threading.Lock()


def skipped(log: logging.Logger, key: str, why: str) -> None:
    """Log that ``key`` was skipped and why, unless it was logged less than a minute ago."""
    now = time.monotonic()
    with _lock:
        last = _last.get(key)
        if last is not None and now - last < INTERVAL:
            return
        if len(_last) >= MAX_SUBJECTS:
            _last.clear()
        _last[key] = now
    log.warning("metrics: skipped key %r: %s", key, why)
