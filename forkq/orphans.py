"""The leader's orphan sweep: in-flight jobs of dead processes go back to their queues.

A process is dead when its process hash ``<identity>`` and its children's beat
hash ``forkq:beats:<identity>`` have both expired: no master beat and no child
beat for 60 s (:data:`~forkq.keys.PROCESS_TTL`). That happens when its host
died, or its master was SIGKILLed and its orphaned children finished or gave up
(see :mod:`forkq.childbeat`). A live master settles its own children's jobs;
the sweep never touches a process whose records exist, and recover.lua checks
that again atomically with the move.

Steady state costs one ``SMEMBERS forkq:inflight`` (one entry per processor in
the cluster), one ``SMEMBERS processes`` and two ``EXISTS`` per process, every
``orphan_sweep_interval`` seconds; no SCAN. For each in-flight list of a dead
process: the job goes back to the front of its queue, and the recovery counts
toward the job's poison-pill limit (:data:`~forkq.settle.KILL_LIMIT`; at the
limit it goes to the dead set with a JobKilledError); the list is deleted and
unregistered. Then the dead process leaves ``processes`` and its busy hashes
are deleted (Sidekiq's ``ProcessSet`` cleanup does the same for any process).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import redis

from forkq import keys, retry
from forkq import payload as payloads
from forkq.connection import raw, text
from forkq.errors import JobError, JobKilledError
from forkq.lease import LeaseLostError
from forkq.refusal import Recurring
from forkq.refusal import describe as describe_error
from forkq.scripts import source
from forkq.settle import KILL_LIMIT

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Recovered:
    """One in-flight list the sweep dealt with."""

    identity: str
    inflight_key: str
    outcome: str  # requeued | dead | dropped | empty
    job: bytes


REFUSALS = Recurring(log)
"""Refusals (a key of the wrong type) reported at most once a minute per key."""


def sweep(client: redis.Redis, token: str, *, now: float) -> list[Recovered]:
    """Recover the in-flight jobs of every dead process and forget it; what was recovered.

    One bad item never stops the sweep: a list or record whose script Redis refuses (a
    key of the wrong type) is reported, naming the key, and left as it is; the sweep goes
    on with the others. Raises :class:`~forkq.lease.LeaseLostError` when ``token`` no
    longer holds the lease, and a Redis error when Redis does not answer.
    """
    lists = inflight_by_owner(client)
    candidates = sorted(set(lists) | _members(client, keys.PROCESSES))
    recovered: list[Recovered] = []
    for identity in _dead(client, candidates):
        recovered += recover_process(client, token, identity, lists.get(identity, []), now=now)
    return recovered


def recover_process(client: redis.Redis, token: str | None, identity: str,
                    inflight_keys: list[str], *, now: float, forget: bool = True
                    ) -> list[Recovered]:
    """Recover the jobs in ``inflight_keys`` of the dead process ``identity``, then forget it
    (leave ``processes``, drop its busy hashes) unless ``forget`` is false.

    ``token`` is the leader's (the owner is dead when its records have expired, checked
    again atomically), or None when the caller proved the owner gone on this host
    (:mod:`forkq.reclaim`). A refused item is reported and left; the others go on."""
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
    try:
        result = step()
    except redis.ResponseError as exc:
        REFUSALS.report(subject, "recovering orphans: %s left as it is: %s", subject,
                        describe_error(exc))
        return None
    REFUSALS.clear(subject)
    return result


def _members(client: redis.Redis, key: str) -> set[str]:
    """The members of the set ``key``; none (reported) when it holds another type."""
    found = refused_is_none(key, partial(client.smembers, key))
    return {text(member) for member in found or ()}


def inflight_by_owner(client: redis.Redis) -> dict[str, list[str]]:
    """The registered in-flight lists by owner identity (none when the registry is refused)."""
    lists: dict[str, list[str]] = defaultdict(list)
    for key in _members(client, keys.INFLIGHT_REGISTRY):
        owner = keys.inflight_owner(key)
        if owner is not None:
            lists[owner].append(key)
    return lists


def _dead(client: redis.Redis, identities: list[str]) -> list[str]:
    """The identities whose process hash and beat hash have both expired."""
    if not identities:
        return []
    with client.pipeline(transaction=False) as pipe:
        for identity in identities:
            pipe.exists(identity, keys.beats(identity))
        counts = pipe.execute()
    return [identity for identity, count in zip(identities, counts, strict=True) if count == 0]


def _recover(client: redis.Redis, token: str | None, *, identity: str, key: str, now: float
             ) -> Recovered | None:
    held = client.lrange(key, 0, 1)
    job = raw(held[1]) if len(held) == 2 else None  # None: the list holds no job
    mode, jid, dead_entry = _decide(job, _queue_name(held[0]) if held else "default", now)
    script = client.register_script(source("recover"))
    result = script(
        keys=[keys.LEADER, key, keys.INFLIGHT_REGISTRY, identity, keys.beats(identity),
              keys.kills(jid), keys.DEAD],
        args=[token or "", job or b"", mode, KILL_LIMIT, dead_entry, keys.KILLS_TTL, repr(now),
              repr(now - keys.DEAD_TIMEOUT), keys.DEAD_MAX_JOBS])
    if result == -1:
        raise LeaseLostError("recovering " + key)
    if isinstance(result, int):
        return None  # the owner came back, or the list changed: look again next sweep
    outcome = result.decode()
    if job is not None:
        log.warning("recovered from dead process %s: job %s: %s", identity, outcome,
                    job[:200].decode("utf-8", "replace"))
    return Recovered(identity, key, outcome, job or b"")


def _queue_name(element: bytes | str) -> str:
    """The queue an in-flight list names (recover.lua's rule: else ``default``)."""
    name = text(element)
    return name[6:] if name.startswith("queue:") and len(name) > 6 else "default"


def _decide(job: bytes | None, queue: str, now: float) -> tuple[str, str, str]:
    """How to recover ``job`` held for ``queue``: (mode, jid, dead-set entry, "" = drop).

    A malformed job is buried at once with its bytes kept ("bury"); a job is otherwise
    requeued and its death counted ("count"), the entry being written at the death limit."""
    if job is None:
        return "requeue", "", ""  # nothing to requeue: the list is just deleted
    try:
        payload = payloads.decode(job)
    except JobError as exc:
        log.error("queue %s: a dead process held %s; moved to the dead set", queue, exc)
        failure = retry.unrunnable(job, queue, exc, now)
        return "bury", "", failure.payload if failure.mode == "dead" else ""
    jid = payloads.kill_key_id(payload, job)
    message = (f"its processor died {KILL_LIMIT} times while running it (last: its process "
               "stopped heartbeating and the job was recovered)")  # used only at the limit
    retry.record_error(payload, retry.error_class_name(JobKilledError()), message, now)
    failure = retry.bury(payload, now)
    return "count", jid, failure.payload if failure.mode == "dead" else ""


def _forget(client: redis.Redis, token: str | None, identity: str) -> None:
    workers, work = keys.workers(identity)
    script = client.register_script(source("forget"))
    result = int(script(keys=[keys.LEADER, identity, keys.beats(identity), keys.PROCESSES,
                              workers, work], args=[token or "", identity]))
    if result < 0:
        raise LeaseLostError("forgetting " + identity)
    if result == 1:
        log.info("forgot dead process %s", identity)
