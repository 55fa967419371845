"""How idle processors wait: a push wakes one of them at once, and nothing piles up in Redis.

One queue: every idle child waits inside Redis (BLMOVE into its armed in-flight list), so a
push is handed to exactly one of them. Several queues: one watcher per daemon (the holder of
the watch token), its watch unsubscribed while its child is busy.
Either way any client's push (Ruby's too) wakes the daemon. A server that closes idle
connections (``timeout``) costs the waiting processors nothing.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from forkq import keys
from forkq.client import Client
from forkq.daemon import held_jobs
from forkq.daemon.children.blocking_wait import BlockingWait, name_for
from forkq.daemon.children.queuewatch import QueueWatch
from forkq.daemon.master.effects import CANCEL_WATCH
from forkq.embedded import EmbeddedServer

from .conftest import counting_fetches, named, push, records, throwaway_server, until
from .test_sidekiq_interop import _run_ruby

MULTI = "queues: [[critical, 2], default]\n"


@pytest.mark.ruby
@pytest.mark.parametrize("queues", ["", MULTI], ids=["one-queue", "weighted-queues"])
def test_a_ruby_push_wakes_an_idle_daemon_at_once(r: redis.Redis, daemon: Any, server: Any,
                                                 queues: str) -> None:
    d = daemon(f"concurrency: 3\nrequire: jobs\nlog_level: warning\n{queues}")
    d.wait_children(3)
    until(lambda: r.scard(keys.INFLIGHT_REGISTRY) == 3, 15, "the children did not register")
    _run_ruby("push_spaced.rb", "12", "default", "0.15", server=server)
    until(lambda: r.llen("test:lag") == 12, 15, lambda: f"not all ran; log:\n{d.log()}")
    lags = [row["lag"] for row in records(r, "test:lag")]
    # idle children that polled (every 2 s) would start a job ~1 s late on average
    assert statistics.median(lags) < 0.25, lags
    assert max(lags) < 1.5, lags


def test_a_push_to_one_queue_wakes_one_idle_child(r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 4\nrequire: jobs\nlog_level: warning\n")
    d.wait_children(4)
    until(lambda: _blocked(r) == 4, 15, "the idle children are not waiting")
    client, jobs = Client(r), 20
    with counting_fetches(r) as fetches:
        started = time.monotonic()
        for n in range(jobs):
            until(lambda: _blocked(r) == 4, 5)  # idle: every child waits
            client.push({"class": "Lag", "args": [n]})
            until(lambda n=n: r.llen("test:lag") == n + 1, 5)
        calls = fetches()
    timeouts = 4 * (int((time.monotonic() - started) / 2) + 1)  # each fetches every 2 s
    # a broadcast wake would cost every idle child a fetch per push: 4 per job here; the
    # child that took the push fetches once after its job
    assert calls <= jobs + timeouts, (calls, timeouts)


def test_only_the_processors_keep_the_watch_token_s_files(r: redis.Redis,
                                                         daemon: Any) -> None:
    """The watch token's file and doorbell are open in the master and in the processors
    that may wait on it; the scheduler, forked by the same master, has none of them."""
    d = daemon(f"concurrency: 2\nrequire: jobs\n{MULTI}")
    (processor, *_) = _booted(d, 2)
    token = _shared_with_master(d.pid, processor.pid)
    assert len(token) == 2, token  # the doorbell pipe and the file
    assert _shared_with_master(d.pid, d.scheduler().pid) == set()


def _booted(d: Any, count: int) -> list[Any]:
    """The ``count`` children of ``d`` once each has reported its boot (the master has
    closed its end of their boot-report pipes then)."""
    until(lambda: f"ready: {count} processors fetching" in d.log(), 15, d.log)
    return list(d.wait_children(count))


def _shared_with_master(master: int, child: int) -> set[str]:
    """The pipes and unlinked files open both in ``master`` and in its ``child``, but for
    the master's standard streams (which every child keeps)."""
    mine = _open_files(master)
    streams = {mine.get(fd) for fd in (0, 1, 2)}
    shared = set(mine.values()) & set(_open_files(child).values())
    return {name for name in shared - streams
            if name.startswith("pipe:") or name.endswith("(deleted)")}


