"""Redis Sentinel: a real master, a replica and three sentinels (Debian's ``redis-sentinel``)
on loopback ports, with passwords on the data nodes and on the sentinels.

The failover tests run a daemon under load (jobs that SADD their jid), fail the master over
(``SENTINEL FAILOVER``, or SIGKILL of the master) and count jobs by jid: every job whose
push Redis acknowledged *and replicated* (``WAIT 1`` sent in the same write as the push
answered 1) must run. They print how long the daemon took to work on the new master and
how many log lines mention ``READONLY`` (one per process and outage at most: no loop).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from forkq.client import Client
from forkq.connection import connect, round_trip

from .conftest import Daemon, run_forkq, until
from .topology import (
    PASSWORD,
    SENTINEL_PASSWORD,
    SERVICE,
    Node,
    SentinelGroup,
    make_certs,
    sentinel_group,
    wait_new_master,
)

CONCURRENCY = 3
DAEMON = f"concurrency: {CONCURRENCY}\nqueues: [failover]\nrequire: jobs\ntimeout: 5\n"
BATCH = 10


def payload(jid: str) -> bytes:
    """A Sidekiq job for ``Mark`` in the ``failover`` queue."""
    now = time.time()
    return json.dumps({"class": "Mark", "args": [], "queue": "failover", "jid": jid,
                       "retry": True, "created_at": now, "enqueued_at": now}).encode()


class Pusher(threading.Thread):
    """Pushes batches through a Sentinel client until stopped. Each batch is one write on
    one connection: SADD queues, LPUSH, then ``WAIT 1 1000``; a batch is *kept* only when
    every reply came and WAIT says a replica has it. Nothing is resent."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = connect(url, socket_timeout=5, connect_timeout=2)
        self.kept: list[str] = []
        self.unsure: list[str] = []
        self.stopping = threading.Event()
        self.sequence = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            jids = [f"{self.sequence:012d}{i:012d}" for i in range(BATCH)]
            self.sequence += 1
            commands: list[tuple[Any, ...]] = [
                ("SADD", "queues", "failover"),
                ("LPUSH", "queue:failover", *map(payload, jids)), ("WAIT", 1, 1000)]
            try:
                replies = round_trip(self.client, commands)
            except redis.RedisError:
                self.unsure += jids
                time.sleep(0.05)
                continue
            kept = not any(isinstance(r, Exception) for r in replies) and replies[-1] >= 1
            (self.kept if kept else self.unsure).extend(jids)
            time.sleep(0.01)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        self.client.close()


def start_daemon(daemon: Callable[..., Daemon], url: str) -> Daemon:
    d = daemon(DAEMON, redis_url=url)
    d.wait_children(CONCURRENCY, timeout=30)
    return d


def done(group: SentinelGroup, port: int) -> set[str]:
    """The jids in ``test:done`` on the node on ``port``."""
    try:
        return {m.decode() for m in group.node_on(port).client().smembers("test:done")}
    except redis.RedisError:
        return set()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["sentinel-failover", "sigkill-master"])
