"""One-write round trips: commands sent in one write on one connection, every reply read.

What ``pipeline(transaction=False).execute(raise_on_error=False)`` does, without building a
pipeline object per call: a command Redis refused has its :class:`redis.ResponseError` in
place of its reply; replies come raw (no response callbacks). Sent once, never resent: any
other error (connect, write, timeout) drops the connection, so no stale reply is left on
it, and propagates.

A connection kept between calls is checked before each use (:func:`drop_if_closed`, one
``poll``): one the server closed while it sat idle (its ``timeout``, a restart,
``CLIENT KILL``) is replaced there, before anything is sent, so the call goes through
instead of failing with "Broken pipe". (One that died without the server closing it — a
host gone, a network cut — looks healthy until the call fails.)

Two ways to get the connection:

- :func:`round_trip` checks one out of the client's pool and releases it (for a client
  given by the application, whose pool may have a limit);
- :class:`KeptConnections` keeps the connections it used, for the pushes of a client whose
  pool forkq built (unbounded). redis-py's checkout and release cost a push about a third
  of its CPU (redis-py 8: a pid check and a lock each way, a readiness ``poll`` — a system
  call —, observability counters), where a connection that only ever carries whole round
  trips needs one check: that the server did not close it (:func:`drop_if_closed`).
"""

from __future__ import annotations

import os
import select
from typing import Any

import hiredis
import redis

Commands = list[tuple[Any, ...]]

_forks = 0
"""How many times this process's line has forked (counted in each child)."""


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


def round_trip(client: redis.Redis, commands: Commands) -> list[Any]:
    """Send ``commands`` in one write on a connection checked out of ``client``'s pool."""
    pool = client.connection_pool
    conn: Any = pool.get_connection()  # redis-py types Connection methods loosely
    try:
        return exchange(conn, commands)
    finally:
        pool.release(conn)


def drop_if_closed(conn: Any) -> None:
    """Disconnect ``conn`` when its socket is readable while no reply is awaited: the server
    closed it (or sent what nobody asked for), and a command written to it would be lost
    in flight. It reconnects at its next use. One ``poll`` system call; call it only
    between round trips."""
    sock = conn._sock
    if sock is None:
        return
    poller = select.poll()
    try:
        poller.register(sock.fileno(), select.POLLIN)  # -1 (ValueError): closed under us
        closed = bool(poller.poll(0))
    except (OSError, ValueError):
        closed = True
    if closed:
        conn.disconnect()


def exchange(conn: Any, commands: Commands) -> list[Any]:
    """Send ``commands`` in one write on ``conn`` (connecting it if it is not) and read every
    reply; on any error the connection is dropped (it reconnects at its next use)."""
    try:
        conn.send_packed_command([pack(commands)])
        return [_reply(conn) for _ in commands]
    except BaseException:
        conn.disconnect()
        raise


def pack(commands: Commands) -> bytes:
    """``commands`` in RESP, as redis-py's hiredis packer writes them (str as UTF-8, int and
    float by ``repr``, bytes as they are), without its per-argument Python checks, which
    only matter for arguments a push never has (a ``memoryview``, a command name with a
    space)."""
    return b"".join(map(hiredis.pack_command, commands))


def _reply(conn: Any) -> Any:
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        return exc


class KeptConnections:
    """The connections of one client's round trips, kept between calls.

    A call takes an idle connection (or, when none is idle, checks a new one out of the
    pool, with the pool's checks) and puts it back after; ``list.pop`` and ``list.append``
    are atomic, so threads need no lock and each thread pushing at once has its own
    connection. The kept connections stay *in use* in the pool's view, so the client's
    ``close()`` (the pool's disconnect, in-use connections included) closes them, and the
    next call reconnects, as a pooled connection would. After a ``fork`` the child drops
    the parent's connections without using or closing them, and checks out its own.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._idle: list[Any] = []
        self._forks = _forks

    def round_trip(self, commands: Commands) -> list[Any]:
        """Send ``commands`` in one write on a kept connection; every reply, as
        :func:`exchange`."""
        if self._forks != _forks:
            self._idle, self._forks = [], _forks
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._pool.get_connection()  # checked by the pool
        try:
            drop_if_closed(conn)
            return exchange(conn, commands)
        finally:
            self._idle.append(conn)
