"""Connections: every client forkq opens is built by :func:`connect`, and the one-write round
trips forkq sends its own commands in.

URLs: ``redis://``, ``rediss://`` (TLS), ``unix://``, the Sentinel forms
``redis+sentinel://``, ``rediss+sentinel://`` and kombu's ``sentinel://`` (checked and
parsed by :mod:`forkq.redis_url`), and the word ``embedded``, which means the unix socket of
the private server that the master starts in ``embedded_dir`` (see :mod:`forkq.embedded`).
AUTH/ACL users go in the URL (``redis://user:secret@host:6379/0``).

Failover: a Sentinel client asks the sentinels for the master's address at every
(re)connection. Every connection, Sentinel or not, takes a ``READONLY`` reply (the server
became a replica) or a blocking command ended by a role change (``UNBLOCKED``) as the loss
of the master: it drops itself and raises :class:`MasterLost`, a ``ConnectionError``, so
callers treat it as the outage it is (logged once, waited out with backoff,
:mod:`forkq.daemon.outage`) and the next connection finds the new master (through the
sentinels, or DNS for a plain URL). Nothing refused by ``READONLY`` was written, so a retry
is safe. Connections made from a client's pool (:class:`Direct`, the processors' blocking
wait and queue watch) are of the same class, so they follow the master too.

Fork safety: a client built in the master must not be used in a child. Children
call :func:`connect` themselves after the fork; redis-py's pools also refuse to
reuse a connection across a pid change.

Round trips: commands sent in one write on one connection, every reply read. What
``pipeline(transaction=False).execute(raise_on_error=False)`` does, without building a
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

A processor's client is a :class:`KeptRedis`: a job body's ``pipeline(transaction=False)``
(:class:`KeptPipeline`) goes out on those kept connections too, packed to redis-py's bytes
and read through redis-py's response callbacks, so its replies and errors are redis-py's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import hiredis
import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.commands.core import Script
from redis.retry import Retry
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

from forkq import __version__, redis_url

EMBEDDED = "embedded"
NO_RETRY = Retry(NoBackoff(), 0)
"""For clients that redis-py would otherwise give ten tries with growing pauses (those built
with ``redis.Redis(...)``, not from a URL): one try; the caller decides what comes next."""
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
    connect_timeout: float = 5.0, redis_class: type[redis.Redis] = redis.Redis,
) -> redis.Redis:
    """A client for ``url`` (an instance of ``redis_class``: :class:`KeptRedis` for a
    processor's) speaking RESP2, answering bytes, with a connect timeout (5 s).

    ``socket_timeout`` bounds every reply; callers that must never hang (the
    master, heartbeat threads, the application's client) set it. ValueError names what is
    wrong with a bad URL (nothing connects before the first command).

    A command is tried once (redis-py's default for a client built from a URL): a connection
    error reaches the caller at once, and forkq's own outage handling waits, logs and stays
    responsive to signals (a connection the server closed while idle is replaced before its
    next use: by the pool's check, or by forkq's own for the connections it keeps).
    """
    resolved = resolve_url(url, embedded_dir=embedded_dir)
    redis_url.check(resolved)
    common: dict[str, Any] = {"protocol": 2, "socket_connect_timeout": connect_timeout,
                              "socket_timeout": socket_timeout, "decode_responses": False,
                              **identified()}
    if redis_url.is_sentinel(resolved):
        return _sentinel_master(redis_url.parse_sentinel(resolved), common, redis_class)
    kind = redis_url.scheme(resolved)
    tcp = {} if kind == "unix" else {"socket_keepalive": True}
    return redis_class.from_url(resolved, connection_class=FOLLOWING[kind], **common, **tcp)


@functools.cache
def identified() -> dict[str, Any]:
    """The connection setting that names forkq to the server: ``CLIENT LIST`` shows
    ``lib-name=redis-py(forkq_v0.1.0)`` (redis-py's ``driver_info``, from 7.2; {} with an
    older redis-py, which names itself alone, or if redis-py refuses the name).

    Built once per process, and before the children fork: a connection of redis-py 7.2 or
    later built without it reads redis-py's version from the installed package's metadata
    (a file read and a parse, ~1 ms) every time one is created — several per processor child
    at boot. Its version is the imported package's own (``redis.__version__``): ``DriverInfo()``
    without it reads the metadata too, 2-6 ms on the master's path to its first fork."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis-py before 7.2
        return {}
    try:
        info = DriverInfo(lib_version=redis.__version__)
        return {"driver_info": info.add_upstream_driver("forkq", __version__)}
    except ValueError:  # a version redis-py's rules refuse: a connection without the name
        return {}


def _sentinel_master(target: redis_url.SentinelTarget, common: dict[str, Any],
                     redis_class: type[redis.Redis]) -> redis.Redis:
    """A client of ``target``'s master: its pool asks the sentinels where the master is at
    every connection, and drops idle connections when the answer changes. A sentinel
    that does not answer within the connect timeout is skipped for the next: a sentinel's
    client never retries (:data:`NO_RETRY`), the next sentinel is the retry. (redis-py gives
    those clients ten tries with growing pauses: with every sentinel gone, one command of
    the master waited ~15 s, a TERM as long, and the stop took ~85 s, past systemd's
    ``TimeoutStopSec``.)"""
    tls: dict[str, Any] = {"ssl": True, **target.tls_options} if target.tls else {}
    sentinel_wait = common["socket_connect_timeout"]
    sentinels = Sentinels(  # type: ignore[no-untyped-call, unused-ignore]
        target.sentinels,
        sentinel_kwargs={"username": target.sentinel_username,
                         "password": target.sentinel_password, "protocol": 2,
                         "socket_connect_timeout": sentinel_wait,
                         "socket_timeout": sentinel_wait, "retry": NO_RETRY, **identified(),
                         **tls})
    connection_class = SentinelSSLMasterConnection if target.tls else SentinelMasterConnection
    client: redis.Redis = sentinels.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        target.service, db=target.db, username=target.username, password=target.password,
        redis_class=redis_class, connection_class=connection_class, socket_keepalive=True,
        **common, **tls)
    return client


class Sentinels(Sentinel):
    """redis-py's Sentinel, with discovery errors one can read: a refused sentinel password
    is an :class:`redis.AuthenticationError` and a sentinel user denied the command a
    :class:`redis.exceptions.NoPermissionError` (exit 77 for the CLI and the daemon), a server
    that knows no SENTINEL command a :class:`NotASentinelError` (exit 78), not "no master
    found" with the clients' reprs. The discovery loop is ours: redis-py's folds those
    errors into the text of :class:`MasterNotFoundError` (8.x also the ResponseError that
    5.x raised), and its text is no contract."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        refused: list[tuple[str, redis.RedisError]] = []  # refused the user or the command
        unknown: list[tuple[str, redis.ResponseError]] = []  # servers that are no sentinel
        for index, sentinel in enumerate(self.sentinels):
            try:
                masters: dict[str, Any] = (  # RESP2 (sentinel_kwargs): a dict
                    sentinel.sentinel_masters())  # type: ignore[assignment, unused-ignore]
            except (redis.AuthenticationError, redis.exceptions.NoPermissionError) as exc:
                refused.append((_address(sentinel), exc))
                continue
            except redis.ResponseError as exc:
                unknown.append((_address(sentinel), exc))
                continue
            except (redis.ConnectionError, redis.TimeoutError):
                continue  # unreachable: the next sentinel is the retry
            state = masters.get(service_name)
            if state and self.check_master_state(  # type: ignore[no-untyped-call, unused-ignore]
                    state, service_name):
                self.sentinels[0], self.sentinels[index] = sentinel, self.sentinels[0]
                return state["ip"], state["port"]
        raise _discovery_error(service_name, [_address(s) for s in self.sentinels], refused,
                               unknown)


def _discovery_error(service_name: str, sentinels: list[str],
                     refused: list[tuple[str, redis.RedisError]],
                     unknown: list[tuple[str, redis.ResponseError]]) -> redis.RedisError:
    """Why no sentinel named the master of ``service_name``: a refused user or command first,
    then a server that is no sentinel, else none knew the service or none answered."""
    if refused:
        where, exc = refused[0]
        if isinstance(exc, redis.exceptions.NoPermissionError):
            return redis.exceptions.NoPermissionError(
                f"a sentinel ({where}) denied sentinel_username the SENTINEL command: {exc}")
        return redis.AuthenticationError(
            f"a sentinel ({where}) refused sentinel_password / sentinel_username")
    if unknown:
        where, exc = unknown[0]
        return NotASentinelError(
            f"a server named as a sentinel ({where}) answered SENTINEL with {exc}: it is no "
            "sentinel (a Redis server?); a sentinel URL names sentinels, a redis:// URL a "
            "server")
    return MasterNotFoundError(
        f"no sentinel ({', '.join(sentinels)}) named a master for service {service_name!r}: "
        "they are unreachable, or do not monitor that service")


class NotASentinelError(redis.ConnectionError):
    """A server a Sentinel URL names refused the SENTINEL command: a configuration error
    when the daemon starts (exit 78), an outage like any other later."""


def _address(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"{kwargs.get('host')}:{kwargs.get('port')}"


class MasterLost(redis.ConnectionError):
    """The server this connection talks to is no longer the master (a failover).

    ``sent`` is False when it was found before the command was sent (``ROLE`` on a new
    connection, the sentinels naming another master): nothing reached any server."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


ROLE_CHANGED = "UNBLOCKED"  # Redis ends blocked commands so when a master becomes a replica


class FollowsMaster:
    """Connection mixin: the server must be the master.

    A new connection asks ``ROLE`` before its first command and drops itself with
    :class:`MasterLost` when the server is a replica (a server that refuses ``ROLE``, an
    ACL without it, is taken at its word); ``READONLY`` or ``UNBLOCKED`` replies do the
    same later. So a process whose server became a replica stays in one outage (reads
    would otherwise end it and the next write start another) until a master answers.
    A command sent on a closed connection connects through :meth:`connect` (redis-py's
    own send path bypasses it, and a Sentinel connection would then reach its last or
    default address, localhost:6379, instead of asking the sentinels)."""

    _verified: object = None  # the socket ROLE was checked on
    _handshaking = False  # AUTH, SELECT, CLIENT SETNAME... come before ROLE

    def on_connect(self) -> None:
        with self._handshake():
            super().on_connect()  # type: ignore[misc]

    def on_connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        with self._handshake():
            super().on_connect_check_health(*args, **kwargs)  # type: ignore[misc]

    @contextlib.contextmanager
    def _handshake(self) -> Iterator[None]:
        before, self._handshaking = self._handshaking, True
        try:
            yield
        finally:
            self._handshaking = before

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        me: Any = self
        if getattr(me, "_sock", None) is None:
            me.connect()
        if not self._handshaking and self._verified is not me._sock:
            self._verified = me._sock
            self._check_role()
        super().send_packed_command(command, check_health)  # type: ignore[misc]

    def _check_role(self) -> None:
        me: Any = self
        try:
            super().send_packed_command(me.pack_command("ROLE"), False)  # type: ignore[misc]
            reply = super().read_response()  # type: ignore[misc]
        except redis.ResponseError:
            return
        role = text(reply[0]) if isinstance(reply, list) and reply else "master"
        if role != "master":
            self._lost(f"the server is a replica (ROLE {role})", sent=False)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.exceptions.ReadOnlyError as exc:
            self._lost(f"READONLY {exc}", exc, sent=True)
        except redis.ResponseError as exc:
            if not str(exc).startswith(ROLE_CHANGED):
                raise
            self._lost(str(exc), exc, sent=True)

    def _lost(self, why: str, cause: Exception | None = None, *, sent: bool) -> NoReturn:
        self.disconnect()  # type: ignore[attr-defined]
        raise MasterLost(f"{why} (no longer the master: a failover? reconnecting)",
                         sent=sent) from cause


class MasterConnection(FollowsMaster, redis.Connection):
    """A TCP connection that follows the master."""


class SSLMasterConnection(FollowsMaster, redis.SSLConnection):
    """A TLS connection that follows the master."""


class UnixMasterConnection(FollowsMaster, redis.UnixDomainSocketConnection):
    """A unix-socket connection that follows the master."""


MASTER_CHECK_INTERVAL = 1.0  # seconds between two questions to the sentinels, per connection


class AsksSentinels:
    """Sentinel connection mixin: a connection in use asks the sentinels where the master is
    at most every :data:`MASTER_CHECK_INTERVAL` seconds, before a command; when they name
    another server it drops itself and raises :class:`MasterLost` (nothing was sent).

    Why: after ``SENTINEL FAILOVER`` the old master keeps answering as a master until the
    sentinels reconfigure it (up to ~10 s later); everything written there meanwhile is
    discarded when it resyncs as a replica. Sentinels that do not answer leave the
    connection as it is (the master may be fine)."""

    _checked = 0.0

    def connect_to(self, address: tuple[str, int]) -> None:
        self._checked = time.monotonic()  # just asked; not again during the handshake
        super().connect_to(address)  # type: ignore[misc]

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        now = time.monotonic()
        if getattr(self, "_sock", None) is not None and now - self._checked >= (
                MASTER_CHECK_INTERVAL):
            self._checked = now
            self._check_master()
        super().send_packed_command(command, check_health)  # type: ignore[misc]

    def _check_master(self) -> None:
        me: Any = self
        try:
            address = me.connection_pool.get_master_address()
        except (redis.ConnectionError, redis.TimeoutError):
            return
        if (address[0], int(address[1])) != (me.host, int(me.port)):
            me.disconnect()
            raise MasterLost(f"the sentinels name {address[0]}:{address[1]} the master now, "
                             f"not {me.host}:{me.port} (a failover; reconnecting)", sent=False)


class SentinelMasterConnection(AsksSentinels, FollowsMaster, SentinelManagedConnection):
    """A connection to the master the sentinels name (asked at every connect)."""


class SentinelSSLMasterConnection(AsksSentinels, FollowsMaster, SentinelManagedSSLConnection):
    """A TLS connection to the master the sentinels name."""


FOLLOWING: dict[str, type[redis.Connection] | type[redis.UnixDomainSocketConnection]] = {
    "redis": MasterConnection, "rediss": SSLMasterConnection, "unix": UnixMasterConnection}


def is_wrong_type(exc: redis.ResponseError) -> bool:
    """Redis refused because a key holds another type (also a forkq script's refusal); not an
    ACL refusal or any other error."""
    return "WRONGTYPE" in str(exc)  # a pipeline's error names its command first


def text(value: bytes | str) -> str:
    """A Redis reply value as text (replies are bytes; typed as bytes | str by redis-py)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def raw(value: bytes | str) -> bytes:
    """A Redis reply value as bytes."""
    return value if isinstance(value, bytes) else value.encode()


class Direct:
    """One connection of the caller's own, for a script called in a tight loop (a
    processor's fetch): no pool checkout (a lock, a getpid and observability counters per
    call) and no retry wrapper, only the check that the server did not close it while idle
    (:func:`drop_if_closed`); the call is a one-write round trip
    (:func:`exchange`, packed by hiredis directly: its arguments are text,
    bytes and integers). Not thread-safe; build it after fork.

    :meth:`evalsha` loads the script when the server does not know it. Any error but a
    refusal drops the connection (the next call reconnects) and propagates; a refusal
    (redis.ResponseError) keeps it and is raised."""

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
        drop_if_closed(self._conn)
        [reply] = exchange(self._conn, [("EVALSHA", script.sha, len(keys), *keys, *args)])
        if isinstance(reply, redis.ResponseError):
            raise reply
        return reply

    def close(self) -> None:
        """Drop the connection."""
        self._conn.disconnect()


# -- round trips ----------------------------------------------------------------------

Commands = list[tuple[Any, ...]]
T = TypeVar("T")

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


def _pipeline_packed(conn: Any, commands: Commands) -> list[bytes]:
    """A job body's pipeline commands packed for ``conn``: as :func:`pack` when each is plain
    (a command name without whitespace, arguments hiredis takes: str, bytes, int, float,
    memoryview) and the client encodes text as strict UTF-8, which gives redis-py's bytes;
    by redis-py's ``pack_commands`` otherwise, which splits a name such as ``CLIENT
    SETNAME`` and refuses a bool or an object with its DataError before anything is sent.
    (A ``str`` subclass that overrides ``encode`` is sent as its text.)"""
    encoder = conn.encoder
    if (encoder.encoding == "utf-8" and encoder.encoding_errors == "strict"
            and all(type(name := args[0]) is str and name.isprintable() and " " not in name
                    for args in commands)):
        try:
            return [pack(commands)]
        except (TypeError, ValueError):  # a type hiredis refuses, a lone surrogate
            pass
    return conn.pack_commands(commands)  # type: ignore[no-any-return]


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
        return self.using(lambda conn: exchange(conn, commands))

    def using(self, use: Callable[[Any], T]) -> T:
        """``use(conn)`` on a kept connection, checked open (:func:`drop_if_closed`); ``use``
        disconnects it on an error that could leave a reply unread."""
        if self._forks != _forks:
            self._idle, self._forks = [], _forks
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._pool.get_connection()  # checked by the pool
        try:
            drop_if_closed(conn)
            return use(conn)
        finally:
            self._idle.append(conn)


class KeptRedis(redis.Redis):
    """A processor's client: ``pipeline(transaction=False)`` (a job body's usual way to
    batch commands) gives a :class:`KeptPipeline`, which goes out on one of the client's
    kept connections (:attr:`kept`, shared with the processor's pushes); anything else is
    redis-py's own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept = KeptConnections(self)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        """redis-py's pipeline, but a :class:`KeptPipeline` when not a transaction."""
        if transaction or shard_hint is not None:
            return super().pipeline(transaction, shard_hint)
        pipe = KeptPipeline(self.connection_pool, self.response_callbacks, transaction,
                            shard_hint)
        pipe.kept = self.kept
        return pipe


class KeptPipeline(Pipeline):
    """redis-py's non-transactional pipeline whose :meth:`execute` sends the queued
    commands in one write on a kept connection and reads each reply through redis-py's
    response callbacks: the same commands, bytes, replies and errors as redis-py's
    (``raise_on_error`` included), without its per-call pool checkout, retry wrapper,
    observability hooks and per-argument packing in Python (:func:`_pipeline_packed`),
    which cost a job body about as much as the rest of its run.

    As every command of forkq's clients, it is tried once: a connection error drops the
    connection and reaches the caller (the next call reconnects). A pipeline that WATCHes,
    holds scripts or started MULTI runs as redis-py's."""

    kept: KeptConnections

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Run the queued commands; their replies (the first error raised, as redis-py)."""
        if self.watching or self.scripts or self.explicit_transaction or self.connection:
            return super().execute(raise_on_error)
        stack = self.command_stack
        if not stack:
            return []
        try:
            replies = self.kept.using(lambda conn: self._exchange(conn, stack))
        finally:
            self.reset()
        if raise_on_error:
            self.raise_first_error(stack, replies)  # type: ignore[no-untyped-call]
        return replies

    def _exchange(self, conn: Any, stack: list[Any]) -> list[Any]:
        packed = _pipeline_packed(conn, [args for args, _ in stack])  # DataError: nothing sent
        try:
            conn.send_packed_command(packed)
            replies: list[Any] = []
            parse = self.parse_response  # redis-py's: decoding and response callbacks
            for args, options in stack:
                try:
                    replies.append(parse(conn, args[0], **options))  # type: ignore[no-untyped-call]
                except redis.ResponseError as exc:
                    replies.append(exc)
            return replies
        except BaseException:
            conn.disconnect()  # replies may be left unread on it
            raise
