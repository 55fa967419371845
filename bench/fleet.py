"""What one Redis carries with a fleet of forkq daemons: idle cost, operators' reads, jobs.

Run from a clone: ``python bench/fleet.py`` (100 real daemons of ``-c 2`` and 900 simulated
ones on one private server; ~10 min on 2 cores, ~6 GB of memory). It prints, in order:

1. a **lone daemon**'s idle job latency (``--samples`` single pushes, p50 / p99, after
   each processor ran 3 jobs: a processor's first job after its fork is ~1 ms slower), on
   a queue of its own;
2. the **fleet at idle** (``--window`` s, after ``--settle`` s; that daemon and
   ``--real`` - 1 more, on the fleet's queue): Redis commands/s (sent by clients, and run,
   scripts' inner calls included), Redis CPU, the CPU of the real daemons and of the
   simulator, Redis memory per daemon;
3. **operators' reads** at that size, each the median of 5: the leader's orphan sweep (what
   it reads; it finds no dead daemon when the fleet is healthy), ``forkq
   status``'s view (:func:`forkq.ops.commands.status`), the dashboard's pages and
   ``/metrics`` (time and size), in-process as ``bench/web_pages.py`` does;
4. the fleet's idle **job latency**: the lone daemon's again, inside the fleet (within 20 %
   of its latency alone is the goal), and the fleet's queue's (every real processor waits
   on it, each warmed the same way);
5. the fleet under a **steady load** of ``--rate`` jobs/s for ``--window`` s: Redis
   commands/s and CPU, jobs run, and their latency p50 / p99 (start minus push).

Real daemons are ``python -m forkq run`` with the benchmark job
(:mod:`forkq.tools.bench_jobs`) and their scheduler, started ``--batch`` at a time and
stopped by pid. Simulated daemons come from ``bench/fleet_sim.py`` (one process), which
writes what idle daemons write at their real rates. Exits 1 when a process fails to start.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis
import redis_meter

from forkq import keys
from forkq.client import Client
from forkq.connection import connect
from forkq.daemon.children import orphans
from forkq.embedded import server_url
from forkq.ops import commands
from forkq.subprocesses import terminate
from forkq.tools import bench_phases as phases
from forkq.tools import bench_procs
from forkq.tools.bench_jobs import JOB_CLASS, LATENCY, QUEUE
from forkq.tools.bench_systems import ForkqSystem
from forkq.web import make_app
from forkq.web.security import Auth

HERE = Path(__file__).resolve().parent
PAGES = (("dashboard", "/"), ("busy", "/busy"), ("queues", "/queues"),
         ("metrics", "/metrics"))
READY_TIMEOUT = 300.0
READS = 5
PROBE = "fleet-probe"  # the queue of the daemon whose latency is measured alone and in the fleet
WARM_UP = 3  # jobs each processor runs before a latency is measured


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Fleet:
    """The real daemons and the simulator; :meth:`stop` stops every process by pid."""

    def __init__(self, tmp: str, url: str) -> None:
        self.tmp, self.url = tmp, url
        self.daemons: list[ForkqSystem] = []
        self.simulator: subprocess.Popen[bytes] | None = None

    def start_daemons(self, count: int, concurrency: int, batch: int, *,
                      queue: str = QUEUE) -> None:
        """Start ``count`` daemons on ``queue``, ``batch`` at a time, each waited for."""
        for first in range(0, count, batch):
            started = []
            for number in range(first, min(count, first + batch)):
                folder = os.path.join(self.tmp, f"d{number}")
                os.makedirs(folder, exist_ok=True)
                daemon = ForkqSystem(folder, self.url, concurrency, scheduler=True,
                                     queue=queue)
                self.daemons.append(daemon)
                daemon.start()
                started.append(daemon)
            wait_for(partial(all_ready, started), f"daemons {first}..")
            progress(f"  {len(self.daemons)} real daemons up")

    def start_simulator(self, count: int, concurrency: int) -> None:
        """Start the simulated daemons; return once they are written."""
        self.simulator = subprocess.Popen(
            [sys.executable, str(HERE / "fleet_sim.py"), self.url, str(count),
             "--concurrency", str(concurrency)], stdout=subprocess.PIPE)
        assert self.simulator.stdout is not None
        line = self.simulator.stdout.readline()
        if not line.startswith(b"simulating"):
            raise SystemExit(f"the simulator did not start: {line!r}")
        progress(f"  {count} simulated daemons up")

    def roots(self) -> list[int]:
        """The real daemons' root pids (the simulator's is not among them)."""
        return [pid for daemon in self.daemons for pid in daemon.roots()]

    def simulator_pids(self) -> list[int]:
        return [self.simulator.pid] if self.simulator is not None else []

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()
        self.daemons = []
        if self.simulator is not None:
            terminate(self.simulator, 10.0)
            self.simulator = None


def all_ready(daemons: list[ForkqSystem]) -> bool:
    return all(daemon.ready() for daemon in daemons)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not up within {READY_TIMEOUT:.0f} s")
        time.sleep(0.2)


def idle_latency(r: redis.Redis, url: str, queue: str, processors: int,
                 samples: int) -> tuple[float, float]:
    """(p50, p99) ms of ``samples`` single pushes to ``queue``, once each of its idle
    ``processors`` ran :data:`WARM_UP` jobs (a processor's first job after its fork costs
    ~1 ms more: the pages its job path touches are copied then)."""
    target = phases.Target(queue, JOB_CLASS, queue=queue)
    phases.latencies(r, [target], WARM_UP * processors, url=url)
    [delays] = phases.latencies(r, [target], samples, url=url)
    return phases.percentiles(delays)


Cpu = tuple[float, float]  # the real daemons' and the simulator's CPU, percent of a core


def window(r: redis.Redis, fleet: Fleet, seconds: float) -> tuple[redis_meter.Usage, Cpu]:
    """Redis usage and the fleet's own CPU over ``seconds``."""
    groups = (fleet.roots(), fleet.simulator_pids())
    before = [bench_procs.tree_cpu_seconds(pids) for pids in groups]
    first = redis_meter.read(r)
    time.sleep(seconds)
    second = redis_meter.read(r)
    after = [bench_procs.tree_cpu_seconds(pids) for pids in groups]
    usage = redis_meter.between(first, second)
    real, simulated = (100.0 * (b - a) / usage.seconds for a, b in zip(before, after, strict=True))
    return usage, (real, simulated)


