"""Where job metrics live in Redis: Sidekiq 7.x's and 8.x's metrics keys, and forkq's own.

Pure functions of a time (UTC) and a name; no I/O. The table of keys is in
:mod:`forkq.keys`; this module builds their names.

**Sidekiq's execution metrics** (what its Web UI's Metrics tab reads), written by every
forkq processor with its heartbeat, for both versions, since they differ:

============  =========================================  ======  ========================
version       key                                        type    TTL
============  =========================================  ======  ========================
7.0 - 7.3     ``j|%Y%m%d|%-H:%-M`` (``j|20261125|8:3``)   hash    8 h
8.x minute    ``j|%y%m%d|%-H:%M`` (``j|261125|8:03``)     hash    8 h
8.x 10 min    ``j|%y%m%d|%-H:%M`` minus its last digit    hash    3 days
              (``j|261125|8:0`` for 08:00-08:09)
7.0 - 7.3     ``<class>-%d-%H:%-M`` (``Hard-05-08:3``)    string  8 h (BITFIELD u16 x 26)
8.x           ``h|<class>-%-d-%-H:%-M`` (``h|Hard-5-8:3``) string  8 h (BITFIELD u16 x 26)
============  =========================================  ======  ========================

A ``j|…`` hash holds ``<class>|p`` (executions, failures included), ``<class>|f``
(failures) and ``<class>|ms`` (milliseconds spent in jobs that succeeded). A histogram
string holds 26 saturating unsigned 16-bit counters, counter *i* counting the successful
runs of fewer than :data:`EDGES_MS` [i] milliseconds (and not fewer than the edge before).
Sources: sidekiq/sidekiq ``lib/sidekiq/metrics/tracking.rb`` (``flush``), ``shared.rb``
(``Histogram#persist`` / ``#fetch``) and ``query.rb`` (``top_jobs`` / ``for_job``), at tags
v7.3.10 and v8.1.7 (7.0.0 writes as 7.3.10).

**forkq's own** (``forkq:metrics:*``), what the Prometheus exposition and the dashboard read:

- ``forkq:metrics:jobs`` — hash, no TTL — all-time counters per (queue, class); field =
  JSON ``[queue, class, metric]``, metric ``p`` (executions), ``f`` (failures), ``us``
  (microseconds spent, failures included), ``b<i>`` (runs in runtime bucket *i*, Prometheus
  ``le`` semantics on :data:`EDGES_MS`, ``b25`` above the last edge).
- ``forkq:metrics:queues:<epoch minute>`` — hash, 8 h — one sample per queue per minute,
  taken by the scheduler leader: queue name → JSON ``[size, latency seconds]``.
"""

from __future__ import annotations

import json
import time
from typing import Any

EDGES_MS: tuple[int, ...] = (
    20, 30, 45, 65, 100, 150, 225, 335, 500, 750, 1100, 1700, 2500, 3800, 5750,
    8500, 13000, 20000, 30000, 45000, 65000, 100000, 150000, 225000, 335000,
)
"""Sidekiq's histogram bucket edges in milliseconds (``Histogram::BUCKET_INTERVALS`` without
its last, ``1e20``); there are ``len(EDGES_MS) + 1`` = 26 buckets, the last unbounded."""
BUCKETS = len(EDGES_MS) + 1

SHORT_TERM = 8 * 3600  # Sidekiq's SHORT_TERM and HISTOGRAM_TTL
MID_TERM = 3 * 24 * 3600  # Sidekiq 8's MID_TERM (the 10-minute rollups)
QUEUE_SAMPLES_TTL = 8 * 3600

JOBS = "forkq:metrics:jobs"
QUEUE_SAMPLES_PREFIX = "forkq:metrics:queues:"


def _utc(now: float) -> time.struct_time:
    return time.gmtime(now)


def minute_of(now: float) -> int:
    """The epoch second at the start of ``now``'s minute."""
    return int(now // 60) * 60


def jobs7(now: float) -> str:
    """Sidekiq 7's per-minute ``j|`` hash: ``j|20261125|8:3``."""
    t = _utc(now)
    return f"j|{t.tm_year:04d}{t.tm_mon:02d}{t.tm_mday:02d}|{t.tm_hour}:{t.tm_min}"


def jobs8(now: float) -> str:
    """Sidekiq 8's per-minute ``j|`` hash: ``j|261125|8:03``."""
    t = _utc(now)
    return f"j|{t.tm_year % 100:02d}{t.tm_mon:02d}{t.tm_mday:02d}|{t.tm_hour}:{t.tm_min:02d}"


def jobs8_ten(now: float) -> str:
    """Sidekiq 8's 10-minute ``j|`` rollup: ``j|261125|8:0`` for 08:00 to 08:09."""
    return jobs8(now)[:-1]


def histogram7(klass: str, now: float) -> str:
    """Sidekiq 7's per-minute histogram of one class: ``<class>-05-08:3``."""
    t = _utc(now)
    return f"{klass}-{t.tm_mday:02d}-{t.tm_hour:02d}:{t.tm_min}"


def histogram8(klass: str, now: float) -> str:
    """Sidekiq 8's per-minute histogram of one class: ``h|<class>-5-8:3``."""
    t = _utc(now)
    return f"h|{klass}-{t.tm_mday}-{t.tm_hour}:{t.tm_min}"


def series_field(queue: str, klass: str, metric: str) -> str:
    """A field of :data:`JOBS`: JSON ``[queue, class, metric]`` (any name, no separator to
    escape)."""
    return json.dumps([queue, klass, metric], ensure_ascii=False, separators=(",", ":"))


def parse_series_field(field: bytes | str) -> tuple[str, str, str] | None:
    """Inverse of :func:`series_field`; None for a field of another shape."""
    try:
        value = json.loads(field)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if (isinstance(value, list) and len(value) == 3
            and all(isinstance(part, str) for part in value)):
        return value[0], value[1], value[2]
    return None


def queue_samples(minute: int) -> str:
    """The hash of the queue samples taken in the minute starting at epoch ``minute``."""
    return f"{QUEUE_SAMPLES_PREFIX}{minute}"


def counter(value: Any) -> int | None:
    """A stored count (a reply's bytes or a number) as an int; None when it holds none."""
    try:
        return int(value)
    except (ValueError, TypeError):
        return None
