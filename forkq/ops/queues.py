"""The operator's view of queues: :class:`Queue` (size, latency, jobs, find, delete, clear,
pause and resume).

Same keys and semantics as Sidekiq's ``Sidekiq::Queue`` (api.rb): the names in
``queues``, jobs in ``queue:<name>`` with the oldest at the right end. Latency is
now minus the oldest job's ``enqueued_at``. Deleting matches the raw bytes
(``LREM 1``); clearing unlinks the list and leaves ``queues`` in one step (``clear.lua``),
but, unlike Sidekiq's, refuses a queue key of another type than a list. Pausing is
forkq's own (``forkq:paused``, read by every forkq processor's fetch); Sidekiq processes
sharing the server do not know it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import redis

from forkq import keys
from forkq.connection import is_wrong_type, raw, text
from forkq.errors import ForkqError
from forkq.ops.records import JobRecord
from forkq.scripts import script

PAGE = 50


class Queue:
    """One queue of the server behind ``client``."""

    def __init__(self, client: redis.Redis, name: str = "default") -> None:
        self.redis = client
        self.name = name
        self.key = keys.queue(name)

    @staticmethod
    def paused_names(client: redis.Redis) -> set[str]:
        """The names of the paused queues; ForkqError naming the key when it is no set (any
        other refusal, an ACL's, is raised as it is)."""
        try:
            return {text(name) for name in client.smembers(keys.PAUSED)}
        except redis.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            raise ForkqError(f"key {keys.PAUSED!r} is not a set of queue names: {exc}") from None

    @classmethod
    def all(cls, client: redis.Redis) -> list[Queue]:
        """Every queue listed in ``queues``, sorted by name."""
        return [cls(client, name) for name in sorted(text(n) for n in client.smembers(keys.QUEUES))]

    def exists(self) -> bool:
        """Listed in ``queues`` or holding jobs."""
        return bool(self.redis.sismember(keys.QUEUES, self.name)) or self.size() > 0

    def size(self) -> int:
        return int(self.redis.llen(self.key))

    def latency(self, now: float | None = None) -> float:
        """Seconds the oldest job has waited (0 for an empty queue)."""
        oldest = self.redis.lindex(self.key, -1)
        if oldest is None:
            return 0.0
        return JobRecord(raw(oldest), self.key).latency(time.time() if now is None else now)

    def jobs(self) -> Iterator[JobRecord]:
        """Every job, newest first (as Sidekiq's ``Queue#each``), a page at a time from the left
        end. Processors take from the right end, which shifts nothing; jobs the caller deletes
        are made up for (``initial size - size``), so none is skipped. A job pushed meanwhile
        may show a later one twice."""
        initial = self.size()
        page = 0
        while True:
            start = max(0, page * PAGE - (initial - self.size()))
            found = self.redis.lrange(self.key, start, start + PAGE - 1)
            if not found:
                return
            for member in found:
                yield JobRecord(raw(member), self.key)
            page += 1

    def next_jobs(self, limit: int) -> list[JobRecord]:
        """The ``limit`` jobs that run next, next first: one read, a consistent snapshot."""
        found = self.redis.lrange(self.key, -limit, -1) if limit > 0 else []
        return [JobRecord(raw(member), self.key) for member in reversed(found)]

    def find_job(self, jid: str) -> JobRecord | None:
        """The job with this jid (a scan of the whole list: O(size)); None if not queued."""
        return next((job for job in self.jobs() if job.jid == jid), None)

    def delete(self, job: JobRecord) -> bool:
        """Remove that job (by its raw bytes), releasing its unique lock in the same step
        (``remove.lua``); False if it is no longer there."""
        return remove(self.redis, self.key, job.raw)

    def pause(self) -> bool:
        """Pause the queue across the cluster: every forkq processor's fetch skips it until
        :meth:`resume` (jobs still go in). True if it was not paused yet. Processors blocked
        waiting for a job are woken (``CLIENT UNBLOCK``), so none takes one more from it; a
        server that refuses that leaves them to notice within 30 s."""
        added = bool(self.redis.sadd(keys.PAUSED, self.name))
        with contextlib.suppress(redis.ResponseError):
            for entry in self.redis.client_list(_type="normal"):
                if str(entry.get("name", "")).startswith(keys.WAITER_PREFIX):
                    self.redis.client_unblock(int(entry["id"]))
        return added

    def resume(self) -> bool:
        """Let processors fetch from it again (idle ones notice at once: they watch the
        paused set, or within 2 s). True if it was paused."""
        return bool(self.redis.srem(keys.PAUSED, self.name))

    def is_paused(self) -> bool:
        return bool(self.redis.sismember(keys.PAUSED, self.name))

    def clear(self) -> int:
        """Drop every job and unlist the queue (``clear.lua``, one step); returns how many
        jobs were dropped. A queue key that holds another type than a list holds no jobs,
        and whatever it is stays for whoever wrote it: a ResponseError naming the key
        (``WRONGTYPE forkq: key 'queue:b' holds a string, not a list; ...``), nothing
        changed."""
        return int(script(self.redis, "clear")(keys=[self.key, keys.QUEUES], args=[self.name]))


def remove(client: redis.Redis, key: str, job: bytes, *, kind: str = "list") -> bool:
    """Remove ``job`` (its exact bytes) from ``key``, a queue (``kind`` "list") or a sorted
    set ("zset"), releasing its unique lock in the same step (``remove.lua``); False if
    ``key`` no longer holds it."""
    return int(script(client, "remove")(keys=[key], args=[kind, job])) > 0
