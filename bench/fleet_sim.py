"""Simulated forkq daemons for ``bench/fleet.py``: what an idle daemon writes and reads, at
its real rates, without its processes.

``python bench/fleet_sim.py URL COUNT [--concurrency N]`` keeps ``COUNT`` daemons alive on
the server at ``URL`` until it is sent SIGTERM. Each has an identity of its own
(``sim-<n>:<pid>:<hex>``) and does what a real idle daemon of ``N`` processors and a
following scheduler does, with the constants the real code uses (imported, so the two cannot
drift apart):

- its master writes the process record with ``record.lua`` every
  :data:`~forkq.daemon.master.supervisor.BEAT_INTERVAL` seconds, reads its children's beats
  every :data:`~forkq.daemon.master.supervisor.IDLE_WATCH_INTERVAL`, and renews its liveness
  key every :func:`~forkq.daemon.liveness.renewal`;
- each processor and the scheduler write a beat every ``liveness_timeout / 3`` seconds;
- each processor has a registered, armed in-flight list and waits in a ``BLMOVE`` of
  :data:`~forkq.daemon.children.effects.BLOCK_WAIT` seconds, on a connection of its own, on
  a queue of its own (``queue:fleet-sim``, which nothing pushes to: the jobs of the
  measurement go to the real daemons only);
- its scheduler follower listens, on a connection of its own, to the channel on which a
  leader hands over, and asks the lease's ``PTTL`` whenever the term it saw should end.

Phases are spread at random, as daemons started at different moments are.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import secrets
import signal
import sys
import time
from typing import Any
from urllib.parse import urlparse

import redis.asyncio as aioredis

from forkq import keys
from forkq.config import Config
from forkq.daemon import liveness
from forkq.daemon.children.effects import BLOCK_WAIT
from forkq.daemon.master.supervisor import BEAT_INTERVAL, IDLE_WATCH_INTERVAL
from forkq.scripts import source

QUEUE = "queue:fleet-sim"
CONFIG = Config()


class SimulatedDaemon:
    """One simulated daemon's identity and keys."""

    def __init__(self, number: int, concurrency: int) -> None:
        self.identity = f"sim-{number}:{100000 + number}:{secrets.token_hex(6)}"
        self.pids = [200000 + number * 100 + child for child in range(concurrency)]
        self.scheduler_pid = 200000 + number * 100 + 99
        self.inflight = [keys.inflight(self.identity, pid) for pid in self.pids]
        self.info = json.dumps({
            "hostname": f"sim-{number}", "started_at": time.time(), "pid": 100000 + number,
            "tag": "", "concurrency": concurrency, "queues": ["default"],
            "weights": [{"default": 1}], "labels": [], "identity": self.identity,
            "version": "sim", "embedded": False, "leader": False, "forkq": "sim"})

    def record_args(self) -> tuple[list[str], list[Any]]:
        """record.lua's keys and arguments, as :func:`forkq.daemon.master.heartbeats.beat`
        sends them for an idle daemon."""
        record = {"info": self.info, "busy": 0, "beat": repr(time.time()), "quiet": "false",
                  "rss": 120000, "rtt_us": 150, "concurrency": len(self.pids),
                  keys.FAILOVER_FIELD: repr(liveness.ttl(CONFIG))}
        pairs = [item for pair in record.items() for item in pair]
        return ([keys.PROCESSES, self.identity, *keys.workers(self.identity),
                 keys.signals(self.identity), keys.beats(self.identity)],
                [keys.PROCESS_TTL, len(pairs), *pairs])

    def beat(self, pid: int, seq: int) -> str:
        """A child's beat entry (idle)."""
        return json.dumps({"at": time.time(), "seq": seq, "job": None, "loops": seq,
                           "start": time.time()})


async def every(seconds: float, step: Any) -> None:
    """Run ``step()`` every ``seconds``, from a random phase."""
    await asyncio.sleep(random.uniform(0, seconds))
    while True:
        began = time.monotonic()
        await step()
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - began)))


async def start(r: aioredis.Redis, daemon: SimulatedDaemon) -> None:
    """What a daemon writes as it starts: liveness key, record, registered armed lists."""
    ttl_ms = int(liveness.ttl(CONFIG) * 1000)
    record_keys, record_args = daemon.record_args()
    async with r.pipeline(transaction=False) as pipe:
        pipe.set(keys.alive(daemon.identity), "1", px=ttl_ms)
        pipe.evalsha(RECORD_SHA, len(record_keys), *record_keys, *record_args)
        for key in daemon.inflight:
            pipe.sadd(keys.INFLIGHT_REGISTRY, key)
            pipe.rpush(key, QUEUE)
        for pid in [*daemon.pids, daemon.scheduler_pid]:
            pipe.hset(keys.beats(daemon.identity), str(pid), daemon.beat(pid, 0))
        await pipe.execute()


