"""Reading job metrics back for the dashboard: per class, per class's histogram, per queue.

Reads the Sidekiq 8.x layout that every forkq processor writes (:mod:`forkq.metrics.layout`),
so a cluster that also runs Sidekiq 8 processes shows their jobs too (Sidekiq 7 processes
write only the 7.x keys, which are not read here: forkq writes both, and reading both would
count its jobs twice). Times are UTC minutes, as Sidekiq's.

Bounded work: one pipelined round trip of at most :data:`MAX_MINUTES` commands per call,
whatever the number of jobs or queues. Hostile input: a key of the wrong type, a field or
value that does not parse, is skipped and logged (at most once a minute per key); the rest
is returned.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from forkq.connection import text
from forkq.metrics import layout
from forkq.metrics.report import skipped

log = logging.getLogger(__name__)

MAX_MINUTES = 480  # Sidekiq's own cap (its minute keys live 8 h)
_FETCH = [part for index in range(layout.BUCKETS) for part in ("GET", "u16", f"#{index}")]


@dataclass(frozen=True)
class ClassMetrics:
    """One job class over a window: runs (failures included), failures, time spent in
    successful runs and its average per successful run (Sidekiq's ``total_avg``)."""

    name: str
    executions: int
    failures: int
    total_seconds: float
    avg_ms: float


@dataclass(frozen=True)
class QueuePoint:
    """One queue sample: ``at`` the epoch second of its minute, the queue's size and its
    latency (seconds the oldest job had waited) then."""

    at: int
    size: int
    latency: float


def job_classes(client: redis.Redis, minutes: int, now: float | None = None, *,
                damaged: list[str] | None = None) -> list[ClassMetrics]:
    """Every job class that ran in the last ``minutes`` minutes (60 or 480; at most
    :data:`MAX_MINUTES`), the most time-consuming first. Here and below, a key Redis refuses
    to read (the wrong type) is logged, skipped and appended to ``damaged`` when given."""
    totals: dict[str, dict[str, int]] = defaultdict(lambda: {"p": 0, "f": 0, "ms": 0})
    for key, found in _pipelined(client, minutes, now, lambda t: ("HGETALL", layout.jobs8(t)),
                                  damaged):
        for field, value in (found or {}).items():
            klass, _, metric = text(field).rpartition("|")
            count = layout.counter(value)
            if not klass or metric not in ("p", "f", "ms") or count is None:
                skipped(log, f"key {key!r}", f"field {field!r} = {value!r} is not a metric")
                continue
            totals[klass][metric] += count
    rows = [_class_metrics(name, sums) for name, sums in totals.items()]
    return sorted(rows, key=lambda row: (-row.total_seconds, row.name))


def histogram(client: redis.Redis, klass: str, minutes: int, now: float | None = None, *,
              damaged: list[str] | None = None) -> list[tuple[str, int]]:
    """How many successful runs of ``klass`` in the last ``minutes`` minutes fell in each of
    Sidekiq's 26 duration buckets, shortest first: ``("<= 20 ms", n)`` … ``("> 335 s", n)``."""
    counts = [0] * layout.BUCKETS
    for key, found in _pipelined(client, minutes, now,
                                 lambda t: ("BITFIELD_RO", layout.histogram8(klass, t), *_FETCH),
                                 damaged):
        if found is None:
            continue
        if not isinstance(found, list) or len(found) != layout.BUCKETS:
            skipped(log, f"key {key!r}", "not a histogram")
            continue
        for index, value in enumerate(found):
            counts[index] += layout.counter(value) or 0
    return list(zip(bucket_labels(), counts, strict=True))


def queue_series(client: redis.Redis, queue: str, minutes: int, now: float | None = None, *,
                 damaged: list[str] | None = None) -> list[QueuePoint]:
    """The leader's once-a-minute samples of ``queue`` over the last ``minutes`` minutes,
    oldest first (a minute without a sample has no point)."""
    points = []
    for key, found in _pipelined(client, minutes, now,
                                 lambda t: ("HGET", layout.queue_samples(layout.minute_of(t)),
                                            queue), damaged):
        if found is None:
            continue
        point = _point(key, found)
        if point is None:
            skipped(log, f"key {key!r}", f"sample of {queue!r} is not [size, latency]")
            continue
        points.append(point)
    return sorted(points, key=lambda point: point.at)


def bucket_labels() -> list[str]:
    """The dashboard's names of Sidekiq's buckets: ``<= 20 ms`` … ``<= 335 s``, ``> 335 s``."""
    labels = [f"<= {edge} ms" if edge < 1000 else f"<= {edge / 1000:g} s"
              for edge in layout.EDGES_MS]
    return [*labels, f"> {layout.EDGES_MS[-1] / 1000:g} s"]


def _pipelined(client: redis.Redis, minutes: int, now: float | None,
               command: Callable[[float], tuple[str, ...]],
               damaged: list[str] | None = None) -> list[tuple[str, Any]]:
    """Run ``command(t)`` for each minute ``t`` of the window, newest first, in one round
    trip; (key, reply) pairs, with a refused command's reply logged and given as None."""
    start = time.time() if now is None else now
    count = max(1, min(int(minutes), MAX_MINUTES))
    commands = [command(start - 60 * index) for index in range(count)]
    pipe = client.pipeline(transaction=False)
    for args in commands:
        pipe.execute_command(*args)  # type: ignore[no-untyped-call]
    replies = pipe.execute(raise_on_error=False)
    out: list[tuple[str, Any]] = []
    for args, reply in zip(commands, replies, strict=True):
        key = args[1]
        if isinstance(reply, redis.ResponseError):
            skipped(log, f"key {key!r}", str(reply))
            if damaged is not None:
                damaged.append(key)
            reply = None
        out.append((key, reply))
    return out


def _class_metrics(name: str, sums: dict[str, int]) -> ClassMetrics:
    completed = sums["p"] - sums["f"]
    avg = sums["ms"] / completed if completed > 0 else 0.0
    return ClassMetrics(name, sums["p"], sums["f"], sums["ms"] / 1000.0, avg)


def _point(key: str, raw: Any) -> QueuePoint | None:
    minute = key[len(layout.QUEUE_SAMPLES_PREFIX):]
    try:
        size, latency = json.loads(raw)
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError):
        return None
    if (not minute.isdigit() or isinstance(size, bool) or not isinstance(size, int)
            or isinstance(latency, bool) or not isinstance(latency, (int, float))
            or not math.isfinite(latency)):
        return None
    return QueuePoint(int(minute), size, float(latency))
