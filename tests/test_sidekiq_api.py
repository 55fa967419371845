"""Sidekiq 6.4.1's own Ruby API and Web UI show and control a live forkq daemon.

A forkq daemon writes every kind of data itself: jobs waiting in queues it does not
serve, scheduled jobs, retry entries (a failing job whose retries wait an hour), dead
entries (``retry: 0``), a busy job, its process record and the stats. Then:

- ``tests/ruby/sidekiq_api.rb`` reads it all through ``Sidekiq::Stats`` (+ ``History``),
  ``Queue``, ``ScheduledSet``, ``RetrySet``, ``DeadSet``, ``ProcessSet`` and ``Workers``,
  and acts on forkq's entries (``retry``, ``add_to_queue``, ``delete``, ``kill``,
  ``reschedule``, ``JobRecord#delete``, ``DeadSet#kill``, ``clear``);
- ``tests/ruby/web_ui.rb`` renders Sidekiq::Web in-process (Rack::MockRequest): every
  page, every detail page of forkq's entries, and its buttons (Retry Now, Kill, Delete,
  Add to queue, a queue's Delete, a process's Quiet and Stop).

Every read is compared with what forkq wrote; after every action Redis is counted:
no entry duplicated, none lost, and jobs sent back to a queue are run by the daemon.
The last test files a failure whose message is not valid UTF-8, which Sidekiq scrubs.
Everything talks to the throwaway server of the ``server`` fixture.
"""

from __future__ import annotations

import html
import json
import re
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
import redis

import forkq
from forkq.embedded import EmbeddedServer
from forkq.metrics.recorder import Recorder, queue_writes

from .conftest import Daemon, attempts, records, until
from .test_sidekiq_interop import _need_ruby, _run_ruby

pytestmark = pytest.mark.ruby

DAEMON = """
concurrency: 3
require: jobs
queues: [apiwork]
tag: apitag
labels: [green]
timeout: 2
"""
WORK = "apiwork"  # the only queue the daemon serves; "held" and "default" just wait
TRICKY = ['é/\u2028"q\x01', 1e-05, 1e20, 2**70, 0.1, -0.0, {"k": [None, True, 1.5]}]
HOUR = 3600.0
BACKOFF = (HOUR, HOUR + 9)  # SlowRetry's first retry: its retry_in (3600) + rand(10) s


# --- the scene forkq writes ------------------------------------------------------------------


@dataclass
class Scene:
    """What a live daemon wrote, as pushed (jids by kind) and as found in Redis."""

    daemon: Daemon
    identity: str
    started: float
    busy_jid: str
    busy_pid: int
    held: list[str]
    default: list[str]
    scheduled: dict[str, float]  # jid -> the "at" it was pushed with
    retries: list[str]
    dead: list[str]
    args: dict[str, list[Any]]  # jid -> args pushed


def _scene(r: redis.Redis, daemon: Callable[..., Daemon], *, held: int = 2, default: int = 1,
           scheduled: int = 2, retries: int = 2, dead: int = 2) -> Scene:
    """Start a daemon and let it write queued, scheduled, retry, dead and busy jobs."""
    _need_ruby()
    started = time.time()
    d = daemon(DAEMON)
    d.wait_children(3)
    client = forkq.Client(r)
    args: dict[str, list[Any]] = {}

    def push(item: dict[str, Any]) -> str:
        jid = client.push(item)
        assert jid is not None
        args[jid] = item["args"]
        return jid

    busy_jid = push({"class": "Sleep", "args": [120, "busy"], "queue": WORK})
    until(lambda: r.llen("test:started") == 1, 15, f"the Sleep job did not start:\n{d.log()}")
    busy_pid = records(r, "test:started")[0]["pid"]
    held_jids = [push({"class": "Record", "args": [f"held-{i}", *TRICKY], "queue": "held"})
                 for i in range(held)]
    default_jids = [push({"class": "Record", "args": [f"default-{i}"], "queue": "default"})
                    for i in range(default)]
    now = time.time()
    scheduled_jids = {}
    for i in range(scheduled):
        at = now + HOUR * (i + 1)
        jid = push({"class": "Record", "args": [f"later-{i}", *TRICKY], "queue": WORK,
                    "at": at, "tags": ["api"]})
        scheduled_jids[jid] = at
    retry_jids = [push({"class": "SlowRetry", "args": [f"retry-{i}", *TRICKY], "queue": WORK,
                        "retry": 3, "backtrace": 5}) for i in range(retries)]
    dead_jids = [push({"class": "SlowRetry", "args": [f"dead-{i}", *TRICKY], "queue": WORK,
                       "retry": 0, "backtrace": 5}) for i in range(dead)]

    until(lambda: (r.zcard("retry"), r.zcard("dead"), r.llen("test:slowretry"))
          == (retries, dead, retries + dead), 20,
          f"forkq did not file the failures: retry {r.zcard('retry')}, dead {r.zcard('dead')}"
          f"\nlog:\n{d.log()}")
    until(lambda: r.scard("processes") == 1, 10, "forkq is not in the processes set")
    identity = next(iter(r.smembers("processes"))).decode()
    assert identity.split(":")[1] == str(d.pid), identity
    until(lambda: r.hget(identity, "busy") == b"1" and r.get("dear-leader") == identity.encode(),
          15, f"no beat with the busy job, or forkq is not the leader:\n{d.log()}")
    return Scene(d, identity, started, busy_jid, busy_pid, held_jids, default_jids,
                 scheduled_jids, retry_jids, dead_jids, args)


