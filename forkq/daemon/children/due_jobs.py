"""The leader's due-job mover: due ``schedule`` and ``retry`` entries go to their queues.

Sidekiq's behaviour (docs/sidekiq-wire.md §2): a due entry is pushed to
``queue:<its queue>`` with a fresh ``enqueued_at`` and every other field kept,
the queue is added to ``queues``, and the entry leaves its sorted set. The
job is re-encoded the way Sidekiq's client re-generates it (key order kept,
Ruby's float format). A member that is not a JSON object with a queue name is
pushed unchanged to ``queue:default``, where the processor that fetches it
buries it in the dead set with the reason, rather than leaving it stuck here.

Mechanism: read up to :data:`BATCH` due members (``ZRANGEBYSCORE … LIMIT``),
rewrite them here, then move them with move.lua, which removes each member and
pushes its job in one atomic step and only for the lease holder. A crash between
the two steps moves nothing; a member moved by someone else in between is not
moved twice. :func:`next_due` tells the leader how long it may sleep.
"""

from __future__ import annotations

import logging
from typing import cast

import redis

from forkq import keys, wirejson
from forkq.connection import raw, text
from forkq.daemon.children.lease import LeaseLostError
from forkq.daemon.refusal import Recurring, describe
from forkq.scripts import script

log = logging.getLogger(__name__)

BATCH = 100
SETS = (keys.SCHEDULE, keys.RETRY)


def rewrite(member: bytes, now: float) -> tuple[str | bytes, str]:
    """The job to push for a due ``member``, and its queue name. What :func:`wirejson.loads`
    accepts, :func:`wirejson.dumps` writes back; anything else goes unchanged to ``default``."""
    try:
        job = wirejson.loads(member)
    except ValueError:
        return member, "default"
    if not isinstance(job, dict) or not isinstance(job.get("queue"), str) or not job["queue"]:
        return member, "default"
    job["enqueued_at"] = now
    return wirejson.dumps(job), job["queue"]


REFUSALS = Recurring(log)
"""Keys of the wrong type met while moving, reported at most once a minute each."""


def move_due(client: redis.Redis, token: str, now: float, *, batches: int = 50) -> int:
    """Move the entries due at epoch ``now``, at most ``batches`` times :data:`BATCH` per set.

    A set of the wrong type is reported and skipped; an entry whose queue key holds another
    type stays where it is (reported), and the others move. Returns how many moved; raises
    :class:`~forkq.daemon.children.lease.LeaseLostError` without the lease.
    """
    return sum(_move_set(client, token, zset, now, batches) for zset in SETS)


def _move_set(client: redis.Redis, token: str, zset: str, now: float, batches: int) -> int:
    lua = script(client, "move")
    moved = stayed = 0  # stayed: due entries left in place, read past on the next batch
    for _ in range(batches):
        try:
            found = client.zrangebyscore(zset, "-inf", repr(now), start=stayed, num=BATCH)
        except redis.ResponseError as exc:
            REFUSALS.report(zset, "cannot move due jobs from %r: %s", zset, describe(exc, zset))
            return moved
        members = [raw(cast(bytes, member)) for member in found]
        if not members:
            break
        args: list[str | bytes] = [token, repr(now)]
        for member in members:
            job, queue = rewrite(member, now)
            args += [member, job, queue]
        reply = lua(keys=[keys.LEADER, zset, keys.QUEUES], args=args)
        if reply == -1:
            raise LeaseLostError(f"moving due jobs from {zset}")
        count, *skipped = reply
        moved += int(count)
        stayed += len(members) - int(count)
        for i in range(0, len(skipped), 2):
            key = text(skipped[i])
            REFUSALS.report(key, "due jobs for %r stay in %r: the key holds a %s, not a list",
                            key, zset, text(skipped[i + 1]))
        if len(members) < BATCH:
            break
    return moved


def next_due(client: redis.Redis) -> float | None:
    """The earliest score in ``schedule`` and ``retry`` (epoch seconds); None if both are empty
    (a set of the wrong type counts as empty: :func:`move_due` reports it)."""
    with client.pipeline(transaction=False) as pipe:
        for zset in SETS:
            pipe.zrange(zset, 0, 0, withscores=True)
        firsts = pipe.execute(raise_on_error=False)
    scores = []
    for zset, entries in zip(SETS, firsts, strict=True):
        if isinstance(entries, redis.ResponseError):
            REFUSALS.report(zset, "cannot move due jobs from %r: %s", zset,
                            describe(entries, zset))
        elif entries:
            scores.append(float(entries[0][1]))
    return min(scores, default=None)
