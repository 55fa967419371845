"""The asyncio client (forkq.aio): the bytes it leaves in Redis are the synchronous
client's, and it fails the same way (EnqueueError with the jobs' fates; TypeError and
ValueError before any I/O). Each test drives its coroutines with ``asyncio.run``."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

import forkq
from forkq import aio, testing
from forkq import client as clients
from forkq import payload as payloads
from forkq.embedded import EmbeddedServer
from forkq.errors import EnqueueError
from forkq.middleware import Chain

NOW = 1_700_000_000.25


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The clock and the jids fixed, so two pushes of one item write the same bytes."""
    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setattr(payloads, "new_jids", _counted_jids)
    yield


_issued = [0]


def _counted_jids(n: int) -> list[str]:
    """Jids 0, 1, 2… counted from the last :func:`_both` turn."""
    first, _issued[0] = _issued[0], _issued[0] + n
    return [f"{first + i:024x}" for i in range(n)]


def _snapshot(r: redis.Redis) -> dict[bytes, Any]:
    """Every key of the server with its content (lists, sets, sorted sets, strings)."""
    found: dict[bytes, Any] = {}
    for key in sorted(r.keys("*")):
        kind = r.type(key)
        if kind == b"list":
            found[key] = r.lrange(key, 0, -1)
        elif kind == b"set":
            found[key] = sorted(r.smembers(key))
        elif kind == b"zset":
            found[key] = r.zrange(key, 0, -1, withscores=True)
        elif kind == b"string":
            found[key] = (r.get(key), r.ttl(key) > 0)
        else:
            found[key] = kind
    return found


def _both(r: redis.Redis, server: EmbeddedServer, *,
          sync: Callable[[clients.Client], Any],
          asynchronous: Callable[[aio.Client], Awaitable[Any]],
          middleware: Any = None) -> tuple[Any, Any]:
    """Run the same pushes with each client on a flushed server; assert both left the same
    keys holding the same bytes; return each client's answer."""
    r.flushall()
    _issued[0] = 0
    sync_answer = sync(clients.Client(r, middleware=middleware))
    after_sync = _snapshot(r)
    r.flushall()
    _issued[0] = 0

    async def run() -> Any:
        client = aio.Client(url=server.url, middleware=middleware)
        try:
            return await asynchronous(client)
        finally:
            await client.aclose()

    aio_answer = asyncio.run(run())
    assert _snapshot(r) == after_sync
    assert after_sync, "nothing was pushed"
    return sync_answer, aio_answer


ITEMS = [
    {"class": "HardWorker", "args": [1, "two", {"three": 3.5}], "jid": "a" * 24},
    {"class": "HardWorker", "args": [], "queue": "critical", "retry": 3, "tags": ["x"],
     "jid": "b" * 24},
    {"class": "HardWorker", "args": ["later"], "at": NOW + 60, "jid": "c" * 24},
    {"class": "HardWorker", "args": ["unique"], "unique_for": 600, "jid": "d" * 24},
    {"class": "HardWorker", "args": ["unique later"], "unique_for": 60, "at": NOW + 30,
     "jid": "e" * 24},
    {"class": "HardWorker", "args": [7], "group": "customer-7", "jid": "f" * 24},
    {"class": "HardWorker", "args": ["é ✓ \u2028"], "expires_in": 300, "jid": "1" * 24},
]


@pytest.mark.parametrize("item", ITEMS, ids=lambda item: str(item["args"])[:20])
def test_a_push_writes_the_bytes_the_sync_client_writes(
        r: redis.Redis, server: EmbeddedServer, frozen: None, item: dict[str, Any]) -> None:
    sync_jid, aio_jid = _both(r, server, sync=lambda c: c.push(item),
                              asynchronous=lambda c: c.push(item))
    assert sync_jid == aio_jid == item["jid"]


