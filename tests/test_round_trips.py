"""A push's one write (forkq.connection): its packing, and the connections a client keeps.

The packing is redis-py's, byte for byte. The kept connections: one per thread pushing at
once, closed by the client's ``close()`` and reconnected by the next push; a forked child
never uses the parent's; a refused command leaves the connection in use; one the server
closed while it sat idle (its ``timeout``, CLIENT KILL) is replaced before the next call,
which goes through.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from forkq import client as clients
from forkq.connection import Direct, KeptConnections, connect, pack
from forkq.embedded import EmbeddedServer
from forkq.subprocesses import wait_for

from .conftest import named, throwaway_server

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


@pytest.mark.process
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


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_call(
        kept: KeptConnections, name: str, r: redis.Redis) -> None:
    before = kept.round_trip(CLIENT_ID)[0]
    assert r.client_kill_filter(_id=before) == 1
    assert kept.round_trip([("LPUSH", "queue:default", "x")]) == [1]
    assert r.lrange("queue:default", 0, -1) == [b"x"]  # sent once, on the new connection
    after = kept.round_trip(CLIENT_ID)[0]
    assert after != before
    assert wait_for(lambda: named(r, name) == [after], 5)


@pytest.mark.process
def test_a_push_after_the_servers_idle_timeout_closed_the_connection_lands_once() -> None:
    with throwaway_server("fq-idle-") as srv:
        r = redis.Redis(unix_socket_path=srv.socket, protocol=2)
        try:
            r.config_set("timeout", 1)  # the server closes a client idle for a second
            client = clients.Client(url=f"unix://{srv.socket}?client_name=idle-pusher")
            try:
                first = client.push({"class": "Kept", "args": [1]})
                assert wait_for(lambda: named(r, "idle-pusher") == [], 10)  # the server closed it
                second = client.push({"class": "Kept", "args": [2]})
                queued = [json.loads(job)["jid"] for job in r.lrange("queue:default", 0, -1)]
                assert queued == [second, first]
            finally:
                client.redis.close()
        finally:
            r.close()


def test_a_direct_connection_the_server_closed_while_idle_is_replaced_before_the_call(
        url: str, name: str, r: redis.Redis) -> None:
    client = connect(url, socket_timeout=5)
    direct = Direct(client)
    script = client.register_script("return redis.call('LPUSH', KEYS[1], ARGV[1])")
    script.sha = client.script_load(script.script)  # on a pooled connection of the client
    pooled = set(named(r, name))
    try:
        assert direct.evalsha(script, ["queue:default"], ["a"]) == 1
        [before] = set(named(r, name)) - pooled
        assert r.client_kill_filter(_id=before) == 1
        assert direct.evalsha(script, ["queue:default"], ["b"]) == 2
        assert r.lrange("queue:default", 0, -1) == [b"b", b"a"]
        assert wait_for(lambda: len(set(named(r, name)) - pooled) == 1
                        and before not in named(r, name), 5)
    finally:
        direct.close()
        client.close()


def test_packing_is_redis_pys_byte_for_byte(r: redis.Redis) -> None:
    conn = r.connection_pool.make_connection()
    commands: list[tuple[object, ...]] = [
        ("SADD", "queues", "défaut"), ("LPUSH", "queue:q", b"\xff\x00{}", b"x" * 70_000),
        ("ZADD", "schedule", 1764000000.123456, b"{}"), ("ZADD", "s", -0.5, "é"),
        ("WAIT", 1, 1000), ("SET", "k", "", "PX", 2**62), ("CLIENT", "ID")]
    assert pack(commands) == b"".join(conn.pack_commands(commands))
