"""Freeze a whole daemon and thaw it: does the master kill a healthy child when it resumes?

A daemon of 4 processors runs 4 long jobs; its whole process group is SIGSTOPped (as a VM
pause or a cgroup freeze does) for each of ``--seconds``, ``--trials`` times, then thawed
with one SIGCONT to the group. Each trial prints the children killed, the deaths counted
toward a poison-pill limit, how often the stall was logged, and whether a job failed with
``forkq.JobKilledError``. The run exits 1 unless every trial shows 0, 0, 1 and no.

Run from a clone: ``python bench/freeze_trials.py`` (40 s and 75 s, 3 trials each: ~7 min).
It starts a private server and stops it and the daemon by their pids.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable

import redis

from forkq.embedded import EmbeddedServer
from forkq.tools.driver import DaemonProcess

JOBS = '''
import time
from forkq import Job

class Nap(Job, name="Nap"):
    def perform(self, seconds: float) -> None:
        time.sleep(seconds)
'''


def until(condition: Callable[[], bool], seconds: float, what: str) -> None:
    """Poll ``condition`` until it holds; raise naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.1)


def trial(url: str, work: str, seconds: float) -> tuple[int, int, int, bool]:
    """One freeze of ``seconds``; (children killed, deaths counted, stall lines, killed-error)."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    config = os.path.join(work, "forkq.yml")
    with open(config, "w") as f:
        f.write(f"concurrency: 4\nrequire: freeze_jobs\nredis_url: {url}\n")
    log_path = os.path.join(work, "daemon.log")
    with open(log_path, "wb") as log_file:
        daemon = DaemonProcess(config, env={**os.environ, "PYTHONPATH": work}, stderr=log_file,
                               cwd=work, new_session=True)
        daemon.start()
        try:
            until(lambda: b"ready:" in _read(log_path), 30, "the daemon to be ready")
            for _ in range(4):
                client.lpush("queue:default", _nap(seconds + 60))
            until(lambda: client.llen("queue:default") == 0, 10, "the jobs to start")
            time.sleep(2)  # a beat or two of a healthy, busy daemon
            os.killpg(daemon.pid, signal.SIGSTOP)
            time.sleep(seconds)
            os.killpg(daemon.pid, signal.SIGCONT)
            time.sleep(8)  # a few turns of the master after the thaw
        finally:
            os.killpg(daemon.pid, signal.SIGCONT)
            daemon.stop(timeout=10)
    log = _read(log_path).decode(errors="replace")
    deaths = sum(int(client.get(key) or 0) for key in client.scan_iter("forkq:kills:*"))
    return (log.count(" killed: "), deaths, log.count("the master was stalled for"),
            "JobKilledError" in log)


def _nap(seconds: float) -> str:
    return json.dumps({"class": "Nap", "args": [seconds], "queue": "default", "retry": True,
                       "jid": secrets.token_hex(12), "created_at": time.time(),
                       "enqueued_at": time.time()})


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[40.0, 75.0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "freeze_jobs.py"), "w") as f:
            f.write(textwrap.dedent(JOBS))
        server = EmbeddedServer(os.path.join(work, "srv"), persistent=False)
        server.start()
        try:
            print("freeze s  trial  killed  deaths  stall lines  JobKilledError")
            for seconds in args.seconds:
                for n in range(1, args.trials + 1):
                    killed, deaths, stalls, killed_error = trial(server.url, work, seconds)
                    failed |= killed != 0 or deaths != 0 or stalls != 1 or killed_error
                    print(f"{seconds:8.0f}  {n:5d}  {killed:6d}  {deaths:6d}  {stalls:11d}  "
                          f"{'yes' if killed_error else 'no'}", flush=True)
        finally:
            server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
