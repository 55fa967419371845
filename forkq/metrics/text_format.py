"""Prometheus text exposition (format 0.0.4) written directly, for large scrapes.

Contract: :func:`render` of :class:`Family` objects gives byte for byte what
``prometheus_client.generate_latest`` gives for the same families (checked by
``tests/test_metrics.py``), about ten times faster: a label set is escaped once per
series and reused for every line of it, where the library builds a ``Sample`` and
escapes every label of every line. At 1,000 (queue, class) series a scrape holds some
33,000 lines; through the library that took ~250 ms, over the dashboard's 100 ms.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

KINDS = frozenset({"counter", "gauge", "histogram"})


def number(value: float) -> str:
    """A sample value as Go (and the library) writes it: ``+Inf``, ``NaN``, ``12.0``,
    ``1.234567e+06`` (Go switches to an exponent sooner than Python's ``repr``)."""
    d = float(value)
    if math.isinf(d):
        return "+Inf" if d > 0 else "-Inf"
    if math.isnan(d):
        return "NaN"
    text = repr(d)
    dot = text.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def escape(value: str) -> str:
    """A label value as the text format quotes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def labels(**pairs: str) -> str:
    """``{name="value",…}`` in name order (as the library sorts them), or ``""``."""
    if not pairs:
        return ""
    inner = ",".join(f'{name}="{escape(value)}"' for name, value in sorted(pairs.items()))
    return "{" + inner + "}"


@dataclass
class Family:
    """One metric family: its exposed name (a counter's ends in ``_total``), type, help
    and sample lines in the order added."""

    name: str
    kind: str
    help: str
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown metric type {self.kind!r}")

    def add(self, value: float, label_text: str = "", suffix: str = "") -> None:
        """One sample: ``<name><suffix><label_text> <value>``."""
        self.lines.append(f"{self.name}{suffix}{label_text} {number(value)}\n")

    def add_histogram(self, series: dict[str, str], buckets: list[tuple[str, float]],
                      total: float) -> None:
        """A histogram's cumulative ``buckets`` (``le`` text, count; ``+Inf`` last), then
        its ``_count`` and ``_sum``, labelled ``series`` (which holds no ``le``)."""
        pairs = [f'{name}="{escape(value)}"' for name, value in sorted(series.items())]
        before = "".join(f"{pair}," for name, pair in zip(sorted(series), pairs, strict=True)
                         if name < "le")
        after = "".join(f",{pair}" for name, pair in zip(sorted(series), pairs, strict=True)
                        if name > "le")
        prefix = f"{self.name}_bucket{{{before}le=\""
        for edge, count in buckets:  # one f-string per line: the scrape's hot loop
            self.lines.append(f'{prefix}{edge}"{after}}} {number(count)}\n')
        plain = "{" + ",".join(pairs) + "}" if pairs else ""
        self.add(buckets[-1][1], plain, "_count")
        self.add(total, plain, "_sum")


def render(families: Iterable[Family]) -> bytes:
    """The exposition text of ``families``."""
    out: list[str] = []
    for family in families:
        doc = family.help.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {family.name} {doc}\n# TYPE {family.name} {family.kind}\n")
        out.extend(family.lines)
    return "".join(out).encode("utf-8")
