"""Server-drawn charts for the pages (SVG coordinates; no script needed). Pure; no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LineChart:
    """A polyline's ``points`` attribute in a ``width`` x ``height`` box, and the scale drawn."""

    points: str
    width: int
    height: int
    top: float
    start: float
    end: float


def line(samples: Sequence[tuple[float, float]], *, width: int = 600, height: int = 120
         ) -> LineChart:
    """``(x, y)`` samples (x ascending) scaled into the box: x across, y up from the bottom
    (0 at the bottom, the largest y, at least 1, at the top)."""
    if not samples:
        return LineChart("", width, height, 1.0, 0.0, 0.0)
    start, end = samples[0][0], samples[-1][0]
    span = (end - start) or 1.0
    top = max(1.0, *(y for _, y in samples))
    coords = []
    for x, y in samples:
        px = width * ((x - start) / span if len(samples) > 1 else 1.0)
        py = height - height * max(0.0, y) / top
        coords.append(f"{px:.1f},{py:.1f}")
    return LineChart(" ".join(coords), width, height, top, start, end)


def bar_widths(counts: Sequence[int], full: float = 100.0) -> list[float]:
    """Each count as a bar length, the largest ``full`` long (all 0 when every count is 0)."""
    peak = max(counts, default=0)
    return [round(full * count / peak, 1) if peak else 0.0 for count in counts]
