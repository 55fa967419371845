"""Supervision against the real daemon: signals, reload, heartbeats, culling, timeouts, systemd.

Each test drives ``forkq run`` as a subprocess on the session's throwaway
server, sends real signals with ``os.kill`` and watches the effect in Redis,
in the daemon's log or in its exit status. Waits are bounded polls.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

import forkq
from forkq import api
from forkq.embedded import EmbeddedServer
from forkq.subprocesses import wait_for

from .conftest import Daemon, NotifyReceiver, identity_of, push, records, server_binary, until

Start = Callable[..., Daemon]
LIVENESS = 10  # the smallest liveness_timeout allowed


def started(r: redis.Redis) -> list[dict[str, Any]]:
    return records(r, "test:started")


def ran(r: redis.Redis) -> list[dict[str, Any]]:
    return records(r, "test:ran")


def running(r: redis.Redis, d: Daemon, children: int, job: str, *args: Any,
            queue: str = "default") -> str:
    """Wait for ``children`` children, push ``job`` and wait until it has started; its jid."""
    d.wait_children(children)
    jid = push(r, job, *args, queue=queue)
    until(lambda: any(x["jid"] == jid for x in started(r)), 15, d.log())
    return jid


def edit(d: Daemon, old: str, new: str) -> None:
    path = Path(d.config_file)
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def child_pids(d: Daemon) -> set[int]:
    return {p.pid for p in d.children()}


# --- a. the signal table -------------------------------------------------------------------


def test_second_term_during_graceful_stop_exits_at_once_losing_nothing(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 2\ntimeout: 60\nrequire: jobs\n")
    d.wait_children(2)
    jids = [push(r, "Sleep", 60, f"s{i}") for i in range(2)]
    until(lambda: len(started(r)) == 2, 15, d.log())

    d.signal(signal.SIGTERM)
    until(lambda: "Shutting down" in d.log(), 5, d.log())
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0
    # at once, not after the 60 s timeout: timed by the daemon's own log, from the second
    # TERM acted on to its last line (the test's turn to reap it is not the daemon's)
    assert d.logged_at("Bye!") - d.logged_at("Second stop signal: stopping now") < 3, d.log()
    back = {json.loads(job)["jid"] for job in r.lrange("queue:default", 0, -1)}
    assert back == set(jids), d.log()
    assert r.smembers("processes") == set()
    assert r.scard("forkq:inflight") == 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stop_clears_the_process_record_and_exits_0(
        r: redis.Redis, daemon: Start, signum: signal.Signals) -> None:
    d = daemon("concurrency: 2\nrequire: jobs\n")
    me = identity_of(r, d)
    d.signal(signum)
    assert d.wait(10) == 0
    assert r.sismember("processes", me) == 0
    assert r.exists(f"{me}:workers", f"{me}:work", f"forkq:beats:{me}") == 0
    assert r.hget(me, "quiet") == b"true"
    assert "Bye!" in d.log()


@pytest.mark.parametrize("signum", [signal.SIGTSTP, signal.SIGUSR1])
def test_quiet_finishes_running_jobs_fetches_no_more_and_keeps_beating(
        r: redis.Redis, daemon: Start, signum: signal.Signals) -> None:
    d = daemon("concurrency: 3\nrequire: jobs\n")
    me = identity_of(r, d)
    running(r, d, 3, "Sleep", 3, "running")

    d.signal(signum)
    until(lambda: r.hget(me, "quiet") == b"true", 3, "quiet did not reach the process record")
    until(lambda: len(d.children()) == 1, 5, d.log())  # the idle ones are gone at once
    assert "no longer accepting new work" in d.log()
    until(lambda: [x["marker"] for x in ran(r)] == ["running"], 10, d.log())
    until(lambda: len(d.children()) == 0, 5, d.log())

    push(r, "Sleep", 0, "after-quiet")
    beat = float(r.hget(me, "beat") or 0)
    until(lambda: float(r.hget(me, "beat") or 0) > beat, 8, "the heartbeat stopped when quiet")
    assert r.llen("queue:default") == 1  # nobody fetched it
    assert r.sismember("processes", me) == 1
    assert "[0 of 3 busy] quiet" in " ".join(psutil.Process(d.pid).cmdline())
    d.signal(signal.SIGTERM)
    assert d.wait(10) == 0


def test_ttin_logs_the_stack_of_the_master_and_of_each_child_with_its_job(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 2\ntimeout: 1\nrequire: jobs\n")
    jid = running(r, d, 2, "Sleep", 30, "dump")

    d.signal(signal.SIGTTIN)
    until(lambda: "TTIN: idle" in d.log() and f"TTIN: running Sleep jid={jid}" in d.log(), 5,
          d.log())
    log = d.log()
    assert "master WARNING: TTIN: master thread" in log
    assert "in on_dump" in log
    busy = log[log.index(f"TTIN: running Sleep jid={jid}"):]
    assert "from queue default" in busy.splitlines()[0]
    assert "time.sleep(seconds)" in busy  # the line of the job it is in
    assert len(child_pids(d)) == 2  # nothing else changed

    def titles() -> list[str]:  # a processor's title follows its job on each heartbeat (2 s)
        return sorted(" ".join(p.cmdline()).strip().removeprefix("forkq 0.1.0 ")
                      for p in d.children())

    until(lambda: titles() in (["processor-0 idle", f"processor-1 busy Sleep jid={jid}"],
                               [f"processor-0 busy Sleep jid={jid}", "processor-1 idle"]), 5,
          lambda: str(titles()))


def test_usr2_reopens_the_log_file_in_the_master_and_the_children(
        r: redis.Redis, daemon: Start, tmp_path: Path) -> None:
    log_file = tmp_path / "forkq.log"
    d = daemon(f"concurrency: 2\nrequire: jobs\nlog_file: {log_file}\n")
    d.wait_children(2)
    d.scheduler()
    until(lambda: log_file.exists() and "took office" in log_file.read_text(), 10)
    log_file.rename(tmp_path / "forkq.log.1")  # what logrotate does

    d.signal(signal.SIGUSR2)  # the master, 2 processors and the scheduler reopen
    until(lambda: log_file.exists() and log_file.read_text().count("log file reopened") == 4, 5,
          "USR2 did not make every process reopen the log file")
    assert "scheduler INFO: log file reopened" in log_file.read_text()
    jid = push(r, "Sleep", 0, "logged")
    until(lambda: f"Sleep jid={jid} done" in log_file.read_text(), 10)
    assert f"jid={jid}" not in (tmp_path / "forkq.log.1").read_text()


def test_children_ignore_signals_sent_to_the_whole_process_group(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 2\ntimeout: 20\nrequire: jobs\n", new_session=True)
    jid = running(r, d, 2, "Sleep", 2, "group")
    pids = child_pids(d)

    os.killpg(d.pid, signal.SIGTSTP)  # as a terminal's Ctrl-Z
    os.killpg(d.pid, signal.SIGINT)  # as Ctrl-C, or systemd's control-group TERM
    assert d.wait(15) == 0
    assert [(x["jid"], x["pid"]) for x in ran(r)] == [(jid, started(r)[0]["pid"])]
    assert started(r)[0]["pid"] in pids
    assert "killed" not in d.log()


def test_pid_file_is_written_and_removed(r: redis.Redis, daemon: Start, tmp_path: Path) -> None:
    pid_file = tmp_path / "forkq.pid"
    d = daemon(f"concurrency: 1\nrequire: jobs\npid_file: {pid_file}\n")
    until(pid_file.exists, 10)
    assert pid_file.read_text() == f"{d.pid}\n"
    d.signal(signal.SIGTERM)
    assert d.wait(10) == 0
    assert not pid_file.exists()


def test_children_that_cannot_boot_halt_the_master_with_the_reason(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 2\nrequire: bootfail\n")
    assert d.wait(30) == 79
    log = d.log()
    assert "respawns in 4.0s" in log  # growing backoff: 0.5, 1, 2, 4
    assert ("giving up: processor-0 failed to boot 5 times in a row: RuntimeError: "
            "database at db.invalid:5432 refused the connection") in log or (
        "giving up: processor-1 failed to boot 5 times in a row" in log), log
    assert r.smembers("processes") == set()


# --- b. reload -------------------------------------------------------------------------------


def _ticks(r: redis.Redis) -> list[dict[str, Any]]:
    return records(r, "test:ticks")


def _share(ticks: list[dict[str, Any]], queue: str) -> float:
    return sum(1 for t in ticks if t["queue"] == queue) / max(len(ticks), 1)


TICKS = 600
"""Ticks counted per configuration: a share of 3/4 drawn that often has a standard deviation
of 0.018, so the test's ±0.08 is 4.5 of them."""


