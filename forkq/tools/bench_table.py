"""The table ``forkq bench`` prints: one row per figure, one column per configuration, the
median over the repetitions in each cell, and forkq / Sidekiq.

:class:`Results` collects every repetition's value of every figure under the column's
label. The ratio of a row is forkq's best column over Sidekiq's best column, "best" being
the highest for rates and the lowest for costs and delays (:data:`ROWS`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
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
    Row("cpu_workers", "CPU ms/job workers", 3, False),
    Row("cpu_server", "CPU ms/job redis-server", 3, False),
    Row("p50", "idle latency p50 ms", 2, False),
    Row("p99", "idle latency p99 ms", 2, False),
    Row("floor_p50", "floor beside p50 ms", 2, False),
    Row("over_floor", "p50 over floor ms", 2, False),
    Row("launch", "launch -> first job s", 2, False),
    Row("launch_floor", "launch floor s", 2, False),
    Row("pss", "PSS worker tree MB", 1, False),
    Row("enqueue_one", "enqueue one-by-one jobs/s", 0, True),
    Row("enqueue_bulk", "enqueue bulk jobs/s", 0, True),
)


@dataclass
class Results:
    """Every repetition's figures: column label → figure key → values."""

    columns: list[str] = field(default_factory=list)
    sides: dict[str, str] = field(default_factory=dict)  # column label → "forkq" / "sidekiq"
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


def ratio(results: Results, row: Row) -> float | None:
    """forkq's best column over Sidekiq's best column; None without both, or when
    Sidekiq's best is not above zero."""
    best = max if row.higher_is_better else min
    sides: dict[str, list[float]] = {"forkq": [], "sidekiq": []}
    for label in results.columns:
        value = results.median(label, row.key)
        if value is not None:
            sides[results.sides[label]].append(value)
    if not sides["forkq"] or not sides["sidekiq"] or best(sides["sidekiq"]) <= 0:
        return None  # (a delay over the floor can be 0 or less)
    return best(sides["forkq"]) / best(sides["sidekiq"])


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render(results: Results, *, header: str, notes: Sequence[str] = ()) -> str:
    """The table as text: ``header``, the rows, then ``notes``."""
    with_ratio = {"forkq", "sidekiq"} <= set(results.sides.values())
    headings = ["figure", *results.columns, *(["forkq/sidekiq"] if with_ratio else [])]
    lines = []
    for row in ROWS:
        cells = [_cell(results.median(label, row.key), row.digits) for label in results.columns]
        if with_ratio:
            value = ratio(results, row)
            cells.append("-" if value is None else f"{value:.2f}")
        lines.append([row.label, *cells])
    widths = [max(len(line[i]) for line in [headings, *lines]) for i in range(len(headings))]

    def fmt(line: list[str]) -> str:
        return "  ".join([line[0].ljust(widths[0]),
                          *(cell.rjust(width) for cell, width in zip(line[1:], widths[1:],
                                                                     strict=True))])
    return "\n".join([header, fmt(headings), *map(fmt, lines), *notes])