async def run_master(r: aioredis.Redis, daemon: SimulatedDaemon) -> list[asyncio.Task[None]]:
    """The master's periodic steps."""
    ttl_ms = int(liveness.ttl(CONFIG) * 1000)

    async def record() -> None:
        record_keys, record_args = daemon.record_args()
        await r.evalsha(RECORD_SHA, len(record_keys), *record_keys, *record_args)

    async def watch() -> None:
        await r.hgetall(keys.beats(daemon.identity))

    async def renew() -> None:  # a SET, not the PEXPIRE of a real master: a simulator that
        # fell behind (a host busy starting real daemons) comes back rather than lies dead
        await r.set(keys.alive(daemon.identity), "1", px=ttl_ms)

    return [asyncio.create_task(every(BEAT_INTERVAL, record)),
            asyncio.create_task(every(IDLE_WATCH_INTERVAL, watch)),
            asyncio.create_task(every(liveness.renewal(CONFIG), renew))]


async def run_child(r: aioredis.Redis, daemon: SimulatedDaemon, pid: int) -> None:
    """One child's beats."""
    seq = 0

    async def beat() -> None:
        nonlocal seq
        seq += 1
        await r.hset(keys.beats(daemon.identity), str(pid), daemon.beat(pid, seq))

    await every(CONFIG.liveness_timeout / 3, beat)


async def run_waiter(url: str, key: str) -> None:
    """One processor's blocking wait, on its own connection."""
    r = aioredis.Redis.from_url(url, socket_timeout=BLOCK_WAIT + 5)
    while True:
        await r.blmove(QUEUE, key, BLOCK_WAIT, "RIGHT", "RIGHT")


def _command(*words: str | int) -> bytes:
    """A command in RESP."""
    parts = [str(word).encode() for word in words]
    return b"*%d\r\n" % len(parts) + b"".join(
        b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A plain stream to the server of ``url`` (``unix://`` or ``redis://host:port``)."""
    parsed = urlparse(url)
    if parsed.scheme == "unix":
        return await asyncio.open_unix_connection(parsed.path)
    return await asyncio.open_connection(parsed.hostname, parsed.port or 6379)


async def run_follower(url: str, r: aioredis.Redis) -> None:
    """The scheduler follower: subscribed to the channel on which a leader hands over, on a
    stream of its own (:class:`~forkq.daemon.children.queuewatch.QueueWatch` without
    prefixes), and a ``PTTL`` of the lease whenever the term it saw should have ended (or a
    message arrived), as :meth:`~forkq.daemon.children.scheduler.Scheduler._campaign`."""
    reader, writer = await _open(url)
    writer.write(_command("SUBSCRIBE", keys.LEADER_RELEASED))
    for _ in range(6):  # *3, $9 subscribe, $<n> channel, :1
        await reader.readline()
    while True:
        ttl = int(await r.pttl(keys.LEADER))
        remaining = ttl / 1000 if ttl > 0 else 1.0  # no leader: it would campaign each second
        with contextlib.suppress(asyncio.TimeoutError):
            if not await asyncio.wait_for(reader.read(65536), remaining):
                return


RECORD_SHA = ""


def _report(task: asyncio.Task[Any]) -> None:
    """A simulated process that stopped on an error says so (the figures would be wrong)."""
    if not task.cancelled() and task.exception() is not None:
        print(f"fleet_sim: {task.get_name()} failed: {task.exception()!r}",
              file=sys.stderr, flush=True)


async def main_async(url: str, count: int, concurrency: int) -> None:
    global RECORD_SHA
    # the daemons' periodic commands share 64 connections (a step waits for a free one)
    r = aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool.from_url(
        url, max_connections=64, timeout=None))
    RECORD_SHA = await r.script_load(source("record"))
    daemons = [SimulatedDaemon(number, concurrency) for number in range(count)]
    tasks: list[asyncio.Task[Any]] = []
    for daemon in daemons:
        await start(r, daemon)
        tasks += await run_master(r, daemon)
        for pid in [*daemon.pids, daemon.scheduler_pid]:
            tasks.append(asyncio.create_task(run_child(r, daemon, pid)))
        for key in daemon.inflight:
            tasks.append(asyncio.create_task(run_waiter(url, key), name="waiter"))
        tasks.append(asyncio.create_task(run_follower(url, r), name="follower"))
    for task in tasks:
        task.add_done_callback(_report)
    print(f"simulating {count} daemons", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for task in tasks:
        task.cancel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("count", type=int)
    parser.add_argument("--concurrency", type=int, default=2)
    options = parser.parse_args(argv)
    asyncio.run(main_async(options.url, options.count, options.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())
