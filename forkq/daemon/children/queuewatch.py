"""How an idle processor (or the scheduler) waits for a change without polling.

:class:`QueueWatch` keeps one extra connection that has asked the server for
broadcast invalidations of every key under some prefixes (``CLIENT TRACKING ON
REDIRECT <itself> BCAST PREFIX queue:``, Redis >= 6.0 / Valkey) and subscribes to
``__redis__:invalidate``. Any write to such a key, by any client (Ruby's too),
makes that connection readable within a millisecond, so an idle processor
blocks in ``poll`` and fetches again when woken. The scheduler leader watches ``schedule``
and ``retry`` the same way; a follower only listens to a channel (no prefixes: no
tracking), on which a leader that hands over says so. Messages only ever cause an
extra fetch, never a missed one: the watch is armed before the processor's
first fetch and stays armed.

When the server refuses tracking (an ACL without ``client|tracking``, an old
server), the watch falls back to polling every :data:`POLL_INTERVAL` seconds.

A processor pauses its watch while it is busy or another lane holds the watch token
(:mod:`forkq.daemon.watch_token`; UNSUBSCRIBE: Redis drops the invalidations of a
tracking client whose redirect target is not subscribed), so nothing piles up in Redis for
a connection nobody reads; :meth:`QueueWatch.arm` or the next wait subscribes again (the
wait then returns at once, so the processor fetches once more before it blocks).
A broken watch connection is reopened on the next wait, which then returns for one more
fetch before blocking (a push meanwhile made no invalidation for the new connection). No
keys are written.
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from forkq.daemon import pipes

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.5
QUEUE_WATCH = ("queue:", "forkq:paused")
"""What an idle processor watches: every queue, and the paused-queues set (a resume)."""
CHANNEL = "__redis__:invalidate"


class QueueWatch:
    """Readable-when-a-queue-changes connection for one processor."""

    def __init__(self, redis_client: Any, prefixes: tuple[str, ...] = ("queue:",),
                 name: str = "", channel: str = CHANNEL) -> None:
        self._pool = redis_client.connection_pool
        self._prefixes = prefixes  # none: only ``channel`` is listened to, no key tracking
        self._channel = channel
        self._name = name  # the connection's CLIENT SETNAME, if any
        self._conn: Any = None
        self._refused = False
        self._paused = False

    def open(self) -> None:
        """Arm the watch (before the first fetch). A server that refuses tracking switches
        this watch to polling for good; a connection error propagates (redis.RedisError)."""
        if self._conn is not None or self._refused:
            return
        conn = self._pool.make_connection()
        try:
            conn.connect()
            if self._name:
                conn.send_command("CLIENT", "SETNAME", self._name)
                conn.read_response()
            if self._prefixes:
                conn.send_command("CLIENT", "ID")
                client_id = conn.read_response()
                prefixes = [word for prefix in self._prefixes for word in ("PREFIX", prefix)]
                conn.send_command("CLIENT", "TRACKING", "ON", "REDIRECT", client_id, "BCAST",
                                  *prefixes)
                conn.read_response()
            conn.send_command("SUBSCRIBE", self._channel)
            conn.read_response()
        except redis.ResponseError as exc:
            conn.disconnect()
            self._refused = True
            log.warning("queue watch refused by the server (%s); idle processors poll every "
                        "%.1fs", exc, POLL_INTERVAL)
            return
        except BaseException:
            conn.disconnect()
            raise
        self._conn = conn

    def wait(self, timeout: float, wake_fd: int) -> bool:
        """Block until a queue changed, ``wake_fd`` is readable, or ``timeout``.

        Returns True when ``wake_fd`` became readable. A wait that opens the connection (the
        first, or after it broke) returns False at once once subscribed: a push between the
        caller's last fetch and the subscription made no invalidation for it, so the caller
        fetches once more before it blocks.
        """
        if self._conn is None and not self._refused:
            try:
                self.open()
            except Exception:  # noqa: BLE001 - reported by the next fetch if Redis is down
                return _wait_fd(wake_fd, min(timeout, POLL_INTERVAL))
            if self._conn is not None:
                return False
        if self._conn is None:
            return _wait_fd(wake_fd, min(timeout, POLL_INTERVAL))
        try:
            if self._paused:
                self._rearm()
                return False
            if self._drain():
                return False
            readable = pipes.readable([self._conn._sock.fileno(), wake_fd], timeout)
            self._drain()
        except Exception:  # noqa: BLE001 - drop the connection; reopened on next wait
            self.close()
            return False
        return wake_fd in readable

    def fileno(self) -> int | None:
        """The watch connection's socket, readable when a watched key changed (for a caller
        with its own poll); None while it is not open, refused or paused."""
        if self._conn is None or self._paused or self._conn._sock is None:
            return None
        return int(self._conn._sock.fileno())

    def consume(self) -> bool:
        """Read what arrived without blocking; True if a watched key changed. Errors drop
        the connection (the next :meth:`open` makes a new one)."""
        if self._conn is None:
            return False
        try:
            return self._drain()
        except Exception:  # noqa: BLE001 - reopened by the caller
            self.close()
            return True

    def arm(self) -> None:
        """Make sure invalidations arrive from now on (open, or subscribe again after
        :meth:`pause`), before the fetch that precedes the next :meth:`wait`. Errors drop
        the connection (the next wait reopens it)."""
        try:
            if self._conn is None:
                self.open()
            elif self._paused:
                self._rearm()
        except Exception:  # noqa: BLE001 - reported by the next fetch if Redis is down
            self.close()

    def pause(self) -> None:
        """Stop receiving invalidations until the next :meth:`wait` (no round trip)."""
        if self._conn is None or self._paused:
            return
        try:
            self._conn.send_command("UNSUBSCRIBE", self._channel)
        except Exception:  # noqa: BLE001 - reopened on the next wait
            self.close()
            return
        self._paused = True

    def _rearm(self) -> None:
        """Subscribe again after :meth:`pause`. A paused connection the server closed
        meanwhile (a client no longer subscribed is idle for the server's ``timeout``) is
        replaced by a new one at once, so the subscription still comes before the fetch
        that follows. Raises what opening raises."""
        try:
            self._resume()
        except Exception:  # noqa: BLE001 - replaced below
            self.close()
            self.open()

    def _resume(self) -> None:
        """Subscribe again, discarding what arrived before the unsubscribe took effect."""
        self._conn.send_command("SUBSCRIBE", self._channel)
        while True:
            reply = self._conn.read_response()
            if isinstance(reply, list) and reply and reply[0] in (b"subscribe", "subscribe"):
                self._paused = False
                return

    def _drain(self) -> bool:
        """Consume pending invalidations; True if there were any."""
        seen = False
        while self._conn.can_read(timeout=0):
            self._conn.read_response()
            seen = True
        return seen

    def close(self) -> None:
        """Drop the watch connection."""
        if self._conn is not None:
            self._conn.disconnect()
            self._conn = None
        self._paused = False


def _wait_fd(fd: int, timeout: float) -> bool:
    return bool(pipes.readable([fd], timeout))
