"""Plain-text tables and figures for the operator's CLI. Pure functions, no I/O.

A cell shows its control characters escaped (:mod:`forkq.printable`): a queue name or a jid
read from Redis cannot break a row or send a terminal escape sequence."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from forkq.printable import printable
from forkq.wording import duration


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns two spaces apart, headers first; "(none)" under them when empty."""
    cells = [[str(h) for h in headers],
             *[["" if c is None else printable(str(c)) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    if not rows:
        lines.append("(none)")
    return "\n".join(lines)


def moment(epoch: float | None, now: float) -> str:
    """An epoch as local time with how far from ``now``: ``2026-11-21 10:04:05 (in 5m00s)``."""
    if epoch is None:
        return "-"
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
    except (OverflowError, ValueError, OSError):  # beyond what the C library can show
        return repr(epoch)
    delta = epoch - now
    relative = f"in {duration(delta)}" if delta > 0 else f"{duration(-delta)} ago"
    return f"{stamp} ({relative})"


def short(value: Any, limit: int = 60) -> str:
    """A value on one line, cut to ``limit`` characters."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def yes(flag: bool) -> str:
    return "yes" if flag else "no"
