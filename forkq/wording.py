"""How forkq words quantities for people, the same in the log, the CLI and the dashboard: a
count with its noun (:func:`counted`) and a duration (:func:`duration`). Pure; no I/O."""

from __future__ import annotations

import math
from typing import Any


def counted(count: int, noun: str, plural: str = "") -> str:
    """``1 job``, ``2 jobs``, ``0 jobs``; ``plural`` for a noun that does not just take an
    "s" (``counted(n, "process", "processes")``)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def duration(seconds: Any) -> str:
    """Seconds → ``0.4 ms`` / ``<0.1 ms`` / ``3.2 ms`` / ``850 ms`` / ``12.3 s`` / ``4m 05s`` /
    ``2h 03m`` / ``3d 04h``; "" for what is no finite number. Under 10 ms one decimal is
    kept, so a sub-millisecond job does not read "0 ms"; only a true 0 does."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(
            seconds):
        return ""
    seconds = max(float(seconds), 0.0)
    milliseconds = seconds * 1000
    if milliseconds == 0:
        return "0 ms"
    if milliseconds < 0.05:
        return "<0.1 ms"
    if milliseconds < 9.95:
        return f"{milliseconds:.1f} ms"
    if milliseconds < 999.5:
        return f"{milliseconds:.0f} ms"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"
