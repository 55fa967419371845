"""``forkq cancel`` and ``forkq.api.cancel``: a queued, scheduled or retrying job is removed;
a running one sees the request (``forkq.cancel_requested()``) and may clean up and stop,
else its processor is killed (and replaced) ``cancel_grace`` seconds later; either way it is
filed to ``dead`` as ``forkq.JobCancelledError``, never retried, and never run again, even
when its processor or its whole daemon dies during the grace."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from forkq import api, keys
from forkq.client import Client, cancel_requested
from forkq.daemon.master.cancels import Asked, decide
from forkq.daemon.master.effects import CANCEL_WATCH
from forkq.embedded import EmbeddedServer

from .conftest import named, records, run_forkq, until


def _cancel_cli(server: EmbeddedServer, *jids: str, code: int = 0) -> str:
    done = run_forkq("cancel", *jids, "--redis-url", server.url, timeout=30)
    assert done.returncode == code, f"{done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _dead(r: redis.Redis, jid: str) -> dict[str, Any] | None:
    entry = api.DeadSet(r).find_job(jid)
    return None if entry is None else json.loads(entry.raw)


@pytest.mark.process
def test_a_queued_a_scheduled_and_a_retrying_job_are_removed_where_they_wait(
        r: redis.Redis, server: EmbeddedServer) -> None:
    client = Client(r)
    queued = client.push({"class": "Record", "args": [1], "queue": "low"})
    kept = client.push({"class": "Record", "args": [2], "queue": "low"})
    scheduled = client.push({"class": "Record", "args": [3], "at": time.time() + 3600})
    retrying = "r" * 24
    r.zadd("retry", {json.dumps({"class": "Record", "args": [], "jid": retrying,
                                 "queue": "default", "retry_count": 1}): time.time() + 60})
    out = _cancel_cli(server, str(queued), str(scheduled), retrying)
    assert f"Record {queued}: removed from queue low" in out  # the job, by class and jid
    assert f"{scheduled}: removed from the scheduled jobs" in out
    assert f"{retrying}: removed from the retries" in out
    assert [json.loads(job)["jid"] for job in r.lrange("queue:low", 0, -1)] == [kept]
    assert r.zcard("schedule") == 0 and r.zcard("retry") == 0
    assert not r.exists(keys.CANCELS), "a request carried out at once is withdrawn"


@pytest.mark.process
def test_an_unknown_jid_is_reported_not_found(r: redis.Redis, server: EmbeddedServer) -> None:
    out = _cancel_cli(server, "nosuchjid", code=66)
    assert "nosuchjid: not found" in out
    assert not r.exists(keys.CANCELS)


def test_without_a_grace_a_running_job_is_stopped_within_a_second_and_filed_dead(
        r: redis.Redis, daemon: Any) -> None:
    jid = str(Client(r).push({"class": "Patient", "args": [60], "retry": 5}))
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\ncancel_grace: 0\n")
    until(lambda: records(r, "test:started"), 15, lambda: d.log())
    [started] = records(r, "test:started")
    assert (started["asked"], started["current"]) == (False, jid)
    # "stopped" when its master was quicker than the look-up (a busy machine)
    assert api.cancel(r, jid).outcome in ("stopping", "stopped")
    asked = time.time()
    until(lambda: _dead(r, jid), 5, lambda: d.log())
    took = d.logged_at(f"job {jid} was cancelled") - asked  # the master's own kill line
    print(f"running job cancelled -> its processor killed after {took:.3f} s")
    assert took <= 1.0, d.log()
    entry = _dead(r, jid)
    assert entry is not None and entry["error_class"] == "forkq.JobCancelledError"
    assert r.zcard("retry") == 0 and not r.exists(keys.kills(jid)), "never retried, no death"
    # the master files the job dead, then withdraws the request (what `forkq cancel --wait`
    # waits for): a separate write, so it may land just after the dead entry is seen
    until(lambda: not r.exists(keys.CANCELS), 5, lambda: f"the request is withdrawn once "
          f"carried out\n{d.log()}")
    [child] = d.wait_children(1)
    assert child.pid != started["pid"], "its processor was replaced"
    assert records(r) == [], "the job never completed"
    after = Client(r).push({"class": "Record", "args": ["after"]})
    until(lambda: [row["jid"] for row in records(r)] == [after], 15, lambda: d.log())


def test_the_cli_waits_for_a_running_job_to_be_stopped(
        r: redis.Redis, daemon: Any, server: EmbeddedServer) -> None:
    jid = str(Client(r).push({"class": "Patient", "args": [60]}))
    d = daemon("concurrency: 1\nrequire: jobs\ncancel_grace: 0\n")
    until(lambda: records(r, "test:started"), 15, lambda: d.log())
    out = _cancel_cli(server, jid)
    assert f"{jid}: stopped; filed to dead as cancelled" in out
    assert _dead(r, jid) is not None


def test_a_cancelled_coroutine_job_stops_and_its_lane_neighbours_run_again(
        r: redis.Redis, daemon: Any, tmp_path: Path) -> None:
    out = tmp_path / "naps.txt"
    client = Client(r)
    victim = str(client.push({"class": "Nap", "args": [60, str(out)]}))
    others = client.push_bulk({"class": "Nap", "args": [[2, str(out)]] * 4})
    d = daemon("concurrency: 1\nasync_concurrency: 5\nrequire: jobs\ncancel_grace: 0\n")
    until(lambda: sum(1 for key in r.smembers(keys.INFLIGHT_REGISTRY) if r.llen(key)) == 5, 15,
          lambda: d.log())
    assert api.cancel(r, victim).outcome in ("stopping", "stopped")
    until(lambda: _dead(r, victim), 5, lambda: d.log())
    until(lambda: out.exists() and sorted(line.split()[0] for line in
                                          out.read_text().splitlines()) == sorted(others),
          30, lambda: d.log())


def test_a_job_can_see_that_its_cancellation_was_asked(r: redis.Redis) -> None:
    r.rpush("forkq:inflight:test:1", b"queue:default",
            json.dumps({"class": "Record", "args": [], "jid": "held1"}))
    r.sadd(keys.INFLIGHT_REGISTRY, "forkq:inflight:test:1")
    client = Client(r)
    assert cancel_requested("held1", client=client) is False
    assert api.cancel(r, "held1").outcome == "stopping"
    assert cancel_requested("held1", client=client) is True


def test_a_wrong_typed_cancels_key_is_reported_and_the_daemon_goes_on(
        r: redis.Redis, daemon: Any, server: EmbeddedServer) -> None:
    r.set(keys.CANCELS, "not a zset")
    d = daemon("concurrency: 1\nrequire: jobs\n")
    jid = Client(r).push({"class": "Record", "args": [1]})
    until(lambda: [row["jid"] for row in records(r)] == [jid], 15, lambda: d.log())
    until(lambda: "forkq:cancels" in d.log(), 5, lambda: d.log())
    out = _cancel_cli(server, "somejid", code=1)
    assert "WRONGTYPE" in out
    assert d.alive()


def test_a_killed_cancel_watch_is_reopened_and_cancels_still_arrive_at_once(
        r: redis.Redis, daemon: Any) -> None:
    """The master's watch of ``forkq:cancels`` closed by the server (CLIENT KILL, a proxy):
    the master opens a new one, logs no outage, and a cancellation asked after that stops
    the running job within a second, as before."""
    jid = str(Client(r).push({"class": "Patient", "args": [60]}))
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\ncancel_grace: 0\n")
    until(lambda: records(r, "test:started"), 15, lambda: d.log())
    [first] = named(r, CANCEL_WATCH)
    assert r.client_kill_filter(_id=first) == 1
    until(lambda: [i for i in named(r, CANCEL_WATCH) if i != first], 5,
          lambda: f"no new cancel watch; log:\n{d.log()}")
    assert api.cancel(r, jid).outcome in ("stopping", "stopped")
    asked = time.time()
    until(lambda: _dead(r, jid), 5, lambda: d.log())
    assert d.logged_at(f"job {jid} was cancelled") - asked <= 1.0, d.log()
    log = d.log()
    assert "unavailable" not in log and "downtime" not in log and "Traceback" not in log, log


# --- cooperative first, then by force -----------------------------------------------------


def test_decide_asks_first_and_kills_only_once_the_grace_is_over() -> None:
    first = decide({1: "a"}, {}, now=10.0, grace=5.0)
    assert (first.asked, first.kill, first.ended) == ({1: "a"}, {}, {})
    asked = {1: Asked("a", 10.0)}
    assert decide({1: "a"}, asked, now=14.9, grace=5.0).kill == {}
    assert decide({1: "a"}, asked, now=15.0, grace=5.0).kill == {1: "a"}
    assert decide({1: "a"}, {}, now=10.0, grace=0.0).kill == {1: "a"}, "no grace: at once"
    moved_on = decide({1: "b"}, asked, now=20.0, grace=5.0)  # a, then another cancelled job
    assert (moved_on.asked, moved_on.kill, moved_on.ended) == ({1: "b"}, {}, {1: "a"})
    assert decide({}, asked, now=11.0, grace=5.0).ended == {1: "a"}


def _started(r: redis.Redis, jid: str) -> list[dict[str, Any]]:
    return [row for row in records(r, "test:started") if row["jid"] == jid]


def test_a_running_job_sees_its_cancellation_cleans_up_and_is_filed_cancelled_unkilled(
        r: redis.Redis, daemon: Any, server: EmbeddedServer) -> None:
    """``forkq cancel`` of jobs that look at ``cancel_requested()``: each runs its clean-up
    and ends, by returning or by raising, and is filed to dead as cancelled by its own
    processor: nothing is killed (the grace, 60 s, is far longer than the CLI waits)."""
    client = Client(r)
    returns = str(client.push({"class": "Cooperative", "args": ["return"], "retry": 5}))
    raises = str(client.push({"class": "Cooperative", "args": ["raise"], "retry": 5}))
    d = daemon("concurrency: 2\nrequire: jobs\nlog_level: info\ncancel_grace: 60\n")
    until(lambda: _started(r, returns) and _started(r, raises), 15, lambda: d.log())
    pids = {row["jid"]: row["pid"] for row in records(r, "test:started")}
    out = _cancel_cli(server, returns, raises, "--wait", "30")
    for jid in (returns, raises):
        assert f"{jid}: stopped; filed to dead as cancelled" in out, out
        entry = _dead(r, jid)
        assert entry is not None and entry["error_class"] == "forkq.JobCancelledError"
    assert [row["jid"] for row in records(r, "test:cleanup")] in ([returns, raises],
                                                                  [raises, returns])
    assert "and returned" in str(_dead(r, returns)["error_message"])  # type: ignore[index]
    assert "and raised ValueError: stopped half-way" in str(
        _dead(r, raises)["error_message"])  # type: ignore[index]
    assert not r.exists(keys.CANCELS) and r.zcard("retry") == 0
    assert records(r) == [], "neither went on to complete"
    assert ") killed: " not in d.log(), d.log()
    assert sorted(child.pid for child in d.children()) == sorted(pids.values()), (
        "their processors live on")


def test_a_job_that_ignores_its_cancellation_is_killed_after_the_grace(
        r: redis.Redis, daemon: Any) -> None:
    """A job that never looks runs on through ``cancel_grace`` (the daemon's own log
    timestamps: asked, then killed no earlier than the grace later), then its processor is
    killed and replaced, and the job filed to dead as cancelled."""
    jid = str(Client(r).push({"class": "Patient", "args": [60]}))
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\ncancel_grace: 2\n")
    until(lambda: records(r, "test:started"), 15, lambda: d.log())
    [started] = records(r, "test:started")
    assert api.cancel(r, jid).outcome == "stopping"
    until(lambda: _dead(r, jid), 15, lambda: d.log())
    asked = d.logged_at(f"job {jid} was cancelled: processor-0")
    killed = d.logged_at(f"killed: job {jid} was cancelled and did not stop within "
                         "cancel_grace (2s)")
    assert killed - asked >= 2.0, (killed - asked, d.log())
    entry = _dead(r, jid)
    assert entry is not None and entry["error_class"] == "forkq.JobCancelledError"
    until(lambda: not r.exists(keys.CANCELS), 5, lambda: d.log())
    [child] = d.wait_children(1)
    assert child.pid != started["pid"], "its processor was replaced"


def test_a_processor_killed_during_the_grace_leaves_its_job_cancelled_not_run_again(
        r: redis.Redis, daemon: Any) -> None:
    """Crash-proof: the processor dies (SIGKILL) while its job has its grace; the master's
    settlement finds the request standing and files the job cancelled instead of
    requeueing it."""
    jid = str(Client(r).push({"class": "Patient", "args": [60]}))
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\ncancel_grace: 60\n")
    until(lambda: records(r, "test:started"), 15, lambda: d.log())
    [started] = records(r, "test:started")
    assert api.cancel(r, jid).outcome == "stopping"
    until(lambda: f"job {jid} was cancelled: processor-0" in d.log(), 15, lambda: d.log())
    os.kill(started["pid"], signal.SIGKILL)
    until(lambda: _dead(r, jid), 15, lambda: d.log())
    entry = _dead(r, jid)
    assert entry is not None and entry["error_class"] == "forkq.JobCancelledError"
    assert "its processor ended (killed by signal" in entry["error_message"], entry
    assert not r.exists(keys.CANCELS) and not r.exists(keys.kills(jid))
    after = Client(r).push({"class": "Record", "args": ["after"]})
    until(lambda: [row["jid"] for row in records(r)] == [after], 15, lambda: d.log())
    assert len(_started(r, jid)) == 1 and r.llen("queue:default") == 0, "never run again"


def test_a_daemon_killed_during_the_grace_leaves_its_job_cancelled_after_a_restart(
        r: redis.Redis, daemon: Any) -> None:
    """Crash-proof: the whole daemon is SIGKILLed while the job has its grace; the restarted
    daemon takes the job back (restart recovery, the same step as the leader's orphan sweep)
    and, the request standing, files it cancelled: not requeued, not run again."""
    jid = str(Client(r).push({"class": "Patient", "args": [60]}))
    config = "concurrency: 1\nrequire: jobs\nlog_level: info\ncancel_grace: 60\n"
    d = daemon(config)
    until(lambda: records(r, "test:started"), 15, lambda: d.log())
    assert api.cancel(r, jid).outcome == "stopping"
    until(lambda: f"job {jid} was cancelled: processor-0" in d.log(), 15, lambda: d.log())
    d.sigkill(everything=True)
    again = daemon(config)
    until(lambda: _dead(r, jid), 30, lambda: again.log())
    entry = _dead(r, jid)
    assert entry is not None and entry["error_class"] == "forkq.JobCancelledError"
    assert not r.exists(keys.CANCELS)
    after = Client(r).push({"class": "Record", "args": ["after"]})
    until(lambda: [row["jid"] for row in records(r)] == [after], 15, lambda: again.log())
    assert len(_started(r, jid)) == 1 and r.llen("queue:default") == 0, "never run again"
