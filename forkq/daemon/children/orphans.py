"""The leader's orphan sweep: in-flight jobs of dead processes go back to their queues.

A forkq daemon is dead when its liveness key ``forkq:alive:<identity>`` has lapsed: no
heartbeat of its master or children for 2/3 of ``host_failover`` (:mod:`forkq.daemon.liveness`);
the sweep runs at least every fifth of it. Another process (Sidekiq, a forkq daemon that
keeps no such key) is dead when its process hash ``<identity>`` and its children's beat
hash ``forkq:beats:<identity>`` have both expired: no beat for 60 s
(:data:`~forkq.keys.PROCESS_TTL`). Either happens when its host died or was cut off, or its
master was SIGKILLed and its orphaned children finished or gave up
(see :mod:`forkq.daemon.children.beat_thread`). A live master settles its own children's jobs;
the sweep never touches a process whose records exist, and recover.lua checks
that again atomically with the move.

Steady state costs one ``SMEMBERS forkq:inflight`` (one entry per processor in
the cluster), one ``SMEMBERS processes`` and two ``EXISTS`` per process, every
``orphan_sweep_interval`` seconds; no SCAN, except once to rebuild a registry that some
client overwrote with another type (:func:`rebuild_registry`). For each in-flight list of a dead
process: the job goes back to the front of its queue, and the recovery counts
toward the job's poison-pill limit (at the limit it goes to the dead set with a
JobKilledError; :mod:`forkq.daemon.held_jobs`, the same step the master takes for a child
it reaped); the list is deleted and unregistered. Then the dead process leaves
``processes`` and its busy hashes are deleted (Sidekiq's ``ProcessSet`` cleanup does the
same for any process).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import redis

from forkq import keys
from forkq.connection import text
from forkq.daemon import held_jobs
from forkq.daemon.children.lease import LeaseLostError
from forkq.daemon.refusal import Recurring
from forkq.scripts import script

log = logging.getLogger(__name__)
T = TypeVar("T")

RECOVERED = "its process stopped heartbeating and the job was recovered"


@dataclass(frozen=True)
class Recovered:
    """One in-flight list the sweep dealt with."""

    identity: str
    inflight_key: str
    outcome: held_jobs.Outcome
    job: bytes


REFUSALS = Recurring(log)
"""Refusals (a key of the wrong type) reported at most once a minute per key."""


def sweep(client: redis.Redis, token: str, *, now: float, own: str = "",
          full: bool = True) -> list[Recovered]:
    """Recover the in-flight jobs of every dead process and forget it; what was recovered.
    The daemon ``own`` (the leader's) is left alone: its master settles its own children,
    and after a lapse of its liveness it knows its jobs are its own (:mod:`forkq.daemon.liveness`).
    Without ``full``, only the owners of registered in-flight lists are looked at (a dead
    process that holds none has nothing to recover: it is forgotten by the next full sweep).
    A sweep sends a fixed number of commands whatever the size of the fleet (:func:`dead_owners`).

    One bad item never stops the sweep: a list or record whose script Redis refuses (a
    key of the wrong type) is reported, naming the key, and left as it is; the sweep goes
    on with the others. Raises :class:`~forkq.daemon.children.lease.LeaseLostError` when
    ``token`` no
    longer holds the lease, and a Redis error when Redis does not answer.
    """
    lists = inflight_by_owner(client)
    candidates = owners(client, lists, own=own, full=full)
    recovered: list[Recovered] = []
    for identity in dead_owners(client, candidates):
        recovered += recover_process(client, token, identity, lists.get(identity, []), now=now)
    return recovered


def owners(client: redis.Redis, lists: dict[str, list[str]], *, own: str = "",
           full: bool = True) -> list[str]:
    """The processes a sweep looks at: the owners of ``lists`` (:func:`inflight_by_owner`)
    and, when ``full``, every member of ``processes``; never ``own``."""
    listed = _members(client, keys.PROCESSES) if full else set()
    return sorted((set(lists) | listed) - {own})


def recover_process(client: redis.Redis, token: str | None, identity: str,
                    inflight_keys: list[str], *, now: float, forget: bool = True
                    ) -> list[Recovered]:
    """Recover the jobs in ``inflight_keys`` of the dead process ``identity``, then forget it
    (leave ``processes``, drop its busy hashes) unless ``forget`` is false.

    ``token`` is the leader's (the owner is dead when its records have expired, checked
    again atomically), or None when the caller proved the owner gone on this host
    (:mod:`forkq.daemon.master.restart_recovery`). A refused item is reported and left; the
    others go on."""
    recovered = []
    for key in inflight_keys:
        found = refused_is_none(key, partial(_recover, client, token, identity=identity,
                                             key=key, now=now))
        if found is not None:
            recovered.append(found)
    if forget:
        refused_is_none(identity, partial(_forget, client, token, identity))
    return recovered


def refused_is_none(subject: str, step: Callable[[], T]) -> T | None:
    """Run one item's step; a refusal is reported (once a minute per subject) and gives None."""
    return REFUSALS.skip_refused(subject, "recovering orphans", step)


