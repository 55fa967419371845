"""The Prometheus exposition of the whole cluster, read from Redis (``GET /metrics`` of
``forkq web``): one scrape target sees every daemon that shares the Redis.

Series (docs/metrics.md, "Prometheus", lists them too):

- ``forkq_jobs_processed_total{queue,job_class}`` counter — job runs (failures included),
  ``forkq_jobs_failed_total{queue,job_class}`` counter — failed runs, and
  ``forkq_job_runtime_seconds{queue,job_class}`` histogram — every run's duration, on
  Sidekiq's bucket edges (20 ms … 335 s), and ``forkq_jobs_expired_total{queue,job_class}``
  counter — jobs not run because their ``expires_at`` had passed, and
  ``forkq_jobs_overrated_total{queue,job_class}`` counter — runs a limiter's ``OverLimit``
  ended, rescheduled, and ``forkq_jobs_discarded_total{queue,job_class}`` counter — failed
  runs dropped by the job's rules (``retry: false``, ``discard_on``): from
  ``forkq:metrics:jobs``, all time;
- ``forkq_jobs_blocked{job_class}`` gauge — jobs waiting in concurrency limits' waiting
  lines (those listed in ``forkq:lines``), now;
- ``forkq_batches_total{event}`` counter — batches created (``event="created"``) and the
  batch events fired (``complete``, ``success``, ``death``; :mod:`forkq.batches`), from
  ``forkq:stat:batches``, all time; ``forkq_batches_open`` gauge — batches not yet
  succeeded (created - success, never below 0; one that never succeeds stays
  counted);
- ``forkq_processed_total`` / ``forkq_failed_total`` counters — Sidekiq's ``stat:processed``
  / ``stat:failed`` (every Sidekiq-compatible process, Ruby too);
- ``forkq_queue_size{queue}``, ``forkq_queue_latency_seconds{queue}``,
  ``forkq_queue_paused{queue}`` gauges — now, for each queue in ``queues``;
- ``forkq_scheduled_jobs``, ``forkq_retry_jobs``, ``forkq_dead_jobs`` gauges — set sizes;
- ``forkq_processes``, ``forkq_processors``, ``forkq_processors_busy`` gauges — live
  daemons, their concurrency and busy processors, and per daemon
  ``forkq_process_concurrency`` / ``forkq_process_busy`` / ``forkq_process_leader``
  ``{identity,hostname,tag}``; ``forkq_leader`` — 1 when a scheduler leader holds office;
- ``forkq_metrics_skipped_keys`` gauge — keys this scrape skipped (the wrong type).

Bounded work: four pipelined round trips, whatever the keyspace: the registered sets
(``queues``, ``processes``, ``forkq:paused``, ``forkq:lines``), ``forkq:metrics:jobs`` and
``forkq:stat:batches``, then each listed queue (``LLEN``, ``LINDEX -1``; at most
:data:`~forkq.metrics.sampler.MAX_QUEUES`), each listed process (``HMGET``) and each listed
waiting line (``LLEN``, ``LINDEX 0`` for its jobs' class; at most :data:`MAX_LINES`).
Never ``KEYS`` or ``SCAN``. A key of the wrong type is skipped, counted and logged; the
rest is exposed.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client import CONTENT_TYPE_LATEST

from forkq import concurrency, keys
from forkq import payload as payloads
from forkq.connection import text
from forkq.errors import MalformedJobError
from forkq.metrics import layout, sampler, text_format
from forkq.metrics.recorder import job_class
from forkq.metrics.report import skipped
from forkq.metrics.text_format import Family
from forkq.ops.processes import FIELDS, Process

log = logging.getLogger(__name__)

CONTENT_TYPE: str = CONTENT_TYPE_LATEST
# the ``le`` of each bucket as the text format writes it: Sidekiq's edges in seconds, +Inf
_EDGES = [f"{ms / 1000:g}" for ms in layout.EDGES_MS] + ["+Inf"] * (
    layout.BUCKETS - len(layout.EDGES_MS))


MAX_LINES = 1000
"""The most waiting lines one scrape reads."""

BATCH_EVENTS = ("created", "complete", "success", "death")
"""The counters of ``forkq:stat:batches``, each a ``forkq_batches_total{event}`` series."""


def exposition(client: redis.Redis) -> bytes:
    """The text exposition (``CONTENT_TYPE``) of the cluster behind ``client``, read now."""
    return text_format.render(families(read(client, time.time())))


def families(snap: Snapshot) -> Iterator[Family]:
    """Every series of one scrape, in exposition order."""
    yield from _job_series(snap)
    yield from _batch_series(snap)
    yield from _queue_series(snap)
    yield from _process_series(snap)
    yield from _totals(snap)


@dataclass
class Snapshot:
    """What one scrape read."""

    jobs: dict[tuple[str, str], dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    queues: dict[str, tuple[int, float]] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    processes: list[Process] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    leader: bool = False
    skipped: int = 0
    blocked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    batches: dict[str, int] = field(default_factory=dict)


def read(client: redis.Redis, now: float) -> Snapshot:
    """One scrape's reads, in four round trips."""
    snap = Snapshot()
    first: Any = client.pipeline(transaction=False)
    first.smembers(keys.QUEUES)
    first.smembers(keys.PROCESSES)
    first.smembers(keys.PAUSED)
    first.hgetall(layout.JOBS)
    for name in (keys.STAT_PROCESSED, keys.STAT_FAILED):
        first.get(name)
    for name in (keys.SCHEDULE, keys.RETRY, keys.DEAD):
        first.zcard(name)
    first.exists(keys.LEADER)
    first.smembers(concurrency.LINES)
    first.hgetall(keys.BATCH_STATS)
    names = (keys.QUEUES, keys.PROCESSES, keys.PAUSED, layout.JOBS, keys.STAT_PROCESSED,
             keys.STAT_FAILED, keys.SCHEDULE, keys.RETRY, keys.DEAD, keys.LEADER,
             concurrency.LINES, keys.BATCH_STATS)
    replies = [_checked(snap, name, reply)
               for name, reply in zip(names, first.execute(raise_on_error=False), strict=True)]
    queues, processes, paused, jobs, processed, failed, *sizes, leader, lines, batches = replies
    snap.paused = {text(name) for name in paused or ()}
    _read_jobs(snap, jobs or {})
    _read_batches(snap, batches or {})
    counts = [layout.counter(value) or 0 for value in (processed, failed, *sizes)]
    snap.stats = dict(zip(("processed", "failed", "scheduled", "retry", "dead"), counts,
                          strict=True))
    snap.leader = bool(leader)
    listed = sorted(text(name) for name in queues or ())[:sampler.MAX_QUEUES]
    snap.queues = sampler.sizes_and_latencies(client, listed, now)
    snap.skipped += len(listed) - len(snap.queues)
    snap.processes = _read_processes(snap, client, sorted(text(i) for i in processes or ()))
    _read_lines(snap, client, sorted(text(line) for line in lines or ())[:MAX_LINES])
    return snap