# --- helpers ---------------------------------------------------------------------------------


def _api(server: EmbeddedServer, *args: str) -> Any:
    """Run tests/ruby/sidekiq_api.rb ARGS; its JSON."""
    return json.loads(_run_ruby("sidekiq_api.rb", *args, server=server))


def _web(server: EmbeddedServer, *requests: str) -> list[dict[str, Any]]:
    """Run tests/ruby/web_ui.rb REQUESTS; one result per request."""
    results: list[dict[str, Any]] = json.loads(_run_ruby("web_ui.rb", *requests, server=server))
    assert len(results) == len(requests)
    return results


def _zset(r: redis.Redis, key: str) -> dict[str, list[tuple[bytes, float]]]:
    """The members of ``key`` by jid: jid -> [(member bytes, score)]."""
    found: dict[str, list[tuple[bytes, float]]] = {}
    for member, score in r.zrange(key, 0, -1, withscores=True):
        found.setdefault(json.loads(member)["jid"], []).append((member, score))
    return found


def _one(r: redis.Redis, key: str, jid: str) -> tuple[bytes, float]:
    """The only member of ``key`` for ``jid`` (fails on none or several)."""
    entries = _zset(r, key).get(jid, [])
    assert len(entries) == 1, f"{key} holds {len(entries)} entries for {jid}: {entries!r}"
    return entries[0]


def _queue(r: redis.Redis, queue: str) -> list[str]:
    """The jids in ``queue:<queue>``, newest first (as LRANGE lists them)."""
    return [json.loads(raw)["jid"] for raw in r.lrange(f"queue:{queue}", 0, -1)]


def _ran(r: redis.Redis, jid: str) -> list[dict[str, Any]]:
    """Every completed run of Record job ``jid``."""
    return [row for row in records(r, "test:ran") if row["jid"] == jid]


def _metrics_written(r: redis.Redis) -> bool:
    """Whether job metrics are in Redis: Sidekiq 7's and 8's ``j|`` hashes (SlowRetry's, by
    the daemon), histograms (Record's), and ``forkq:metrics:jobs``."""
    names = {key.decode() for key in r.keys("*")}
    shapes = [r"j\|20\d{6}\|\d+:\d+", r"j\|\d{6}\|\d+:\d\d", r"j\|\d{6}\|\d+:\d",
              r"Record-\d\d-\d\d:\d+", r"h\|Record-\d+-\d+:\d+"]
    return "forkq:metrics:jobs" in names and all(
        any(re.fullmatch(shape, name) for name in names) for shape in shapes)


def _stat(r: redis.Redis, name: str) -> int:
    return int(r.get(f"stat:{name}") or 0)


def _refiled(r: redis.Redis, key: str, jid: str, runs: int) -> Callable[[], bool]:
    """Condition: job ``jid`` has run ``runs`` times and is back in ``key`` after the last run."""
    def check() -> bool:
        if len(attempts(r, jid)) != runs or jid not in _zset(r, key):
            return False
        return any(json.loads(m).get("retried_at") for m, _ in _zset(r, key)[jid])
    return check


def _removal_result(r: redis.Redis, key: str, jid: str, value: Any) -> Any:
    """What Sidekiq 6.4.1's ``retry``, ``add_to_queue`` or ``kill`` of ``jid``'s entry in
    ``key`` will return (read before the call): ``value``, the action's own result, when no
    other entry has the entry's score; else ``SortedEntry#remove_job`` takes every entry of
    that score, keeps the one of ``jid`` and puts the others back in a MULTI, whose replies
    it returns (one True each). Two failures filed within a float's step of each other
    (0.24 µs at today's epoch) by two processors share a score."""
    member, score = _one(r, key, jid)
    others = [m for m in r.zrangebyscore(key, score, score) if m != member]
    return [True] * len(others) if others else value


# --- 1. everything the API reads -------------------------------------------------------------


