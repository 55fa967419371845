"""Failures are visible, one job can be found: a failing job's traceback in the daemon's log
file, and ``forkq job JID`` / :func:`forkq.api.find_job` finding a job queued, scheduled,
running, held, in the retry and dead sets, or nowhere; hostile data is reported, not fatal.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from forkq import api, wirejson
from forkq.client import Client
from forkq.embedded import EmbeddedServer
from forkq.errors import EXIT_NOT_FOUND

from .conftest import Daemon, identity_of, push, records, run_forkq, until

DAEMON = """
concurrency: 1
queues: [default]
require: jobs
fetch_batch: 1
log_file: {log}
"""
LONG = "kaboom " + "x" * 300 + "\nsecond line of the message"

DURATION = r"(<0\.1 ms|[0-9]\.[0-9] ms|[1-9][0-9]{1,2} ms|[0-9]+\.[0-9] s)"
"""A job's time as forkq.wording.duration shows it in the log."""


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _failure_block(log: str, jid: str) -> list[str]:
    """The failure line of ``jid`` and the lines after it up to the next log line."""
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if f"jid={jid} fail:" in line)
    end = next((i for i in range(start + 1, len(lines))
                if re.match(r"\d{4}-\d\d-\d\dT", lines[i])), len(lines))
    return lines[start:end]