def _read_lines(snap: Snapshot, client: redis.Redis, lines: list[str]) -> None:
    """The jobs waiting in each line, by the class of its first job (a line of another type
    is skipped; an empty one, emptied by a cancel, counts nothing)."""
    if not lines:
        return
    pipe: Any = client.pipeline(transaction=False)
    for line in lines:
        pipe.llen(line)
        pipe.lindex(line, 0)
    replies = pipe.execute(raise_on_error=False)
    for line, size, first in zip(lines, replies[::2], replies[1::2], strict=True):
        size = _checked(snap, line, size)
        if size and first is not None:
            snap.blocked[_class_of(first)] += size


def _class_of(raw: bytes) -> str:
    """The metrics class of a job's bytes, or "?" for bytes that are no job."""
    try:
        return job_class(payloads.decode(raw))
    except MalformedJobError:
        return "?"


def _read_jobs(snap: Snapshot, jobs: dict[Any, Any]) -> None:
    for raw_field, value in jobs.items():
        parsed = layout.parse_series_field(raw_field)
        count = layout.counter(value)
        if parsed is None or count is None:
            snap.skipped += 1
            skipped(log, f"key {layout.JOBS!r}", f"field {raw_field!r} is not a metric")
            continue
        queue, klass, metric = parsed
        snap.jobs[(queue, klass)][metric] += count


def _read_batches(snap: Snapshot, counters: dict[Any, Any]) -> None:
    """The batch counters; one that is no number is skipped (counted, logged) and reads 0."""
    named = {text(name): value for name, value in counters.items()}
    for event in BATCH_EVENTS:
        count = layout.counter(named.get(event, 0))
        if count is None:
            snap.skipped += 1
            skipped(log, f"key {keys.BATCH_STATS!r}", f"field {event!r} is not a number")
        snap.batches[event] = count or 0


def _read_processes(snap: Snapshot, client: redis.Redis, identities: list[str]) -> list[Process]:
    pipe: Any = client.pipeline(transaction=False)
    for identity in identities:
        pipe.hmget(identity, list(FIELDS))
    pipe.get(keys.DEAR_LEADER)
    *records, leader = pipe.execute(raise_on_error=False) if identities else [None]
    leader_identity = "" if isinstance(leader, Exception) or leader is None else text(leader)
    found = []
    for identity, values in zip(identities, records, strict=True):
        if _checked(snap, identity, values) is None or values[0] is None:
            continue  # expired: the process is gone
        found.append(Process.from_hash(identity, values, leader=leader_identity))
    return found


def _checked(snap: Snapshot, key: str, reply: Any) -> Any:
    """``reply``, or None when Redis refused it (counted and logged)."""
    if isinstance(reply, redis.ResponseError):
        snap.skipped += 1
        skipped(log, f"key {key!r}", str(reply))
        return None
    return reply


