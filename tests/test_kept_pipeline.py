"""A processor's client (forkq.connection.KeptRedis): its non-transactional pipelines go out
on the connections the client keeps, with redis-py's packing, replies and errors.

Each case runs the same commands through redis-py's own pipeline (a plain ``redis.Redis`` on
the same server) and through the kept one, and compares what they give back; transactions,
WATCH and scripts stay redis-py's; a connection the server closed while idle is replaced
before the next pipeline; a job body's pipelines and the processor's pushes share one
connection.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.client import Pipeline

from forkq import client as clients
from forkq.connection import KeptPipeline, KeptRedis, _pipeline_packed, connect
from forkq.embedded import EmbeddedServer
from forkq.subprocesses import wait_for

from .conftest import named


@pytest.fixture
def name() -> str:
    """A client name of this test's own (connections of earlier tests never count)."""
    return f"kept-pipe-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def kept(server: EmbeddedServer, r: redis.Redis, name: str) -> Iterator[redis.Redis]:
    """A processor's client of the session server (``r`` flushed it)."""
    client = connect(f"unix://{server.socket}?client_name={name}", socket_timeout=5,
                     redis_class=KeptRedis)
    yield client
    client.close()


@pytest.fixture
def plain(server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A plain redis-py client of the same server, the reference."""
    client = connect(f"unix://{server.socket}", socket_timeout=5)
    assert type(client) is redis.Redis
    yield client
    client.close()


def _queue_mixed(pipe: Any, prefix: str) -> None:
    """Commands whose replies go through redis-py's callbacks in different ways."""
    pipe.incr(f"{prefix}:n")
    pipe.setbit(f"{prefix}:bits", 7, 1)
    pipe.hset(f"{prefix}:h", mapping={"a": 1, "b": "é"})
    pipe.hgetall(f"{prefix}:h")  # a dict, by callback
    pipe.zadd(f"{prefix}:z", {"x": 1.5, "y": 2})
    pipe.zrange(f"{prefix}:z", 0, -1, withscores=True)  # an option for its callback
    pipe.get(f"{prefix}:missing")
    pipe.set(f"{prefix}:s", b"\xff\x00v")
    pipe.lpush(f"{prefix}:s", "x")  # WRONGTYPE: an error reply in its place
    pipe.exists(f"{prefix}:n", f"{prefix}:missing")
    pipe.client_setname(f"{prefix}-named")  # "CLIENT SETNAME": split like redis-py


def _same(replies: list[Any], reference: list[Any]) -> None:
    assert len(replies) == len(reference)
    for got, want in zip(replies, reference, strict=True):
        if isinstance(want, Exception):
            assert type(got) is type(want) and str(got) == str(want)
        else:
            assert got == want


def test_a_pipeline_gives_what_redis_pys_gives(kept: redis.Redis,
                                               plain: redis.Redis) -> None:
    pipe = kept.pipeline(transaction=False)
    assert isinstance(pipe, KeptPipeline)
    _queue_mixed(pipe, "kept")
    replies = pipe.execute(raise_on_error=False)
    reference_pipe = plain.pipeline(transaction=False)
    _queue_mixed(reference_pipe, "plain")
    reference = reference_pipe.execute(raise_on_error=False)
    _same(replies, reference)
    assert replies[3] == {b"a": b"1", b"b": "é".encode()}
    assert replies[5] == [(b"x", 1.5), (b"y", 2.0)]
    assert isinstance(replies[8], redis.ResponseError) and "WRONGTYPE" in str(replies[8])
    assert pipe.command_stack == [] and pipe.execute() == []  # reset after execute


def test_the_first_error_is_raised_as_redis_py_raises_it(kept: redis.Redis,
                                                         plain: redis.Redis) -> None:
    errors = []
    for client, key in ((kept, "kept"), (plain, "plain")):
        client.set(key, "text")
        pipe = client.pipeline(transaction=False)
        pipe.incr(f"{key}:ok")
        pipe.incr(key)  # not an integer
        with pytest.raises(redis.ResponseError) as raised:
            pipe.execute()
        errors.append(str(raised.value).replace(key, "KEY"))
        assert client.get(f"{key}:ok") == b"1"  # the rest ran
    assert errors[0] == errors[1] and "Command # 2 (INCRBY KEY 1)" in errors[0]


def test_an_argument_redis_py_refuses_is_refused_before_anything_is_sent(
        kept: redis.Redis, r: redis.Redis) -> None:
    pipe = kept.pipeline(transaction=False)
    pipe.set("a", 1)
    pipe.set("b", True)  # type: ignore[arg-type]  # redis-py refuses a bool
    with pytest.raises(redis.DataError):
        pipe.execute()
    assert r.exists("a") == 0
    assert kept.pipeline(transaction=False).set("c", 1).execute() == [True]


class Color(enum.IntEnum):
    RED = 1


class Shade(enum.StrEnum):
    DARK = "dark"


class Ratio(float):
    def __repr__(self) -> str:
        return "ratio"


PLAIN_AND_ODD_COMMANDS = [
    ("INCRBY", "n", 1),
    ("SETBIT", "bits", 2**40, 1),
    ("SET", "é", b"\xff\x00", "EX", 1.5),
    ("SET", memoryview(b"view"), bytearray(b"array")),  # bytearray: redis-py's path
    ("SET", Shade.DARK, Color.RED),  # an IntEnum: redis-py writes its repr
    ("SET", "ratio", Ratio(0.5)),
    ("SET", "view", memoryview(b"v" * 10_000)),  # beyond redis-py's 6,000-byte chunks
    ("CLIENT SETNAME", "split"),  # a name with whitespace: redis-py's path
    ("CLIENT\tSETNAME", "split"),
]


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_a_pipeline_is_packed_to_redis_pys_bytes(encoding: str) -> None:
    conn = redis.Connection(encoding=encoding)  # never connected: packing needs no server
    for command in PLAIN_AND_ODD_COMMANDS:
        assert b"".join(_pipeline_packed(conn, [command])) == \
            b"".join(conn.pack_commands([command]))
    assert b"".join(_pipeline_packed(conn, PLAIN_AND_ODD_COMMANDS)) == \
        b"".join(conn.pack_commands(PLAIN_AND_ODD_COMMANDS))


def test_what_redis_py_refuses_in_packing_is_refused_alike() -> None:
    conn = redis.Connection()
    for command, error in ((("SET", "k", True), redis.DataError),
                           (("SET", "k", object()), redis.DataError),
                           (("SET", "k", "\ud800"), UnicodeEncodeError)):
        with pytest.raises(error) as ours:
            _pipeline_packed(conn, [command])
        with pytest.raises(error) as theirs:
            conn.pack_commands([command])
        assert str(ours.value) == str(theirs.value)


def test_transactions_watch_and_scripts_stay_redis_pys(kept: redis.Redis,
                                                       r: redis.Redis) -> None:
    transaction = kept.pipeline()
    assert type(transaction) is Pipeline
    assert transaction.incr("t").incr("t").execute() == [1, 2]
    with kept.pipeline(transaction=False) as pipe:
        pipe.watch("w")  # WATCH checks a connection out of the pool: redis-py's path
        pipe.multi()
        pipe.set("w", 1)
        assert pipe.execute() == [True]
    scripted = kept.pipeline(transaction=False)
    double = kept.register_script("return 2 * tonumber(ARGV[1])")
    double(args=[21], client=scripted)
    assert scripted.execute() == [42]
    assert r.get("w") == b"1"


def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_pipeline(
        kept: redis.Redis, name: str, r: redis.Redis) -> None:
    before = kept.pipeline(transaction=False).client_id().execute()[0]
    assert r.client_kill_filter(_id=before) == 1
    assert kept.pipeline(transaction=False).lpush("l", "x").execute() == [1]
    assert r.lrange("l", 0, -1) == [b"x"]  # sent once, on the new connection
    after = kept.pipeline(transaction=False).client_id().execute()[0]
    assert after != before
    assert wait_for(lambda: named(r, name) == [after], 5)


def test_a_job_bodys_pipelines_and_the_processors_pushes_share_one_connection(
        kept: redis.Redis, name: str, r: redis.Redis) -> None:
    client = clients.Client.keeping(kept)  # as forkq.daemon.child_process.setup builds it
    for n in range(20):
        client.push({"class": "Kept", "args": [n]})
        kept.pipeline(transaction=False).incr("done").setbit("bits", n, 1).execute()
    assert r.llen("queue:default") == 20 and r.get("done") == b"20"
    assert wait_for(lambda: len(named(r, name)) == 1, 5), named(r, name)
