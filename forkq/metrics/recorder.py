"""A processor child's job metrics: counted in memory per job, written with its heartbeat.

Contract: :meth:`Recorder.record` (any thread: the processor's, or each lane's) adds one run
to in-memory counters under a lock — no I/O, no Redis round trip per job. The heartbeat
thread :meth:`~Recorder.drain` s them every beat and queues the writes on the pipeline that
carries its beat (:func:`queue_writes`), so metrics cost no round trip of their own; after
the reply, :func:`check_replies` reports a refused write (a key of the wrong type, OOM) —
those counts are dropped, the beat and the other keys go on. A beat that does not reach
Redis (a connection error) gives its counts back (:meth:`Recorder.restore`) for the next one.

Written per beat (:mod:`forkq.metrics.layout` has the key names and Sidekiq's sources):

- Sidekiq 7 and 8's ``j|…`` hashes (7's minute, 8's minute and 8's 10-minute rollup):
  ``HINCRBY <class>|p`` (runs), ``|f`` (failures), ``|ms`` (ms of successful runs), then
  ``EXPIRE``, as Sidekiq's ``ExecutionTracker#flush``;
- Sidekiq 7 and 8's histograms of successful runs: ``BITFIELD … OVERFLOW SAT INCRBY u16 #i``
  and ``EXPIRE``, as Sidekiq's ``Histogram#persist``;
- forkq's all-time counters per (queue, class) in ``forkq:metrics:jobs``.

The class is the payload's ``wrapped`` when it is a string, else its ``class`` (Sidekiq's
``hash["wrapped"] || hash["class"]``). The counts of a child that is SIGKILLed are lost with
it (at most one beat, 2 s, of jobs), but for the run of the job the master killed it for (its
timeout, its cancellation), which the master counts as a failed run
(:mod:`forkq.daemon.master.dead_child`); a child that exits writes its last ones on the way
out.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

import redis

from forkq.metrics import layout
from forkq.metrics.report import skipped

log = logging.getLogger(__name__)


@dataclass
class Counts:
    """What one (queue, class) did since the last beat."""

    runs: int = 0
    failures: int = 0
    success_ms: int = 0  # Sidekiq's ``ms``: whole milliseconds of the successful runs
    micros: int = 0  # every run's time, failures included
    sidekiq_buckets: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    le_buckets: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    expired: int = 0  # jobs not run: their expires_at had passed (no run, no time)
    overrated: int = 0  # runs ended by a limiter's OverLimit, rescheduled (not failures)
    discarded: int = 0  # failed runs dropped by the job's rules (retry: false, discard_on)

    def add(self, other: Counts) -> None:
        self.runs += other.runs
        self.failures += other.failures
        self.success_ms += other.success_ms
        self.micros += other.micros
        self.expired += other.expired
        self.overrated += other.overrated
        self.discarded += other.discarded
        for index, count in other.sidekiq_buckets.items():
            self.sidekiq_buckets[index] += count
        for index, count in other.le_buckets.items():
            self.le_buckets[index] += count


Batch = dict[tuple[str, str], Counts]
"""(queue, class) → counts: what one beat writes."""


class Recorder:
    """The in-memory counters of one child; built in the child, after fork."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batch: Batch = {}

    def record(self, queue: str, klass: str, seconds: float, *, failed: bool) -> None:
        """Count one run of ``klass`` from ``queue`` that took ``seconds``: in Prometheus's
        bucket (``le``, every run: the index of the first of ``layout.EDGES_MS`` not below
        it) and, when it did not fail, in Sidekiq's (its whole milliseconds: the index of the
        first edge above them); ``len(EDGES_MS)`` past the last edge."""
        ms = int(seconds * 1000)
        with self._lock:
            counts = self._batch.get((queue, klass))
            if counts is None:
                counts = self._batch[(queue, klass)] = Counts()
            counts.runs += 1
            counts.micros += int(seconds * 1_000_000)
            counts.le_buckets[bisect.bisect_left(layout.EDGES_MS, seconds * 1000.0)] += 1
            if failed:
                counts.failures += 1
            else:
                counts.success_ms += ms
                counts.sidekiq_buckets[bisect.bisect_right(layout.EDGES_MS, ms)] += 1

    def note(self, queue: str, klass: str,
             what: Literal["expired", "overrated", "discarded"]) -> None:
        """Count one job of ``klass`` from ``queue`` that ``what``: not run because it had
        expired, rescheduled by a limiter's OverLimit (neither is a run), or dropped after a
        failed run (retry: false, discard_on, retry_in's "discard": its run is counted
        too)."""
        with self._lock:
            counts = self._batch.get((queue, klass))
            if counts is None:
                counts = self._batch[(queue, klass)] = Counts()
            setattr(counts, what, getattr(counts, what) + 1)

    def pending(self) -> bool:
        """Whether anything was counted since the last :meth:`drain` (read without the lock:
        a count that lands just after is written with the next beat)."""
        return bool(self._batch)

    def drain(self) -> Batch:
        """Take everything counted so far (the heartbeat writes it)."""
        with self._lock:
            batch, self._batch = self._batch, {}
        return batch

    def restore(self, batch: Batch) -> None:
        """Give back a batch that did not reach Redis, to go with the next beat."""
        with self._lock:
            for series, counts in batch.items():
                self._batch.setdefault(series, Counts()).add(counts)


