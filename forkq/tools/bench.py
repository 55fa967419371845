"""``forkq bench``: throughput, enqueue-to-start latency and Redis cost of the real daemon.

Runs ``forkq run`` as a subprocess on a private throwaway server (or the one
given), then prints:

- throughput: N no-op jobs pushed in bulk, jobs/s from the first push to the
  last job counted in ``stat:processed`` (with a progress display);
- latency: single pushes to an idle daemon, p50 / p99 / max of job start minus
  ``enqueued_at``, recorded by a server middleware in each child and flushed to
  ``forkq:bench:latency`` when the child exits;
- Redis commands per job while busy, and per idle processor per second.

Importing this module (as the daemon does through ``require: forkq.tools.bench``)
registers the no-op job, the middleware and the exit hook.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Any

import redis

from forkq import client as clients
from forkq import hooks, keys, registry
from forkq.embedded import server_url
from forkq.middleware import SERVER, JobContext
from forkq.subprocesses import wait_for
from forkq.tools import bench_sidekiq
from forkq.tools.driver import DaemonProcess

QUEUE = "forkq-bench"
LATENCY_KEY = "forkq:bench:latency"
CHUNK = 1000
_latencies: list[float] = []


@registry.job(name="forkq.bench.noop", queue=QUEUE, retry=False)
def noop(phase: str) -> None:
    """Does nothing; ``phase`` tells the middleware whether to record latency."""


def _record_latency(context: JobContext, call_next: Any) -> Any:
    if context.name == "forkq.bench.noop" and context.args == ["latency"]:
        _latencies.append(time.time() - float(context.payload["enqueued_at"]))
    return call_next()


def _flush_latencies() -> None:
    if _latencies:
        clients.default().redis.rpush(LATENCY_KEY, *map(repr, _latencies))
        _latencies.clear()


SERVER.add(_record_latency)
hooks.on_child_exit(_flush_latencies)


def run(*, jobs: int, concurrency: int, latency_samples: int, redis_url: str | None,
        sidekiq: bool = False) -> int:
    """Run the benchmark and print its figures; the exit status."""
    with tempfile.TemporaryDirectory(prefix="forkq-bench-") as tmp, \
            server_url(tmp, redis_url) as url:
        status = _measure(tmp, url, jobs, concurrency, latency_samples,
                          embedded=redis_url is None)
        if sidekiq and status == 0:
            bench_sidekiq.run(redis.Redis.from_url(url, protocol=2), url, jobs=jobs,
                             concurrency=concurrency, log_path=os.path.join(tmp, "sidekiq.log"))
        return status


def _measure(tmp: str, url: str, jobs: int, concurrency: int, samples: int,
             *, embedded: bool) -> int:
    r: redis.Redis = redis.Redis.from_url(url, protocol=2)
    r.delete(LATENCY_KEY, keys.queue(QUEUE))
    client = clients.Client(r)
    version = r.info("server").get("valkey_version") or r.info("server")["redis_version"]
    print(f"forkq bench: {jobs} no-op jobs, concurrency {concurrency}, "
          f"server {version}{' (private)' if embedded else ''}")
    with open(os.path.join(tmp, "daemon.log"), "wb") as log_file:
        daemon = DaemonProcess(_write_config(tmp, url, concurrency), stderr=log_file)
        return _phases(r, client, daemon, jobs=jobs, concurrency=concurrency, samples=samples)


def _phases(r: redis.Redis, client: clients.Client, daemon: DaemonProcess, *, jobs: int,
            concurrency: int, samples: int) -> int:
    daemon.start()
    try:
        _push(client, "warmup", concurrency)
        if not wait_for(lambda: _processed(r) >= concurrency, 30):
            print("bench: the daemon did not start; see its log", file=sys.stderr)
            return 1
        _throughput(r, client, jobs)
        _latency_phase(r, client, samples)
        _idle_cost(r, concurrency)
    finally:
        daemon.stop()
    _report_latency(r, samples)
    return 0


def _write_config(tmp: str, url: str, concurrency: int) -> str:
    path = os.path.join(tmp, "bench.yml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"concurrency: {concurrency}\nqueues: [{QUEUE}]\nrequire: forkq.tools.bench\n"
                f"redis_url: {url}\nlog_level: warning\nscheduler: false\n")
    return path


def _push(client: clients.Client, phase: str, count: int) -> int:
    pushed = 0
    while pushed < count:
        size = min(CHUNK, count - pushed)
        client.push_bulk({"class": "forkq.bench.noop", "args": [[phase]] * size, "queue": QUEUE})
        pushed += size
    return (count + CHUNK - 1) // CHUNK * 2  # commands sent: SADD + LPUSH per chunk


def _throughput(r: redis.Redis, client: clients.Client, jobs: int) -> None:
    base = _processed(r)
    calls_before, scripts_before = _total_calls(r), _script_calls(r)
    started = time.perf_counter()
    own = _push(client, "throughput", jobs) + 2
    own += _progress(r, base, jobs, started)
    elapsed = time.perf_counter() - started
    per_job = (_total_calls(r) - calls_before - own) / jobs
    trips = (_script_calls(r) - scripts_before) / jobs
    print(f"throughput: {jobs} jobs in {elapsed:.2f} s = {jobs / elapsed:,.0f} jobs/s")
    print(f"processor round trips per job while busy: {trips:.2f} "
          f"({per_job:.2f} commands counting those inside the Lua script)")


def _progress(r: redis.Redis, base: int, jobs: int, started: float) -> int:
    """Show progress until ``jobs`` more are processed; the number of polls made."""
    polls, tty = 0, sys.stderr.isatty()
    last_line = 0.0
    while True:
        done = _processed(r) - base
        polls += 1
        now = time.perf_counter()
        if tty or now - last_line >= 1.0 or done >= jobs:
            bar = "#" * int(30 * done / jobs)
            rate = done / max(now - started, 1e-9)
            end = "\r" if tty and done < jobs else "\n"
            print(f"  [{bar:<30}] {done}/{jobs} {rate:,.0f} jobs/s", end=end, file=sys.stderr,
                  flush=True)
            last_line = now
        if done >= jobs:
            return polls
        time.sleep(0.05)


def _latency_phase(r: redis.Redis, client: clients.Client, samples: int) -> None:
    base = _processed(r)
    for n in range(samples):
        client.push({"class": "forkq.bench.noop", "args": ["latency"], "queue": QUEUE})
        wait_for(lambda n=n: _processed(r) - base > n, 5, interval=0.001)  # type: ignore[misc]
        time.sleep(0.005)


def _idle_cost(r: redis.Redis, concurrency: int, seconds: float = 4.0) -> None:
    before = _script_calls(r)
    time.sleep(seconds)
    per_child = (_script_calls(r) - before) / seconds / concurrency
    print(f"idle: {per_child:.2f} fetches per processor per second")


def _report_latency(r: redis.Redis, samples: int) -> None:
    values = sorted(float(v) * 1000 for v in r.lrange(LATENCY_KEY, 0, -1))
    if not values:
        print("latency: no samples recorded")
        return
    p50 = statistics.median(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    print(f"latency, enqueue to start, idle daemon ({len(values)} of {samples} single pushes): "
          f"p50 {p50:.2f} ms  p99 {p99:.2f} ms  max {values[-1]:.2f} ms")


def _processed(r: redis.Redis) -> int:
    return int(r.get(keys.STAT_PROCESSED) or 0)


def _script_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(name, {}).get("calls", 0)) for name in
               ("cmdstat_evalsha", "cmdstat_eval"))


def _total_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict))