def timed(step: Callable[[], Any]) -> tuple[float, Any]:
    """The median ms of :data:`READS` runs of ``step`` (after one warm-up), and its result."""
    result = step()
    times = []
    for _ in range(READS):
        started = time.perf_counter()
        result = step()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


def call(app: Any, path: str) -> int:
    """GET ``path`` in-process; the body's size (raises on a status other than 200)."""
    environ = {"REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": path,
               "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "9191",
               "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
               "wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr,
               "HTTP_ACCEPT": "text/html"}
    status: list[str] = []
    body = b"".join(app(environ, lambda line, headers: status.append(line)))
    if not status[0].startswith("200"):
        raise SystemExit(f"{path}: {status[0]}")
    return len(body)


def operator_reads(r: redis.Redis, url: str) -> list[str]:
    """The timed reads, one line each."""
    lines = []
    for full, label in ((True, "full, 1 in 10"), (False, "registry only, 9 in 10")):
        ms, dead = timed(partial(sweep_reads, r, full=full))
        lines.append(f"leader's sweep ({label}): {ms:.1f} ms, {len(dead)} dead found")
    ms, outcome = timed(lambda: commands.status(r, argparse.Namespace()))
    lines.append(f"forkq status: {ms:.1f} ms ({len(outcome.data['processes'])} processes)")
    app = make_app(url, auth=Auth(), allow_anonymous=True)
    for label, path in PAGES:
        ms, size = timed(partial(call, app, path))
        lines.append(f"dashboard {label} ({path}): {ms:.1f} ms, {size / 1024:.0f} KiB")
    return lines


def sweep_reads(r: redis.Redis, *, full: bool) -> list[str]:
    """What the leader's sweep reads (:func:`forkq.daemon.children.orphans.sweep` before it
    recovers anything): the dead owners it would recover from, none when all live."""
    lists = orphans.inflight_by_owner(r)
    return orphans.dead_owners(r, orphans.owners(r, lists, full=full))


