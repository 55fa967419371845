"""The elected scheduler against real daemons sharing the session's throwaway server.

Several ``forkq run`` daemons campaign for one lease; tests SIGKILL masters or
whole daemons, SIGSTOP a scheduler, and check in Redis and in the logs that
exactly one leader acts, that due and retried jobs move on time and once, that
the jobs of a dead daemon run again elsewhere, and that periodic ticks are
enqueued once each. Every wait is a bounded poll.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

import forkq
from forkq import keys
from forkq.subprocesses import wait_for

from .conftest import (
    Daemon,
    _cmdline,
    elapsed_since,
    identity_of,
    records,
    run_bench,
    until,
)

Start = Callable[..., Daemon]

TTL = 4
SWEEP = 2
CLUSTER = f"""
concurrency: 2
require: jobs
leader_lease_ttl: {TTL}
leader_renew_interval: 1
orphan_sweep_interval: {SWEEP}
liveness_timeout: 60
timeout: 5
log_level: debug
"""


def leader_token(r: redis.Redis) -> str | None:
    token = r.get(keys.LEADER)
    return token.decode() if token else None


def leader_of(r: redis.Redis, daemons: list[Daemon]) -> Daemon | None:
    """The daemon whose scheduler holds the lease (the token names its master's pid)."""
    token = leader_token(r)
    if token is None:
        return None
    return next((d for d in daemons if token.split(":")[1] == str(d.pid)), None)


def wait_leader(r: redis.Redis, daemons: list[Daemon], timeout: float = 20) -> Daemon:
    """The leading daemon among ``daemons``, once there is one."""
    assert wait_for(lambda: leader_of(r, daemons) is not None, timeout, interval=0.02), (
        f"no leader among {[d.pid for d in daemons]}: lease {leader_token(r)}")
    found = leader_of(r, daemons)
    assert found is not None
    return found


def believers(schedulers: list[psutil.Process]) -> int:
    """How many schedulers call themselves leader in their process title."""
    return sum(1 for s in schedulers if "scheduler leader" in _cmdline(s))


def schedule(r: redis.Redis, job: str, args: list[Any], at: float, queue: str = "default"
             ) -> str:
    jid = forkq.Client(r).push({"class": job, "args": args, "queue": queue, "at": at})
    assert jid is not None
    return jid


# -- a: one leader; a killed leader is replaced; a paused one moves nothing ---------------------


def test_three_daemons_keep_exactly_one_leader_and_replace_a_killed_one(
        r: redis.Redis, daemon: Start) -> None:
    daemons = [daemon(CLUSTER) for _ in range(3)]
    schedulers = [d.scheduler() for d in daemons]
    first = wait_leader(r, daemons)
    until(lambda: believers(schedulers) == 1, 5)
    tokens, samples = Counter[str](), 0
    end = time.monotonic() + 3 * TTL
    while time.monotonic() < end:  # a sample every 100 ms over three lease TTLs (renewals)
        token = leader_token(r)
        assert token is not None, f"no leader at sample {samples}"
        assert believers(schedulers) == 1, f"{believers(schedulers)} leaders at sample {samples}"
        tokens[token] += 1
        samples += 1
        time.sleep(0.1)
    assert len(tokens) == 1, tokens  # one term throughout: no flapping
    print(f"{samples} samples over {3 * TTL} s: exactly one leader in each, one term")

    first.sigkill(everything=False)  # the leader's master only; its scheduler is orphaned
    killed = time.monotonic()
    probe = schedule(r, "Record", ["probe"], time.time() + 0.1, queue="probe")
    until(lambda: r.llen("queue:probe") == 1, TTL + 1, "no new leader moved the due job")
    took = elapsed_since(killed)
    rest = [d for d in daemons if d is not first]
    successor = wait_leader(r, rest, 1)
    until(lambda: "moved 1 due jobs" in successor.log(), 2)  # logged just after the move
    assert json.loads(r.lindex("queue:probe", 0))["jid"] == probe
    print(f"new leader acted {took:.2f}s after the leader's master was SIGKILLed (TTL {TTL}s)")


def test_a_leader_paused_past_its_lease_moves_no_job_after_waking(
        r: redis.Redis, daemon: Start) -> None:
    a = daemon(CLUSTER)
    paused = a.scheduler()
    wait_leader(r, [a])
    b = daemon(CLUSTER)
    b.scheduler()
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        until(lambda: leader_of(r, [a, b]) is b, TTL + 2, "b did not take over")
        print(f"b took over {elapsed_since(stopped):.2f}s after a's scheduler was stopped")
        now = time.time()
        jids = {schedule(r, "Record", [i], now + 0.5 + i * 0.05, queue="probe")
                for i in range(60)}  # due from before to after the wake-up
        time.sleep(0.5)
        woke = a.log().count("no longer the scheduler leader")  # read before it can wake
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    until(lambda: r.llen("queue:probe") == 60, 10)
    until(lambda: "no longer the scheduler leader" in a.log(), 5)
    wait_for(lambda: r.llen("queue:probe") > 60, 2)  # a double move would show up here
    assert sorted(json.loads(x)["jid"] for x in r.lrange("queue:probe", 0, -1)) == sorted(jids)
    after = a.log().split("no longer the scheduler leader", 1)[1]
    assert "moved" not in after and "took office" not in after
    assert woke == 0 and paused.is_running() and leader_of(r, [a, b]) is b


# -- b: scheduled jobs run once, on time -------------------------------------------------------


@pytest.mark.process
@pytest.mark.bench
@pytest.mark.slow
def test_a_thousand_scheduled_jobs_each_run_exactly_once_near_their_time(tmp_path: Any) -> None:
    done = run_bench("scheduled.py", "-n", "1000", "--over", "10", "-c", "3", cwd=tmp_path,
                     timeout=150)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "forkq: ran exactly once: 1000 of 1000 (missing 0, duplicates 0)" in done.stdout
    assert "p99" in done.stdout


# -- c: a dead daemon's jobs run again elsewhere ------------------------------------------------


@pytest.mark.slow
def test_a_sigkilled_daemons_running_jobs_run_again_on_another(
        r: redis.Redis, daemon: Start) -> None:
    big = CLUSTER.replace("concurrency: 2", "concurrency: 20")
    a = daemon(big)
    a.wait_children(20, timeout=30)
    wait_leader(r, [a])
    quick = [forkq.Client(r).push({"class": "Record", "args": [i]}) for i in range(10)]
    until(lambda: len(records(r)) == 10, 10)
    long = {forkq.Client(r).push({"class": "Sleep", "args": [600, f"long-{i}"]})
            for i in range(20)}
    until(lambda: len(records(r, "test:started")) == 20, 20)
    b = daemon(big)
    b.wait_children(20, timeout=30)
    dead, alive = identity_of(r, a), identity_of(r, b)

    a.sigkill(everything=True)  # master, processors and the leading scheduler at once
    killed = time.monotonic()
    until(lambda: len(records(r, "test:started")) == 40, keys.PROCESS_TTL + SWEEP + TTL + 5,
          "the dead daemon's jobs did not run again")
    took = elapsed_since(killed)
    again = records(r, "test:started")[20:]
    assert {x["jid"] for x in again} == long
    assert {x["pid"] for x in again} <= {p.pid for p in b.children()}
    assert sorted(x["jid"] for x in records(r)) == sorted(quick)  # completed ones: not again
    registered = [m.decode() for m in r.smembers(keys.INFLIGHT_REGISTRY)]
    assert len(registered) == 20 and all(alive in key for key in registered)  # none of a's
    assert not r.sismember(keys.PROCESSES, dead) and r.sismember(keys.PROCESSES, alive)
    print(f"all 20 jobs of the SIGKILLed daemon started again {took:.1f}s after the kill "
          f"(heartbeat TTL {keys.PROCESS_TTL}s + sweep {SWEEP}s)")


# -- d: periodic ticks, once each, across two leader kills --------------------------------------


TICK = 10  # seconds between ticks: more than the lease TTL, so a kill costs at most one


@pytest.mark.slow
def test_a_periodic_job_is_enqueued_once_per_tick_across_leader_kills(
        r: redis.Redis, daemon: Start) -> None:
    config = CLUSTER + f"periodic:\n  - name: every-{TICK}s\n    cron: '* * * * * */{TICK}'\n" \
        "    class: Record\n    args: [tick]\n    queue: ticks\n"
    daemons = [daemon(config) for _ in range(3)]
    wait_leader(r, daemons)
    # the first tick the leader enqueues (an entry counts from when a leader first saw it):
    # from it on, every tick must be enqueued exactly once
    until(lambda: r.llen("queue:ticks") >= 1, TICK + TTL + 5, "no first tick")
    first = json.loads(r.lindex("queue:ticks", 0) or b"{}")["periodic_at"]
    ticks = [first + TICK * i for i in range(6)]
    kills = [(ticks[2] - 2, "2 s before a tick"), (ticks[3] + 0.5, "0.5 s after a tick")]
    for moment, when in kills:
        wait_until(moment)
        leader = wait_leader(r, daemons, TTL + 2)
        leader.sigkill(everything=True)
        daemons.remove(leader)
        print(f"killed the leader {when}")
    wait_until(ticks[-1] + TTL + 2)
    enqueued = [json.loads(x) for x in r.lrange("queue:ticks", 0, -1)]
    per_tick = Counter(job["periodic_at"] for job in enqueued)
    assert per_tick == Counter({float(t): 1 for t in ticks}), per_tick
    late = {job["periodic_at"]: job["enqueued_at"] - job["periodic_at"] for job in enqueued}
    print("tick lateness: " + ", ".join(f"{v:.2f}s" for _, v in sorted(late.items())))
    assert late[float(ticks[2])] <= TTL + 1  # fired by the successor once it took office


def wait_until(epoch: float) -> None:
    time.sleep(max(0.0, epoch - time.time()))


# -- e: retries come back on time --------------------------------------------------------------


@pytest.mark.slow
def test_retries_run_near_their_due_times(r: redis.Redis, daemon: Start) -> None:
    daemon(CLUSTER)
    jid = forkq.Client(r).push({"class": "Flaky", "args": ["e"], "retry": 2})
    dues: list[float] = []
    for attempt in (1, 2):
        until(lambda n=attempt: len(records(r, "test:attempts")) == n, 40)
        until(lambda: r.zcard(keys.RETRY) == 1, 5)
        dues.append(float(r.zscore(keys.RETRY, r.zrange(keys.RETRY, 0, 0)[0]) or 0))
    until(lambda: len(records(r, "test:attempts")) == 3, 40)
    until(lambda: r.zcard(keys.DEAD) == 1, 5)
    attempts = records(r, "test:attempts")
    assert {a["jid"] for a in attempts} == {jid}
    late = [attempts[i + 1]["at"] - dues[i] for i in range(2)]
    print("retry lateness: " + ", ".join(f"{x * 1000:.0f} ms" for x in late))
    assert all(0 <= x < 2.0 for x in late), late  # not a poll every ~5 s, as Sidekiq's


# -- hand-over, reload, visibility -------------------------------------------------------------


def test_quiet_hands_the_lease_over_at_once_and_the_leader_is_visible(
        r: redis.Redis, daemon: Start) -> None:
    a = daemon(CLUSTER)
    wait_leader(r, [a])
    b = daemon(CLUSTER)
    b.scheduler()
    ident_a, ident_b = identity_of(r, a), identity_of(r, b)
    assert r.get("dear-leader") == ident_a.encode()
    until(lambda: json.loads(r.hget(ident_a, "info") or "{}").get("leader") is True, 7)
    assert json.loads(r.hget(ident_b, "info") or "{}").get("leader") is False

    a.signal(signal.SIGTSTP)
    quieted = time.monotonic()
    until(lambda: leader_of(r, [a, b]) is b, 2, "the quiet daemon did not hand over")
    print(f"hand-over on quiet took {elapsed_since(quieted) * 1000:.0f} ms")
    until(lambda: "handed over the scheduler leadership" in a.log(), 2)
    assert r.get("dear-leader") == ident_b.encode()
    schedule(r, "Record", ["after"], time.time() + 0.2)
    until(lambda: len(records(r)) == 1, 5)
    assert records(r)[0]["pid"] in {p.pid for p in b.children()}


def test_hup_rejects_a_bad_periodic_entry_and_applies_a_good_one(
        r: redis.Redis, daemon: Start) -> None:
    d = daemon(CLUSTER)
    first = d.scheduler()
    wait_leader(r, [d])
    processors = {p.pid for p in d.wait_children(2)}
    path = Path(d.config_file)
    base = path.read_text()

    path.write_text(base + "periodic:\n  - cron: '* * * * * *'\n    class: NoSuchJob\n")
    d.signal(signal.SIGHUP)
    until(lambda: "reload rejected" in d.log(), 5)
    assert "no registered job 'NoSuchJob'" in d.log() and first.is_running()

    path.write_text(base + "periodic:\n  - name: each-second\n    cron: '* * * * * *'\n"
                          "    class: Record\n    args: [p]\n    queue: ticks\n")
    d.signal(signal.SIGHUP)
    until(lambda: r.llen("queue:ticks") >= 2, 10, d.log())
    assert not first.is_running() and d.scheduler().pid != first.pid
    assert {p.pid for p in d.children()} == processors  # only the scheduler was replaced
    jobs = [json.loads(x) for x in r.lrange("queue:ticks", 0, -1)]
    assert {job["periodic"] for job in jobs} == {"each-second"}
    assert len({job["periodic_at"] for job in jobs}) == len(jobs)


# -- leadership is logged when it changes hands, by the scheduler that takes or gives it -------


def _leadership_lines(log: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in log.splitlines()
            if "scheduler leader" in line and ("INFO" in line or "WARNING" in line)]


def test_leadership_is_logged_when_taken_and_handed_over_and_never_after(
        r: redis.Redis, daemon: Start) -> None:
    """Taking office is logged before the leader's first act (the move of a job that was due
    at start), not at the master's next beat 5 s later; a reload that replaces the scheduler
    logs the hand-over, then the new term; a stop ends with the hand-over, and nothing about
    leadership comes after it."""
    due = "d" * 24  # in the schedule already due (a push of a past time would enqueue it)
    r.zadd("schedule", {json.dumps({"class": "Record", "args": ["due"], "jid": due,
                                    "queue": "default", "retry": True}): time.time() - 60})
    d = daemon(CLUSTER.replace("log_level: debug", "log_level: info"))
    until(lambda: [row["jid"] for row in records(r)] == [due], 15, d.log)
    took = d.logged_at("took office as the scheduler leader")
    assert took <= d.logged_at(f"jid={due} start"), d.log()
    identity = identity_of(r, d)  # a master beat after the term began: it saw the lease
    until(lambda: float(r.hget(identity, "beat") or 0) > took, 15, d.log)
    config = Path(d.config_file)
    config.write_text(config.read_text().replace(f"leader_lease_ttl: {TTL}",
                                                 f"leader_lease_ttl: {TTL + 1}"))
    d.signal(signal.SIGHUP)
    until(lambda: len(_leadership_lines(d.log())) == 3, 15, d.log)
    d.signal(signal.SIGTERM)
    assert d.process is not None and d.process.wait(timeout=30) == 0, d.log()
    lines = _leadership_lines(d.log())
    assert [line.split(" (", 1)[0] for line in lines] == [
        "took office as the scheduler leader", "handed over the scheduler leadership",
        "took office as the scheduler leader", "handed over the scheduler leadership"], lines
    assert "this daemon is now" not in d.log() and "is no longer the scheduler" not in d.log()