def test_api_reads_what_forkq_wrote(server: EmbeddedServer, r: redis.Redis,
                                    daemon: Callable[..., Daemon]) -> None:
    s = _scene(r, daemon)
    seen = _api(server, "read")

    # Stats, Stats::Queues and Stats::History
    failures = len(s.retries) + len(s.dead)
    stats = seen["stats"]
    assert _stat(r, "processed") == _stat(r, "failed") == failures
    assert {k: stats[k] for k in ("processed", "failed", "scheduled_size", "retry_size",
                                  "dead_size", "processes_size", "enqueued", "workers_size")} == {
        "processed": failures, "failed": failures, "scheduled_size": 2, "retry_size": 2,
        "dead_size": 2, "processes_size": 1, "enqueued": 3, "workers_size": 1}
    assert stats["queues"] == {"held": 2, "default": 1, WORK: 0}
    oldest_default = json.loads(r.lindex("queue:default", -1) or b"{}")
    assert 0 < stats["default_queue_latency"] <= time.time() - oldest_default["enqueued_at"]
    assert sum(stats["history_processed"].values()) == failures, stats["history_processed"]
    assert sum(stats["history_failed"].values()) == failures, stats["history_failed"]

    # Queue.all, Queue#size / #latency / #each / #find_job, JobRecord
    queues = {q["name"]: q for q in seen["queues"]}
    assert sorted(queues) == [WORK, "default", "held"]
    for name, jids in (("held", s.held), ("default", s.default), (WORK, [])):
        queue = queues[name]
        raws = [raw.decode() for raw in r.lrange(f"queue:{name}", 0, -1)]
        assert queue["size"] == len(jids) == len(raws)
        assert [job["raw"] for job in queue["jobs"]] == raws, "JobRecord#value: not the bytes"
        assert sorted(job["jid"] for job in queue["jobs"]) == sorted(jids)
        assert (queue["latency"] > 0) == bool(jids)
        for job in queue["jobs"]:
            payload = json.loads(job["raw"])
            assert (job["class"], job["display_class"], job["queue"], job["retry"]) == (
                "Record", "Record", name, True)
            assert job["args"] == job["display_args"] == s.args[job["jid"]]
            assert job["created_at"] == pytest.approx(payload["created_at"], abs=1e-6)
            assert job["enqueued_at"] == pytest.approx(payload["enqueued_at"], abs=1e-6)
            assert job["tags"] == []

    # ScheduledSet: SortedEntry of forkq's scheduled pushes
    schedule = seen["schedule"]
    assert schedule["size"] == 2
    assert {e["jid"]: e["raw"].encode() for e in schedule["entries"]} == {
        jid: m for jid, [(m, _)] in _zset(r, "schedule").items()}
    for entry in schedule["entries"]:
        jid = entry["jid"]
        assert entry["score"] == pytest.approx(s.scheduled[jid], abs=1e-3)
        assert entry["at"] == pytest.approx(entry["score"], abs=1e-6)
        assert (entry["class"], entry["queue"], entry["tags"], entry["error"]) == (
            "Record", WORK, ["api"], False)
        assert entry["args"] == s.args[jid]
        assert entry["enqueued_at"] is None, "scheduled entries carry no enqueued_at"
        assert entry["created_at"] == pytest.approx(
            json.loads(entry["raw"])["created_at"], abs=1e-6)
        assert entry["error_class"] is entry["retry_count"] is entry["error_backtrace"] is None

    # RetrySet and DeadSet: forkq's failure fields, read and decoded by Sidekiq
    for key, jids, retry, marker in (("retry", s.retries, 3, "retry"), ("dead", s.dead, 0, "dead")):
        found = seen[key]
        assert found["size"] == len(jids)
        assert {e["jid"]: e["raw"].encode() for e in found["entries"]} == {
            jid: m for jid, [(m, _)] in _zset(r, key).items()}
        assert sorted(e["jid"] for e in found["entries"]) == sorted(jids)
        for entry in found["entries"]:
            payload = json.loads(entry["raw"])
            index = s.args[entry["jid"]][0].split("-")[1]
            assert (entry["class"], entry["queue"], entry["retry"], entry["error"]) == (
                "SlowRetry", WORK, retry, True)
            assert entry["args"] == entry["display_args"] == s.args[entry["jid"]]
            assert entry["error_class"] == "RuntimeError"
            assert entry["error_message"] == f"slow {marker}-{index}"
            assert entry["retry_count"] == 0 and entry["retried_at"] is None
            assert entry["failed_at"] == pytest.approx(payload["failed_at"], abs=1e-6)
            assert entry["created_at"] == pytest.approx(payload["created_at"], abs=1e-6)
            assert entry["enqueued_at"] == pytest.approx(payload["enqueued_at"], abs=1e-6)
            assert s.started < entry["created_at"] <= entry["enqueued_at"] <= entry["failed_at"]
            backtrace = entry["error_backtrace"]
            assert 1 <= len(backtrace) <= 5, backtrace
            assert backtrace[0].endswith(":in `perform'") and "jobs.py:" in backtrace[0]
            delay = entry["score"] - entry["failed_at"]
            if key == "retry":
                assert BACKOFF[0] - 0.01 <= delay <= BACKOFF[1] + 0.01, delay
            else:
                assert delay == pytest.approx(0, abs=1e-3), "dead score = time of death"

    # ProcessSet (+ leader, total_concurrency) and Workers
    process_set = seen["process_set"]
    assert process_set["size"] == 1 and process_set["total_concurrency"] == 3
    assert process_set["leader"] == s.identity, "ProcessSet#leader is not forkq's identity"
    (process,) = process_set["processes"]
    assert {k: process[k] for k in ("identity", "hostname", "pid", "tag", "labels", "queues",
                                    "concurrency", "busy", "quiet", "stopping")} == {
        "identity": s.identity, "hostname": socket.gethostname(), "pid": s.daemon.pid,
        "tag": "apitag", "labels": ["green"], "queues": [WORK], "concurrency": 3, "busy": 1,
        "quiet": "false", "stopping": False}
    assert s.started - 1 <= process["started_at"] <= process["beat"] <= time.time()
    assert process["rss"] > 0
    workers = seen["workers"]
    assert workers["size"] == 1
    (work,) = workers["workers"]
    assert {k: work[k] for k in ("process", "thread", "queue", "jid", "class", "args")} == {
        "process": s.identity, "thread": str(s.busy_pid), "queue": WORK, "jid": s.busy_jid,
        "class": "Sleep", "args": [120, "busy"]}
    assert isinstance(work["run_at"], int) and s.started - 1 <= work["run_at"] <= time.time()


# --- 2. actions on forkq's retry entries -----------------------------------------------------


