"""The operator's totals: :class:`Stats` (Sidekiq's ``Sidekiq::Stats``) and :func:`history`.

One pipelined read: ``stat:processed`` / ``stat:failed`` (failures count as
processed too, as in Sidekiq), the sizes of ``schedule``, ``retry``, ``dead`` and
``processes``, every listed queue's length (``enqueued``) and latency, the processes' ``busy``
(``workers_size``) and the default queue's latency. :func:`history` reads the daily
counters ``stat:<x>:YYYY-MM-DD`` (UTC).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from forkq import keys
from forkq.connection import text
from forkq.ops.records import JobRecord


@dataclass(frozen=True)
class Stats:
    """A snapshot of the cluster's counters."""

    processed: int
    failed: int
    scheduled_size: int
    retry_size: int
    dead_size: int
    processes_size: int
    enqueued: int
    workers_size: int
    default_queue_latency: float
    queues: dict[str, int]
    latencies: dict[str, float]

    @classmethod
    def read(cls, client: redis.Redis, now: float | None = None) -> Stats:
        """Read every figure in one pipelined round trip (after listing queues and processes)."""
        queues = sorted(text(q) for q in client.smembers(keys.QUEUES))
        identities = [text(i) for i in client.smembers(keys.PROCESSES)]
        with client.pipeline(transaction=False) as pipe:
            pipe.get(keys.STAT_PROCESSED)
            pipe.get(keys.STAT_FAILED)
            for zset in (keys.SCHEDULE, keys.RETRY, keys.DEAD):
                pipe.zcard(zset)
            pipe.scard(keys.PROCESSES)
            pipe.lindex(keys.queue("default"), -1)
            for queue in queues:
                pipe.llen(keys.queue(queue))
                pipe.lindex(keys.queue(queue), -1)
            for identity in identities:
                pipe.hget(identity, "busy")
            processed, failed, scheduled, retries, dead, listed, oldest, *rest = pipe.execute()
        now = time.time() if now is None else now
        per_queue, busy = rest[:2 * len(queues)], rest[2 * len(queues):]
        lengths = dict(zip(queues, (int(n) for n in per_queue[0::2]), strict=True))
        latencies = dict(zip(queues, (_latency(job, now) for job in per_queue[1::2]), strict=True))
        return cls(
            processed=int(processed or 0), failed=int(failed or 0), scheduled_size=int(scheduled),
            retry_size=int(retries), dead_size=int(dead),
            processes_size=int(listed),
            enqueued=sum(lengths.values()),
            workers_size=sum(int(b) for b in busy if b is not None and text(b).isdigit()),
            default_queue_latency=_latency(oldest, now), queues=lengths, latencies=latencies,
        )

    def summary(self) -> dict[str, Any]:
        return asdict(self)


def _latency(oldest: bytes | None, now: float) -> float:
    """Seconds the oldest job of a queue (its right end) has waited; 0 for an empty queue."""
    return JobRecord(oldest).latency(now) if oldest else 0.0


def history(client: redis.Redis, days: int = 7, now: float | None = None
            ) -> list[dict[str, Any]]:
    """Processed and failed per UTC day, today first, ``days`` days."""
    start = time.time() if now is None else now
    dates = [keys.utc_date(start - 86400 * day) for day in range(days)]
    processed = client.mget([keys.daily(keys.STAT_PROCESSED, d) for d in dates])
    failed = client.mget([keys.daily(keys.STAT_FAILED, d) for d in dates])
    return [{"date": d, "processed": int(p or 0), "failed": int(f or 0)}
            for d, p, f in zip(dates, processed, failed, strict=True)]
