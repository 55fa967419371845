"""``forkq bench --sidekiq``: the same no-op jobs through a real Ruby Sidekiq, for comparison.

Starts ``sidekiq -c <concurrency> -r forkq/tools/ruby/noop_worker.rb`` (Debian's ruby-sidekiq)
on the benchmark's server, pushes the jobs with forkq's client in the same bulk chunks,
and times from the first push until the queue is empty and no job is busy. Sidekiq
counts ``stat:processed`` only every 5 s, so the end is read from the queue length
and the busy count in its process hash instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from importlib import resources

import redis

from forkq import client as clients
from forkq.errors import ForkqError
from forkq.subprocesses import terminate, wait_for

QUEUE = "forkq-bench-rb"
CHUNK = 1000


def run(r: redis.Redis, url: str, *, jobs: int, concurrency: int, log_path: str) -> None:
    """Measure Sidekiq and print one throughput line."""
    sidekiq = shutil.which("sidekiq")
    if sidekiq is None:
        raise ForkqError("bench --sidekiq needs Ruby's Sidekiq: apt-get install -y ruby-sidekiq")
    worker = str(resources.files("forkq.tools").joinpath("ruby/noop_worker.rb"))
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sidekiq, "-r", worker, "-q", QUEUE, "-c", str(concurrency), "-t", "5"],
            env={**os.environ, "REDIS_URL": url}, stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            _measure(r, jobs, concurrency)
        finally:
            terminate(process, 15)


def _measure(r: redis.Redis, jobs: int, concurrency: int) -> None:
    client = clients.Client(r)
    if not wait_for(lambda: bool(r.smembers("processes")), 60):
        raise ForkqError("sidekiq did not start; see its log")
    started = time.perf_counter()
    for offset in range(0, jobs, CHUNK):
        size = min(CHUNK, jobs - offset)
        client.push_bulk({"class": "ForkqBenchNoop", "args": [[]] * size, "queue": QUEUE})
    wait_for(lambda: r.llen(f"queue:{QUEUE}") == 0 and _busy(r) == 0, 600, interval=0.01)
    elapsed = time.perf_counter() - started
    print(f"sidekiq {concurrency} threads: {jobs} jobs in {elapsed:.2f} s = "
          f"{jobs / elapsed:,.0f} jobs/s")


def _busy(r: redis.Redis) -> int:
    return sum(int(r.hget(identity, "busy") or 0) for identity in r.smembers("processes"))