def test_a_failover_loses_no_job_redis_kept(daemon: Callable[..., Daemon], tmp_path: Path,
                                            how: str) -> None:
    with sentinel_group(tmp_path / "redis") as group:
        d = start_daemon(daemon, group.url)
        old = group.master.port
        pusher = Pusher(group.url)
        pusher.start()
        try:
            until(lambda: len(pusher.kept) >= 200 and len(done(group, old)) >= 100, 60,
                  lambda: f"no load on the old master; log:\n{d.log()}")
            triggered = time.monotonic()
            if how == "sentinel-failover":
                group.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", SERVICE)
            else:
                group.master.kill()
            new = wait_new_master(group, old)
            switched = time.monotonic() - triggered
            before = len(pusher.kept)
            # the daemon works on the new master: a job pushed there after the switch runs
            probe = "probe" + "0" * 19
            group.node_on(new).client().lpush("queue:failover", payload(probe))
            until(lambda: probe in done(group, new), 60,
                  lambda: f"the daemon did not work on the new master; log:\n{d.log()}")
            working = time.monotonic() - triggered
            until(lambda: len(pusher.kept) >= before + 100 or how == "sigkill-master", 60,
                  "no pushes kept on the new master")
        finally:
            pusher.stop()
        lost: set[str] = set()

        def all_ran() -> bool:
            lost.clear()
            lost.update(set(pusher.kept) - done(group, new))
            return not lost

        until(all_ran, 120, lambda: f"{len(lost)} kept jobs never ran, e.g. "
              f"{sorted(lost)[:5]}; log:\n{d.log()[-5000:]}")
        ran = done(group, new)
        log = d.log()
        readonly = [line for line in log.splitlines() if "READONLY" in line]
        unavailable = [line for line in log.splitlines() if "Redis unavailable" in line]
        print(f"\n{how}: pushed {len(pusher.kept) + len(pusher.unsure)} jobs, "
              f"{len(pusher.kept)} acknowledged and replicated, all {len(pusher.kept)} ran "
              f"(0 lost); {len(ran)} distinct jids ran in all (unreplicated pushes included); "
              f"sentinels named the new master {switched:.2f}s after the trigger, the daemon "
              f"ran a job pushed there {working:.2f}s after it; log lines: {len(readonly)} "
              f"READONLY, {len(unavailable)} 'Redis unavailable'")
        print("\n".join(line for line in log.splitlines() if "Redis " in line))
        assert d.alive(), d.log()
        # each process (master, scheduler, processors) reports the outage of each of its
        # connections at most once (a pooled one, a processor's own): no loop
        processes = CONCURRENCY + 2
        assert len(readonly) <= 2 * processes, "\n".join(readonly)
        assert len(unavailable) <= 2 * processes, "\n".join(unavailable)
        assert "NOPERM" not in log


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_term_is_acted_on_at_once_while_no_sentinel_answers(daemon: Callable[..., Daemon],
                                                             tmp_path: Path) -> None:
    """Sentinels and data nodes all gone: TERM still starts the stop at once, and the master
    exits by its stop deadline (``timeout`` 5 s, then 10 s more trying to requeue). redis-py's
    sentinel clients' own retries (ten, with growing pauses, for each sentinel in each
    discovery) held one command ~15 s and a stop ~85 s, past systemd's ``TimeoutStopSec``."""
    with sentinel_group(tmp_path / "redis") as group:
        d = start_daemon(daemon, group.url)
        for node in (*group.sentinels, group.master, group.replica):
            node.kill()
        until(lambda: "master ERROR: Redis unavailable" in d.log(), 30, d.log)
        asked = time.monotonic()
        d.signal(signal.SIGTERM)
        until(lambda: "Shutting down" in d.log(), 5, lambda: f"TERM not acted on:\n{d.log()}")
        assert d.wait(timeout=5 + 10 + 10) == 0, d.log()
        print(f"\nstopped {time.monotonic() - asked:.1f} s after TERM, with no Redis")