def test_a_failing_jobs_traceback_is_in_the_daemons_log_file(
        r: redis.Redis, daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    log = tmp_path / "forkq.log"
    d = daemon(DAEMON.format(log=log))
    retried = Client(r).push({"class": "Boom", "args": ["first"], "retry": 2})
    buried = Client(r).push({"class": "Boom", "args": ["last"], "retry": 0})
    until(lambda: r.zcard("retry") == 1 and r.zcard("dead") == 1, 30,
          lambda: f"log:\n{_log(log)}\nstderr:\n{d.log()}")
    until(lambda: f"jid={buried} fail:" in _log(log), 10, lambda: _log(log))

    retry_block = _failure_block(_log(log), retried)
    assert re.search(rf"processor-0 WARNING: Boom jid={retried} fail: {DURATION}: ValueError: "
                     r"first -> retry$", retry_block[0]), retry_block
    assert retry_block[1] == "Traceback (most recent call last):", retry_block
    assert any(re.search(r'tests/jobs\.py", line \d+, in perform$', x) for x in retry_block)
    assert "    raise ValueError(message)" in retry_block
    assert retry_block[-1] == "ValueError: first", retry_block

    dead_block = _failure_block(_log(log), buried)
    assert re.search(rf"processor-0 ERROR: Boom jid={buried} fail: .* -> dead$",
                     dead_block[0]), dead_block
    assert dead_block[1] == "Traceback (most recent call last):"
    assert dead_block[-1] == "ValueError: last", dead_block


class Forkq:
    """``forkq job`` against the session server."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.url = server.url

    def text(self, *args: str, code: int = 0) -> tuple[str, str]:
        done = run_forkq(*args, "--redis-url", self.url, timeout=30)
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        return done.stdout, done.stderr

    def json(self, *args: str, code: int = 0) -> dict[str, Any]:
        done = run_forkq(*args, "--redis-url", self.url, "--json", timeout=30)
        assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
        data: dict[str, Any] = json.loads(done.stdout)
        return data

    def place(self, jid: str) -> dict[str, Any]:
        """The one place ``forkq job --json`` finds the job in."""
        data = self.json("job", jid)
        assert data["jid"] == jid and data["problems"] == [], data
        (place,) = data["places"]
        assert place["job"]["jid"] == jid
        return place  # type: ignore[no-any-return]


def test_forkq_job_finds_a_job_in_each_place_it_can_be(
        r: redis.Redis, server: EmbeddedServer, daemon: Callable[..., Daemon],
        tmp_path: Path) -> None:
    d = daemon(DAEMON.format(log=tmp_path / "forkq.log"))
    identity = identity_of(r, d)
    cli = Forkq(server)
    client = Client(r)

    retried = client.push({"class": "SlowRetry", "args": ["lookup"], "retry": 3,
                           "backtrace": 5})  # fails once, next try in an hour
    dead = client.push({"class": "Boom", "args": [LONG], "retry": 0, "backtrace": 3})
    until(lambda: r.zcard("retry") == 1 and r.zcard("dead") == 1, 30, d.log)
    running = push(r, "Gate", "lookup")
    until(lambda: [x["jid"] for x in records(r, "test:started")] == [running], 15, d.log)
    # the child's next heartbeat (every ~2 s) names its job; "fetched" until then
    until(lambda: [p.kind for p in api.find_job(r, running).places] == ["running"], 10,
          lambda: repr(api.find_job(r, running)))
    queued = [push(r, "Record", n) for n in range(3)]
    due = time.time() + 3600
    scheduled = client.push({"class": "Record", "args": ["later"], "at": due})
    assert scheduled is not None

    try:
        # running: the daemon, its processor child, since when
        place = cli.place(running)
        (child,) = d.children()
        assert (place["place"], place["identity"], place["pid"], place["worker"]) == (
            "running", identity, d.pid, str(child.pid))
        assert place["hostname"] == socket.gethostname() and place["queue"] == "default"
        assert time.time() - 60 < place["at"] <= time.time()
        out, _ = cli.text("job", running)
        assert out.startswith(f"job {running}: running in {identity} (host "
                              f"{socket.gethostname()}, pid {d.pid}), processor {child.pid}, "
                              "since "), out

        # queued: queue name and position (0 runs next)
        for position, jid in enumerate(queued):
            place = cli.place(jid)
            assert (place["place"], place["queue"], place["position"]) == (
                "queued", "default", position)
            assert place["job"]["args"] == [position]
        out, _ = cli.text("job", queued[2])
        assert f"job {queued[2]}: queued in default, position 2 (2 jobs run before it)" in out

        # scheduled: when it is due
        place = cli.place(scheduled)
        assert place["place"] == "scheduled" and abs(place["at"] - due) < 1
        assert json.loads(place["payload"])["args"] == ["later"]
        out, _ = cli.text("job", scheduled)
        assert f"job {scheduled}: scheduled, due " in out and "(in 59m" in out

        # retry: next try, retry count, error
        place = cli.place(retried)
        assert (place["place"], place["job"]["retry_count"], place["job"]["error_class"],
                place["job"]["error_message"]) == ("retry", 0, "RuntimeError", "slow lookup")
        assert place["at"] > time.time() + 3000
        assert place["job"]["error_backtrace"][0].endswith(":in `perform'")
        out, _ = cli.text("job", retried)
        assert "in the retry set, next try" in out and "RuntimeError: slow lookup" in out

        # dead: the whole message (forkq dead cuts it), and the backtrace
        place = cli.place(dead)
        assert place["place"] == "dead" and place["job"]["error_message"] == LONG
        backtrace = place["job"]["error_backtrace"]
        assert 1 <= len(backtrace) <= 3 and re.search(r"tests/jobs\.py:\d+:in `perform'$",
                                                      backtrace[0]), backtrace
        listed, _ = cli.text("dead")
        assert f"ValueError: {LONG[:30]}" in listed and LONG[:60] not in listed  # cut there
        out, _ = cli.text("job", dead)
        assert f"job {dead}: dead since " in out
        assert f"  error      ValueError: {LONG.splitlines()[0]}\n" in out
        assert f"\n             {LONG.splitlines()[1]}\n" in out  # the message's second line
        assert f"  backtrace  {backtrace[0]}" in out
        assert '  payload    {"retry":0,' in out

        # the Python API sees the same
        found = api.find_job(r, queued[1])
        assert found.found and [(p.kind, p.position) for p in found.places] == [("queued", 1)]

        # not found
        nowhere = "0" * 24
        out, err = cli.text("job", nowhere, code=EXIT_NOT_FOUND)
        assert out == "" and err == f"forkq: job {nowhere} not found\n"
        data = cli.json("job", nowhere, code=EXIT_NOT_FOUND)
        assert data["places"] == [] and data["error"] == f"job {nowhere} not found"
        assert not api.find_job(r, nowhere).found
    finally:
        r.lpush("test:gate:lookup", 1)
    until(lambda: len(records(r)) == 4, 15, d.log)
    until(lambda: not api.find_job(r, running).found, 10, "a job done is nowhere")
    done = run_forkq("job", running, "--redis-url", cli.url, timeout=30)
    assert done.returncode == EXIT_NOT_FOUND, (
        f"{done.stdout}\nstarted: {records(r, 'test:started')}\n"
        f"lookup now: {api.find_job(r, running)!r}\nlog:\n{d.log()}")


def _stand_in_process(r: redis.Redis, identity: str, pid: int, *, forkq: bool = True) -> None:
    """A live process record, as a forkq master (or, without ``forkq``, Sidekiq) writes it
    (enough for the lookup)."""
    info = {"hostname": "box", "pid": pid, "started_at": time.time(), "queues": ["default"],
            "identity": identity, **({"forkq": "1"} if forkq else {})}
    r.hset(identity, mapping={"info": json.dumps(info), "busy": 1, "beat": time.time(),
                              "quiet": "false"})
    r.sadd("processes", identity)


def _job(jid: str, **extra: Any) -> str:
    return wirejson.dumps({"class": "Record", "args": [jid], "queue": "default", "jid": jid,
                           "created_at": time.time(), **extra})


def _beat(r: redis.Redis, identity: str, child: int, job: str | None) -> None:
    """A forkq child's heartbeat naming ``job`` (its raw JSON) as the one it runs."""
    running = None if job is None else {"queue": "default", "payload": job, "run_at": 1,
                                        "started": time.time() - 5, "class": "Record",
                                        "jid": json.loads(job)["jid"]}
    r.hset(f"forkq:beats:{identity}", str(child), json.dumps({"at": time.time(), "seq": 1,
                                                              "job": running}))


def test_in_flight_jobs_running_held_completed_and_orphaned(r: redis.Redis) -> None:
    identity, gone = "box:100:aaaaaaaaaaaa", "box:200:bbbbbbbbbbbb"
    _stand_in_process(r, identity, 100)
    done, runs, held = (_job(f"{n:024x}") for n in range(1, 4))
    mine = f"forkq:inflight:{identity}:101"
    r.rpush(mine, "queue:default", done, "queue:default", runs, "queue:default", held)
    _beat(r, identity, 101, runs)
    orphan = _job("f" * 24)
    r.rpush(f"forkq:inflight:{gone}:201", "queue:low", orphan)
    r.sadd("forkq:inflight", mine, f"forkq:inflight:{gone}:201")

    def where(jid: str) -> tuple[Any, ...]:
        (place,) = api.find_job(r, jid).places
        return place.kind, place.state, place.identity, place.worker, place.queue, place.pid

    assert where(f"{1:024x}") == ("in-flight", "completed", identity, "101", "default", 100)
    assert where(f"{2:024x}") == ("running", "running", identity, "101", "default", 100)
    assert where(f"{3:024x}") == ("in-flight", "held", identity, "101", "default", 100)
    assert where("f" * 24) == ("in-flight", "orphaned", gone, "201", "low", None)
    (running,) = api.find_job(r, f"{2:024x}").places
    assert running.at is not None and time.time() - 6 < running.at < time.time() - 4
    _beat(r, identity, 101, None)  # idle beat: the list still holds the job
    assert where(f"{2:024x}")[:2] == ("in-flight", "fetched")


def test_a_sidekiq_process_busy_job_is_found_running(r: redis.Redis) -> None:
    identity = "rubyhost:300:cccccccccccc"
    _stand_in_process(r, identity, 300, forkq=False)
    job = _job("d" * 24)
    r.hset(f"{identity}:work", "tid-52k", wirejson.dumps({"queue": "critical", "payload": job,
                                                          "run_at": 1795238985}))
    r.hset(f"{identity}:workers", "tid-52k", wirejson.dumps({"queue": "critical",
                                                             "payload": job,
                                                             "run_at": 1795238985}))
    (place,) = api.find_job(r, "d" * 24).places
    assert (place.kind, place.identity, place.hostname, place.pid, place.worker, place.queue,
            place.at) == ("running", identity, "box", 300, "tid-52k", "critical", 1795238985)


def test_a_forkq_daemons_busy_hash_alone_does_not_make_a_job_running(r: redis.Redis) -> None:
    """Its master rewrites the busy hash every 5 s from the children's last beats: after a
    job is acknowledged, one more rewrite can still name it. Only its in-flight lists tell."""
    identity = "box:400:dddddddddddd"
    _stand_in_process(r, identity, 400)
    done = _job("c" * 24)
    for key in (f"{identity}:workers", f"{identity}:work"):
        r.hset(key, "401", wirejson.dumps({"queue": "default", "payload": done,
                                           "run_at": int(time.time()) - 5}))
    assert not api.find_job(r, "c" * 24).found


def test_hostile_data_is_reported_and_the_lookup_goes_on(r: redis.Redis) -> None:
    jid = "e" * 24
    r.set("retry", "not a zset")
    r.sadd("queues", "broken", "default")
    r.hset("queue:broken", "x", jid)
    r.lpush("queue:default", f'{{"jid":"{jid}", broken json', _job("other", note=jid))
    r.zadd("dead", {f'["{jid}"]': 1.0})
    r.set("processes", "a string")
    r.sadd("forkq:inflight", "not-an-inflight-key")
    r.zadd("schedule", {_job(jid): 2e9})

    found = api.find_job(r, jid)
    assert [(p.kind, p.at) for p in found.places] == [("scheduled", 2e9)]
    problems = "\n".join(found.problems)
    assert "key 'retry' holds a string, not a zset; not searched" in problems
    assert "key 'queue:broken' holds a hash, not a list" in problems
    assert f"queue 'default' holds {jid!r} in something that is not a job" in problems
    assert f"the dead set holds {jid!r} in something that is not a job" in problems
    assert "key 'processes': not searched further: WRONGTYPE" in problems
    assert "'not-an-inflight-key', which is not an in-flight list" in problems
    assert "other" not in problems  # a job whose args mention the jid is just another job


def test_jids_with_glob_characters_match_themselves_only(r: redis.Redis) -> None:
    odd = 'a*[b]?\\c"d^-e'
    r.zadd("dead", {_job(odd): 1.0, _job("aXXbYc\"d^-e"): 2.0, _job('a*[b]?\\c"d^-e2'): 3.0})
    r.zadd("retry", {_job("a*[b]?\\\\c"): 1.0})
    (place,) = api.find_job(r, odd).places
    assert (place.kind, place.job.jid) == ("dead", odd)
    assert api.RetrySet(r).find_job(odd) is None and api.DeadSet(r).find_job(odd) == place.job
    assert not api.find_job(r, "*").found and not api.find_job(r, "").found
    assert api.find_job(r, "x\udcff").problems  # no job can hold it: said, not raised


def test_a_deep_queue_is_searched_window_by_window(r: redis.Redis) -> None:
    client = Client(r)
    jids = client.push_bulk({"class": "Record", "args": [[n] for n in range(2500)]})
    for position in (0, 999, 1000, 1001, 2499):
        (place,) = api.find_job(r, jids[position]).places
        assert (place.kind, place.queue, place.position) == ("queued", "default", position)


@pytest.mark.process
def test_forkq_job_notes_what_it_could_not_search(r: redis.Redis, server: EmbeddedServer
                                                  ) -> None:
    cli = Forkq(server)
    jid = "9" * 24
    r.set("retry", "not a zset")
    r.zadd("schedule", {_job(jid): 2e9})
    out, err = cli.text("job", jid)
    assert out.startswith(f"job {jid}: scheduled, due ")
    assert err == ("forkq: note: key 'retry' holds a string, not a zset; not searched\n")
    r.delete("schedule")
    out, err = cli.text("job", jid, code=EXIT_NOT_FOUND)
    assert out == "" and err.splitlines() == [
        "forkq: note: key 'retry' holds a string, not a zset; not searched",
        f"forkq: job {jid} not found"]
