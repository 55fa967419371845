"""The operator's view of the sorted sets: :class:`ScheduledSet`, :class:`RetrySet`,
:class:`DeadSet` (iterate, find by jid, retry now, add to queue, kill, delete,
reschedule, clear).

Same keys and meaning as Sidekiq's ``JobSet`` classes (api.rb): members are job
JSON, scores epoch seconds (due time; time of death for ``dead``). Every action
names the member by the raw bytes it was read as and runs in entry.lua, which
removes it and writes its job to the target in one step: a job raced by Sidekiq,
the leader's mover or another operator is acted on once or not at all (the
method then returns False). Rescheduling is ``ZADD XX`` of those same bytes, so
it moves the member and never adds a second one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, cast

import redis

from forkq import keys, wirejson
from forkq.connection import raw
from forkq.errors import ForkqError
from forkq.ops.records import SortedEntry
from forkq.scripts import script

PAGE = 50


class JobSet:
    """One of Sidekiq's sorted sets of jobs."""

    name = ""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def size(self) -> int:
        return int(self.redis.zcard(self.name))

    def __iter__(self) -> Iterator[SortedEntry]:
        return self.entries()

    def entries(self, limit: int | None = None, *, reverse: bool = False) -> Iterator[SortedEntry]:
        """The entries by score (soonest first; latest first with ``reverse``), a page at a time.

        Pages continue from the last score seen, not from a position, so entries removed
        meanwhile (by the caller, the leader's mover or anyone) never make others skipped."""
        yielded = 0
        bound: float | None = None
        at_bound: set[bytes] = set()  # members already yielded at score ``bound``
        while limit is None or yielded < limit:
            page = self._page_from(bound, PAGE + len(at_bound), reverse=reverse)
            fresh = [(m, s) for m, s in page if not (s == bound and m in at_bound)]
            for member, score in fresh[: None if limit is None else limit - yielded]:
                yield SortedEntry(member, score=score, set_name=self.name)
                yielded += 1
            if not fresh or len(page) < PAGE + len(at_bound):
                return
            last = fresh[-1][1]
            at_bound = (at_bound if last == bound else set()) | {m for m, s in fresh if s == last}
            bound = last

    def _page_from(self, bound: float | None, count: int, *, reverse: bool
                   ) -> list[tuple[bytes, float]]:
        """Up to ``count`` members scored from ``bound`` (inclusive) onwards."""
        start = ("+inf" if reverse else "-inf") if bound is None else repr(bound)
        if reverse:
            found = self.redis.zrevrangebyscore(self.name, start, "-inf", start=0, num=count,
                                                withscores=True)
        else:
            found = self.redis.zrangebyscore(self.name, start, "+inf", start=0, num=count,
                                             withscores=True)
        return [(raw(member), float(score)) for member, score in cast(list[Any], found)]

    def find_job(self, jid: str) -> SortedEntry | None:
        """The entry whose payload has this ``jid``; None if there is none."""
        return next((entry for entry in self.candidates(jid) if entry.jid == jid), None)

    def candidates(self, jid: str) -> Iterator[SortedEntry]:
        """Every member holding ``jid`` as a JSON string (``"<jid>"``): one ``ZSCAN`` with a
        MATCH, as Sidekiq's ``find_job`` (O(set size) on the server; only the matches cross
        the wire). Glob characters in the jid are escaped. A candidate may be a member that
        is not a job, or one whose args hold the jid: check ``entry.jid``."""
        quoted = quoted_jid(jid)
        if quoted is None:
            return
        pattern = f"*{glob_escape(quoted)}*"
        for member, score in self.redis.zscan_iter(self.name, match=pattern, count=1000):
            yield SortedEntry(raw(member), score=float(score), set_name=self.name)

    def retry(self, entry: SortedEntry) -> bool:
        """Push it to its queue now with ``retry_count`` one lower (Sidekiq's ``retry``: the
        next failure counts the same attempt again)."""
        return self._run(self._retry_step(entry))

    def add_to_queue(self, entry: SortedEntry) -> bool:
        """Push it to its queue now, unchanged but for a fresh ``enqueued_at``."""
        return self._run(self._add_step(entry))

    def kill(self, entry: SortedEntry) -> bool:
        """Move it to the dead set, scored now (trimmed as Sidekiq's ``DeadSet#kill``)."""
        return self._run(self._kill_step(entry))

    def delete(self, entry: SortedEntry) -> bool:
        """Remove it; False if it was no longer in the set."""
        return self._run(self._delete_step(entry))

    def act_many(self, entries: list[SortedEntry], action: str) -> list[bool | Exception]:
        """``action`` (``retry``, ``add_to_queue``, ``kill`` or ``delete``) on each entry, in
        one pipelined round trip; each a separate entry.lua call, so each is atomic on its
        own and one refusal (not a job, a wrong-typed target key) changes nothing but its own
        result, which is the exception instead of True/False."""
        if action not in _STEPS:
            raise ValueError(f"no such action: {action!r}")
        build = getattr(self, _STEPS[action])
        steps: list[Step | Exception] = []
        for entry in entries:
            try:
                steps.append(build(entry))
            except (ForkqError, TypeError, ValueError) as exc:  # not a job; JSON cannot carry it
                steps.append(exc)
        lua = script(self.redis, "entry")
        # SCRIPT LOAD here, then plain EVALSHAs: a redis-py pipeline of Script calls would
        # first send SCRIPT EXISTS, which the least-privilege ACL (docs/redis.md) does not grant
        self.redis.script_load(lua.script)
        with self.redis.pipeline(transaction=False) as pipe:
            for step in steps:
                if not isinstance(step, Exception):
                    pipe.evalsha(lua.sha, len(step[0]), *step[0], *step[1])
            replies = iter(pipe.execute(raise_on_error=False))
        return [step if isinstance(step, Exception) else _done(next(replies))
                for step in steps]

    def reschedule(self, entry: SortedEntry, at: float) -> bool:
        """Give it a new score (epoch seconds); False if it is no longer in the set."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self.name, {entry.raw: at}, xx=True)
            pipe.zscore(self.name, entry.raw)
            return pipe.execute()[1] is not None

    def clear(self) -> int:
        """Empty the set, releasing the unique locks of its jobs in the same step
        (``empty.lua``); returns how many entries it held."""
        return int(script(self.redis, "empty")(keys=[self.name]))

    def retry_all(self) -> int:
        """Retry every entry; returns how many were pushed."""
        return self._each_first_page(self.retry)

    def kill_all(self) -> int:
        """Kill every entry; returns how many were moved."""
        return self._each_first_page(self.kill)

    def _each_first_page(self, action: Any) -> int:
        done = 0
        while page := list(self.entries(PAGE)):
            done += sum(1 for entry in page if action(entry))
        return done

    def _job(self, entry: SortedEntry, doing: str) -> dict[str, Any]:
        queue = entry.item.get("queue")
        if not entry.item or not isinstance(queue, str) or not queue:
            raise ForkqError(f"cannot {doing} a {self.name} entry that is not a job: "
                             f"{entry.raw[:200]!r}")
        return dict(entry.item)

    def _retry_step(self, entry: SortedEntry) -> Step:
        item = self._job(entry, "retry")
        if isinstance(item.get("retry_count"), int):
            item["retry_count"] -= 1
        return self._queue_step(entry, item)

    def _add_step(self, entry: SortedEntry) -> Step:
        return self._queue_step(entry, self._job(entry, "add to a queue"))

    def _kill_step(self, entry: SortedEntry) -> Step:
        if self.name == keys.DEAD:
            raise ForkqError(f"job {entry.jid} is already dead")
        return self._step(entry, "dead", keys.DEAD, entry.raw, "")

    def _delete_step(self, entry: SortedEntry) -> Step:
        return self._step(entry, "delete", self.name, b"", "")

    def _queue_step(self, entry: SortedEntry, item: dict[str, Any]) -> Step:
        item["enqueued_at"] = time.time()
        return self._step(entry, "queue", keys.queue(item["queue"]), wirejson.dumps(item),
                          item["queue"])

    def _step(self, entry: SortedEntry, action: str, target: str, write: str | bytes,
              queue: str) -> Step:
        """The keys and arguments of one entry.lua call."""
        now = time.time()
        return ([self.name, target, keys.QUEUES],
                [entry.raw, action, write, queue, repr(now), repr(now - keys.DEAD_TIMEOUT),
                 keys.DEAD_MAX_JOBS])

    def _run(self, step: Step) -> bool:
        return cast(int, script(self.redis, "entry")(keys=step[0], args=step[1])) == 1


_STEPS = {"retry": "_retry_step", "add_to_queue": "_add_step", "kill": "_kill_step",
          "delete": "_delete_step"}
"""The actions :meth:`JobSet.act_many` takes, each to the method building its step."""

Step = tuple[list[str], list[Any]]
"""One entry.lua call: its keys and its arguments."""


def _done(reply: Any) -> bool | Exception:
    return reply if isinstance(reply, Exception) else cast(int, reply) == 1


def quoted_jid(jid: str) -> str | None:
    """``jid`` as a JSON string, as every job JSON holds it (Ruby's escapes); None for a jid
    no job can hold (empty, or not valid UTF-8)."""
    if not jid:
        return None
    try:
        return wirejson.dumps(jid)
    except (TypeError, ValueError):
        return None


def glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis glob pattern (``MATCH``, ``KEYS``)."""
    return "".join("\\" + c if c in "*?[]\\^-" else c for c in text)


class ScheduledSet(JobSet):
    """``schedule``: jobs pushed with ``at`` / ``perform_in``, scored by when they are due."""

    name = keys.SCHEDULE


class RetrySet(JobSet):
    """``retry``: failed jobs awaiting their next attempt, scored by when it is due."""

    name = keys.RETRY


class DeadSet(JobSet):
    """``dead``: jobs out of retries, scored by when they died; 10,000 / 180 days at most."""

    name = keys.DEAD


SETS: dict[str, type[JobSet]] = {"scheduled": ScheduledSet, "retries": RetrySet,
                                 "dead": DeadSet}
