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
    assert re.search(rf"processor-0 WARNING: Boom jid={retried} fail: [0-9.]+ sec: ValueError: "
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
    cli.text("job", running, code=EXIT_NOT_FOUND)


def _stand_in_process(r: redis.Redis, identity: str, pid: int) -> None:
    """A live process record, as a forkq master writes it (enough for the lookup)."""
    info = {"hostname": "box", "pid": pid, "started_at": time.time(), "queues": ["default"],
            "identity": identity, "forkq": "1"}
    r.hset(identity, mapping={"info": json.dumps(info), "busy": 1, "beat": time.time(),
                              "quiet": "false"})
    r.sadd("processes", identity)


def _job(jid: str, **extra: Any) -> str:
    return wirejson.dumps({"class": "Record", "args": [jid], "queue": "default", "jid": jid,
                           "created_at": time.time(), **extra})
