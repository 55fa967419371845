"""The real daemon as a subprocess: delivery, weights, failures, kills, stop, security."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from forkq import __version__
from forkq.client import Client
from forkq.connection import identified
from forkq.embedded import EmbeddedServer, find_binary

from .conftest import holding, push, records, until

WEIGHTED = """
concurrency: 4
require: jobs
log_level: warning
queues:
  - [critical, 3]
  - [default, 2]
  - low
"""


def _settled(r: redis.Redis, total: int) -> bool:
    return int(r.get("stat:processed") or 0) >= total and not holding(r)


def test_weighted_queues_run_every_job_once_in_order_and_share(r: redis.Redis,
                                                               daemon: Any) -> None:
    client, per_queue, jids = Client(r), 3334, {}
    for queue in ("critical", "default", "low"):
        pushed = client.push_bulk({"class": "Record", "queue": queue,
                                   "args": [[queue, n] for n in range(per_queue)]})
        jids.update({jid: (queue, n) for n, jid in enumerate(pushed)})
    daemon(WEIGHTED)
    until(lambda: _settled(r, len(jids)), 120, "not all jobs ran")
    rows = records(r)
    runs = Counter(rec["jid"] for rec in rows)
    assert set(runs) == set(jids) and max(runs.values()) == 1, "every job exactly once"
    by_child: dict[tuple[int, str], list[int]] = defaultdict(list)
    for rec in rows:
        by_child[(rec["pid"], rec["queue"])].append(rec["args"][1])
    for seqs in by_child.values():
        assert seqs == sorted(seqs), "each child fetched each queue oldest-first (FIFO)"
    window = Counter(rec["queue"] for rec in rows[:6000])
    assert max(window.values()) < per_queue, "all queues stayed non-empty in the window"
    shares = {q: window[q] / 6000 for q in window}
    for queue, expected in (("critical", 3 / 6), ("default", 2 / 6), ("low", 1 / 6)):
        assert abs(shares[queue] - expected) <= 0.05, shares


def test_strict_order_runs_low_only_when_the_others_are_empty(r: redis.Redis,
                                                              daemon: Any) -> None:
    client = Client(r)
    for queue in ("low", "default", "critical"):
        client.push_bulk({"class": "StrictProbe", "queue": queue,
                          "args": [[n] for n in range(200)]})
    daemon(WEIGHTED + "strict: true\n")
    until(lambda: _settled(r, 600), 60)
    rows = records(r)
    assert len(rows) == 600
    assert all(rec["critical"] == 0 for rec in rows if rec["queue"] == "default")
    assert all(rec["critical"] == rec["default"] == 0 for rec in rows
               if rec["queue"] == "low")


def _move_due(r: redis.Redis, zset: str) -> None:
    """Do what the scheduler does for a due entry: back into its queue, fresh enqueued_at."""
    (raw,) = r.zrange(zset, 0, 0)
    r.zrem(zset, raw)
    job = json.loads(raw)
    job["enqueued_at"] = time.time()
    r.lpush(f"queue:{job['queue']}", json.dumps(job))


def test_failures_go_to_retry_then_dead_with_sidekiqs_fields(r: redis.Redis,
                                                             daemon: Any) -> None:
    daemon("concurrency: 1\nrequire: jobs\n")
    jid = Client(r).push({"class": "Boom", "args": ["kaboom"], "retry": 2, "backtrace": 3})
    until(lambda: r.zcard("retry") == 1)
    ((raw, score),) = r.zrange("retry", 0, -1, withscores=True)
    first = json.loads(raw)
    assert (first["jid"], first["class"], first["args"], first["queue"]) == (
        jid, "Boom", ["kaboom"], "default")
    assert (first["error_class"], first["error_message"], first["retry_count"]) == (
        "ValueError", "kaboom", 0)
    assert isinstance(first["failed_at"], float) and "retried_at" not in first
    assert first["error_backtrace"].endswith("\n")
    assert 15 <= score - first["failed_at"] <= 24
    _move_due(r, "retry")
    until(lambda: r.zcard("retry") == 1)
    second = json.loads(r.zrange("retry", 0, 0)[0])
    assert second["retry_count"] == 1 and second["retried_at"] >= second["failed_at"]
    _move_due(r, "retry")
    until(lambda: r.zcard("dead") == 1)
    dead = json.loads(r.zrange("dead", 0, 0)[0])
    assert (dead["jid"], dead["retry_count"], r.zcard("retry")) == (jid, 2, 0)
    assert int(r.get("stat:failed") or 0) == 3


def test_retry_false_counts_the_failure_and_keeps_nothing(r: redis.Redis,
                                                         daemon: Any) -> None:
    daemon("concurrency: 1\nrequire: jobs\n")
    Client(r).push({"class": "Boom", "args": ["gone"], "retry": False})
    until(lambda: int(r.get("stat:failed") or 0) == 1)
    until(lambda: _settled(r, 1))
    assert (r.zcard("retry"), r.zcard("dead"), r.llen("queue:default")) == (0, 0, 0)


def test_a_killed_childs_job_completes_in_a_replacement(r: redis.Redis,
                                                        daemon: Any) -> None:
    d = daemon("concurrency: 1\nrequire: jobs\n")
    Client(r).push({"class": "Sleep", "args": [5, "long"]})
    until(lambda: r.llen("test:started") == 1)
    victim = records(r, "test:started")[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    until(lambda: r.llen("test:ran") == 1, 20, "the job did not complete after the kill")
    starts = records(r, "test:started")
    assert len(starts) == 2 and starts[1]["pid"] != victim
    assert records(r)[0]["pid"] == starts[1]["pid"]
    assert "killed by signal SIGKILL" in d.log()


@pytest.mark.slow
@pytest.mark.parametrize(("total", "longest", "gap"), [(2000, 0.01, 0.15), (20_000, 0.0, 0.1)],
                         ids=["2000-jobs-of-ms", "20000-short-jobs"])
def test_random_child_kills_lose_no_job(r: redis.Redis, daemon: Any, total: int,
                                        longest: float, gap: float) -> None:
    # batched fetch is on (fetch_batch 16 by default): a killed child holds up to 16 jobs
    Client(r).push_bulk({"class": "Sleep",
                         "args": [[random.uniform(longest / 10, longest), str(n)]
                                  for n in range(total)]})
    d = daemon("concurrency: 4\nrequire: jobs\nlog_level: warning\n")
    d.wait_children(4)
    killed: set[int] = set()
    rng = random.Random(2)
    while len(killed) < 20:
        time.sleep(gap)
        candidates = [c.pid for c in d.children() if c.pid not in killed]
        if candidates:
            victim = rng.choice(candidates)
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
    # every job runs, except one whose processor was killed under it three times: by design
    # that one is a poison pill and goes to the dead set (it happens on a loaded machine,
    # where a requeued job is fetched again by the next child before the next kill)
    until(lambda: len({rec["marker"] for rec in records(r)} | set(_buried(r))) == total, 120,
          _where_missing(r, total, d))
    until(lambda: r.llen("queue:default") == 0 and not holding(r))
    buried = _buried(r)
    assert all(error == "forkq.JobKilledError: its processor died 3 times while running it "
               "(last: killed by signal SIGKILL)" for error in buried.values()), buried
    assert 3 * len(buried) <= len(killed) and r.zcard("dead") == len(buried)
    assert r.llen("test:ran") - (total - len(buried)) <= len(killed)
    print(f"{len(killed)} children killed: {total - len(buried)} jobs ran, {len(buried)} buried "
          "as poison pills")
    starts = Counter(rec["marker"] for rec in records(r, "test:started"))
    repeated = {m for m, n in starts.items() if n > 1}
    assert len(repeated) <= len(killed)
    first_pid = {}
    for rec in records(r, "test:started"):
        first_pid.setdefault(rec["marker"], rec["pid"])
    assert all(first_pid[m] in killed for m in repeated), "only jobs killed mid-run ran twice"


def test_term_requeues_unfinished_jobs_to_the_front(r: redis.Redis,
                                                     daemon: Any) -> None:
    client = Client(r)
    for marker in ("a", "b"):
        client.push({"class": "Sleep", "args": [30, marker]})
    sleepers = set(r.lrange("queue:default", 0, -1))
    client.push_bulk({"class": "Record", "args": [["behind", n] for n in range(3)]})
    behind = r.lrange("queue:default", 0, 2)
    d = daemon("concurrency: 2\ntimeout: 3\nrequire: jobs\n")
    until(lambda: r.llen("test:started") == 2)
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0
    assert d.logged_at("Bye!") - d.logged_at("Shutting down") < 5, d.log()  # timeout 3 s
    queue = r.lrange("queue:default", 0, -1)
    assert set(queue[-2:]) == sleepers, "unfinished jobs are next, bytes unchanged"
    assert queue[:-2] == behind
    assert r.llen("test:ran") == 0 and not r.keys("forkq:inflight:*")


def test_an_idle_daemon_stops_within_a_second(r: redis.Redis, daemon: Any) -> None:
    """Timed by the daemon's own log, from the TERM acted on to its last line: the test's
    own turn to reap it on a loaded host is not the daemon's (the bench times stops)."""
    d = daemon("concurrency: 3\nrequire: jobs\n")
    until(lambda: r.scard("forkq:inflight") == 3)
    d.signal(signal.SIGTERM)
    assert d.wait(30) == 0
    assert d.logged_at("Bye!") - d.logged_at("Shutting down") < 1.0, d.log()


