"""The asyncio client: :class:`Client` pushes jobs over ``redis.asyncio`` without blocking
the event loop (a FastAPI handler, an aiohttp view, any coroutine).

Same wire as :class:`forkq.client.Client`, by construction: both run the I/O-free steps of
:class:`forkq.client.PushSteps` (field checks, the client middleware chain
:data:`forkq.middleware.CLIENT`, payload building and encoding, the commands of a push,
push.lua for unique jobs and groups), so a push writes the same bytes to the same keys;
only the round trip differs. Errors are the same: TypeError/ValueError for bad arguments
before any I/O, and :class:`~forkq.errors.EnqueueError` telling the jobs enqueued, certainly
not enqueued and of unknown fate when Redis fails or refuses.

What it does not do: push inside a ``with forkq.batch()`` block (the batch is committed by
the synchronous client: TypeError), reach Redis through Sentinel from a URL (ValueError:
give it a ``redis.asyncio`` client of your own, e.g. from ``redis.asyncio.sentinel``), or
follow a failover by itself as the synchronous client's connections do
(:mod:`forkq.connection`): a push to a server that became a replica is refused
(``READONLY``) and raised as an EnqueueError with the jobs not enqueued. Testing modes
(:mod:`forkq.testing`) apply to it as to the synchronous client.

A client belongs to one event loop (``redis.asyncio``'s connections do): build it inside
the loop that uses it, e.g. in a FastAPI ``lifespan`` (docs/asyncio.md), and ``await
client.aclose()`` at shutdown. :func:`default` builds one per running loop from the same
environment as the synchronous default (``FORKQ_REDIS_URL`` / ``REDIS_URL``,
``FORKQ_EMBEDDED_DIR``, ``FORKQ_CLIENT_TIMEOUT``, ``FORKQ_CLIENT_CONNECT_TIMEOUT``).
Keys: those of a push (``queues``, ``queue:<name>``, ``schedule``, a unique job's lock).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Mapping
from typing import Any

import redis
import redis.asyncio

from forkq import client as clients
from forkq import durability, redis_url
from forkq.connection import identified, pack, resolve_url
from forkq.durability import Durability
from forkq.middleware import CLIENT, ClientChain

Commands = list[tuple[Any, ...]]


class Client(clients.PushSteps):
    """Pushes jobs to one Redis from coroutines of one event loop.

    A client built from a URL owns its ``redis.asyncio`` pool (no limit: one connection per
    push in flight at once, kept for the next ones) and closes it in :meth:`aclose`; one
    given a ``redis_client`` uses that client's pool and leaves closing it to its owner."""

    def __init__(
        self,
        redis_client: redis.asyncio.Redis | None = None,
        *,
        url: str | None = None,
        embedded_dir: str | None = None,
        middleware: ClientChain | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        self._owned = redis_client is None
        if redis_client is None:
            redis_client = connect(
                url or clients.env_url(), embedded_dir=embedded_dir or clients.env_dir(),
                socket_timeout=timeout or clients.env_seconds("FORKQ_CLIENT_TIMEOUT"),
                connect_timeout=connect_timeout
                or clients.env_seconds("FORKQ_CLIENT_CONNECT_TIMEOUT"))
        self.redis = redis_client
        self.middleware: ClientChain = middleware if middleware is not None else CLIENT

    async def push(self, item: Mapping[str, Any], *, durable: bool | Durability = False
                   ) -> str | None:
        """Push one job, as :meth:`forkq.client.Client.push`: the jid, or None when a client
        middleware stopped the push or a unique job's lock is held."""
        _refuse_batch()
        now = time.time()
        job = self._job(item, now)
        if job is None:
            return None
        dropped = await self._send([job], now,
                                   durability.resolve(durable) if durable else None)
        return None if dropped else str(job[0]["jid"])

    async def push_bulk(self, item: Mapping[str, Any], *, durable: bool | Durability = False
                        ) -> list[str]:
        """Push many jobs of one class in one round trip, as
        :meth:`forkq.client.Client.push_bulk`: the jids pushed."""
        _refuse_batch()
        now = time.time()
        level = durability.resolve(durable) if durable else None
        jobs, encoded = self._bulk(item, now)
        if encoded is not None:  # the common case, encoded at once
            if encoded.commands:
                await self._round_trip(encoded.commands, encoded.carried, level)
            return encoded.jids
        return clients.pushed(jobs, await self._send(jobs, now, level))

    async def aclose(self) -> None:
        """Close the connections of a client built from a URL (one given a ``redis_client``
        is left to its owner)."""
        if self._owned:
            await self.redis.aclose()

    async def _send(self, jobs: list[clients.Job], now: float,
                    level: Durability | None = None) -> set[str]:
        """One round trip pushing ``jobs`` (a testing mode takes them instead); the jids of
        the unique jobs dropped. EnqueueError unless every job's command succeeded."""
        held = self._elsewhere(jobs, now)
        if held is not None:
            return held
        commands, carried = self.commands(jobs, now)
        return clients.dropped_by(commands, carried,
                                  await self._round_trip(commands, carried, level))

    async def _round_trip(self, commands: Commands, carried: list[list[str]],
                          level: Durability | None = None) -> list[Any]:
        """Send ``commands`` in one write and read every reply; ``carried[i]`` names the jids
        command ``i`` carries ([]: a command whose refusal loses no job, checked by its
        caller, if at all: the ``queues`` index, and any command appended after the push's
        own). push.lua unknown to the server (NOSCRIPT: nothing ran) is loaded and its
        commands sent again. With ``level``, its WAIT follows the pushes, as the synchronous
        client's. EnqueueError as the synchronous client's; the replies, in
        order, a refused command's as its :class:`redis.ResponseError`."""
        wait = [level.command()] if level else []
        try:
            results = await self._exchange(commands + wait)
            confirmed = results.pop() if wait else None
            unknown = clients.unknown_scripts(results)
            if unknown:
                await self._exchange(clients.load_push())
                again = await self._exchange([commands[i] for i in unknown] + wait)
                confirmed = again.pop() if wait else None
                clients.retried(results, unknown, again)
        except redis.RedisError as exc:
            raise clients.failed_push(exc, carried) from exc
        clients.check_results(carried, results)
        clients.confirm(level, confirmed, carried)
        return results

    async def _exchange(self, commands: Commands) -> list[Any]:
        """``commands`` in one write on one connection of the pool, every reply read (a
        refused command's error in its place). Any other error, or a cancellation of the
        awaiting task, drops the connection, so no unread reply is left on it."""
        pool = self.redis.connection_pool
        conn: Any = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(pack(commands), check_health=True)
            return [await _reply(conn) for _ in commands]
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)


