"""The leader files the failures that waited in ``forkq:unfiled``.

A processor whose failure's set (``retry`` or ``dead``) held another type parked it in
``forkq:unfiled`` as ``<retry|dead>|<job JSON>`` at the score it was due (fail.lua) and
went on working. With every full orphan sweep (one in
:data:`~forkq.daemon.children.scheduler.FULL_SWEEP_EVERY`: every 30 s with the default
settings) the leader moves up to :data:`BATCH` of those entries into their set with
entry.lua (the member leaves ``forkq:unfiled`` and arrives in
its set in one step; a set still of the wrong type is reported, naming it, and its entries
wait). An entry with no ``retry|`` / ``dead|`` prefix (any client may write anything)
goes to ``dead`` as it is. Steady state: one ``ZRANGE`` of an empty key per full sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import TypeVar, cast

import redis

from forkq import keys
from forkq.daemon.refusal import Recurring
from forkq.scripts import script
from forkq.wording import counted

log = logging.getLogger(__name__)
T = TypeVar("T")

BATCH = 100
TARGETS = {b"retry": keys.RETRY, b"dead": keys.DEAD}


REFUSALS = Recurring(log)
"""Keys of the wrong type met while filing, reported at most once a minute each."""


def refile(client: redis.Redis, *, now: float) -> int:
    """Move the parked failures whose set accepts them again; how many moved."""
    moved = 0
    parked = cast("list[tuple[bytes, float]] | None", _refused_is_none(
        keys.UNFILED, partial(client.zrange, keys.UNFILED, 0, BATCH - 1, withscores=True)))
    for member, score in parked or []:
        to, _, job = member.partition(b"|")
        target = TARGETS.get(to)
        if target is None:
            target, job = keys.DEAD, member
        done = _refused_is_none(target, partial(_move, client, member, target, job, score, now))
        moved += bool(done)
    if moved:
        log.info("filed %s that waited in %r", counted(moved, "failure"), keys.UNFILED)
    return moved


def _refused_is_none(key: str, step: Callable[[], T]) -> T | None:
    return REFUSALS.skip_refused(key, f"filing the failures in {keys.UNFILED!r}", step)


def _move(client: redis.Redis, member: bytes, target: str, job: bytes, score: float,
          now: float) -> bool:
    mode = "retry" if target == keys.RETRY else "dead"
    lua = script(client, "entry")
    return bool(lua(keys=[keys.UNFILED, target, keys.QUEUES],
                    args=[member, mode, job, "", score, repr(now - keys.DEAD_TIMEOUT),
                          keys.DEAD_MAX_JOBS]))