def steady_load(r: redis.Redis, url: str, rate: int, seconds: float) -> list[float]:
    """Push ``rate`` jobs/s for ``seconds`` (10 pushes a second of rate/10 jobs each); the
    latencies (ms) of the jobs, once all ran."""
    r.delete(LATENCY)
    client = Client(url=url)
    per_push = max(1, rate // 100)
    pushed = 0
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        now = time.time()
        client.push_bulk({"class": JOB_CLASS, "queue": QUEUE, "retry": False,
                          "args": [[pushed + i, now] for i in range(per_push)]})
        pushed += per_push
        time.sleep(max(0.0, began + pushed / rate - time.monotonic()))
    wait_for(lambda: r.llen(LATENCY) >= pushed, "the load's jobs")
    client.redis.close()
    return [float(value) * 1000 for value in r.lrange(LATENCY, 0, -1)]


def usage_line(label: str, usage: redis_meter.Usage, own: Cpu) -> str:
    return (f"{label}: Redis {usage.sent_per_second:,.0f} commands/s sent "
            f"({usage.run_per_second:,.0f} run), Redis CPU {usage.cpu_percent:.2f} % of a "
            f"core; CPU of the real daemons {own[0]:.1f} %, of the simulator {own[1]:.1f} %"
            f"\n    {redis_meter.breakdown(usage, 10)}")


def run(options: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="forkq-fleet-") as tmp, \
            server_url(tmp, None) as url:
        r = connect(url)
        version = r.info("server")["redis_version"]
        empty = int(r.info("memory")["used_memory"])
        fleet = Fleet(tmp, url)
        try:
            progress("a lone daemon ...")
            fleet.start_daemons(1, options.concurrency, 1, queue=PROBE)
            time.sleep(options.settle / 3)
            lone = idle_latency(r, url, PROBE, options.concurrency, options.samples)
            progress("the fleet ...")
            fleet.start_daemons(options.real - 1, options.concurrency, options.batch)
            fleet.start_simulator(options.simulated, options.concurrency)
            daemons = options.real + options.simulated
            wait_for(lambda: r.scard(keys.PROCESSES) >= daemons, "every process record")
            time.sleep(options.settle)
            idle, idle_own = window(r, fleet, options.window)
            memory = (int(r.info("memory")["used_memory"]) - empty) / daemons
            reads = operator_reads(r, url)
            latency = idle_latency(r, url, PROBE, options.concurrency, options.samples)
            processors = (options.real - 1) * options.concurrency
            fleet_queue = idle_latency(r, url, QUEUE, processors, options.samples)
            progress(f"steady load, {options.rate} jobs/s ...")
            loaded: dict[str, Any] = {}
            thread = threading.Thread(target=lambda: loaded.update(
                usage=window(r, fleet, options.window)))
            thread.start()
            delays = steady_load(r, url, options.rate, options.window)
            thread.join()
        finally:
            fleet.stop()
            r.close()
    print(f"fleet: {options.real} real daemons (-c {options.concurrency}, with their "
          f"schedulers) + {options.simulated} simulated, one Redis {version}")
    print(f"lone daemon, idle job latency: p50 {lone[0]:.2f} ms, p99 {lone[1]:.2f} ms")
    print(usage_line(f"idle, {options.window:.0f} s", idle, idle_own))
    print(f"Redis memory per daemon: {memory / 1024:.1f} KiB")
    for line in reads:
        print(line)
    ratio = latency[0] / lone[0]
    print(f"fleet, idle job latency: p50 {latency[0]:.2f} ms ({ratio:.2f} x the lone "
          f"daemon's), p99 {latency[1]:.2f} ms (the same daemon, on its queue, in the fleet)")
    print(f"fleet, idle job latency on the fleet's queue ({processors} processors wait on "
          f"it): p50 {fleet_queue[0]:.2f} ms, p99 {fleet_queue[1]:.2f} ms")
    usage, own = loaded["usage"]
    p50, p99 = phases.percentiles(delays)
    print(usage_line(f"steady load {options.rate} jobs/s, {options.window:.0f} s", usage, own))
    print(f"    {len(delays):,} jobs ran; latency p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=int, default=100,
                        help="real daemons, the lone one included (at least 2)")
    parser.add_argument("--simulated", type=int, default=900)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--batch", type=int, default=10, help="daemons started at once")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--rate", type=int, default=1000)
    options = parser.parse_args(argv)
    if options.real < 2:
        parser.error("--real: at least 2 (the lone daemon and one on the fleet's queue)")
    return run(options)


if __name__ == "__main__":
    sys.exit(main())