def test_api_acts_on_forkq_retries(server: EmbeddedServer, r: redis.Redis,
                                   daemon: Callable[..., Daemon]) -> None:
    s = _scene(r, daemon, held=0, default=0, scheduled=0, retries=5, dead=0)
    r0, r1, r2, r3, r4 = s.retries
    first = {jid: _one(r, "retry", jid) for jid in s.retries}

    # kill: the entry moves to the dead set, byte for byte, once
    expected = _removal_result(r, "retry", r2, True)
    out = _api(server, "act", "retry", r2, "kill")
    assert out["result"] == expected and type(out["result"]) is type(expected)
    assert out["before"]["raw"].encode() == first[r2][0]
    assert r2 not in _zset(r, "retry")
    assert _one(r, "dead", r2)[0] == first[r2][0]

    # delete: gone from everywhere
    out = _api(server, "act", "retry", r3, "delete")
    assert out["result"] is True and out["after"] == []
    assert r3 not in _zset(r, "retry") and r3 not in _zset(r, "dead")

    # reschedule a forkq-written retry entry: one entry, same bytes, the new score
    target = time.time() + 2 * HOUR
    out = _api(server, "act", "retry", r1, "reschedule", repr(target))
    member, score = _one(r, "retry", r1)
    assert member == first[r1][0] and score == pytest.approx(target, abs=0.01)
    assert [e["score"] for e in out["after"]] == [pytest.approx(target, abs=0.01)]

    # retry: pushed (by Sidekiq's client) to its queue, run by forkq, filed again by forkq
    expected = _removal_result(r, "retry", r0, r0)
    out = _api(server, "act", "retry", r0, "retry")
    assert out["result"] == expected  # the entry left (the Ruby script checks it): whatever is
    # there now is forkq's new filing of the job's next failure, never the entry itself
    assert all(e["raw"] != out["before"]["raw"] for e in out["after"]), out["after"]
    until(_refiled(r, "retry", r0, 2), 15, f"forkq did not run and refile {r0}:\n{s.daemon.log()}")
    assert [a["retry_count"] for a in attempts(r, r0)] == [None, -1], "Sidekiq decrements it"
    member, score = _one(r, "retry", r0)
    job, before = json.loads(member), json.loads(first[r0][0])
    assert job["retry_count"] == 0 and job["failed_at"] == before["failed_at"]
    assert job["retried_at"] > before["failed_at"] and job["error_message"] == "slow retry-0"
    assert BACKOFF[0] - 0.01 <= score - job["retried_at"] <= BACKOFF[1] + 0.01

    # add_to_queue: same, without the decrement
    expected = _removal_result(r, "retry", r4, r4)
    out = _api(server, "act", "retry", r4, "add_to_queue")
    assert out["result"] == expected
    until(_refiled(r, "retry", r4, 2), 15, f"forkq did not run and refile {r4}:\n{s.daemon.log()}")
    assert [a["retry_count"] for a in attempts(r, r4)] == [None, 0]
    assert json.loads(_one(r, "retry", r4)[0])["retry_count"] == 1

    # reschedule the entry forkq refiled after Sidekiq's client had re-encoded the job
    refiled = _one(r, "retry", r0)[0]
    target = time.time() + 3 * HOUR
    _api(server, "act", "retry", r0, "reschedule", repr(target))
    member, score = _one(r, "retry", r0)
    assert member == refiled and score == pytest.approx(target, abs=0.01)

    # reschedule into the past: forkq's scheduler moves it, it runs once, is filed once
    _api(server, "act", "retry", r1, "reschedule", repr(time.time() - 1))
    until(_refiled(r, "retry", r1, 2), 15, f"forkq did not run the due {r1}:\n{s.daemon.log()}")
    assert json.loads(_one(r, "retry", r1)[0])["retry_count"] == 1

    # reschedule an entry whose error message, backtrace and args stress the JSON encoding
    marker = 'multi\nline "é" \u2028\x01\t/\\ 1e-05 \U0001f600'
    tricky = forkq.Client(r).push({
        "class": "SlowRetry", "args": [marker, 1e22, 5e-324, -1.5e-07, 123456789012345.67,
                                       1234567890123456.7, 2**64, [], {}],
        "queue": WORK, "retry": 3, "backtrace": True, "tags": ["t/1"], "custom": {"x": None}})
    assert tricky is not None
    until(lambda: tricky in _zset(r, "retry"), 15,
          f"forkq did not file {tricky}:\n{s.daemon.log()}")
    member = _one(r, "retry", tricky)[0]
    assert json.loads(member)["error_message"] == f"slow {marker}"
    target = time.time() + 4 * HOUR
    out = _api(server, "act", "retry", tricky, "reschedule", repr(target))
    assert out["before"]["error_message"] == f"slow {marker}"
    assert _one(r, "retry", tricky) == (member, pytest.approx(target, abs=0.01))

    # nothing duplicated, nothing lost
    assert r.llen(f"queue:{WORK}") == 0
    assert {jid: len(v) for jid, v in _zset(r, "retry").items()} == {
        r0: 1, r1: 1, r4: 1, tricky: 1}
    assert {jid: len(v) for jid, v in _zset(r, "dead").items()} == {r2: 1}
    assert {jid: len(attempts(r, jid)) for jid in [*s.retries, tricky]} == {
        r0: 2, r1: 2, r2: 1, r3: 1, r4: 2, tricky: 1}
    assert _stat(r, "processed") == _stat(r, "failed") == 9

    # clear
    assert _api(server, "clear", "retry") == {"before": 4, "after": 0}
    assert _api(server, "clear", "dead") == {"before": 1, "after": 0}
    assert not r.exists("retry", "dead")
    stats = _api(server, "read")["stats"]
    assert (stats["retry_size"], stats["dead_size"], stats["processed"], stats["failed"]) == (
        0, 0, 9, 9)


# --- 3. actions on forkq's scheduled and dead entries, queues, clear -------------------------


