"""The scheduler leader's once-a-minute sample of every queue's size and latency.

Contract of :func:`sample`: reads the ``queues`` set, then in one pipelined round trip
``LLEN`` and ``LINDEX -1`` (the oldest job) of each listed queue (at most
:data:`MAX_QUEUES`, by name), and writes ``forkq:metrics:queues:<epoch minute>`` (hash:
queue name → JSON ``[size, latency seconds]``, 8 h TTL) in a second one. Sampling the same
minute twice (a new leader) overwrites it. A key of the wrong type (``queues``, a queue, the
samples hash) is reported and skipped; the other queues are sampled.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import redis

from forkq import keys, wirejson
from forkq import payload as payloads
from forkq.connection import text
from forkq.metrics import layout
from forkq.metrics.report import skipped
from forkq.wording import counted

log = logging.getLogger(__name__)

MAX_QUEUES = 10_000


def sample(client: redis.Redis, now: float) -> int:
    """Sample every listed queue at epoch ``now``; how many were written."""
    names = listed_queues(client, MAX_QUEUES)
    found = sizes_and_latencies(client, names, now)
    if not found:
        return 0
    key = layout.queue_samples(layout.minute_of(now))
    pipe: Any = client.pipeline(transaction=False)
    pipe.hset(key, mapping={name: json.dumps([size, round(latency, 3)])
                            for name, (size, latency) in found.items()})
    pipe.expire(key, layout.QUEUE_SAMPLES_TTL)
    for reply in pipe.execute(raise_on_error=False):
        if isinstance(reply, redis.ResponseError):
            skipped(log, f"key {key!r}", f"queue samples not written: {reply}")
            return 0
    return len(found)


def listed_queues(client: redis.Redis, limit: int) -> list[str]:
    """The names in ``queues``, sorted, at most ``limit`` of them ([] if it is not a set)."""
    try:
        members = client.smembers(keys.QUEUES)
    except redis.ResponseError as exc:
        skipped(log, f"key {keys.QUEUES!r}", str(exc))
        return []
    names = sorted(text(member) for member in members)
    if len(names) > limit:
        skipped(log, f"key {keys.QUEUES!r}",
                f"{counted(len(names), 'queue')} listed; only the first {limit} read")
    return names[:limit]


def sizes_and_latencies(client: redis.Redis, names: list[str],
                        now: float) -> dict[str, tuple[int, float]]:
    """Each queue's size and latency at ``now``, in one round trip; a queue whose key holds
    another type is left out (and reported)."""
    pipe: Any = client.pipeline(transaction=False)
    for name in names:
        pipe.llen(keys.queue(name))
        pipe.lindex(keys.queue(name), -1)
    replies = pipe.execute(raise_on_error=False) if names else []
    found: dict[str, tuple[int, float]] = {}
    for index, name in enumerate(names):
        size, oldest = replies[2 * index], replies[2 * index + 1]
        if isinstance(size, redis.ResponseError) or isinstance(oldest, redis.ResponseError):
            skipped(log, f"key {keys.queue(name)!r}", "not a list")
            continue
        found[name] = (int(size), latency_of(oldest, now))
    return found


def latency_of(oldest: bytes | None, now: float) -> float:
    """Seconds the job ``oldest`` has waited (its ``enqueued_at``, else ``created_at``, in
    either unit Sidekiq writes); 0 for none or for a job without either."""
    if oldest is None:
        return 0.0
    try:
        item = wirejson.loads(oldest)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return 0.0
    if not isinstance(item, dict):
        return 0.0
    since = (payloads.epoch_seconds(item.get("enqueued_at"))
             or payloads.epoch_seconds(item.get("created_at")))
    if since is None or not math.isfinite(since):
        return 0.0
    return max(0.0, now - since)
