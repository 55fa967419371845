"""How late scheduled jobs start, and that each runs once.

Run from a clone: ``python bench/scheduled.py [-n N] [--over SECONDS] [-c C] [--daemons D]
[--sidekiq] [--redis-url URL]`` (default 1,000 jobs over 30 s, 2 daemons of 4 processors).

Starts ``--daemons`` forkq daemons (default 2, so a real election decides who
moves the jobs) on a private throwaway server or the one given, waits for a
leader, then schedules N jobs at random moments over the next ``--over``
seconds (one ``push_bulk`` with an ``at`` per job, as an application would).
Each job records its start time. Prints how many ran exactly once, and p50 /
p99 / max of the lateness (start time minus scheduled time). With
``--sidekiq`` the same jobs then run through Ruby's Sidekiq 6.4.1, whose
poller looks at the sorted sets every ~5 s on average.

Importing this module (as the daemons do: their ``require`` is this file's path) registers
the job.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis

from forkq import client as clients
from forkq import keys
from forkq.connection import connect
from forkq.embedded import server_url
from forkq.errors import ForkqError
from forkq.registry import Job
from forkq.subprocesses import terminate, wait_for
from forkq.tools.driver import DaemonProcess

QUEUE = "forkq-bench-sched"
STAMPS = "forkq:bench:stamps"
LEAD = 2.0  # seconds between the push and the first job's time


class Stamp(Job, name="forkq.bench.stamp", queue=QUEUE, retry=False):
    """Records its jid, the time it was scheduled for, and the time it started."""

    def perform(self, due: float) -> None:
        now = time.time()
        clients.default().redis.rpush(STAMPS, json.dumps({"jid": self.jid, "due": due,
                                                           "at": now}))


def run(*, jobs: int, over: float, daemons: int, concurrency: int, redis_url: str | None,
        sidekiq: bool) -> int:
    """Run the benchmark, print its figures; 0 when every job ran exactly once."""
    with tempfile.TemporaryDirectory(prefix="forkq-bench-") as tmp, \
            server_url(tmp, redis_url) as url:
        r: redis.Redis = connect(url)
        status = _forkq(r, tmp, url, jobs=jobs, over=over, daemons=daemons,
                        concurrency=concurrency)
        if sidekiq:
            status |= _sidekiq(r, tmp, url, jobs=jobs, over=over, concurrency=concurrency)
        return status


def _forkq(r: redis.Redis, tmp: str, url: str, *, jobs: int, over: float, daemons: int,
           concurrency: int) -> int:
    r.delete(STAMPS, keys.queue(QUEUE), keys.SCHEDULE)
    path = os.path.join(tmp, "sched.yml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"concurrency: {concurrency}\nqueues: [{QUEUE}]\n"
                f"require: {Path(__file__).resolve()}\n"
                f"redis_url: {url}\nlog_level: warning\n")
    print(f"bench/scheduled.py: {jobs} jobs at random moments over {over:g} s, "
          f"{daemons} daemons x {concurrency} processors")
    with open(os.path.join(tmp, "daemons.log"), "wb") as log_file:
        running = [DaemonProcess(path, stderr=log_file) for _ in range(daemons)]
        try:
            for daemon in running:
                daemon.start()
            print("  forkq: waiting for the daemons and their leader", file=sys.stderr, flush=True)
            if not wait_for(lambda: r.exists(keys.LEADER) == 1 and
                            r.scard(keys.INFLIGHT_REGISTRY) >= daemons * concurrency, 60):
                raise ForkqError(f"the daemons did not start; see {log_file.name}")
            return _measure(r, "forkq", jobs=jobs, over=over)
        finally:
            for daemon in running:
                daemon.stop()


def _sidekiq(r: redis.Redis, tmp: str, url: str, *, jobs: int, over: float,
             concurrency: int) -> int:
    binary = shutil.which("sidekiq")
    if binary is None:
        raise ForkqError("--sidekiq needs Ruby's Sidekiq: apt-get install -y ruby-sidekiq")
    r.delete(STAMPS, keys.queue(QUEUE), keys.SCHEDULE, keys.PROCESSES)
    worker = str(Path(__file__).resolve().parent / "ruby" / "stamp_worker.rb")
    with open(os.path.join(tmp, "sidekiq.log"), "wb") as log_file:
        process = subprocess.Popen(
            [binary, "-r", worker, "-q", QUEUE, "-c", str(concurrency), "-t", "5"],
            env={**os.environ, "REDIS_URL": url}, stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
        try:
            if not wait_for(lambda: bool(r.smembers(keys.PROCESSES)), 60):
                raise ForkqError("sidekiq did not start; see its log")
            return _measure(r, "sidekiq 6.4.1 (1 process)", jobs=jobs, over=over,
                            job_class="ForkqBenchStamp")
        finally:
            terminate(process, 15)


def _measure(r: redis.Redis, name: str, *, jobs: int, over: float,
             job_class: str = "forkq.bench.stamp") -> int:
    rng = random.Random()
    first = time.time() + LEAD
    dues = [first + rng.random() * over for _ in range(jobs)]
    jids = clients.Client(r).push_bulk({"class": job_class, "args": [[due] for due in dues],
                                        "at": dues, "queue": QUEUE})
    settle = over + LEAD + 30
    wait_for(_all_ran(r, name, dues), settle, interval=0.1)
    _done_waiting(lambda: r.llen(STAMPS) > jobs, 2.0)  # any duplicate shows up now
    stamps = [json.loads(row) for row in r.lrange(STAMPS, 0, -1)]
    return _report(name, jids, stamps)


def _all_ran(r: redis.Redis, name: str, dues: list[float]) -> Callable[[], bool]:
    """The wait's condition (every job ran), showing on stderr about once a second how many
    ran and how many were due by then."""
    shown = [time.monotonic()]

    def check() -> bool:
        ran = int(r.llen(STAMPS))
        if ran >= len(dues):
            return True
        if time.monotonic() - shown[0] >= 1.0:
            shown[0] = time.monotonic()
            due = sum(1 for moment in dues if moment <= time.time())
            print(f"  {name}: {ran} of {len(dues)} ran, {due} due by now", file=sys.stderr,
                  flush=True)
        return False
    return check


def _done_waiting(condition: Callable[[], bool], seconds: float) -> None:
    """Give late duplicates ``seconds`` to appear (returns early if one does)."""
    wait_for(condition, seconds, interval=0.1)


def _report(name: str, jids: list[str], stamps: list[dict[str, float]]) -> int:
    runs = Counter(str(row["jid"]) for row in stamps)
    once = sum(1 for jid in jids if runs[jid] == 1)
    missing = sum(1 for jid in jids if runs[jid] == 0)
    extra = sum(count - 1 for count in runs.values() if count > 1)
    late = sorted(row["at"] - row["due"] for row in stamps)
    print(f"{name}: ran exactly once: {once} of {len(jids)} (missing {missing}, "
          f"duplicates {extra})")
    if late:
        p99 = late[min(len(late) - 1, int(len(late) * 0.99))]
        print(f"{name}: lateness (start - scheduled time): p50 {statistics.median(late) * 1000:.1f}"
              f" ms, p99 {p99 * 1000:.1f} ms, max {late[-1] * 1000:.1f} ms, "
              f"min {late[0] * 1000:.1f} ms")
    return 0 if once == len(jids) and not extra else 1


def main(argv: list[str] | None = None) -> int:
    """``python bench/scheduled.py [flags]``; the exit status (0 when every job ran once)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--jobs", type=int, default=1000, help="jobs to schedule")
    parser.add_argument("--over", type=float, default=30.0, metavar="SECONDS",
                        help="the span their times are spread over")
    parser.add_argument("-c", "--concurrency", type=int, default=4, help="processors per daemon")
    parser.add_argument("--daemons", type=int, default=2, help="forkq daemons sharing the server")
    parser.add_argument("--sidekiq", action="store_true",
                        help="then the same jobs through Ruby's Sidekiq 6.4.1 (ruby-sidekiq)")
    parser.add_argument("--redis-url", help="use this server (default: a private one)")
    args = parser.parse_args(argv)
    try:
        return run(jobs=args.jobs, over=args.over, daemons=args.daemons,
                   concurrency=args.concurrency, redis_url=args.redis_url, sidekiq=args.sidekiq)
    except ForkqError as exc:
        raise SystemExit(f"bench/scheduled.py: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
