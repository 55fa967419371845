"""Cancelling jobs by jid: ``forkq cancel`` and :func:`forkq.api.cancel`.

:func:`cancel` first records the request (``forkq:cancels``, jid → expiry, kept
:data:`~forkq.keys.CANCEL_TTL` seconds), then looks for the job where a job moves, in that
order (:func:`forkq.ops.lookup.find_job`): ``schedule``, each queue, the waiting lines of
concurrency limits, the processors' in-flight lists, ``retry``. A job found waiting is
removed where it is (``ZREM`` / ``LREM`` of its exact bytes, with its unique lock:
``remove.lua``) and the request withdrawn. A job found in an in-flight list is running (or
held by a processor about to run it): the request stands, and the job is stopped
cooperatively, then by force (:mod:`forkq.daemon.master.cancels`): it sees the request at
once (:func:`forkq.cancel_requested` turns True) and may clean up and return or raise; the
master of the daemon running it kills its processor (replaced at once) if it still runs it
``cancel_grace`` seconds (default 5) after the master first saw it running. Either way the job is
filed to ``dead`` with ``forkq.JobCancelledError`` (never retried) and the request withdrawn
in the same step; a processor that dies meanwhile, or a daemon, leaves a job that is filed
the same way by whoever takes it back (:mod:`forkq.daemon.held_jobs`), never run again. A
job that completes within the grace without looking is done; the request is then withdrawn.
A job that moves while it is looked for (a queue → a processor) is found at its next place,
and the standing request catches it there. A job in ``dead`` is left there; one found
nowhere was done (or never existed) and the request is withdrawn.

Cost: the look-up's (O(total jobs), searched on the server). A job a Sidekiq process runs
cannot be stopped from here (it is reported not found); one completed but not yet
acknowledged is done (not found).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import redis

from forkq import keys
from forkq.ops.lookup import Place, find_job
from forkq.ops.queues import remove
from forkq.ops.sorted_sets import DeadSet
from forkq.printable import printable

Outcome = Literal["unscheduled", "removed from retries", "dequeued", "unblocked", "stopping",
                  "stopped", "completed", "dead", "not found"]


@dataclass(frozen=True)
class Cancelled:
    """What :func:`cancel` did for one jid: ``where`` names the queue, set or in-flight list
    (for programs; the operator's line names the job, ``job_class`` and jid, not keys)."""

    jid: str
    outcome: Outcome
    where: str = ""
    job_class: str = ""  # as the job was found ("" when it was not)

    def describe(self) -> str:
        """One line for the operator (names escaped: :mod:`forkq.printable`)."""
        return printable(self._describe())

    def _describe(self) -> str:
        job = f"{self.job_class} {self.jid}" if self.job_class else self.jid
        return {
            "unscheduled": f"{job}: removed from the scheduled jobs",
            "removed from retries": f"{job}: removed from the retries",
            "dequeued": f"{job}: removed from queue {self.where}",
            "unblocked": f"{job}: removed from its concurrency limit's waiting line",
            "stopping": f"{job}: running; asked to stop (killed after the daemon's "
                        "cancel_grace if it goes on)",
            "stopped": f"{job}: stopped; filed to dead as cancelled",
            "completed": f"{job}: completed before it could be stopped",
            "dead": f"{job}: already dead; left in the dead set",
            "not found": f"{job}: not found (done, or no such job)",
        }[self.outcome]


def cancel(client: redis.Redis, jid: str, *, now: float | None = None) -> Cancelled:
    """Cancel job ``jid`` wherever it is (see the module's rules). Redis errors propagate
    (the request may then stand: it expires)."""
    if not jid or not isinstance(jid, str):
        raise ValueError(f"not a jid: {jid!r}")
    now = time.time() if now is None else now
    with client.pipeline(transaction=False) as pipe:
        pipe.zremrangebyscore(keys.CANCELS, "-inf", now)
        pipe.zadd(keys.CANCELS, {jid: now + keys.CANCEL_TTL})
        pipe.execute()
    result = _act(client, jid, find_job(client, jid).places)
    if result.outcome in ("dead", "not found") and client.zscore(keys.CANCELS, jid) is None:
        return settled(client, jid)  # the request was carried out during the look-up
    if result.outcome != "stopping":
        withdraw(client, jid)
    return result


def settled(client: redis.Redis, jid: str) -> Cancelled:
    """What became of running job ``jid`` once its request was withdrawn: filed to ``dead``
    as cancelled ("stopped"), or it completed within the grace without looking."""
    entry = DeadSet(client).find_job(jid)
    if entry is not None and entry.item.get("error_class") == CANCELLED:
        return Cancelled(jid, "stopped", keys.DEAD, entry.klass)
    return Cancelled(jid, "completed")


CANCELLED = "forkq.JobCancelledError"


def withdraw(client: redis.Redis, jid: str) -> None:
    """Forget the request to cancel ``jid`` (it was carried out, or there is nothing to do)."""
    client.zrem(keys.CANCELS, jid)


def _act(client: redis.Redis, jid: str, places: list[Place]) -> Cancelled:
    """Remove the job from the first place it waits in (by the bytes it was read as: a job
    that left meanwhile is not removed), or find it in a forkq processor's hands."""
    dead: Place | None = None
    for place in places:
        klass = place.job.klass
        if place.kind in _SETS and remove(client, place.key, place.job.raw, kind="zset"):
            return Cancelled(jid, _SETS[place.kind], place.key, klass)
        if place.kind == "queued" and remove(client, place.key, place.job.raw):
            return Cancelled(jid, "dequeued", place.queue, klass)
        if place.kind == "blocked" and remove(client, place.key, place.job.raw):
            return Cancelled(jid, "unblocked", place.key, klass)
        if (place.key.startswith(keys.INFLIGHT_PREFIX) and place.state != "completed"
                and place.kind in ("running", "in-flight")):
            return Cancelled(jid, "stopping", place.key, klass)
        if place.kind == "dead":
            dead = dead or place
    if dead is not None:
        return Cancelled(jid, "dead", keys.DEAD, dead.job.klass)
    return Cancelled(jid, "not found")


_SETS: dict[str, Outcome] = {"scheduled": "unscheduled", "retry": "removed from retries"}
