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
from forkq.connection import is_wrong_type, text
from forkq.errors import DamagedKeyError
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
    def read(cls, client: redis.Redis, now: float | None = None, *,
             damaged: list[str] | None = None, busy: int | None = None) -> Stats:
        """Read every figure in one pipelined round trip (after listing queues and processes).
        ``busy``: the busy processors of the live processes, when the caller read their
        records already (``workers_size``; else each record's ``busy`` is read here).

        Without ``damaged`` a key of the wrong type raises Redis's WRONGTYPE (and a counter
        that is no number DamagedKeyError, a ValueError naming the key); with it, such a key
        reads as empty (0) and its name is appended to ``damaged``, so the other figures
        still show. Any other refusal (an ACL's, ``NoPermissionError``) is raised either way."""
        queues = sorted(text(q) for q in _members(client, keys.QUEUES, damaged))
        identities = ([text(i) for i in _members(client, keys.PROCESSES, damaged)]
                      if busy is None else [])
        names = [keys.STAT_PROCESSED, keys.STAT_FAILED, keys.SCHEDULE, keys.RETRY, keys.DEAD,
                 keys.PROCESSES, keys.queue("default"),
                 *(keys.queue(q) for q in queues for _ in range(2)), *identities]
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
            replies = pipe.execute(raise_on_error=damaged is None)
        if damaged is not None:
            replies = [_refused(damaged, name, reply)
                       for name, reply in zip(names, replies, strict=True)]
        processed, failed, scheduled, retries, dead, listed, oldest, *rest = replies
        now = time.time() if now is None else now
        per_queue, busy_fields = rest[:2 * len(queues)], rest[2 * len(queues):]

        def count(name: str, value: Any) -> int:
            return _count(damaged, name, value)

        lengths = dict(zip(queues, (count(keys.queue(q), n) for q, n in zip(
            queues, per_queue[0::2], strict=True)), strict=True))
        latencies = dict(zip(queues, (_latency(job, now) for job in per_queue[1::2]), strict=True))
        return cls(
            processed=count(keys.STAT_PROCESSED, processed),
            failed=count(keys.STAT_FAILED, failed), scheduled_size=count(keys.SCHEDULE, scheduled),
            retry_size=count(keys.RETRY, retries), dead_size=count(keys.DEAD, dead),
            processes_size=count(keys.PROCESSES, listed),
            enqueued=sum(lengths.values()),
            workers_size=busy if busy is not None else sum(
                int(b) for b in busy_fields if b is not None and text(b).isdigit()),
            default_queue_latency=_latency(oldest, now), queues=lengths, latencies=latencies,
        )

    def summary(self) -> dict[str, Any]:
        return asdict(self)


def describe_damage(client: redis.Redis, name: str) -> str:
    """Why the key ``name``, which :meth:`Stats.read` (or a read of ``forkq:paused``) found
    damaged, could not be read: ``key 'queue:b' holds a string, not a list``; a counter, the
    first 40 bytes of its value. Asks Redis again (TYPE, and GETRANGE for a counter), so it
    also says when the key changed since. Raises redis.ConnectionError when Redis does not
    answer; an ACL refusing those commands only leaves out what the key holds."""
    expected = _expected_type(name)
    try:
        kind = text(client.type(name))
        if kind == "string" and name in (keys.STAT_PROCESSED, keys.STAT_FAILED):
            return f"key {name!r} holds {client.getrange(name, 0, 39)!r}, not a number"
    except redis.ResponseError as exc:
        return f"key {name!r} is not a {expected} (what it holds could not be asked: {exc})"
    if kind in ("none", expected):
        now = "is gone now" if kind == "none" else "is one now"
        return f"key {name!r} was not a {expected} when it was read (it {now})"
    return holds(name, kind, expected)


def holds(name: str, kind: str, expected: str) -> str:
    """``key 'queue:b' holds a string, not a list``: the words for a key of the wrong type."""
    return f"key {name!r} holds a {kind}, not a {expected}"


def _expected_type(name: str) -> str:
    """The type of a key :meth:`Stats.read` reads: a fixed key's (:data:`keys.TYPES`), a
    queue's list, else a process record's hash (the only other keys it reads)."""
    return keys.TYPES.get(name) or ("list" if name.startswith(keys.QUEUE_PREFIX) else "hash")


def _members(client: redis.Redis, name: str, damaged: list[str] | None) -> set[Any]:
    """SMEMBERS ``name``; empty (and noted) when it is of another type and ``damaged`` given."""
    try:
        return set(client.smembers(name))
    except redis.ResponseError as exc:
        if damaged is None or not is_wrong_type(exc):
            raise
        damaged.append(name)
        return set()


def _refused(damaged: list[str], name: str, reply: Any) -> Any:
    """A pipeline reply, or None (``name`` noted) for a key of the wrong type; any other
    refusal (an ACL's) is raised."""
    if isinstance(reply, redis.ResponseError):
        if not is_wrong_type(reply):
            raise reply
        if name not in damaged:
            damaged.append(name)
        return None
    return reply


def _count(damaged: list[str] | None, name: str, value: Any) -> int:
    """A counter or size as read (None: 0); one that is no number raises DamagedKeyError (a
    ValueError naming the key), or reads as 0 and is noted when ``damaged`` is given."""
    try:
        return int(value or 0)
    except ValueError:
        if damaged is None:
            raise DamagedKeyError(f"key {name!r} holds {value!r}, not a number") from None
        if name not in damaged:
            damaged.append(name)
        return 0


def _latency(oldest: bytes | None, now: float) -> float:
    """Seconds the oldest job of a queue (its right end) has waited; 0 for an empty queue."""
    return JobRecord(oldest).latency(now) if oldest else 0.0


def history(client: redis.Redis, days: int = 7, now: float | None = None, *,
            damaged: list[str] | None = None) -> list[dict[str, Any]]:
    """Processed and failed per UTC day, today first, ``days`` days. A counter of another type
    reads as 0 (MGET answers nil for it); one that is no number raises ValueError, or with
    ``damaged`` given reads as 0 and is appended to it."""
    start = time.time() if now is None else now
    dates = [keys.utc_date(start - 86400 * day) for day in range(days)]
    rows = []
    processed = client.mget([keys.daily(keys.STAT_PROCESSED, d) for d in dates])
    failed = client.mget([keys.daily(keys.STAT_FAILED, d) for d in dates])
    for d, p, f in zip(dates, processed, failed, strict=True):
        rows.append({"date": d,
                     "processed": _count(damaged, keys.daily(keys.STAT_PROCESSED, d), p),
                     "failed": _count(damaged, keys.daily(keys.STAT_FAILED, d), f)})
    return rows
