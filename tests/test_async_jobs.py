"""``async def`` jobs: run to completion on the processor's event loop, inside the server
middleware, with their timeout; with ``async_concurrency: N`` one processor runs up to N jobs
at once, each in an in-flight list of its own lane, and a killed processor gives back every
job it held."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import redis

from forkq import api, keys
from forkq.client import Client

from .conftest import records, until

LANES = """
concurrency: 2
async_concurrency: 50
require: [jobs, timing_app]
log_level: warning
"""


def _done(path: Path) -> list[str]:
    """The jids the Nap jobs wrote, in order (a jid twice when it ran twice)."""
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


def _retry_entries(r: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in r.zrange("retry", 0, -1)]


def test_a_coroutine_job_runs_to_completion_inside_the_middleware(
        r: redis.Redis, daemon: Any, tmp_path: Path) -> None:
    out = tmp_path / "naps.txt"
    jid = Client(r).push({"class": "Nap", "args": [0.2, str(out)]})
    d = daemon("concurrency: 1\nrequire: [jobs, timing_app]\n")
    until(lambda: _done(out) == [jid], 15, lambda: d.log())
    until(lambda: r.get("stat:processed") == b"1", 5, lambda: d.log())
    [timed] = records(r, "test:timed")
    assert timed["jid"] == jid and timed["took"] >= 0.2, "the middleware wraps the await"
    assert "never awaited" not in d.log()


def test_a_failing_coroutine_job_is_retried_with_its_error(
        r: redis.Redis, daemon: Any) -> None:
    jid = Client(r).push({"class": "async_boom", "args": ["kaboom"]})
    d = daemon("concurrency: 1\nrequire: jobs\n")
    until(lambda: _retry_entries(r), 15, lambda: d.log())
    [entry] = _retry_entries(r)
    assert (entry["jid"], entry["error_class"], entry["error_message"]) == (
        jid, "ValueError", "kaboom")


def test_a_coroutine_job_past_its_timeout_is_cancelled_and_its_processor_goes_on(
        r: redis.Redis, daemon: Any, tmp_path: Path) -> None:
    client = Client(r)
    stuck = client.push({"class": "async_stuck", "args": ["s"]})
    d = daemon("concurrency: 1\njob_timeout: 1\nrequire: jobs\n")
    until(lambda: _retry_entries(r), 15, lambda: d.log())
    [entry] = _retry_entries(r)
    assert (entry["jid"], entry["error_class"]) == (stuck, "forkq.JobTimeoutError")
    assert "cancelled" in entry["error_message"]
    out = tmp_path / "after.txt"
    after = client.push({"class": "Nap", "args": [0, str(out)]})
    until(lambda: _done(out) == [after], 15, lambda: d.log())
    [started] = records(r, "test:started")
    assert out.read_text().split()[1] == str(started["pid"]), "the same processor went on"
    assert "killed" not in d.log()


def test_coroutine_jobs_overlap_up_to_async_concurrency_in_each_of_two_processors(
        r: redis.Redis, daemon: Any, tmp_path: Path) -> None:
    """300 coroutine jobs that each await 1 s, on 2 processors of 50 lanes: the jobs' own
    start and end times show how many ran at once in each processor (at most 50, and far
    more than one: they await together), whatever the host's speed (the wall time of such a
    run is a bench figure)."""
    out = tmp_path / "naps.txt"
    jids = Client(r).push_bulk({"class": "Nap", "args": [[1, str(out)]] * 300})
    d = daemon(LANES)
    until(lambda: len(_done(out)) >= 300, 60, lambda: d.log())
    assert sorted(_done(out)) == sorted(jids)
    peaks = _peak_overlap(out)
    print(f"300 coroutine jobs of 1 s, -c 2, async_concurrency 50: at most {peaks} at once")
    assert len(peaks) == 2 and all(25 <= peak <= 50 for peak in peaks.values()), peaks
    until(lambda: len(records(r, "test:timed")) == 300, 5, lambda: d.log())
    timed = records(r, "test:timed")
    assert min(row["took"] for row in timed) >= 1


def _peak_overlap(path: Path) -> dict[int, int]:
    """Per pid, the most Nap jobs of ``path`` that were running at one moment."""
    events: dict[int, list[tuple[float, int]]] = {}
    for line in path.read_text().splitlines():
        _, pid, began, ended = line.split()
        events.setdefault(int(pid), []).extend([(float(began), 1), (float(ended), -1)])
    peaks = {}
    for pid, moments in events.items():
        running = peak = 0
        for _, step in sorted(moments):  # an end before a start at the same moment
            running += step
            peak = max(peak, running)
        peaks[pid] = peak
    return peaks


def _lanes_busy(r: redis.Redis, pid: int) -> int:
    """How many lanes of ``pid`` hold a job (a pair; an armed list holds one element)."""
    return sum(1 for key in r.smembers(keys.INFLIGHT_REGISTRY)
               if key.decode().rpartition(":")[2].startswith(f"{pid}-") and r.llen(key) >= 2)


def test_a_killed_processor_gives_back_every_coroutine_job_it_held(
        r: redis.Redis, daemon: Any, tmp_path: Path) -> None:
    out = tmp_path / "naps.txt"
    jids = Client(r).push_bulk({"class": "Nap", "args": [[1.5, str(out)]] * 300})
    d = daemon(LANES)
    victim, _ = d.wait_children(2)
    until(lambda: _lanes_busy(r, victim.pid) == 50, 15, lambda: d.log())
    held = {json.loads(r.lindex(key, 1))["jid"] for key in r.smembers(keys.INFLIGHT_REGISTRY)
            if key.decode().rpartition(":")[2].startswith(f"{victim.pid}-") and r.llen(key)}
    os.kill(victim.pid, signal.SIGKILL)
    until(lambda: set(_done(out)) == set(jids), 60, lambda: d.log())
    assert len(held) == 50
    twice = {jid for jid in jids if _done(out).count(jid) > 1}
    assert twice <= held, "only a job the killed processor held may run twice"
    assert all(r.get(keys.kills(jid)) == b"1" for jid in held), "each running job's death counts"
    assert r.zcard("dead") == 0
    until(lambda: _lanes_busy(r, victim.pid) == 0, 5, lambda: d.log())


def test_a_dead_daemon_s_lanes_are_recovered_by_the_next_one(
        r: redis.Redis, daemon: Any, tmp_path: Path) -> None:
    out = tmp_path / "naps.txt"
    jids = Client(r).push_bulk({"class": "Nap", "args": [[3, str(out)]] * 40})
    first = daemon(LANES)
    children = first.wait_children(2)
    until(lambda: sum(_lanes_busy(r, c.pid) for c in children) == 40, 15, lambda: first.log())
    first.sigkill(everything=True)
    second = daemon(LANES.replace("log_level: warning", "log_level: info"))
    until(lambda: set(_done(out)) == set(jids), 60, lambda: second.log())
    assert "restart recovery" in second.log()


def test_a_stopped_processor_lets_every_lane_finish_its_job(
        r: redis.Redis, daemon: Any, tmp_path: Path) -> None:
    out = tmp_path / "naps.txt"
    jids = Client(r).push_bulk({"class": "Nap", "args": [[1, str(out)]] * 10})
    d = daemon("concurrency: 1\nasync_concurrency: 20\nrequire: jobs\n")
    [child] = d.wait_children(1)
    until(lambda: _lanes_busy(r, child.pid) == 10, 15, lambda: d.log())
    [place] = api.find_job(r, jids[3]).places
    assert (place.kind, place.pid) == ("running", d.pid)
    d.signal(signal.SIGTTIN)
    until(lambda: d.log().count("TTIN: lane ") == 10, 5, lambda: d.log())
    assert "in _perform" in d.log(), "each lane's stack is dumped"
    d.signal(signal.SIGTERM)
    assert d.process is not None and d.process.wait(timeout=20) == 0, d.log()
    assert sorted(_done(out)) == sorted(jids), "each lane finished its job"
    assert r.llen("queue:default") == 0 and r.get("stat:processed") == b"10"
    assert not [key for key in r.smembers(keys.INFLIGHT_REGISTRY) if r.llen(key)]