def test_every_connection_of_the_daemon_names_forkq(daemon: Any, tmp_path: Path) -> None:
    """CLIENT LIST's ``lib-name`` and ``lib-ver`` (redis-py's version) (CLIENT SETINFO:
    Redis 7.2, Valkey; the session's server may be older, so a Valkey of its own)."""
    valkey = EmbeddedServer(str(tmp_path / "valkey"), persistent=False, binary=find_binary())
    valkey.start()
    try:
        v = redis.Redis(unix_socket_path=valkey.socket, protocol=2)
        d = daemon("concurrency: 2\nrequire: jobs\nlog_level: warning\n",
                   redis_url=f"unix://{valkey.socket}")
        until(lambda: int(v.info("clients")["blocked_clients"]) == 2, 15,
              "the idle children are not waiting in Redis")
        named = f"redis-py(forkq_v{__version__})" if identified() else "redis-py"
        me = v.client_id()
        # A connection is listed from its connect() on, without a lib-name until its
        # handshake's CLIENT SETINFO lands: on a loaded host the children's other
        # connections may still be opening while their fetches block. So wait until
        # every connection has been through its handshake; one that never names itself
        # fails here.
        theirs: list[dict[str, Any]] = []
        # the master's store and cancel watch; each child's client, fetch, wait and heartbeat
        at_least = 2 + 2 * 4

        def handshaken() -> bool:
            theirs[:] = [c for c in v.client_list() if int(c["id"]) != me]
            return len(theirs) >= at_least and all(c["lib-name"] for c in theirs)

        until(handshaken, 15, lambda: f"connections without a lib-name: {theirs}")
        v.close()
        assert d.stop() == 0
    finally:
        valkey.stop()  # after the daemon: its stop needs the server
    assert len(theirs) >= at_least, theirs
    assert {c["lib-name"] for c in theirs} == {named}, theirs
    assert {c["lib-ver"] for c in theirs} == {redis.__version__}, theirs


