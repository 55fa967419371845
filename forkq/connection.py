"""Redis connection factory.

URLs: ``redis://``, ``rediss://`` (TLS), ``unix://`` and the word ``embedded``,
which means the unix socket of the private server that the master starts in
``embedded_dir`` (see :mod:`forkq.embedded`). AUTH/ACL users go in the URL
(``redis://user:secret@host:6379/0``).

Fork safety: a client built in the master must not be used in a child. Children
call :func:`connect` themselves after the fork; redis-py's pools also refuse to
reuse a connection across a pid change.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from redis.commands.core import Script

EMBEDDED = "embedded"
SOCKET_NAME = "redis.sock"


def embedded_socket(embedded_dir: str) -> str:
    """Absolute path of the embedded server's unix socket."""
    return os.path.join(os.path.abspath(embedded_dir), SOCKET_NAME)


def resolve_url(url: str, *, embedded_dir: str = ".forkq") -> str:
    """The URL to connect to: ``embedded`` becomes ``unix://<embedded_dir>/redis.sock``."""
    if url == EMBEDDED:
        return "unix://" + embedded_socket(embedded_dir)
    return url


def connect(
    url: str, *, embedded_dir: str = ".forkq", socket_timeout: float | None = None,
    connect_timeout: float = 5.0,
) -> redis.Redis:
    """A client for ``url`` speaking RESP2, answering bytes, with a connect timeout (5 s).

    ``socket_timeout`` bounds every reply; callers that must never hang (the
    master, heartbeat threads, the application's client) set it.
    """
    resolved = resolve_url(url, embedded_dir=embedded_dir)
    tcp = {} if resolved.startswith("unix:") else {"socket_keepalive": True}
    return redis.Redis.from_url(
        resolved, protocol=2, socket_connect_timeout=connect_timeout,
        socket_timeout=socket_timeout, decode_responses=False, **tcp
    )


def text(value: bytes | str) -> str:
    """A Redis reply value as text (replies are bytes; typed as bytes | str by redis-py)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def raw(value: bytes | str) -> bytes:
    """A Redis reply value as bytes."""
    return value if isinstance(value, bytes) else value.encode()


class Direct:
    """One connection of the caller's own, for a script called in a tight loop (a
    processor's fetch): no pool checkout (a poll and a getpid per call) and no retry
    wrapper. Not thread-safe; build it after fork.

    :meth:`evalsha` loads the script when the server does not know it. A connection or
    timeout error drops the connection (the next call reconnects) and propagates, as
    does a refusal (redis.ResponseError)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._conn: Any = client.connection_pool.make_connection()

    def evalsha(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """Run ``script`` (registered with the client given) with ``keys`` and ``args``."""
        try:
            return self._call(script, keys, args)
        except redis.exceptions.NoScriptError:
            script.sha = self._client.script_load(script.script)
            return self._call(script, keys, args)

    def _call(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        try:
            self._conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return self._conn.read_response()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self._conn.disconnect()
            raise

    def close(self) -> None:
        """Drop the connection."""
        self._conn.disconnect()


def round_trip(client: redis.Redis, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` in one write on one pooled connection; read every reply.

    What ``pipeline(transaction=False).execute(raise_on_error=False)`` does, without
    building a pipeline object for each push (its bookkeeping cost more than the
    encoding): a command Redis refused has its :class:`redis.ResponseError` in place of
    its reply; replies come raw (no response callbacks). Sent once, never resent: any
    other error (connect, write, timeout) drops the connection, so no stale reply is
    left on a pooled socket, and propagates.
    """
    pool = client.connection_pool
    conn: Any = pool.get_connection()  # redis-py types Connection methods loosely
    try:
        conn.send_packed_command(conn.pack_commands(commands))
        return [_reply(conn) for _ in commands]
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def _reply(conn: Any) -> Any:
    try:
        return conn.read_response()
    except redis.ResponseError as exc:
        return exc
