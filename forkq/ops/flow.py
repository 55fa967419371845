"""What flow control holds now, read only (``forkq limits``, ``forkq uniques``): the
concurrency limits' keys (running, waiting), the limiters in use, the groups waiting in
the queues with groups, the unique locks.

Each reading is a ``SCAN`` of its prefix (``forkq:slots:``, ``forkq:limiter:``,
``forkq:groups:``, ``forkq:unique:``) and one read per key found: O(keys). A key of
another type than its kind is reported as damaged (named) and skipped; the reading goes
on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from forkq import concurrency, groups, keys, limiter
from forkq.connection import text


@dataclass(frozen=True)
class Slots:
    """One key of a concurrency limit: the jobs running and waiting."""

    name: str  # "<class>:<key>"
    running: int
    waiting: int


@dataclass(frozen=True)
class InUse:
    """One limiter's key and what it holds now: entries in its window, holders of a
    concurrent limiter, this period's count of a bucket, a leaky bucket's level."""

    kind: str
    name: str
    used: float


@dataclass(frozen=True)
class Lock:
    """A unique job's lock: the job holding it and the seconds it has left."""

    key: str
    jid: str
    ttl: int | None


@dataclass(frozen=True)
class Group:
    """A group with jobs waiting in a queue with groups (:mod:`forkq.groups`)."""

    queue: str
    group: str
    waiting: int


@dataclass
class Reading:
    """What one reading found, and the keys it skipped (another type)."""

    slots: list[Slots] = field(default_factory=list)
    limiters: list[InUse] = field(default_factory=list)
    locks: list[Lock] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)


def _scan(client: redis.Redis, prefix: str) -> list[str]:
    return sorted(text(key) for key in client.scan_iter(match=prefix + "*", count=1000))


def concurrency_keys(client: redis.Redis, found: Reading) -> None:
    """Every key with jobs running or waiting (its running set or its waiting line)."""
    names: dict[str, tuple[int, int]] = {}
    for key in _scan(client, concurrency.SLOTS_PREFIX):
        line = key.endswith(":blocked")
        base = key.removesuffix(":blocked") if line else key
        kind = text(client.type(key))
        if kind != ("list" if line else "set"):
            found.damaged.append(key)
            continue
        running, waiting = names.get(base, (0, 0))
        if line:
            waiting = int(client.llen(key))
        else:
            running = int(client.scard(key))
        names[base] = (running, waiting)
    found.slots = [Slots(base.removeprefix(concurrency.SLOTS_PREFIX), running, waiting)
                   for base, (running, waiting) in sorted(names.items())]


def limiters(client: redis.Redis, found: Reading) -> None:
    """Every limiter key in use (slot lists of dead processes are not shown)."""
    for key in _scan(client, limiter.PREFIX):
        if key.startswith(limiter.HELD_PREFIX):
            continue
        kind, _, name = key.removeprefix(limiter.PREFIX).partition(":")
        used = _used(client, kind, key)
        if used is None:
            found.damaged.append(key)
        else:
            found.limiters.append(InUse(kind, name, used))


def _used(client: redis.Redis, kind: str, key: str) -> float | None:
    held = text(client.type(key))
    if kind in ("window", "concurrent") and held == "zset":
        return float(client.zcard(key))
    if kind == "bucket" and held == "string":
        return float(client.get(key) or 0)
    if kind == "leaky" and held == "hash":
        return round(float(client.hget(key, "level") or 0), 2)
    return None


def queue_groups(client: redis.Redis, found: Reading) -> None:
    """Every group waiting in a queue with groups, in each queue's turn order."""
    for key in _scan(client, groups.ROTATION_PREFIX):
        if text(client.type(key)) != "list":
            found.damaged.append(key)
            continue
        queue = key.removeprefix(groups.ROTATION_PREFIX)
        found.groups += [Group(queue, name, waiting)
                         for name, waiting in groups.waiting(client, queue)]


def unique_locks(client: redis.Redis, found: Reading, limit: int = 0) -> int:
    """The unique locks (the first ``limit``; 0: all); how many there are."""
    names = _scan(client, keys.UNIQUE_PREFIX)
    for key in names[:limit or None]:
        if text(client.type(key)) != "string":
            found.damaged.append(key)
            continue
        holder, ttl = client.get(key), int(client.pttl(key))  # PTTL: the documented ACL's
        found.locks.append(Lock(key, text(holder or b""), ttl // 1000 if ttl >= 0 else None))
    return len(names)
