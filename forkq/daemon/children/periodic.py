"""Firing a periodic job's tick exactly once (the leader's side of :mod:`forkq.cron`).

``forkq:periodic`` remembers the last tick handled per entry; periodic.lua enqueues a tick
only if it is newer than that and only for the lease holder, atomically, so neither two
leaders nor a leader and its successor enqueue the same tick. The payload carries
``periodic`` (the entry name) and ``periodic_at`` (the tick's epoch) besides the job's
options (:func:`forkq.cron.payload_for`).
"""

from __future__ import annotations

import redis

from forkq import keys
from forkq import payload as payloads
from forkq.connection import text
from forkq.daemon.children.lease import LeaseLostError
from forkq.scripts import script


def last_handled(client: redis.Redis) -> dict[str, float]:
    """Entry name → last tick handled, from ``forkq:periodic``."""
    found: dict[str, float] = {}
    for name, value in client.hgetall(keys.PERIODIC).items():
        try:
            found[text(name)] = float(value)
        except ValueError:
            continue
    return found


def fire(client: redis.Redis, token: str, *, name: str, tick: float,
         payload: payloads.Payload | None) -> bool:
    """Mark ``tick`` handled for entry ``name`` and enqueue ``payload`` (None: only mark).

    True when this call handled the tick; False when it was handled before. Raises
    :class:`~forkq.daemon.children.lease.LeaseLostError` if ``token`` no longer holds the lease.
    """
    queue = str(payload["queue"]) if payload else ""
    lua = script(client, "periodic")
    result = int(lua(keys=[keys.LEADER, keys.PERIODIC, keys.queue(queue), keys.QUEUES],
                        args=[token, name, repr(tick),
                              payloads.encode(payload) if payload else "", queue]))
    if result < 0:
        raise LeaseLostError("periodic job " + name)
    return result == 1