def _open_files(pid: int) -> dict[int, str]:
    """What each of ``pid``'s file descriptors names (``pipe:[inode]``, a path ...)."""
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed while listed
            found[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
    return found


@pytest.mark.parametrize("queues", ["", MULTI], ids=["one-queue", "weighted-queues"])
def test_a_burst_to_an_idle_daemon_starts_on_every_processor_at_once(
        r: redis.Redis, daemon: Any, queues: str) -> None:
    d = daemon(f"concurrency: 4\nrequire: jobs\nlog_level: warning\n{queues}")
    d.wait_children(4)
    until(lambda: r.scard(keys.INFLIGHT_REGISTRY) == 4, 15, "the children did not register")
    if not queues:  # every idle child waits in Redis
        until(lambda: _blocked(r) == 4, 15, "the idle children are not waiting")
    # all four start at once, not when idle ones fetch on their own (2 s)
    _assert_a_burst_starts_on_every_processor(r, d, 4)


def test_a_reload_that_raises_concurrency_wakes_the_new_processors_too(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 2\nrequire: jobs\nlog_level: warning\n")
    d.wait_children(2)
    path = Path(d.config_file)
    path.write_text(path.read_text().replace("concurrency: 2", "concurrency: 5"))
    d.signal(signal.SIGHUP)
    d.wait_children(5)
    until(lambda: r.scard(keys.INFLIGHT_REGISTRY) == 5, 15, d.log)
    _assert_a_burst_starts_on_every_processor(r, d, 5)
    assert "Traceback" not in d.log(), d.log()


def _assert_a_burst_starts_on_every_processor(r: redis.Redis, d: Any, count: int) -> None:
    """Push ``count`` jobs of 3 s at once: each starts on a processor of its own within 1 s
    of the push."""
    Client(r).push_bulk({"class": "SlowLag", "args": [[3]] * count})
    until(lambda: r.llen("test:lag") == count, 10, d.log)
    rows = records(r, "test:lag")
    assert len({row["pid"] for row in rows}) == count, rows
    assert max(row["lag"] for row in rows) < 1.0, rows


def _blocked(r: redis.Redis) -> int:
    """How many clients wait in a blocking command."""
    return int(r.info("clients")["blocked_clients"])


def test_a_push_to_a_daemon_of_several_queues_wakes_one_watcher(r: redis.Redis,
                                                                daemon: Any) -> None:
    d = daemon(f"concurrency: 8\nrequire: jobs\nlog_level: warning\n{MULTI}")
    d.wait_children(8)
    until(lambda: r.scard(keys.INFLIGHT_REGISTRY) == 8, 15, "the children did not register")
    watching = _watches(r)
    client, jobs = Client(r), 20
    with counting_fetches(r) as fetches:
        started = time.monotonic()
        for n in range(jobs):
            client.push({"class": "Lag", "args": [n],
                         "queue": ("critical", "default")[n % 2]})
            until(lambda n=n: r.llen("test:lag") == n + 1, 5)
            time.sleep(0.01)
        calls = fetches()
    timeouts = 8 * (int((time.monotonic() - started) / 2) + 1)  # each fetches every 2 s
    # a broadcast wake costs every idle child a fetch per push: 8 per job here; one watcher
    # costs its fetch, its successor's first fetch and its own fetch after the job
    assert calls <= 4 * jobs + timeouts, (calls, timeouts)
    assert len(watching) <= 2, watching  # one subscribed watch (two while handing over)
    lags = [row["lag"] for row in records(r, "test:lag")]
    assert statistics.median(lags) < 0.25, lags


@pytest.mark.parametrize("queues", ["", MULTI], ids=["one-queue", "weighted-queues"])
def test_a_killed_listener_is_replaced_at_once(r: redis.Redis, daemon: Any,
                                               queues: str) -> None:
    d = daemon(f"concurrency: 3\nrequire: jobs\nlog_level: warning\n{queues}")
    d.wait_children(3)
    until(lambda: r.scard(keys.INFLIGHT_REGISTRY) == 3, 15, "the children did not register")
    client, queue = Client(r), "critical" if queues else "default"
    client.push({"class": "Lag", "args": ["first"], "queue": "default"})
    until(lambda: r.llen("test:lag") == 1)
    for child in d.children():  # kill them one after the other: the listeners among them
        os.kill(child.pid, signal.SIGKILL)
        d.wait_children(3)
        until(lambda: r.scard(keys.INFLIGHT_REGISTRY) == 3, 15)
        pushed = r.llen("test:lag")
        client.push({"class": "Lag", "args": ["after"], "queue": queue})
        until(lambda pushed=pushed: r.llen("test:lag") == pushed + 1, 5)
    lags = [row["lag"] for row in records(r, "test:lag")[1:]]
    assert max(lags) < 1.0, lags  # not the 2 s poll: a listener took over


@pytest.mark.parametrize("queues", ["", MULTI], ids=["one-queue", "weighted-queues"])
def test_busy_children_pile_up_nothing_in_redis(r: redis.Redis, daemon: Any,
                                                queues: str) -> None:
    d = daemon(f"concurrency: 2\nrequire: jobs\nlog_level: warning\n{queues}")
    d.wait_children(2)
    until(lambda: r.scard(keys.INFLIGHT_REGISTRY) == 2, 15, "the children did not register")
    largest, done = [0], threading.Event()
    sampler = redis.Redis(connection_pool=r.connection_pool)

    def sample() -> None:
        while not done.is_set():
            clients = sampler.client_list()
            largest[0] = max([largest[0], *(int(c["omem"]) for c in clients)])
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        client = Client(r)
        for queue in ("critical", "default") if queues else ("default",):
            client.push_bulk({"class": "Lag", "queue": queue, "args": [[n] for n in range(3000)]})
        total = 6000 if queues else 3000
        until(lambda: r.llen("test:lag") == total, 60, lambda: f"log:\n{d.log()}")
    finally:
        done.set()
        thread.join(5)
    # before, each busy child's watch kept ~180 bytes per job processed by anyone
    assert largest[0] < 64 * 1024, largest[0]


def test_taking_back_a_list_ends_its_holders_waiting_connection(r: redis.Redis) -> None:
    inflight = keys.inflight("host:1:abc", 4242)
    r.rpush(inflight, "queue:waiting")  # armed, as fetch.lua leaves it
    waiter = redis.Redis(connection_pool=r.connection_pool).connection_pool.make_connection()
    waiter.connect()
    try:
        waiter.send_command("CLIENT", "SETNAME", name_for(inflight))
        waiter.read_response()
        waiter.send_command("BLMOVE", "queue:waiting", inflight, "RIGHT", "RIGHT", 0)
        until(lambda: int(r.info("clients")["blocked_clients"]) == 1)
        held = held_jobs.read(r, inflight)  # the holder is gone; its socket not yet seen closed
        assert held == held_jobs.Held("waiting", None, 1)
        assert not [c for c in r.client_list() if c["name"] == name_for(inflight)]
        r.lpush("queue:waiting", "job")
        assert r.lrange("queue:waiting", 0, -1) == [b"job"]
        assert r.lrange(inflight, 0, -1) == [b"queue:waiting"]
    finally:
        waiter.disconnect()


def test_a_waiting_connection_the_server_closed_between_waits_is_replaced(
        r: redis.Redis) -> None:
    inflight = keys.inflight("host:1:abc", 4343)
    waiting = BlockingWait(r, inflight, "queue:waiting")
    read_fd, write_fd = os.pipe()
    try:
        r.lpush("queue:waiting", "first")
        assert waiting.wait(1, read_fd) == b"first"
        [before] = named(r, name_for(inflight))
        assert r.client_kill_filter(_id=before) == 1  # as the server's idle timeout would
        r.lpush("queue:waiting", "second")
        assert waiting.wait(1, read_fd) == b"second"  # no error: a new connection waited
        assert r.lrange(inflight, 0, -1) == [b"first", b"second"]
        assert named(r, name_for(inflight)) not in ([], [before])
    finally:
        waiting.close()
        os.close(read_fd)
        os.close(write_fd)


def test_a_waiting_connection_the_server_closes_while_it_waits_ends_the_wait(
        r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """A close by the server during a wait is a timeout with a warning, not an outage; a
    second within CLOSED_AGAIN is raised (the caller backs off): no busy loop."""
    inflight = keys.inflight("host:1:abc", 4344)
    waiting = BlockingWait(r, inflight, "queue:waiting")
    read_fd, write_fd = os.pipe()
    try:
        for outcome in (None, redis.ConnectionError):
            killer = threading.Thread(target=_kill_when_waiting, args=(r, name_for(inflight)))
            killer.start()
            try:
                if outcome is None:
                    assert waiting.wait(5, read_fd) is None
                else:
                    with pytest.raises(outcome):
                        waiting.wait(5, read_fd)
            finally:
                killer.join(10)
        assert "closed this processor's waiting connection" in caplog.text
        r.lpush("queue:waiting", "after")
        assert waiting.wait(1, read_fd) == b"after"  # a new connection waits again
    finally:
        waiting.close()
        os.close(read_fd)
        os.close(write_fd)


def _kill_when_waiting(r: redis.Redis, name: str) -> None:
    """CLIENT KILL the connection named ``name`` once it is blocked in its BLMOVE."""
    until(lambda: any(c["name"] == name and c["cmd"] == "blmove" for c in r.client_list()),
          5, f"{name} is not waiting")
    [found] = named(r, name)
    r.client_kill_filter(_id=found)


def test_a_daemon_whose_waiting_connections_are_killed_sees_no_outage(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 2\nrequire: jobs\nlog_level: info\n")
    d.wait_children(2)
    until(lambda: _blocked(r) == 2, 15, "the idle children are not waiting")
    killed = [c["id"] for c in r.client_list() if c["cmd"] == "blmove"]
    assert len(killed) == 2 and all(r.client_kill_filter(_id=i) for i in killed)
    until(lambda: _blocked(r) == 2, 5, lambda: f"they do not wait again; log:\n{d.log()}")
    jid = push(r, "Lag", "after")
    until(lambda: r.llen("test:lag") == 1, 5, d.log)
    [row] = records(r, "test:lag")
    assert row["jid"] == jid and row["lag"] < 0.5, row
    log = d.log()
    assert log.count("closed this processor's waiting connection") == 2, log
    assert "unavailable" not in log and "downtime" not in log, log


def test_a_daemon_of_several_queues_whose_watches_are_killed_sees_no_outage(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon(f"concurrency: 2\nrequire: jobs\nlog_level: info\n{MULTI}")
    d.wait_children(2)
    until(lambda: len(_watches(r)) == 2, 15, "the idle children are not watching")
    killed = _watches(r)
    assert all(r.client_kill_filter(_id=i) for i in killed)
    jid = push(r, "Lag", "after")  # at once: found by the fetch that follows the reopening
    until(lambda: r.llen("test:lag") == 1, 5, d.log)
    [row] = records(r, "test:lag")
    assert row["jid"] == jid and row["lag"] < 0.5, row
    until(lambda: len(_watches(r)) == 2 and not set(_watches(r)) & set(killed), 5,
          lambda: f"they do not watch again; log:\n{d.log()}")
    log = d.log()
    assert "unavailable" not in log and "downtime" not in log and "Traceback" not in log, log


def _watches(r: redis.Redis) -> list[int]:
    """The ids of the processors' subscribed queue watches (not the master's cancel watch)."""
    return [int(c["id"]) for c in r.client_list()
            if c["cmd"] == "subscribe" and "P" in c["flags"] and c["name"] != CANCEL_WATCH]


@pytest.fixture
def closing_server() -> Iterator[EmbeddedServer]:
    """A server of its own that closes any connection idle for a second (``timeout 1``)."""
    with throwaway_server("fq-timeout-") as srv:
        with redis.Redis(unix_socket_path=srv.socket) as client:
            client.config_set("timeout", 1)
        yield srv


def test_a_daemon_on_a_server_that_closes_idle_connections_sees_no_outage(
        closing_server: EmbeddedServer, daemon: Any) -> None:
    rc = redis.Redis(unix_socket_path=closing_server.socket)
    try:
        d = daemon("concurrency: 2\nrequire: jobs\n", redis_url=closing_server.url)
        d.wait_children(2)
        until(lambda: _blocking_moves(rc) >= 2, 15, lambda: f"no child waited; log:\n{d.log()}")
        for n in range(3):
            waited = _blocking_moves(rc)
            time.sleep(1.5)
            # the waiting processor that takes it acknowledges it with a fetch on its own
            # connection, idle since the fetch before its wait, which the server closed after
            # 1 s; then it waits again
            jid = push(rc, "Record", f"after an idle spell {n}")
            until(lambda j=jid: j in [row["jid"] for row in records(rc)], 10,
                  lambda: f"the job never ran; log:\n{d.log()}")
            until(lambda w=waited: _blocking_moves(rc) >= w + 1, 10,
                  lambda: f"the children did not wait again; log:\n{d.log()}")
        assert "Redis unavailable" not in d.log() and "downtime" not in d.log(), d.log()
    finally:
        rc.close()


def _blocking_moves(rc: redis.Redis) -> int:
    """How many BLMOVE commands the server has run."""
    return int(rc.info("commandstats").get("cmdstat_blmove", {}).get("calls", 0))


def test_a_processor_whose_job_holds_a_thousand_files_waits_and_runs_on(
        r: redis.Redis, daemon: Any) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= 2048, f"this test needs an open-files hard limit of 2048 or more, not {hard}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))  # the daemon inherits
    try:
        push(r, "hold_files", 1100)  # its first job: it has no waiting connection yet
        d = daemon("concurrency: 1\nrequire: jobs\n")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    until(lambda: records(r), 15, lambda: d.log())
    assert records(r)[0]["top_fd"] >= 1100
    # idle now, waiting on a connection opened past fd 1024 (past select's limit)
    until(lambda: int(r.info("clients")["blocked_clients"]) == 1, 15, lambda: d.log())
    jid = push(r, "Record", "after")
    until(lambda: jid in [row["jid"] for row in records(r)], 15, lambda: d.log())
    held, after = records(r)
    assert held["pid"] == after["pid"], d.log()  # the same processor: it never crashed
    assert "Traceback" not in d.log() and "exited with status" not in d.log(), d.log()


@pytest.mark.parametrize("then", ["arm", "wait"])
def test_a_paused_watch_the_server_closed_is_replaced_before_the_next_fetch(
        r: redis.Redis, then: str) -> None:
    watch = QueueWatch(r, name="paused-watch")
    read_fd, write_fd = os.pipe()
    try:
        watch.open()
        watch.pause()  # busy: unsubscribed, an idle client to the server's timeout
        [paused] = named(r, "paused-watch")
        assert r.client_kill_filter(_id=paused) == 1
        if then == "arm":  # the lane took the token: armed before its fetch
            watch.arm()
        else:  # the watcher's next wait: subscribes again, returns for a fetch
            assert watch.wait(5, read_fd) is False
        r.lpush("queue:pushed-after", "job")  # after the fetch that follows: must wake it
        until(watch.consume, 5, "the push after the fetch was missed")
    finally:
        watch.close()
        os.close(read_fd)
        os.close(write_fd)


def test_a_wait_that_reopens_a_broken_watch_returns_for_a_fetch_first(r: redis.Redis) -> None:
    """A watch whose connection broke (killed, a server restart) is reopened by the next wait.
    A push between the processor's fetch and that reopening made no invalidation for the
    new connection: the wait returns at once after subscribing, so the fetch that follows
    finds such a push, instead of blocking until the idle timeout."""
    watch = QueueWatch(r, name="broken-watch")
    read_fd, write_fd = os.pipe()
    try:
        watch.open()
        [first] = named(r, "broken-watch")
        assert r.client_kill_filter(_id=first) == 1
        assert watch.wait(5, read_fd) is False  # the broken connection ends the wait
        r.lpush("queue:pushed-before-the-reopen", "job")  # after the fetch that followed
        started = time.monotonic()
        # reopens, then returns for a fetch: a wait that blocked would take its whole 60 s
        assert watch.wait(60, read_fd) is False
        assert time.monotonic() - started < 30, "the reopening wait blocked"
        [second] = named(r, "broken-watch")
        assert second != first
        r.lpush("queue:pushed-after", "job")  # after that fetch: must wake the next wait
        until(watch.consume, 5, "the push after the fetch was missed")
    finally:
        watch.close()
        os.close(read_fd)
        os.close(write_fd)
