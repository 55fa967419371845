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
from collections.abc import Callable
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
    """One connection of the caller's own, for scripts called in a tight loop (a
    processor's fetch and acknowledgements): no pool checkout (a poll and a getpid per
    call) and no retry wrapper. Not thread-safe; build it after fork.

    :meth:`send` sends a script call without waiting for its answer; the answers are read
    before the next :meth:`evalsha` or by :meth:`answer`. Scripts sent that way must be
    idempotent: after a connection error, everything sent and not answered is sent again.
    A script the server does not know is loaded and called again. A connection or timeout
    error drops the connection (the next call reconnects) and propagates, as does a
    refusal (redis.ResponseError, after every pending answer was read)."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._conn: Any = client.connection_pool.make_connection()
        self._unanswered: list[tuple[Script, list[str], list[Any]]] = []
        self._resend = False
        self._loaded: set[str] = set()

    def evalsha(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """Run ``script`` (registered with the client given) with ``keys`` and ``args``."""
        self.answer()
        try:
            return self._call(script, keys, args)
        except redis.exceptions.NoScriptError:
            self._load(script)
            return self._call(script, keys, args)

    def _load(self, script: Script) -> None:
        script.sha = self._client.script_load(script.script)
        self._loaded.add(script.sha)

    def send(self, script: Script, keys: list[str], args: list[Any]) -> None:
        """Send an idempotent script call; its answer is read later."""
        if script.sha not in self._loaded:
            self._load(script)
        self._unanswered.append((script, keys, args))
        if not self._resend:
            self._guard(lambda: self._send(script, keys, args))

    @property
    def pending(self) -> int:
        """Calls sent (or to send again) whose answers were not read yet."""
        return len(self._unanswered)

    def answer(self) -> None:
        """Read the answers to what :meth:`send` sent (sending it again after a connection
        error); raises the first refusal among them, once all were read."""
        if not self._unanswered:
            return
        if self._resend:
            for call in self._unanswered:
                self._guard(lambda call=call: self._send(*call))  # type: ignore[misc]
            self._resend = False
        refusals: list[redis.ResponseError] = []
        unknown: list[tuple[Script, list[str], list[Any]]] = []
        for call in self._unanswered[:]:
            try:
                self._guard(self._conn.read_response)
            except redis.exceptions.NoScriptError:
                unknown.append(call)  # called again once every answer was read
            except redis.ResponseError as exc:
                refusals.append(exc)
            self._unanswered.pop(0)
        for script, keys, args in unknown:
            self._load(script)
            self._call(script, keys, args)
        if refusals:
            raise refusals[0]

    def _send(self, script: Script, keys: list[str], args: list[Any]) -> None:
        self._conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)

    def _call(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        def call() -> Any:
            self._send(script, keys, args)
            return self._conn.read_response()

        return self._guard(call)

    def _guard(self, step: Callable[[], Any]) -> Any:
        try:
            return step()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            self._conn.disconnect()
            self._resend = bool(self._unanswered)
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