def test_sentinel_urls_serve_the_daemon_the_cli_and_the_client(
        daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    with sentinel_group(tmp_path / "redis") as group:
        hosts = ";".join(f"sentinel://:{PASSWORD}@127.0.0.1:{node.port}/0"
                         for node in group.sentinels)
        kombu = f"{hosts}?master_name={SERVICE}&sentinel_password={SENTINEL_PASSWORD}"
        d = start_daemon(daemon, kombu)  # Celery's spelling for the daemon
        client = Client(url=group.url)  # the redis+sentinel:// one for the client
        jid = client.push({"class": "Mark", "args": [], "queue": "failover"})
        master = group.master.client()
        until(lambda: master.sismember("test:done", jid or ""), 30,
              lambda: f"the job did not run; log:\n{d.log()}")
        enqueued = run_forkq("enqueue", "Mark", "-q", "failover", "--redis-url", group.url)
        assert enqueued.returncode == 0, enqueued.stderr
        until(lambda: master.scard("test:done") == 2, 30, lambda: d.log())
        status = run_forkq("status", "--json", "--redis-url", kombu)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["processes"][0]["concurrency"] == CONCURRENCY
        wrong = run_forkq("status", "--redis-url", group.url.replace(SENTINEL_PASSWORD, "no"))
        assert wrong.returncode == 77, (wrong.returncode, wrong.stderr)


def test_a_plain_url_whose_server_turns_replica_is_an_outage_logged_once(
        daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    """READONLY (and UNBLOCKED for a waiting BLMOVE) on a plain redis:// URL: each process
    logs one outage and its end, retries with backoff, and works again once the server is
    a master again (as when a DNS name moves to the promoted server)."""
    auth = ["--requirepass", PASSWORD, "--masterauth", PASSWORD]
    served, other = Node(tmp_path / "a", auth), Node(tmp_path / "b", auth)
    served.start()
    other.start()
    try:
        d = start_daemon(daemon, f"redis://:{PASSWORD}@127.0.0.1:{served.port}/0")
        a = served.client()
        a.lpush("queue:failover", payload("before" + "0" * 18))
        until(lambda: a.sismember("test:done", "before" + "0" * 18), 30, lambda: d.log())
        a.replicaof("127.0.0.1", other.port)
        processes = CONCURRENCY + 2
        until(lambda: d.log().count("Redis unavailable") >= processes, 30, lambda: d.log())
        time.sleep(5)  # an observation window: a loop would log every backoff turn
        a.replicaof("NO", "ONE")
        after = "after" + "0" * 19
        a.lpush("queue:failover", payload(after))
        until(lambda: a.sismember("test:done", after), 30, lambda: d.log())
        log = d.log()
        readonly = [line for line in log.splitlines() if "READONLY" in line]
        unavailable = [line for line in log.splitlines() if "Redis unavailable" in line]
        online = [line for line in log.splitlines() if "Redis is online" in line]
        print(f"\nreplica for 5+ s: {len(unavailable)} 'Redis unavailable' lines "
              f"({len(readonly)} READONLY), {len(online)} 'Redis is online'")
        print("\n".join(line for line in log.splitlines() if "Redis " in line))
        # each process (master, scheduler, processors) logs this outage once, and its end
        # once: a server that stays a replica is one outage, not a loop of short ones
        pids = [line.split("pid=")[1].split()[0] for line in unavailable]
        assert len(pids) == len(set(pids)) <= processes, "\n".join(unavailable)
        assert "Redis refused" not in log, log
        assert d.alive()
    finally:
        served.stop()
        other.stop()


def test_tls_to_the_sentinels_and_the_master(daemon: Callable[..., Daemon],
                                             tmp_path: Path) -> None:
    """rediss+sentinel://: every node speaks only TLS and wants a client certificate; the
    daemon, the client and the CLI find the master, and follow it after a failover."""
    with sentinel_group(tmp_path / "redis", make_certs(tmp_path / "certs")) as group:
        d = start_daemon(daemon, group.url)
        jid = Client(url=group.url).push({"class": "Mark", "args": [], "queue": "failover"})
        until(lambda: jid in done(group, group.master.port), 30, lambda: d.log())
        status = run_forkq("status", "--json", "--redis-url", group.url)
        assert status.returncode == 0, status.stderr
        group.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", SERVICE)
        new = wait_new_master(group, group.master.port)
        enqueued = run_forkq("enqueue", "Mark", "-q", "failover", "--redis-url", group.url)
        assert enqueued.returncode == 0, enqueued.stderr
        until(lambda: len(done(group, new)) == 2, 60, lambda: d.log())


def test_a_sentinel_url_naming_a_plain_server_is_a_config_error_at_start(
        daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    """``unknown command 'SENTINEL'`` on every step until killed, before: now exit 78 at
    start, naming the URL (password hidden) and what answered."""
    plain = Node(tmp_path / "plain", [])
    try:
        plain.start(ready=lambda: plain.client(password=None).ping())
        url = f"redis+sentinel://:{PASSWORD}@127.0.0.1:{plain.port}/{SERVICE}"
        d = daemon(DAEMON, redis_url=url)
        assert d.wait(timeout=30) == 78, d.log()
        log = d.log()
        assert f"redis_url redis+sentinel://:***@127.0.0.1:{plain.port}/{SERVICE}" in log, log
        assert "answered SENTINEL with unknown command" in log and "is no sentinel" in log, log
        assert PASSWORD not in log and "ready:" not in log
    finally:
        plain.stop()