def test_api_acts_on_forkq_scheduled_dead_and_queues(server: EmbeddedServer, r: redis.Redis,
                                                     daemon: Callable[..., Daemon]) -> None:
    s = _scene(r, daemon, held=2, default=1, scheduled=4, retries=0, dead=4)
    s0, s1, s2, s3 = s.scheduled
    d0, d1, d2, d3 = s.dead
    h0, h1 = s.held
    scheduled = {jid: _one(r, "schedule", jid) for jid in s.scheduled}
    dead = {jid: _one(r, "dead", jid) for jid in s.dead}

    # ScheduledSet: add_to_queue runs it now
    expected = _removal_result(r, "schedule", s0, s0)
    out = _api(server, "act", "schedule", s0, "add_to_queue")
    assert out["result"] == expected and out["after"] == []
    until(lambda: len(_ran(r, s0)) == 1, 15, f"forkq did not run {s0}:\n{s.daemon.log()}")
    assert _ran(r, s0)[0]["args"] == s.args[s0]

    # reschedule: later (one entry, same bytes), then now (forkq's scheduler runs it once)
    target = time.time() + 5 * HOUR
    _api(server, "act", "schedule", s1, "reschedule", repr(target))
    member, score = _one(r, "schedule", s1)
    assert member == scheduled[s1][0] and score == pytest.approx(target, abs=0.01)
    _api(server, "act", "schedule", s1, "reschedule", repr(time.time() - 1))
    until(lambda: len(_ran(r, s1)) == 1, 15, f"forkq did not run the due {s1}:\n{s.daemon.log()}")
    assert s1 not in _zset(r, "schedule")

    # delete, kill
    assert _api(server, "act", "schedule", s2, "delete")["result"] is True
    expected = _removal_result(r, "schedule", s3, True)
    killed = _api(server, "act", "schedule", s3, "kill")["result"]
    assert killed == expected and type(killed) is type(expected)
    assert list(_zset(r, "schedule")) == []
    assert _one(r, "dead", s3)[0] == scheduled[s3][0]

    # DeadSet: retry (forkq runs it, buries it again), add_to_queue, delete, reschedule
    expected = _removal_result(r, "dead", d0, d0)
    assert _api(server, "act", "dead", d0, "retry")["result"] == expected
    until(_refiled(r, "dead", d0, 2), 15, f"forkq did not run and rebury {d0}:\n{s.daemon.log()}")
    job = json.loads(_one(r, "dead", d0)[0])
    assert job["retry_count"] == 0 and job["failed_at"] == json.loads(dead[d0][0])["failed_at"]
    assert [a["retry_count"] for a in attempts(r, d0)] == [None, -1]
    expected = _removal_result(r, "dead", d2, d2)
    assert _api(server, "act", "dead", d2, "add_to_queue")["result"] == expected
    until(_refiled(r, "dead", d2, 2), 15, f"forkq did not run and rebury {d2}:\n{s.daemon.log()}")
    assert json.loads(_one(r, "dead", d2)[0])["retry_count"] == 1
    assert _api(server, "act", "dead", d1, "delete")["result"] is True
    target = time.time() + HOUR
    _api(server, "act", "dead", d3, "reschedule", repr(target))
    member, score = _one(r, "dead", d3)
    assert member == dead[d3][0] and score == pytest.approx(target, abs=0.01)

    # Queue: JobRecord#delete, then DeadSet#kill of a raw forkq job
    held_raw = {json.loads(raw)["jid"]: raw for raw in r.lrange("queue:held", 0, -1)}
    out = _api(server, "queue-delete", "held", h0)
    assert out["deleted"]["jid"] == h0 and out["size"] == 1 and _queue(r, "held") == [h1]
    out = _api(server, "queue-kill", "held", h1)
    assert out["result"] is True and out["size"] == 0 and r.llen("queue:held") == 0
    assert _one(r, "dead", h1)[0] == held_raw[h1]

    # nothing duplicated, nothing lost, nothing run that should not have
    assert {jid: len(v) for jid, v in _zset(r, "dead").items()} == {
        s3: 1, d0: 1, d2: 1, d3: 1, h1: 1}
    assert {jid: len(_ran(r, jid)) for jid in [*s.scheduled, *s.held, *s.default]} == {
        s0: 1, s1: 1, s2: 0, s3: 0, h0: 0, h1: 0, s.default[0]: 0}
    assert {jid: len(attempts(r, jid)) for jid in s.dead} == {d0: 2, d1: 1, d2: 2, d3: 1}
    assert r.llen(f"queue:{WORK}") == 0

    # clear a queue and each set
    out = _api(server, "clear", "queue:default")
    assert out["before"] == 1 and out["after"] == 0 and "default" not in out["queues"]
    assert not r.exists("queue:default") and not r.sismember("queues", "default")
    r.zadd("schedule", dict([scheduled[s2]]))  # a forkq-written entry again, to clear
    assert _api(server, "clear", "schedule") == {"before": 1, "after": 0}
    assert _api(server, "clear", "dead") == {"before": 5, "after": 0}
    assert not r.exists("schedule", "dead")
    stats = _api(server, "read")["stats"]
    assert (stats["scheduled_size"], stats["dead_size"], stats["enqueued"],
            stats["workers_size"]) == (0, 0, 0, 1)