@pytest.mark.parametrize("item", [
    {"class": "Bulk", "args": [[n, str(n)] for n in range(50)]},
    {"class": "Bulk", "args": [[1], [2], [3]], "queue": "low", "at": [NOW + 5, 0, NOW - 5]},
    {"class": "Bulk", "args": [[1], [2], [1]], "unique_for": 60},
    {"class": "Bulk", "args": []},
], ids=["plain", "at-each", "unique", "empty"])
def test_push_bulk_writes_the_bytes_the_sync_client_writes(
        r: redis.Redis, server: EmbeddedServer, frozen: None, item: dict[str, Any]) -> None:
    jids = [f"{n:024x}" for n in range(len(item["args"]))]

    async def asynchronous(c: aio.Client) -> list[str]:
        return await c.push_bulk(item)

    if item["args"]:
        sync_jids, aio_jids = _both(r, server, sync=lambda c: c.push_bulk(item),
                                    asynchronous=asynchronous)
    else:
        sync_jids = clients.Client(r).push_bulk(item)
        aio_jids = asyncio.run(_bulk_alone(server, item))
    assert sync_jids == aio_jids
    if "unique_for" in item:
        assert aio_jids == jids[:2], "the repeated unique job is dropped by both"


async def _bulk_alone(server: EmbeddedServer, item: dict[str, Any]) -> list[str]:
    client = aio.Client(url=server.url)
    try:
        return await client.push_bulk(item)
    finally:
        await client.aclose()


def test_client_middleware_runs_as_for_the_sync_client(
        r: redis.Redis, server: EmbeddedServer, frozen: None) -> None:
    chain: Chain[Any, Any] = Chain()
    seen: list[str] = []

    def stamp(payload: dict[str, Any], call_next: Callable[[], Any]) -> Any:
        seen.append(payload["jid"])
        if payload["args"] == ["stop"]:
            return None  # a middleware that does not call on stops the push
        payload["tenant"] = "acme"
        return call_next()

    chain.add(stamp)

    async def pushes(c: aio.Client) -> list[Any]:
        return [await c.push({"class": "M", "args": ["go"], "jid": "9" * 24}),
                await c.push({"class": "M", "args": ["stop"], "jid": "8" * 24}),
                await c.push_bulk({"class": "M", "args": [["x"], ["stop"], ["y"]]})]

    def sync_pushes(c: clients.Client) -> list[Any]:
        return [c.push({"class": "M", "args": ["go"], "jid": "9" * 24}),
                c.push({"class": "M", "args": ["stop"], "jid": "8" * 24}),
                c.push_bulk({"class": "M", "args": [["x"], ["stop"], ["y"]]})]

    sync_answer, aio_answer = _both(r, server, sync=sync_pushes, asynchronous=pushes,
                                    middleware=chain)
    assert aio_answer[:2] == ["9" * 24, None] and len(aio_answer[2]) == 2
    assert [p["tenant"] for p in map(payloads.decode, r.lrange("queue:default", 0, -1))] \
        == ["acme"] * 3
    assert len(seen) == 10  # both clients ran the middleware for each of their five jobs
    assert sync_answer[:2] == aio_answer[:2]


