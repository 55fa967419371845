"""An idle processor of one queue waits inside Redis: ``BLMOVE`` into its in-flight list.

When a processor fetches from a single queue and finds it empty, fetch.lua *arms* its
in-flight list (``{queue:<name>}``) and the processor sends, on a connection of its own,
``BLMOVE queue:<name> <in-flight list> RIGHT RIGHT <timeout>`` (each idle lane of
:mod:`forkq.daemon.children.processor` on its own connection). A push by any client (Ruby's too) is
then handed by Redis to exactly one waiting processor — the one that has waited longest —
and the job lands in that processor's in-flight list as ``{queue key, job}`` in the same
step, so the guarantee is the reliable fetch's: a job is always in a queue or in exactly
one in-flight list. No message is sent to the other idle processors, and nothing
accumulates for a busy one.

The waiting connection is named ``forkq-wait:<in-flight list>`` (:func:`name_for`).
Whoever takes back the list of a holder that is gone first ends that connection
(:func:`forkq.daemon.held_jobs.read`), so a ``BLMOVE`` Redis has not yet seen closed cannot
move a job into a list that was already given back.

A stop request (the wake pipe) while waiting drops the connection: a job Redis moved in at
that moment stays in the in-flight list, and the master gives it back unchanged to the
front of its queue when it settles the exited child.

A waiting connection the server closes while it waits (``CLIENT KILL`` by an operator or by
the take-back above, a proxy, a failover) is no outage: the wait ends as after a timeout,
with a warning, and the processor fetches again on its own connection, where an outage
shows for what it is. Only a second such close within :data:`CLOSED_AGAIN` seconds is
raised (the caller's outage handling then backs off), so a server that closes every
blocking command at once costs no busy loop.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from forkq import keys
from forkq.connection import drop_if_closed
from forkq.daemon import pipes

log = logging.getLogger(__name__)

NAME_PREFIX = keys.WAITER_PREFIX
CLOSED_AGAIN = 1.0
"""Seconds within which a second close of the waiting connection by the server is raised
as an outage rather than waited through."""
WAKE = object()
"""What :meth:`BlockingWait.wait` returns when the wake pipe became readable."""


def name_for(inflight_key: str) -> str:
    """The client name of the connection waiting to move a job into ``inflight_key``
    (CLIENT SETNAME allows no spaces or control characters: those become ``?``)."""
    return NAME_PREFIX + "".join(c if "!" <= c <= "~" else "?" for c in inflight_key)


class BlockingWait:
    """One processor's blocking move from ``queue_key`` into ``inflight_key``."""

    def __init__(self, redis_client: Any, inflight_key: str, queue_key: str) -> None:
        self._pool = redis_client.connection_pool
        self._inflight = inflight_key
        self._queue = queue_key
        self._conn: Any = None
        self._closed_at = -CLOSED_AGAIN  # monotonic time the server last closed a wait

    def wait(self, timeout: int, wake_fd: int) -> bytes | object | None:
        """Wait up to ``timeout`` seconds for a job to be moved into the (armed) in-flight
        list; the job's bytes, None after the timeout or when the server closed the
        connection while it waited (see the module's doc), or :data:`WAKE` when ``wake_fd``
        became readable (the connection is dropped then).

        Raises redis.RedisError when the connection cannot be made, Redis refuses the move,
        or closes the connection a second time within :data:`CLOSED_AGAIN` seconds (the
        caller's outage handling applies); the connection is dropped then too.
        """
        waiting = False  # the move was sent: a close from now on is the server's
        try:
            conn = self._connection()
            conn.send_command("BLMOVE", self._queue, self._inflight, "RIGHT", "RIGHT", timeout)
            waiting = True
            fd = conn._sock.fileno()
            readable = pipes.readable([fd, wake_fd], timeout + 5)
            if fd not in readable:
                self.close()
                return WAKE if wake_fd in readable else None
            job: bytes | None = conn.read_response()
        except redis.ConnectionError as exc:
            self.close()
            if waiting and self._closed_while_waiting(exc):
                return None
            raise
        except BaseException:
            self.close()
            raise
        return job

    def _closed_while_waiting(self, exc: redis.ConnectionError) -> bool:
        """Whether the server's close of the waiting connection (``exc``) ends the wait as
        a timeout does: unless it closed the one before less than :data:`CLOSED_AGAIN`
        seconds ago (it is logged)."""
        now = time.monotonic()
        if now - self._closed_at < CLOSED_AGAIN:
            return False
        self._closed_at = now
        log.warning("the server closed this processor's waiting connection (%s: CLIENT KILL, "
                    "a proxy or a failover?); fetching again", exc)
        return True

    def _connection(self) -> Any:
        """The waiting connection, connected and named: a new one when there is none or the
        server closed it since the last wait (a new connection, not a reconnect, which
        would lose the ``CLIENT SETNAME`` that :func:`end_waiters` finds it by)."""
        if self._conn is not None:
            drop_if_closed(self._conn)
            if self._conn._sock is None:  # the server closed it since the last wait
                self._conn = None
        if self._conn is None:
            conn = self._pool.make_connection()
            try:
                conn.connect()
                conn.send_command("CLIENT", "SETNAME", name_for(self._inflight))
                conn.read_response()
            except BaseException:
                conn.disconnect()
                raise
            self._conn = conn
        return self._conn

    def close(self) -> None:
        """Drop the waiting connection (Redis ends its BLMOVE)."""
        if self._conn is not None:
            self._conn.disconnect()
            self._conn = None


def end_waiters(client: redis.Redis, inflight_key: str) -> int:
    """Close every connection still waiting to move a job into ``inflight_key``; how many.

    Raises redis.ResponseError when the server refuses CLIENT LIST or CLIENT KILL (an ACL
    without them)."""
    name = name_for(inflight_key)
    ended = 0
    for entry in client.client_list(_type="normal"):
        if entry.get("name") == name:
            ended += int(client.client_kill_filter(_id=entry["id"]) or 0)
    return ended