def test_api_acts_on_one_of_forkq_s_entries_that_share_a_score(server: EmbeddedServer,
                                                                r: redis.Redis) -> None:
    """Jobs scheduled for the same moment share a score: Sidekiq's add_to_queue and kill
    take the one asked for and put the others back byte for byte, at their score."""
    at = time.time() + HOUR
    first, second, third = forkq.Client(r).push_bulk(
        {"class": "Record", "args": [["tie-0", *TRICKY], ["tie-1"], ["tie-2"]],
         "queue": "ties", "at": at})
    entries = {jid: _one(r, "schedule", jid) for jid in (first, second, third)}
    assert len({score for _, score in entries.values()}) == 1

    expected = _removal_result(r, "schedule", first, first)
    assert expected == [True, True]
    assert _api(server, "act", "schedule", first, "add_to_queue")["result"] == expected
    queued = json.loads(r.lindex("queue:ties", 0) or b"{}")
    assert (queued["jid"], queued["args"]) == (first, ["tie-0", *TRICKY])
    assert r.llen("queue:ties") == 1
    assert {jid: _one(r, "schedule", jid) for jid in (second, third)} == {
        second: entries[second], third: entries[third]}

    assert _api(server, "act", "schedule", second, "kill")["result"] == [True]
    assert _one(r, "dead", second)[0] == entries[second][0]
    assert list(_zset(r, "schedule")) == [third] and _one(r, "schedule", third) == entries[third]


# --- 4. the Web UI's pages -------------------------------------------------------------------


def _text(result: dict[str, Any]) -> str:
    """A page's body, HTML entities decoded; fails unless it rendered (200, no exception)."""
    assert result["error"] is None, f"{result['path']} raised:\n{result['error']}"
    assert result["status"] == 200, f"{result['path']}: status {result['status']}"
    return html.unescape(result["body"])


def _row(body: str, needle: str) -> str:
    """The one table row of ``body`` that contains ``needle``."""
    rows = [row for row in re.split(r"<tr\b", body) if needle in row]
    assert len(rows) == 1, f"{len(rows)} rows contain {needle!r}"
    return rows[0]


def _count(body: str, name: str) -> int:
    """A dashboard summary number (``txtProcessed``...)."""
    found = re.search(rf'id="{name}" class="count">([\d,]+)<', body)
    assert found, f"no {name} in the page"
    return int(found.group(1).replace(",", ""))


def _keys(body: str, page: str) -> dict[str, str]:
    """The ``<score>-<jid>`` detail keys a list page links to, by jid."""
    keys = re.findall(rf'href="/{page}/([0-9.e+-]+-[0-9a-f]{{24}})"', body)
    return {key.rsplit("-", 1)[1]: key for key in keys}


def test_web_ui_shows_forkq(server: EmbeddedServer, r: redis.Redis,
                            daemon: Callable[..., Daemon]) -> None:
    s = _scene(r, daemon)
    r0, r1 = s.retries
    # one retry entry with retry_count 1, so the detail page shows "Retry Count" / "Last Retry"
    _api(server, "act", "retry", r1, "add_to_queue")
    until(_refiled(r, "retry", r1, 2), 15, f"forkq did not refile {r1}:\n{s.daemon.log()}")
    # the job metrics forkq writes (Sidekiq 7.x / 8.x layout, forkq's counters) are in Redis
    # while 6.4.1 renders every page: the daemon's (its jobs all failed: no histogram), and a
    # successful run written by the same code, for the histogram keys
    until(lambda: r.exists("forkq:metrics:jobs"), 10, s.daemon.log)
    recorder = Recorder()
    recorder.record(WORK, "Record", 0.025, failed=False)
    pipe = r.pipeline(transaction=False)
    queue_writes(pipe, recorder.drain(), time.time())
    pipe.execute()
    until(lambda: _metrics_written(r), 10, lambda: f"{r.keys('*')}\n{s.daemon.log()}")
    pages = ["/", "/busy", "/queues", "/queues/held", "/queues/default", f"/queues/{WORK}",
             "/retries", "/scheduled", "/morgue", "/stats", "/stats/queues"]
    got = dict(zip(pages, map(_text, _web(server, *(f"GET {p}" for p in pages))), strict=True))

    processed, failed = _stat(r, "processed"), _stat(r, "failed")
    assert processed == failed == 5
    dashboard = got["/"]
    assert {name: _count(dashboard, name) for name in (
        "txtProcessed", "txtFailed", "txtBusy", "txtEnqueued", "txtRetries", "txtScheduled",
        "txtDead")} == {"txtProcessed": processed, "txtFailed": failed, "txtBusy": 1,
                        "txtEnqueued": 3, "txtRetries": 2, "txtScheduled": 2, "txtDead": 2}
    assert json.loads(got["/stats"])["sidekiq"] | {"default_latency": None} == {
        "processed": processed, "failed": failed, "busy": 1, "processes": 1, "enqueued": 3,
        "scheduled": 2, "retries": 2, "dead": 2, "default_latency": None}
    assert json.loads(got["/stats/queues"]) == {"held": 2, "default": 1, WORK: 0}

    busy = got["/busy"]
    process = _row(busy, f'name="identity" value="{s.identity}"')
    assert f"{socket.gethostname()}:{s.daemon.pid}" in process
    for fact in ('label-success">apitag<', 'label-info">green<', 'label-warning">leader<',
                 WORK, "<td>3</td>", "<td>1</td>"):
        assert fact in process, f"{fact!r} missing from the /busy process row:\n{process}"
    assert 'label-danger">quiet<' not in process
    work = _row(busy, f"<td>{s.busy_jid}</td>")
    for fact in (f"<td>{s.identity}</td>", f"<td>{s.busy_pid}</td>", "Sleep", "120, \"busy\"",
                 f'href="/queues/{WORK}"'):
        assert fact in work, f"{fact!r} missing from the /busy job row:\n{work}"

    queues = got["/queues"]
    for name, size in (("held", 2), ("default", 1), (WORK, 0)):
        assert f"<td>{size} </td>" in _row(queues, f'href="/queues/{name}"'), name
    for name, jids in (("held", s.held), ("default", s.default)):
        for jid in jids:
            row = _row(got[f"/queues/{name}"], f'title="{jid}"')
            assert "Record" in row and f'"{s.args[jid][0]}"' in row, row

    # list pages: one linked row per entry, with forkq's class, queue and error
    detail: list[str] = []
    for page, kind, jids in (("retries", "retries", s.retries), ("scheduled", "scheduled",
                             list(s.scheduled)), ("morgue", "morgue", s.dead)):
        body = got[f"/{page}"]
        keys = _keys(body, kind)
        assert sorted(keys) == sorted(jids), f"/{page} links {keys}"
        for jid, key in keys.items():
            row = _row(body, f'href="/{kind}/{key}"')
            assert f'href="/queues/{WORK}"' in row and ("SlowRetry" if kind != "scheduled"
                                                        else "Record") in row, row
            assert f'"{s.args[jid][0]}"' in row, row
            if kind != "scheduled":
                assert f"RuntimeError: slow {s.args[jid][0]}" in row, row
            detail.append(f"/{kind}/{key}")
        if kind == "retries":
            assert "<td>0</td>" in _row(body, keys[r0]) and "<td>1</td>" in _row(body, keys[r1])

    # detail pages (the links above): job, error and backtrace
    pages = dict(zip(detail, map(_text, _web(server, *(f"GET {p}" for p in detail))),
                     strict=True))
    for path, body in pages.items():
        jid = path.rsplit("-", 1)[1]
        assert f"<code>{jid}</code>" in body and f'href="/queues/{WORK}"' in body, path
        assert f'"{s.args[jid][0]}"' in body
        if path.startswith("/scheduled/"):
            assert "Record" in body and 'name="add_to_queue"' in body
            continue
        assert "<code>RuntimeError</code>" in body and f"slow {s.args[jid][0]}" in body, path
        assert "jobs.py:" in body and "in `perform'" in body, f"no backtrace on {path}"
    retry_pages = {path.rsplit("-", 1)[1]: body for path, body in pages.items()
                   if path.startswith("/retries/")}
    assert "Originally Failed" in retry_pages[r0] and "Retry Count" not in retry_pages[r0]
    assert "Retry Count" in retry_pages[r1] and "Last Retry" in retry_pages[r1]


