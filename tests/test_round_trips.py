"""A push's one write (forkq.round_trips): its packing, and the connections a client keeps.

The packing is redis-py's, byte for byte. The kept connections: one per thread pushing at
once, closed by the client's ``close()`` and reconnected by the next push; a forked child
never uses the parent's; a refused command leaves the connection in use, a lost one is
replaced at the next call.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from forkq import client as clients
from forkq.connection import connect
from forkq.embedded import EmbeddedServer
from forkq.round_trips import KeptConnections, pack
from forkq.subprocesses import wait_for

CLIENT_ID = [("CLIENT", "ID")]


@pytest.fixture
def name() -> str:
    """A client name of this test's own: connections an earlier test closed, which the
    server may not have seen go yet, never count."""
    return f"kept-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def url(server: EmbeddedServer, r: redis.Redis, name: str) -> str:
    """The session server's URL, its connections named ``name`` (``r`` flushed it)."""
    return f"unix://{server.socket}?client_name={name}"


@pytest.fixture
def kept(url: str) -> Iterator[KeptConnections]:
    client = connect(url, socket_timeout=5)
    yield KeptConnections(client)
    client.close()


def named(r: redis.Redis, name: str) -> list[int]:
    """The ids of the connections named ``name``."""
    return [int(c["id"]) for c in r.client_list(_type="normal") if c.get("name") == name]


@pytest.mark.parametrize("built", ["from a URL", "keeping a forkq-built client"])
def test_threads_pushing_at_once_keep_one_connection_each_and_every_job_lands(
        url: str, name: str, r: redis.Redis, built: str) -> None:
    if built == "from a URL":
        client = clients.Client(url=url)
    else:  # a processor's client (forkq.daemon.child_process.setup)
        client = clients.Client.keeping(connect(url, socket_timeout=5))
    checkouts = _count_checkouts(client.redis.connection_pool)
    threads, pushes = 8, 200
    start = threading.Barrier(threads)
    jids: list[list[str | None]] = [[] for _ in range(threads)]

    def push(k: int) -> None:
        start.wait()
        jids[k] += [client.push({"class": "Kept", "args": [k, n]}) for n in range(pushes)]

    workers = [threading.Thread(target=push, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    try:
        every = [jid for group in jids for jid in group]
        assert len(set(every)) == threads * pushes and None not in every
        assert r.llen("queue:default") == threads * pushes
        assert 1 <= len(named(r, name)) <= threads
        assert 1 <= len(checkouts) <= threads  # not one per push
    finally:
        client.redis.close()


def _count_checkouts(pool: redis.ConnectionPool) -> list[None]:
    """A list that grows by one at each connection checked out of ``pool`` from now on."""
    calls: list[None] = []
    get_connection = pool.get_connection

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        return get_connection(*args, **kwargs)

    pool.get_connection = counted  # type: ignore[method-assign]
    return calls


def test_close_closes_the_kept_connections_and_the_next_push_reconnects(
        url: str, name: str, r: redis.Redis) -> None:
    client = clients.Client(url=url)
    client.push({"class": "Kept", "args": [1]})
    assert len(named(r, name)) == 1
    client.redis.close()
    assert wait_for(lambda: named(r, name) == [], 5)  # the server reads the close in its own time
    client.push({"class": "Kept", "args": [2]})
    try:
        assert r.llen("queue:default") == 2
        assert len(named(r, name)) == 1
    finally:
        client.redis.close()


def test_a_forked_child_uses_a_connection_of_its_own_and_leaves_the_parents(
        kept: KeptConnections) -> None:
    parent = kept.round_trip(CLIENT_ID)[0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its connection's id, never return into pytest
        status = 1
        try:
            os.write(write, str(kept.round_trip(CLIENT_ID)[0]).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    try:
        child = int(os.read(read, 64) or b"0")
    finally:
        os.close(read)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child not in (0, parent)
    assert kept.round_trip(CLIENT_ID)[0] == parent  # still the parent's, still open


def test_a_refusal_comes_in_place_and_keeps_the_connection(kept: KeptConnections,
                                                           r: redis.Redis) -> None:
    before = kept.round_trip(CLIENT_ID)[0]
    replies = kept.round_trip([("SET", "k", b"\xff\x00v"), ("LPUSH", "k", "x"),
                               ("GET", "k")])
    assert replies[0] == b"OK" and replies[2] == b"\xff\x00v"
    assert isinstance(replies[1], redis.ResponseError) and "WRONGTYPE" in str(replies[1])
    assert kept.round_trip(CLIENT_ID)[0] == before
    assert r.type("k") == b"string"


def test_a_connection_killed_by_the_server_fails_one_call_and_is_replaced(
        kept: KeptConnections, name: str, r: redis.Redis) -> None:
    before = kept.round_trip(CLIENT_ID)[0]
    assert r.client_kill_filter(_id=before) == 1
    with pytest.raises(redis.ConnectionError):
        kept.round_trip([("LPUSH", "queue:default", "x")])
    after = kept.round_trip(CLIENT_ID)[0]
    assert after != before
    assert wait_for(lambda: named(r, name) == [after], 5)


def test_packing_is_redis_pys_byte_for_byte(r: redis.Redis) -> None:
    conn = r.connection_pool.make_connection()
    commands: list[tuple[object, ...]] = [
        ("SADD", "queues", "défaut"), ("LPUSH", "queue:q", b"\xff\x00{}", b"x" * 70_000),
        ("ZADD", "schedule", 1764000000.123456, b"{}"), ("ZADD", "s", -0.5, "é"),
        ("WAIT", 1, 1000), ("SET", "k", "", "PX", 2**62), ("CLIENT", "ID")]
    assert pack(commands) == b"".join(conn.pack_commands(commands))