def test_jobs_pushed_by_jobs_run_once_over_a_few_connections(r: redis.Redis,
                                                             daemon: Any) -> None:
    daemon("concurrency: 2\nrequire: jobs\nlog_level: warning\n")
    until(lambda: int(r.info("clients")["blocked_clients"]) == 2, 15)
    connected = int(r.info("stats")["total_connections_received"])
    Client(r).push_bulk({"class": "FanOut", "args": [[100], [100]]})
    until(lambda: r.llen("test:ran") == 200, 30)
    ran = [json.loads(entry) for entry in r.lrange("test:ran", 0, -1)]
    assert sorted(job["args"][1] for job in ran) == sorted(list(range(100)) * 2)
    assert len({job["jid"] for job in ran}) == 200
    # the processor's client pushes on a connection it keeps: a few, not one per push
    assert int(r.info("stats")["total_connections_received"]) - connected <= 8


def test_payloads_never_import_or_call_by_name(r: redis.Redis, daemon: Any,
                                               tmp_path: Path) -> None:
    proof = tmp_path / "pwned"
    evil = [("os.system", [f"touch {proof}"]), ("builtins.eval", [f"open('{proof}', 'w')"]),
            ("subprocess.call", [["touch", str(proof)]])]
    for name, args in evil:
        r.lpush("queue:default", json.dumps({"class": name, "args": args, "queue": "default",
                                             "jid": "e" * 24}))
    malformed = [b"not json", b"[1, 2]", b'{"class": "Record", "queue": "default"}',
                 b'{"class": "Record", "args": "x"}']
    for raw in malformed:
        r.lpush("queue:default", raw)
    d = daemon("concurrency: 1\nrequire: jobs\n")
    (child,) = d.wait_children(1)
    until(lambda: r.zcard("dead") == 7)
    Client(r).push({"class": "Record", "args": ["after"]})
    until(lambda: r.llen("test:ran") == 1)
    assert records(r)[0]["pid"] == child.pid, "the same child kept processing"
    assert not proof.exists()
    dead = [json.loads(x) for x in r.zrange("dead", 0, -1)]
    errors = sorted(f"{d['error_class']}: {d['error_message']}" for d in dead)
    assert sum("forkq.UnknownJobError: unknown job" in e for e in errors) == 3
    for problem in ("not valid JSON", "got a JSON array", "has no 'args'",
                    "'args' must be a JSON array"):
        assert any(problem in e for e in errors), (problem, errors)
    stand_ins = [d for d in dead if d["class"] == "forkq.Unrunnable"]
    assert sorted(d["raw"] for d in stand_ins) == ["[1, 2]", "not json"]