# --- 5. the Web UI's buttons -----------------------------------------------------------------


def test_web_ui_buttons_act_on_forkq(server: EmbeddedServer, r: redis.Redis,
                                     daemon: Callable[..., Daemon]) -> None:
    s = _scene(r, daemon, held=2, default=1, scheduled=2, retries=3, dead=2)
    r0, r1, r2 = s.retries
    s0, s1 = s.scheduled
    d0, d1 = s.dead
    h0, h1 = s.held
    before_dead = {jid: _one(r, "dead", jid)[0] for jid in s.dead}
    before_retry = {jid: _one(r, "retry", jid)[0] for jid in s.retries}
    lists = ["/retries", "/scheduled", "/morgue", "/queues/held"]
    results = _web(server, *(f"GET {p}" for p in lists))
    got = dict(zip(lists, map(_text, results), strict=True))
    retries, scheduled, morgue = (_keys(got[p], k) for p, k in (
        ("/retries", "retries"), ("/scheduled", "scheduled"), ("/morgue", "morgue")))
    key_val = re.search(r'<tr title="' + h0 + r'">.*?name="key_val" value="([^"]*)"',
                        results[3]["body"], re.S)
    assert key_val, "no delete form for the held job"
    raw_h0 = html.unescape(key_val.group(1))  # what a browser posts
    assert raw_h0.encode() in r.lrange("queue:held", 0, -1)

    def press(page: str, action: str, **form: str) -> list[str]:
        """Open ``page`` (its form carries the CSRF token), then submit ``form`` to ``action``."""
        fields = [("key[]" if k == "key" else k, v) for k, v in form.items()]
        return [f"GET {page}", f"POST {action} {urlencode(fields)}"]

    requests = [
        *press(f"/retries/{retries[r0]}", f"/retries/{retries[r0]}", retry="Retry Now"),
        *press("/retries", "/retries", key=retries[r1], kill="Kill"),
        *press(f"/retries/{retries[r2]}", f"/retries/{retries[r2]}", delete="Delete"),
        *press(f"/scheduled/{scheduled[s0]}", f"/scheduled/{scheduled[s0]}",
               add_to_queue="Add to queue"),
        *press("/scheduled", "/scheduled", key=scheduled[s1], delete="Delete"),
        *press(f"/morgue/{morgue[d0]}", f"/morgue/{morgue[d0]}", retry="Retry Now"),
        *press("/morgue", "/morgue", key=morgue[d1], delete="Delete"),
        *press("/queues/held", "/queues/held/delete", key_val=raw_h0),
        *press("/queues", "/queues/default", delete="Delete"),
    ]
    results = _web(server, *requests)
    for page, result in zip(results[::2], results[1::2], strict=True):
        _text(page)
        assert result["error"] is None, f"{result['path']} raised:\n{result['error']}"
        assert (result["status"], result["followed"]) == (302, 200), (
            f"POST {result['path']}: {result['status']}, then {result['followed']}")

    until(lambda: _refiled(r, "retry", r0, 2)() and _refiled(r, "dead", d0, 2)()
          and len(_ran(r, s0)) == 1, 15, f"forkq did not run what the UI queued:\n{s.daemon.log()}")
    assert json.loads(_one(r, "retry", r0)[0])["retry_count"] == 0
    assert json.loads(_one(r, "dead", d0)[0])["retry_count"] == 0
    assert _one(r, "dead", r1)[0] == before_retry[r1], "Kill moves the bytes unchanged"
    assert {jid: len(v) for jid, v in _zset(r, "retry").items()} == {r0: 1}
    assert {jid: len(v) for jid, v in _zset(r, "dead").items()} == {d0: 1, r1: 1}
    assert _zset(r, "schedule") == {}
    assert {jid: len(attempts(r, jid)) for jid in [*s.retries, *s.dead]} == {
        r0: 2, r1: 1, r2: 1, d0: 2, d1: 1}
    assert {jid: len(_ran(r, jid)) for jid in [s0, s1, h0, h1]} == {s0: 1, s1: 0, h0: 0, h1: 0}
    assert _queue(r, "held") == [h1]
    assert not r.exists("queue:default") and not r.sismember("queues", "default")
    assert before_dead[d1] not in r.zrange("dead", 0, -1)