def _job_series(snap: Snapshot) -> Iterator[Family]:
    processed = Family("forkq_jobs_processed_total", "counter",
                       "Job runs, failures included.")
    failed = Family("forkq_jobs_failed_total", "counter", "Job runs that failed.")
    runtime = Family("forkq_job_runtime_seconds", "histogram",
                     "Duration of job runs, failures included.")
    expired = Family("forkq_jobs_expired_total", "counter",
                     "Jobs not run because their expires_at had passed (not counted as runs).")
    overrated = Family("forkq_jobs_overrated_total", "counter",
                       "Runs a limiter's OverLimit ended, rescheduled (not failures).")
    discarded = Family("forkq_jobs_discarded_total", "counter",
                       "Failed runs dropped by the job's rules (retry: false, discard_on).")
    for (queue, klass), metrics in sorted(snap.jobs.items()):
        series = {"queue": queue, "job_class": klass}
        label_text = text_format.labels(**series)
        processed.add(metrics.get("p", 0), label_text)
        failed.add(metrics.get("f", 0), label_text)
        expired.add(metrics.get("x", 0), label_text)
        overrated.add(metrics.get("o", 0), label_text)
        discarded.add(metrics.get("d", 0), label_text)
        runtime.add_histogram(series, _buckets(metrics), metrics.get("us", 0) / 1e6)
    yield from (processed, failed, runtime, expired, overrated, discarded)
    blocked = Family("forkq_jobs_blocked", "gauge",
                     "Jobs waiting for a concurrency slot, in their key's waiting line.")
    for klass, count in sorted(snap.blocked.items()):
        blocked.add(count, text_format.labels(job_class=klass))
    yield blocked


def _batch_series(snap: Snapshot) -> Iterator[Family]:
    events = Family("forkq_batches_total", "counter",
                    "Batches created, and batch events fired (complete, success, death).")
    for event in BATCH_EVENTS:
        events.add(snap.batches.get(event, 0), text_format.labels(event=event))
    yield events
    yield _single("forkq_batches_open", "gauge", "Batches not yet succeeded (created - success).",
                  max(snap.batches.get("created", 0) - snap.batches.get("success", 0), 0))


def _buckets(metrics: dict[str, int]) -> list[tuple[str, float]]:
    """Cumulative ``le`` buckets from the per-bucket counts ``b0`` … ``b25``."""
    out: list[tuple[str, float]] = []
    total = 0
    for index, edge in enumerate(_EDGES):
        total += metrics.get(f"b{index}", 0)
        out.append((edge, total))
    return out


def _queue_series(snap: Snapshot) -> Iterator[Family]:
    size = Family("forkq_queue_size", "gauge", "Jobs waiting in the queue.")
    latency = Family("forkq_queue_latency_seconds", "gauge",
                     "How long the oldest job of the queue has waited.")
    paused = Family("forkq_queue_paused", "gauge", "1 when the queue is paused.")
    for name, (count, waited) in sorted(snap.queues.items()):
        label_text = text_format.labels(queue=name)
        size.add(count, label_text)
        latency.add(waited, label_text)
        paused.add(1 if name in snap.paused else 0, label_text)
    yield from (size, latency, paused)


def _process_series(snap: Snapshot) -> Iterator[Family]:
    concurrency = Family("forkq_process_concurrency", "gauge", "Processors of one daemon.")
    busy = Family("forkq_process_busy", "gauge", "Busy processors of one daemon.")
    leader = Family("forkq_process_leader", "gauge",
                    "1 for the daemon whose scheduler is the leader.")
    for process in snap.processes:
        label_text = text_format.labels(identity=process.identity, hostname=process.hostname,
                                        tag=str(process.info.get("tag") or ""))
        concurrency.add(process.concurrency, label_text)
        busy.add(process.busy, label_text)
        leader.add(1 if process.leader else 0, label_text)
    yield from (concurrency, busy, leader)
    yield _single("forkq_processes", "gauge", "Live daemons.", len(snap.processes))
    yield _single("forkq_processors", "gauge", "Processors of every live daemon.",
                  sum(p.concurrency for p in snap.processes))
    yield _single("forkq_processors_busy", "gauge", "Busy processors of every live daemon.",
                  sum(p.busy for p in snap.processes))
    yield _single("forkq_leader", "gauge", "1 when a scheduler leader holds office.",
                  1 if snap.leader else 0)


def _totals(snap: Snapshot) -> Iterator[Family]:
    yield _single("forkq_processed_total", "counter",
                  "Sidekiq's stat:processed (every process).", snap.stats["processed"])
    yield _single("forkq_failed_total", "counter", "Sidekiq's stat:failed (every process).",
                  snap.stats["failed"])
    for name in ("scheduled", "retry", "dead"):
        yield _single(f"forkq_{name}_jobs", "gauge", f"Jobs in the {name} set.",
                      snap.stats[name])
    yield _single("forkq_metrics_skipped_keys", "gauge",
                  "Keys this scrape skipped: the wrong type or unreadable.", snap.skipped)


def _single(name: str, kind: str, doc: str, value: float) -> Family:
    family = Family(name, kind, doc)
    family.add(value)
    return family