def _members(client: redis.Redis, key: str) -> set[str]:
    """The members of the set ``key``; none (reported) when it holds another type."""
    found = refused_is_none(key, partial(client.smembers, key))
    return {text(member) for member in found or ()}


def inflight_by_owner(client: redis.Redis) -> dict[str, list[str]]:
    """The registered in-flight lists by owner identity; when the registry holds another
    type than a set, the lists :func:`rebuild_registry` finds."""
    try:
        registered = {text(key) for key in client.smembers(keys.INFLIGHT_REGISTRY)}
    except redis.ResponseError:  # another type (or a refusal: the rebuild is refused too)
        registered = refused_is_none(keys.INFLIGHT_REGISTRY,
                                     partial(rebuild_registry, client)) or set()
    lists: dict[str, list[str]] = defaultdict(list)
    for key in registered:
        owner = keys.inflight_owner(key)
        if owner is not None:
            lists[owner].append(key)
    return lists


def rebuild_registry(client: redis.Redis) -> set[str]:
    """Replace an in-flight registry of another type than a set (any client may have
    written it; processors fetch on, unregistered, meanwhile) with the set of every
    in-flight list: one SCAN of the keyspace, only after such damage. The lists found."""
    found = {text(key) for key in client.scan_iter(match=keys.INFLIGHT_PREFIX + "*", count=1000,
                                                   _type="list")}

    held: list[str] = []  # the type replaced, as the (last) try of the transaction saw it

    def replace(pipe: redis.client.Pipeline) -> None:
        held[:] = [text(pipe.type(keys.INFLIGHT_REGISTRY))]
        if held[0] not in ("set", "none"):  # else mended meanwhile
            pipe.multi()
            pipe.delete(keys.INFLIGHT_REGISTRY)
            if found:
                pipe.sadd(keys.INFLIGHT_REGISTRY, *found)

    client.transaction(replace, keys.INFLIGHT_REGISTRY)
    kind = held[0]
    if kind not in ("set", "none"):
        log.warning("the in-flight registry %r held a %s, not a set: rebuilt from the %d "
                    "in-flight lists found", keys.INFLIGHT_REGISTRY, kind, len(found))
    return found


def dead_owners(client: redis.Redis, identities: list[str]) -> list[str]:
    """The identities that are not ``owner_alive`` (guard.lua; recover.lua checks again):
    a forkq daemon whose liveness key lapsed, or a process that keeps none whose process
    hash and beat hash have both expired. One ``MGET`` of every liveness key answers for
    the live daemons of the fleet; only the others are asked about their records."""
    if not identities:
        return []
    found = client.mget([keys.alive(identity) for identity in identities])
    identities = [identity for identity, value in zip(identities, found, strict=True)
                  if value is None]  # absent, or of another type (asked below)
    if not identities:
        return []
    with client.pipeline(transaction=False) as pipe:
        for identity in identities:
            pipe.exists(keys.alive(identity))
            pipe.hexists(identity, keys.FAILOVER_FIELD)
            pipe.exists(identity, keys.beats(identity))
        replies = pipe.execute(raise_on_error=False)  # HEXISTS of a key of another type
    answers = [replies[i:i + 3] for i in range(0, len(replies), 3)]
    return [identity for identity, (alive, keeps, records) in zip(identities, answers, strict=True)
            if alive == 0 and (keeps == 1 or records == 0)]


def _recover(client: redis.Redis, token: str | None, *, identity: str, key: str, now: float
             ) -> Recovered | None:
    held = held_jobs.read(client, key)
    try:
        back = held_jobs.give_back(client, key, held, count=True, how=RECOVERED, now=now,
                                   token=token, owner=identity)
    except held_jobs.FencedError as fenced:
        if fenced.code == -1:
            raise LeaseLostError("recovering " + key) from None
        return None  # the owner came back, or the list changed: look again next sweep
    if held.job is not None:
        log.warning("recovered from dead process %s: job %s: %s", identity, back.outcome,
                    held.job[:200].decode("utf-8", "replace"))
    return Recovered(identity, key, back.outcome, back.job)


def _forget(client: redis.Redis, token: str | None, identity: str) -> None:
    workers, work = keys.workers(identity)
    lua = script(client, "forget")
    result = int(lua(keys=[keys.LEADER, identity, keys.beats(identity), keys.PROCESSES,
                              workers, work, keys.alive(identity)], args=[token or "", identity]))
    if result < 0:
        raise LeaseLostError("forgetting " + identity)
    if result == 1:
        log.info("forgot dead process %s", identity)