def job_class(payload: dict[str, Any]) -> str:
    """The class name metrics are kept under: ``wrapped`` if a string, else ``class``."""
    wrapped = payload.get("wrapped")
    return wrapped if isinstance(wrapped, str) and wrapped else str(payload.get("class", ""))


Touched = list[tuple[str, str]]
"""(kind of key, key) of each command queued, in order: what :func:`check_replies` reports."""


def queue_writes(pipe: Any, batch: Batch, now: float) -> Touched:
    """Queue on ``pipe`` the writes of ``batch`` at epoch ``now``; what each command touches."""
    touched: Touched = []

    def send(kind: str, key: str, *args: Any) -> None:
        pipe.execute_command(*args[:1], key, *args[1:])
        touched.append((kind, key))

    per_class = _per_class(batch)
    for kind, key, ttl in (("Sidekiq 7 j|", layout.jobs7(now), layout.SHORT_TERM),
                           ("Sidekiq 8 j|", layout.jobs8(now), layout.SHORT_TERM),
                           ("Sidekiq 8 j| 10-minute", layout.jobs8_ten(now), layout.MID_TERM)):
        for klass, counts in per_class.items():
            for metric, value in _sidekiq_fields(counts):
                send(kind, key, "HINCRBY", f"{klass}|{metric}", value)
        send(kind, key, "EXPIRE", ttl)
    for klass, counts in per_class.items():
        if counts.sidekiq_buckets:
            for kind, key in (("Sidekiq 7 histogram", layout.histogram7(klass, now)),
                              ("Sidekiq 8 histogram", layout.histogram8(klass, now))):
                send(kind, key, "BITFIELD", *_bitfield_incr(counts.sidekiq_buckets))
                send(kind, key, "EXPIRE", layout.SHORT_TERM)
    for (queue, klass), counts in batch.items():
        for metric, value in _forkq_fields(counts):
            send(layout.JOBS, layout.JOBS, "HINCRBY", layout.series_field(queue, klass, metric),
                 value)
    return touched


def check_replies(touched: Touched, replies: list[Any]) -> None:
    """Report each refused write, at most once a minute per kind of key (a key of the wrong
    type, an ACL that does not grant it, OOM); its counts are dropped, the others stand."""
    for (kind, key), reply in zip(touched, replies, strict=False):
        if isinstance(reply, redis.ResponseError):
            skipped(log, kind, f"job metrics not written to {key!r}: {reply}")


def _per_class(batch: Batch) -> dict[str, Counts]:
    """Sidekiq's metrics are per class, whatever the queue."""
    merged: dict[str, Counts] = {}
    for (_, klass), counts in batch.items():
        merged.setdefault(klass, Counts()).add(counts)
    return merged


def _sidekiq_fields(counts: Counts) -> list[tuple[str, int]]:
    fields = [("p", counts.runs)]
    if counts.failures:
        fields.append(("f", counts.failures))
    if counts.runs > counts.failures:
        fields.append(("ms", counts.success_ms))
    return fields


def _forkq_fields(counts: Counts) -> list[tuple[str, int]]:
    fields = [("p", counts.runs), ("us", counts.micros)]
    if counts.expired:
        fields.append(("x", counts.expired))
    if counts.overrated:
        fields.append(("o", counts.overrated))
    if counts.discarded:
        fields.append(("d", counts.discarded))
    if counts.failures:
        fields.append(("f", counts.failures))
    fields.extend((f"b{index}", count) for index, count in sorted(counts.le_buckets.items()))
    return fields


def _bitfield_incr(buckets: dict[int, int]) -> list[Any]:
    args: list[Any] = ["OVERFLOW", "SAT"]
    for index, count in sorted(buckets.items()):
        args += ["INCRBY", "u16", f"#{index}", count]
    return args
