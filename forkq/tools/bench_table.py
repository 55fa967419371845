"""The table ``forkq bench`` prints: one row per figure, one column per configuration, the
median over the repetitions in each cell.

:class:`Results` collects every repetition's value of every figure under the column's
label; each column also names its side (``forkq``, or another system's in a comparison
run from a clone: ``bench/side_by_side.py``), and :func:`render` can add one column computed
from each row (that comparison's ratio).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Row:
    """One figure: its key in :class:`Results`, its label, digits after the point, and
    whether a higher value is better."""

    key: str
    label: str
    digits: int
    higher_is_better: bool


ROWS = (
    Row("drain", "drain jobs/s", 0, True),
    Row("per_cpu", "jobs per CPU-second (workers + redis)", 0, True),
    Row("cpu_workers", "CPU ms/job workers", 3, False),
    Row("cpu_server", "CPU ms/job redis-server", 3, False),
    Row("p50", "idle latency p50 ms", 2, False),
    Row("p99", "idle latency p99 ms", 2, False),
    Row("floor_p50", "floor beside p50 ms", 2, False),
    Row("over_floor", "p50 over floor ms", 2, False),
    Row("launch", "launch -> first job s", 2, False),
    Row("launch_floor", "launch floor s", 2, False),
    Row("pss", "PSS worker tree MB", 1, False),
)


@dataclass
class Results:
    """Every repetition's figures: column label → figure key → values."""

    columns: list[str] = field(default_factory=list)
    sides: dict[str, str] = field(default_factory=dict)  # column label → its system's name
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def add_column(self, label: str, side: str) -> None:
        """Declare a column (in display order)."""
        if label not in self.sides:
            self.columns.append(label)
            self.sides[label] = side
            self.values[label] = {}

    def record(self, label: str, key: str, value: float | None) -> None:
        """Add one repetition's ``value`` of figure ``key`` to column ``label``."""
        if value is not None:
            self.values[label].setdefault(key, []).append(value)

    def median(self, label: str, key: str) -> float | None:
        """The median of a cell, None when it has no value."""
        found = self.values[label].get(key)
        return statistics.median(found) if found else None


def cell(value: float | None, digits: int) -> str:
    """A number as the table shows it ("-" for none)."""
    return "-" if value is None else f"{value:,.{digits}f}"


def render(results: Results, *, header: str, rows: Sequence[Row] = ROWS,
           notes: Sequence[str] = (),
           extra: tuple[str, Callable[[Row], str]] | None = None) -> str:
    """The table as text: ``header``, the ``rows``, then ``notes``; ``extra`` is the heading
    of a last column and what it shows for each row."""
    headings = ["figure", *results.columns, *([extra[0]] if extra else [])]
    lines = []
    for row in rows:
        cells = [cell(results.median(label, row.key), row.digits) for label in results.columns]
        lines.append([row.label, *cells, *([extra[1](row)] if extra else [])])
    widths = [max(len(line[i]) for line in [headings, *lines]) for i in range(len(headings))]

    def fmt(line: list[str]) -> str:
        return "  ".join([line[0].ljust(widths[0]),
                          *(text.rjust(width) for text, width in zip(line[1:], widths[1:],
                                                                     strict=True))])
    return "\n".join([header, fmt(headings), *map(fmt, lines), *notes])