async def _reply(conn: Any) -> Any:
    try:
        return await conn.read_response()
    except redis.ResponseError as exc:
        return exc


def _refuse_batch() -> None:
    if clients.OPEN_BATCH.get() is not None:
        raise TypeError("the asyncio client cannot push inside a `with forkq.batch()` block "
                        "(a batch is committed by the synchronous client): use "
                        "perform_async there")


def connect(url: str, *, embedded_dir: str = ".forkq", socket_timeout: float | None = None,
            connect_timeout: float = 5.0) -> redis.asyncio.Redis:
    """A ``redis.asyncio`` client for ``url`` with the settings of
    :func:`forkq.connection.connect` (RESP2, bytes, timeouts, forkq's client name); nothing
    connects before the first push. ValueError for a bad URL, and for a Sentinel URL (not
    supported here: build the client with ``redis.asyncio.sentinel`` and pass it)."""
    resolved = resolve_url(url, embedded_dir=embedded_dir)
    redis_url.check(resolved)
    if redis_url.is_sentinel(resolved):
        raise ValueError(f"{redis_url.redact(url)}: the asyncio client does not read Sentinel "
                         "URLs; pass Client(redis_client) a client from redis.asyncio.sentinel")
    tcp = {} if redis_url.scheme(resolved) == "unix" else {"socket_keepalive": True}
    return redis.asyncio.Redis.from_url(
        resolved, protocol=2, socket_connect_timeout=connect_timeout,
        socket_timeout=socket_timeout, decode_responses=False, **identified(), **tcp)


_defaults: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Client] = (
    weakref.WeakKeyDictionary())
_configured: Client | None = None


def default() -> Client:
    """The client of ``perform_async_aio`` and friends: the one given to :func:`configure`,
    else one per running event loop, built on first use from the environment (module doc).
    RuntimeError outside a running loop."""
    if _configured is not None:
        return _configured
    loop = asyncio.get_running_loop()
    found = _defaults.get(loop)
    if found is None:
        found = _defaults[loop] = Client()
    return found


def configure(client: Client | None) -> None:
    """Make ``client`` the default (None: one per loop from the environment again)."""
    global _configured
    _configured = client
