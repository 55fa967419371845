"""Cancelling jobs by jid: ``forkq cancel`` and :func:`forkq.api.cancel`.

:func:`cancel` first records the request (``forkq:cancels``, jid → expiry, kept
:data:`~forkq.keys.CANCEL_TTL` seconds), then looks for the job where a job moves, in that
order: ``schedule``, ``retry``, each queue, the processors' in-flight lists. A job found
waiting is removed where it is (``ZREM`` / ``LREM`` of its exact bytes) and the request
withdrawn. A job found in an in-flight list is running (or held by a processor about to
run it): the request stands, and the master of the daemon running it kills that processor
within a second of the request (:mod:`forkq.daemon.master.cancels`; the processor is replaced
at once) and files the job to ``dead`` with ``forkq.JobCancelledError``: never retried. A
job that moves while it is looked for (a queue → a processor) is found at its next place,
and the standing request catches it there. A job in ``dead`` is left there; one found
nowhere was done (or never existed) and the request is withdrawn.

A job can also look at the request itself (:func:`forkq.cancel_requested`) and stop early.

Cost: each sorted set is a ``ZSCAN`` for the jid; each queue is read whole (O(its
length)), as Sidekiq's ``Queue#find_job``; the in-flight lists come from their registry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import redis

from forkq import keys
from forkq.connection import raw, text
from forkq.ops.queues import Queue
from forkq.ops.records import JobRecord
from forkq.ops.sorted_sets import DeadSet, JobSet, RetrySet, ScheduledSet

Outcome = Literal["unscheduled", "removed from retries", "dequeued", "stopping", "dead",
                  "not found"]


@dataclass(frozen=True)
class Cancelled:
    """What :func:`cancel` did for one jid: ``where`` names the queue, set or in-flight list."""

    jid: str
    outcome: Outcome
    where: str = ""

    def describe(self) -> str:
        """One line for the operator."""
        where = f" ({self.where})" if self.where else ""
        return {
            "unscheduled": f"{self.jid}: removed from the scheduled jobs",
            "removed from retries": f"{self.jid}: removed from the retries",
            "dequeued": f"{self.jid}: removed from queue {self.where}",
            "stopping": f"{self.jid}: running{where}; its processor is being stopped",
            "dead": f"{self.jid}: already dead; left in the dead set",
            "not found": f"{self.jid}: not found (done, or no such job)",
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
    found = _waiting(client, jid) or _running(client, jid)
    if found is None:
        found = Cancelled(jid, "dead" if DeadSet(client).find_job(jid) else "not found")
    if found.outcome != "stopping":
        withdraw(client, jid)
    return found


def withdraw(client: redis.Redis, jid: str) -> None:
    """Forget the request to cancel ``jid`` (it was carried out, or there is nothing to do)."""
    client.zrem(keys.CANCELS, jid)


def _waiting(client: redis.Redis, jid: str) -> Cancelled | None:
    """Remove ``jid`` from the first place it waits in; None when it waits nowhere."""
    sets: list[tuple[JobSet, Outcome]] = [(ScheduledSet(client), "unscheduled"),
                                          (RetrySet(client), "removed from retries")]
    for job_set, outcome in sets:
        entry = job_set.find_job(jid)
        if entry is not None and job_set.delete(entry):
            return Cancelled(jid, outcome, job_set.name)
    for queue in Queue.all(client):
        job = queue.find_job(jid)
        if job is not None and queue.delete(job):
            return Cancelled(jid, "dequeued", queue.name)
    return None


def _running(client: redis.Redis, jid: str) -> Cancelled | None:
    """The in-flight list holding ``jid``, if any (a key of another type is passed over)."""
    try:
        registered = client.smembers(keys.INFLIGHT_REGISTRY)
    except redis.ResponseError:  # the registry holds another type: nothing to look in
        return None
    for key in sorted(text(member) for member in registered):
        try:
            held = client.lrange(key, 0, -1)
        except redis.ResponseError:
            continue
        if any(JobRecord(raw(element)).jid == jid for element in held[1::2]):
            return Cancelled(jid, "stopping", key)
    return None