def test_hup_applies_new_weights_to_new_processors_and_a_running_job_completes(
        r: redis.Redis, daemon: Start) -> None:
    """The shares are counted by who ran the ticks (the processors of the old configuration,
    those forked for the new one), not over windows of wall time: a loaded host changes how
    long the test takes, not what it sees."""
    d = daemon("concurrency: 3\nstrict: false\nrequire: jobs\nqueues:\n  - [aa, 3]\n  - [bb, 1]\n")
    long_jid = running(r, d, 3, "Sleep", 15, "long", queue="aa")
    old_pids = child_pids(d)
    client = forkq.Client(r)
    # both queues fill while paused: pushed one after the other, the idle processors would
    # run aa's ticks alone until bb's 4,000 land (a loaded clone: 0.830 for 0.75)
    paused = [api.Queue(r, queue) for queue in ("aa", "bb")]
    for queue in paused:
        queue.pause()
        client.push_bulk({"class": "Tick", "queue": queue.name,
                          "args": [[i, 0.005] for i in range(4000)]})
    for queue in paused:
        queue.resume()
    until(lambda: len(_ticks(r)) >= TICKS, 60, d.log)  # the old weights show
    assert not any(x["jid"] == long_jid for x in ran(r)), "the long job ended before the HUP"

    edit(d, "[aa, 3]\n  - [bb, 1]", "[aa, 1]\n  - [bb, 3]")
    d.signal(signal.SIGHUP)
    until(lambda: "reload: queues: aa:3, bb:1 -> aa:1, bb:3" in d.log(), 15, d.log)
    until(lambda: len([t for t in _ticks(r) if t["pid"] not in old_pids]) >= TICKS, 60, d.log)
    ticks = _ticks(r)
    old = [t for t in ticks if t["pid"] in old_pids]
    new = [t for t in ticks if t["pid"] not in old_pids]
    print(f"share of aa in the old processors' ticks: {_share(old, 'aa'):.3f} of {len(old)}; "
          f"share of bb in the new ones': {_share(new, 'bb'):.3f} of {len(new)}")
    assert len(old) >= TICKS and len(new) >= TICKS
    assert abs(_share(old, "aa") - 0.75) < 0.08
    assert abs(_share(new, "bb") - 0.75) < 0.08
    until(lambda: any(x["jid"] == long_jid for x in ran(r)), 30, d.log)
    [done] = [x for x in ran(r) if x["jid"] == long_jid]
    assert done["pid"] == started(r)[0]["pid"]  # the same child finished it
    assert len([x for x in started(r) if x["jid"] == long_jid]) == 1
    assert "killed" not in d.log()