# --- 6. the Web UI's Quiet and Stop buttons --------------------------------------------------


def test_web_ui_quiet_and_stop_buttons_reach_forkq(server: EmbeddedServer, r: redis.Redis,
                                                   daemon: Callable[..., Daemon]) -> None:
    _need_ruby()
    d = daemon(DAEMON)
    d.wait_children(3)
    until(lambda: r.scard("processes") == 1, 10, "forkq is not in the processes set")
    identity = next(iter(r.smembers("processes"))).decode()

    def press(button: str) -> None:
        form = urlencode({"identity": identity, button: "1"})
        page, result = _web(server, "GET /busy", f"POST /busy {form}")
        assert f'name="{button}"' in _row(_text(page), f'value="{identity}"')
        assert result["error"] is None, result["error"]
        assert (result["status"], result["followed"]) == (302, 200), result

    press("quiet")
    until(lambda: r.hget(identity, "quiet") == b"true", 15,
          f"forkq did not go quiet:\n{d.log()}")
    row = _row(_text(_web(server, "GET /busy")[0]), f'value="{identity}"')
    assert 'label-danger">quiet<' in row and 'name="quiet"' not in row, row
    assert "Received remote TSTP" in d.log()

    press("stop")
    try:
        code = d.wait(5 + 2 + 10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the Stop button did not stop forkq; log:\n{d.log()}")
    assert code == 0 and "Received remote TERM" in d.log() and "Bye!" in d.log(), d.log()
    assert not r.sismember("processes", identity)
    assert identity not in _text(_web(server, "GET /busy")[0])


# --- 7. a failure whose message is not valid UTF-8 -------------------------------------------


def test_api_shows_a_failure_whose_message_is_not_utf8(server: EmbeddedServer, r: redis.Redis,
                                                       daemon: Callable[..., Daemon]) -> None:
    """Sidekiq (job_retry.rb) scrubs an error message to valid UTF-8 and files the failure.
    A Python message may hold lone surrogates (``os.fsdecode`` of a non-UTF-8 file name):
    the failure must still reach the RetrySet, once, with its own error."""
    _need_ruby()
    d = daemon(DAEMON)
    d.wait_children(3)
    jid = forkq.Client(r).push({"class": "BadMessage", "args": ["x"], "queue": WORK,
                                "retry": 3})
    assert jid is not None
    until(lambda: r.zcard("retry") + r.zcard("dead") == 1, 30,
          f"forkq filed the failure nowhere:\n{d.log()}")
    seen = _api(server, "read")
    retries = {e["jid"]: e for e in seen["retry"]["entries"]}
    dead = {e["jid"]: e for e in seen["dead"]["entries"]}
    runs = len(attempts(r, jid))
    assert jid in retries, (
        f"RetrySet does not show the failure; DeadSet: {dead.get(jid, {}).get('error_class')}: "
        f"{dead.get(jid, {}).get('error_message')!r} after {runs} runs of a job allowed 3 "
        f"retries (forkq could not encode the message, its processor crashed)")
    entry = retries[jid]
    assert (entry["error_class"], entry["retry_count"]) == ("RuntimeError", 0)
    assert entry["error_message"].startswith("bad x "), entry["error_message"]
    assert runs == 1


def test_web_ui_shows_the_jobs_of_a_batch_and_a_chain_unharmed(server: EmbeddedServer,
                                                                 r: redis.Redis) -> None:
    """A batch's jobs carry ``bid`` as Sidekiq Pro writes it, a chain's step ``chain`` and
    ``chain_step``: Sidekiq 6.4.1's Web UI and API list them as any job."""
    from forkq import client as clients

    from . import jobs

    clients.configure(clients.Client(r))
    try:
        with forkq.batch(on_success=jobs.Mark.s()) as b:
            batched = jobs.Mark.set(queue="batched").perform_async("row")
        forkq.chain(jobs.Mark.set(queue="batched").s("step"), jobs.Mark.s()).perform_async()
    finally:
        clients.configure(None)
    [page] = _web(server, "GET /queues/batched")
    body = _text(page)
    assert _row(body, f'title="{batched}"') and '"row"' in body and '"step"' in body
    assert json.loads(r.lrange("queue:batched", -1, -1)[0])["bid"] == b.bid
