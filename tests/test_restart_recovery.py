"""Restart recovery: a daemon killed whole and restarted gets its in-flight jobs back at once.

Issue #11, finding 9: after a SIGKILL of a daemon's whole process group, the restarted
daemon used to wait for the old records' 60 s TTL, the lease and a settle (127 s median)
before the leader's sweep gave the jobs back. At boot, a daemon now proves its earlier
incarnations on this host gone (kernel run, pid namespace, pid + start time) and takes
their in-flight jobs back before forking; a live daemon on the same host is never touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest
import redis

from forkq.daemon import process_proof

from .conftest import Daemon, push, records, until

VICTIM = """
concurrency: 8
require: jobs
log_level: info
queues: [work]
"""

LIVE = """
concurrency: 2
require: jobs
log_level: info
queues: [live]
"""


def _started(r: redis.Redis, jids: list[str]) -> dict[str, int]:
    """How many times each of ``jids`` has started."""
    counts = dict.fromkeys(jids, 0)
    for row in records(r, "test:started"):
        if row["jid"] in counts:
            counts[row["jid"]] += 1
    return counts


def _back(r: redis.Redis, jids: list[str]) -> bool:
    """Every job is back: in its queue, or started a second time."""
    queued = {json.loads(job)["jid"] for job in r.lrange("queue:work", 0, -1)}
    again = {jid for jid, count in _started(r, jids).items() if count >= 2}
    return set(jids) <= queued | again


def _inflight_holding(r: redis.Redis, jid: str) -> list[bytes]:
    return [key for key in r.keys("forkq:inflight:*:*")
            if jid.encode() in (r.lindex(key, 1) or b"")]


def test_a_killed_daemon_restarted_at_once_gets_its_jobs_back_and_robs_no_live_one(
        r: redis.Redis, daemon: Any) -> None:
    live = daemon(LIVE)
    live.wait_children(2)
    kept = [push(r, "Sleep", 10, f"live-{n}", queue="live") for n in range(2)]
    until(lambda: min(_started(r, kept).values()) == 1, 15, live.log())
    victim: Daemon = daemon(VICTIM, new_session=True)
    victim.wait_children(8)
    held = [push(r, "Sleep", 120, f"held-{n}", queue="work") for n in range(8)]
    until(lambda: min(_started(r, held).values()) == 1, 20, victim.log())

    os.killpg(victim.pid, signal.SIGKILL)  # the whole process group, as the OOM killer may
    assert victim.process is not None
    victim.process.wait(timeout=10)
    until(lambda: not any(p.is_running() and p.status() != "zombie"
                          for p in _group(victim)), 10)
    began = time.monotonic()
    restarted = daemon(VICTIM)
    until(lambda: _back(r, held), 15, restarted.log())
    took = time.monotonic() - began
    print(f"\nrestart recovery: 8 of 8 in-flight jobs back {took:.2f}s after the restart "
          "(process start and app import included)")

    until(lambda: "ready:" in restarted.log(), 15, restarted.log())
    log = restarted.log()
    assert "taking back 8 in-flight list(s)" in log, log
    assert log.index("restart recovery:") < log.index("ready:"), "recovered before fetching"
    assert {key.decode(): int(r.get(key) or 0) for key in r.keys("forkq:kills:*")} == {
        f"forkq:kills:{jid}": 1 for jid in held}, "each recovery counts one death, as the sweep"
    for jid in kept:  # the live daemon's jobs were never touched
        assert len(_inflight_holding(r, jid)) == 1
    until(lambda: {row["marker"] for row in records(r)} >= {"live-0", "live-1"}, 30)
    assert _started(r, kept) == dict.fromkeys(kept, 1), "the live daemon's jobs ran once"


def _group(d: Daemon) -> list[psutil.Process]:
    """The processes still in the daemon's process group."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == d.pid:
                found.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


@pytest.mark.process
def test_only_a_process_that_is_provably_gone_counts_as_gone() -> None:
    """The proof: same kernel run and pid namespace, and the pid free, a zombie, or another
    process (another start time). Anything unknown proves nothing."""
    here = process_proof.this_host()
    assert here.known()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = process_proof.start_time(child.pid)
        assert start is not None
        assert not process_proof.gone(child.pid, start, here, here), "alive, same start"
        assert not process_proof.gone(child.pid, None, here, here), "alive, start unknown"
        assert process_proof.gone(child.pid, start - 5, here, here), "pid reused by another"
        elsewhere = process_proof.Host("another-boot", here.pid_ns)
        assert not process_proof.gone(child.pid, start - 5, elsewhere, here), "another kernel run"
        assert not process_proof.gone(child.pid, start - 5, here, process_proof.Host("", "")), \
            "nothing known here"
        child.kill()
        until(lambda: process_proof.gone(child.pid, start, here, here), 5)  # a zombie runs nothing
    finally:
        child.kill()
        child.wait(timeout=10)
    assert process_proof.gone(child.pid, start, here, here), "reaped: the pid is free"