def test_idle_children_poll_when_the_server_refuses_tracking(r: redis.Redis, daemon: Any,
                                                              server: Any) -> None:
    r.execute_command("ACL", "SETUSER", "limited", "on", ">secret", "~*", "&*", "+@all",
                      "-client|tracking")
    # several queues: idle children watch them (one queue is waited on with BLMOVE)
    d = daemon("concurrency: 1\nrequire: jobs\nqueues: [default, low]\n",
               redis_url=f"unix://limited:secret@{server.socket}")
    try:
        until(lambda: "queue watch refused" in d.log())
        Client(r).push({"class": "Record", "args": ["polled"]})
        until(lambda: r.llen("test:ran") == 1, 5)
    finally:
        d.stop(timeout=10)
        r.execute_command("ACL", "DELUSER", "limited")


def _buried(r: redis.Redis) -> dict[str, str]:
    """Marker -> "error_class: error_message" of the Sleep jobs in the dead set."""
    dead = [json.loads(raw) for raw in r.zrange("dead", 0, -1)]
    return {str(job["args"][-1]): f"{job['error_class']}: {job['error_message']}"
            for job in dead}


def _where_missing(r: redis.Redis, total: int, d: Any) -> Callable[[], str]:
    """The failure message, made when it is needed: where the jobs that never ran are."""

    def explain() -> str:
        ran = {rec["marker"] for rec in records(r)}
        missing = sorted(set(map(str, range(total))) - ran, key=int)
        places = {}
        for key in ["queue:default", "retry", "dead", *map(bytes.decode,
                                                          r.keys("forkq:inflight:*"))]:
            kind = r.type(key).decode()
            items = (r.lrange(key, 0, -1) if kind == "list" else
                     r.zrange(key, 0, -1) if kind == "zset" else [])
            for raw in items:
                job = json.loads(raw) if raw.startswith(b"{") else {}
                marker = str((job.get("args") or [None, None])[-1])
                if marker in missing:
                    places[marker] = (key, job.get("error_message"))
        return (f"jobs lost: {len(missing)} never ran: {missing[:20]}; found: {places}; "
                f"kill counts: {[(k.decode(), r.get(k)) for k in r.keys('forkq:kills:*')][:20]}"
                f"\nlog:\n{d.log()[-6000:]}")

    return explain


def test_a_job_that_closes_stderr_leaves_its_processor_running_and_logging(
        r: redis.Redis, daemon: Callable[..., Any]) -> None:
    d = daemon("concurrency: 1\nrequire: jobs\n")
    push(r, "close_stderr")
    until(lambda: records(r), 15, lambda: d.log())
    jid = push(r, "Record", "after")
    until(lambda: len(records(r)) == 2, 15, lambda: d.log())
    closed, after = records(r)
    assert closed["pid"] == after["pid"], d.log()  # the same processor: it never crashed
    until(lambda: f"Record jid={jid} done" in d.log(), 10, lambda: d.log())  # still logging
    assert "exited with status" not in d.log(), d.log()