def test_a_job_pushed_by_perform_async_aio_runs_through_the_default_client(
        r: redis.Redis, server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKQ_REDIS_URL", server.url)
    monkeypatch.delenv("FORKQ_CLIENT_TIMEOUT", raising=False)

    @forkq.job(name="AioThing", queue="aioq", registry=forkq.registry.Registry())
    def thing(n: int) -> None:
        """A job only pushed here."""

    async def push() -> list[str | None]:
        return [await thing.perform_async_aio(1), await thing.perform_in_aio(60, 2),
                await thing.perform_at_aio(time.time() + 120, 3),
                await thing.set(queue="other").perform_async_aio(4)]

    jids = asyncio.run(push())
    queued = [payloads.decode(raw) for raw in r.lrange("queue:aioq", 0, -1)]
    assert [p["jid"] for p in queued] == [jids[0]] and queued[0]["args"] == [1]
    assert [payloads.decode(raw)["args"] for raw in r.zrange("schedule", 0, -1)] == [[2], [3]]
    assert payloads.decode(r.lrange("queue:other", 0, -1)[0])["jid"] == jids[3]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_server_down_raises_enqueue_error_with_every_job_not_enqueued() -> None:
    async def push() -> None:
        client = aio.Client(url=f"redis://127.0.0.1:{_free_port()}/0", connect_timeout=2)
        try:
            with pytest.raises(EnqueueError) as one:
                await client.push({"class": "X", "args": [], "jid": "7" * 24})
            assert one.value.not_enqueued == ["7" * 24]
            assert one.value.enqueued == [] and one.value.unknown == []
            with pytest.raises(EnqueueError) as bulk:
                await client.push_bulk({"class": "X", "args": [[1], [2]]})
            assert len(bulk.value.not_enqueued) == 2
        finally:
            await client.aclose()

    asyncio.run(push())


def test_a_refused_command_raises_enqueue_error_naming_the_jobs(
        r: redis.Redis, server: EmbeddedServer) -> None:
    r.set("queue:broken", "a string, not a list")

    async def push() -> tuple[EnqueueError, EnqueueError]:
        client = aio.Client(url=server.url)
        try:
            with pytest.raises(EnqueueError) as refused:
                await client.push({"class": "X", "args": [], "queue": "broken", "jid": "6" * 24})
            with pytest.raises(EnqueueError) as partly:
                await client.push_bulk({"class": "X", "args": [[1], [2]],
                                        "at": [None, time.time() + 60], "queue": "broken"})
            return refused.value, partly.value
        finally:
            await client.aclose()

    refused, partly = asyncio.run(push())
    with pytest.raises(EnqueueError) as sync_error:
        clients.Client(r).push({"class": "X", "args": [], "queue": "broken", "jid": "6" * 24})
    assert str(refused) == str(sync_error.value) and "WRONGTYPE" in str(refused)
    assert refused.not_enqueued == ["6" * 24] and refused.enqueued == []
    assert len(partly.not_enqueued) == 1 and len(partly.enqueued) == 1  # the scheduled one
    assert r.zcard("schedule") == 1


def test_bad_arguments_raise_before_any_io() -> None:
    async def push() -> None:
        client = aio.Client(url=f"redis://127.0.0.1:{_free_port()}/0")  # nothing listens
        for item, error in [({"class": "X", "args": "no list"}, TypeError),
                            ({"class": "", "args": []}, TypeError),
                            ({"class": "X", "args": [], "queue": ""}, ValueError),
                            ({"class": "X", "args": [], "at": "soon"}, TypeError),
                            ({"class": "X", "args": [{1, 2}]}, TypeError),
                            ({"class": "X", "args": [float("nan")]}, ValueError)]:
            with pytest.raises(error):
                await client.push(item)
        with pytest.raises(ValueError, match="one entry per job"):
            await client.push_bulk({"class": "X", "args": [[1]], "at": [1, 2]})
        await client.aclose()

    asyncio.run(push())
    with pytest.raises(ValueError, match="Sentinel"):
        aio.Client(url="redis+sentinel://127.0.0.1:26379/mymaster")


def test_push_lua_unknown_to_the_server_is_loaded_and_the_push_sent_again(
        r: redis.Redis, server: EmbeddedServer) -> None:
    r.script_flush()

    async def push() -> str | None:
        client = aio.Client(url=server.url)
        try:
            return await client.push({"class": "U", "args": [1], "unique_for": 60})
        finally:
            await client.aclose()

    jid = asyncio.run(push())
    assert jid is not None and payloads.decode(r.lrange("queue:default", 0, -1)[0])["jid"] == jid


def test_testing_modes_take_the_pushes_and_a_batch_block_is_refused(
        r: redis.Redis, server: EmbeddedServer, default_client: clients.Client) -> None:
    async def push(client: aio.Client) -> str | None:
        return await client.push({"class": "T", "args": [1]})

    client = aio.Client(url=server.url)
    with testing.fake() as fake:
        jid = asyncio.run(push(client))
    assert [p["jid"] for p in fake.jobs()] == [jid]
    assert r.llen("queue:default") == 0
    with forkq.batch(), pytest.raises(TypeError, match="batch"):
        asyncio.run(push(client))