def test_hup_with_a_broken_file_keeps_the_old_configuration(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 2\nstrict: false\nrequire: jobs\nqueues:\n  - [aa, 3]\n  - bb\n")
    me = identity_of(r, d)
    d.wait_children(2)
    until(lambda: "ready" in d.log(), 10)
    pids = child_pids(d)
    edit(d, "[aa, 3]", "[aa, -3]")

    d.signal(signal.SIGHUP)
    until(lambda: "reload rejected" in d.log(), 5, d.log())
    assert "queues: item 1: weight must be at least 1" in d.log() or "-3" in d.log(), d.log()
    d.signal(signal.SIGTTIN)  # any later turn of the loop; the children stay the same
    until(lambda: "TTIN: asking 2" in d.log(), 5)
    assert child_pids(d) == pids
    info = json.loads(r.hget(me, "info") or b"{}")
    assert info["weights"] == [{"aa": 3, "bb": 1}]


def test_hup_grows_and_shrinks_the_pool(r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 2\nrequire: jobs\n")
    d.wait_children(2)
    edit(d, "concurrency: 2", "concurrency: 5")
    d.signal(signal.SIGHUP)
    d.wait_children(5, timeout=10)
    assert "reload: concurrency: 2 -> 5" in d.log()
    edit(d, "concurrency: 5", "concurrency: 1")
    d.signal(signal.SIGHUP)
    d.wait_children(1, timeout=10)
    push(r, "Sleep", 0, "one")
    until(lambda: len(ran(r)) == 1, 10, d.log())
    me = identity_of(r, d)
    until(lambda: json.loads(r.hget(me, "info") or b"{}").get("concurrency") == 1, 8)


# --- c. heartbeats and culling -----------------------------------------------------------


def test_a_sigstopped_child_is_culled_and_its_job_runs_again(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 2\nliveness_timeout: 10\nrequire: jobs\n")
    jid = running(r, d, 2, "Sleep", 3, "stopped")
    frozen = started(r)[0]["pid"]

    os.kill(frozen, signal.SIGSTOP)
    t0 = time.monotonic()
    until(lambda: frozen not in child_pids(d) and len(d.children()) == 2, 10 + 5, d.log())
    print(f"culled and replaced {time.monotonic() - t0:.1f}s after SIGSTOP")
    assert f"(pid {frozen}) killed: no heartbeat for" in d.log()
    until(lambda: [x["jid"] for x in ran(r)] == [jid], 10, d.log())
    assert ran(r)[0]["pid"] != frozen


@pytest.mark.slow
def test_a_cpu_bound_job_of_twice_liveness_timeout_is_not_culled(r: redis.Redis,
                                                                  daemon: Start) -> None:
    d = daemon(f"concurrency: 1\nliveness_timeout: {LIVENESS}\nrequire: jobs\n")
    [child] = d.wait_children(1)
    running(r, d, 1, "Spin", 2 * LIVENESS, "cpu")
    until(lambda: len(ran(r)) == 1, 2 * LIVENESS + 15, d.log())
    assert ran(r)[0]["pid"] == child.pid
    assert "killed" not in d.log()


# --- d. job timeout and poison pill ---------------------------------------------------------


def test_a_job_past_job_timeout_is_killed_and_retried_with_a_timeout_error(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 2\njob_timeout: 2\nrequire: jobs\n")
    d.wait_children(2)
    jid = push(r, "Sleep", 100000, "forever")
    until(lambda: r.zcard("retry") == 1, 10, d.log())
    [entry] = [json.loads(x) for x in r.zrange("retry", 0, -1)]
    assert entry["jid"] == jid
    assert entry["error_class"] == "forkq.JobTimeoutError"
    assert "longer than its timeout of 2s" in entry["error_message"]
    assert entry["retry_count"] == 0
    assert r.llen("queue:default") == 0 and r.scard("forkq:inflight") <= 2
    d.wait_children(2)  # replaced
    push(r, "Sleep", 0, "still-healthy")
    until(lambda: [x["marker"] for x in ran(r)] == ["still-healthy"], 10, d.log())


def test_a_job_that_kills_its_child_three_times_goes_dead(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 1\nrequire: jobs\n")
    d.wait_children(1)
    jid = push(r, "Suicide")
    until(lambda: r.zcard("dead") == 1, 20, d.log())
    [entry] = [json.loads(x) for x in r.zrange("dead", 0, -1)]
    assert entry["jid"] == jid
    assert entry["error_class"] == "forkq.JobKilledError"
    assert entry["error_message"] == (
        "its processor died 3 times while running it (last: killed by signal SIGKILL)")
    assert d.log().count(f"Suicide jid={jid} start") == 3
    assert r.llen("queue:default") == 0
    d.wait_children(1)
    push(r, "Sleep", 0, "after")
    until(lambda: len(ran(r)) == 1, 10, d.log())


# --- e. sd_notify ---------------------------------------------------------------------------


def test_sd_notify_ready_status_reloading_stopping_and_watchdog(
        r: redis.Redis, daemon: Start, receiver: NotifyReceiver) -> None:
    messages = receiver
    d = daemon("concurrency: 2\nrequire: jobs\n", NOTIFY_SOCKET=receiver.notify_socket,
               WATCHDOG_USEC="1000000")

    ready = messages.wait(lambda m: m.startswith("READY=1"), 15)
    assert r.scard("forkq:inflight") == 2  # both children registered and fetching
    assert "STATUS=0 of 2 busy; queues default:1" in ready
    # a child beats within 2 s of its job's start; an idle master reads the beats every 2 s
    jid = push(r, "Sleep", 8, "status")
    messages.wait(lambda m: m == "STATUS=1 of 2 busy; queues default:1", 10)
    assert jid

    first = len(messages.poll())
    d.signal(signal.SIGHUP)
    messages.wait(lambda m: m.startswith("RELOADING=1\nMONOTONIC_USEC="), 5)
    after = messages.poll()[first:]
    reloading = next(i for i, m in enumerate(after) if m.startswith("RELOADING=1"))
    assert any(m.startswith("READY=1") for m in after[reloading:]) or wait_for(
        lambda: any(m.startswith("READY=1") for m in messages.poll()[first + reloading:]), 5)

    assert wait_for(lambda: len([m for m in messages.poll() if m == "WATCHDOG=1"]) >= 4, 5)
    pings = [t for t, m in messages.items if m == "WATCHDOG=1"]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    # WATCHDOG_USEC 1 s: pinged about every 0.5 s (the interval and its rate limit are unit
    # tests of test_systemd.py); here, that the pings keep coming within the watchdog on
    # average: one late turn of the master on a loaded host is not a missed watchdog
    assert statistics.mean(gaps) < 1.0, gaps

    d.signal(signal.SIGTERM)
    messages.wait(lambda m: m == "STOPPING=1", 5)
    assert d.wait(15) == 0
    stopping_at = next(t for t, m in messages.items if m == "STOPPING=1")
    assert not [m for t, m in messages.items if t > stopping_at and m == "WATCHDOG=1"]


@pytest.mark.slow
def test_a_redis_outage_culls_no_child_and_loses_no_job(
        daemon: Start, tmp_path: Path, r: redis.Redis) -> None:
    """Redis is shut down for 10 s mid-run and started again on its append-only file."""
    srv = EmbeddedServer(str(tmp_path / "outage"), persistent=True,
                         binary=server_binary())
    srv.start()
    try:
        rr = redis.Redis(unix_socket_path=srv.socket, protocol=2)
        d = daemon("concurrency: 3\nliveness_timeout: 10\nrequire: jobs\n", redis_url=srv.url)
        pids = {p.pid for p in d.wait_children(3)}
        forkq.Client(rr).push_bulk({"class": "Tick", "args": [[i, 0.05] for i in range(600)]})
        until(lambda: rr.llen("test:ticks") >= 60, 20, d.log())

        srv.stop()
        outage = time.monotonic()
        while time.monotonic() - outage < 10:  # the outage itself: 10 s without Redis
            assert child_pids(d) == pids, d.log()
            time.sleep(0.5)
        srv.start()
        rr = redis.Redis(unix_socket_path=srv.socket, protocol=2)

        def accounted() -> set[int]:
            done = {json.loads(x)["seq"] for x in rr.lrange("test:ticks", 0, -1)}
            retried = {json.loads(x)["args"][0] for x in rr.zrange("retry", 0, -1)}
            return done | retried

        until(lambda: accounted() == set(range(600)), 60,
              f"missing {sorted(set(range(600)) - accounted())[:20]}\n{d.log()[-3000:]}")
        assert child_pids(d) == pids
        assert "killed" not in d.log()
        assert "master WARNING: Redis is online" in d.log()
        jid = push(rr, "Sleep", 0, "after-outage")
        until(lambda: any(x["jid"] == jid for x in ran(rr)), 10, d.log())
        print(f"retried after the outage: {rr.zcard('retry')}; ran {rr.llen('test:ticks')} ticks")
        d.signal(signal.SIGTERM)
        assert d.wait(15) == 0
    finally:
        srv.stop()


# --- recycling and remote signals -----------------------------------------------------------


def test_max_jobs_recycles_a_child_after_that_many_jobs(r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 1\nmax_jobs: 2\nrequire: jobs\n")
    d.wait_children(1)
    for i in range(5):
        push(r, "Sleep", 0, f"j{i}")
    until(lambda: len(ran(r)) == 5, 15, d.log())
    pids = [x["pid"] for x in ran(r)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4], pids
    assert d.log().count("recycling after 2 jobs (max_jobs)") >= 2
    assert "respawns in" not in d.log()


def test_max_memory_mb_recycles_after_the_job_and_kills_above_the_ceiling(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 1\nmax_memory_mb: 200\nrequire: jobs\n")
    d.wait_children(1)
    push(r, "Hog", 230, 0, True)  # over 200 MB after the job: recycled, job done
    until(lambda: len(ran(r)) == 1, 15, d.log())
    until(lambda: "recycling at" in d.log(), 5, d.log())
    first = ran(r)[0]["pid"]
    until(lambda: first not in child_pids(d) and len(d.children()) == 1, 10, d.log())
    assert "killed" not in d.log()

    jid = push(r, "Hog", 400, 60, False)  # over 1.5 x 200 MB during the job: killed each time
    until(lambda: r.zcard("dead") == 1, 40, d.log())
    [entry] = [json.loads(x) for x in r.zrange("dead", 0, -1)]
    assert entry["jid"] == jid
    assert entry["error_message"] == ("its processor died 3 times while running it "
                                      "(last: RSS above 300 MB (1.5 x max_memory_mb))")


def test_remote_signals_from_redis_go_through_the_signal_table(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon("concurrency: 2\nrequire: jobs\n")
    me = identity_of(r, d)
    d.wait_children(2)
    r.lpush(f"{me}-signals", "TTIN")
    until(lambda: "Received remote TTIN" in d.log() and "TTIN: idle" in d.log(), 8, d.log())
    r.lpush(f"{me}-signals", "KILL")
    until(lambda: "ignoring remote signal 'KILL'" in d.log(), 8, d.log())
    r.lpush(f"{me}-signals", "TERM")
    assert d.wait(15) == 0
    assert "Received remote TERM" in d.log()
