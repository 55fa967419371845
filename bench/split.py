"""Where a drain's CPU goes: the job's body alone, forkq alone, both.

Run from a clone: ``python bench/split.py [-n N] [-c C] [--redis-url URL]`` (default 20,000
jobs, 4 processes).

Three drains of N jobs (``-n``, rounded up to a multiple of 1,000) with ``-c`` processes on
one server (a private throwaway one unless ``--redis-url`` is given), each measured as
``forkq bench`` measures a drain (jobs/s; CPU ms per job of the workers and of the server,
from the OS's accounting):

- **job body alone**: ``-c`` forked processes run the benchmark job's body
  (:func:`forkq.tools.bench_jobs.work`, on a client of their own of the class a processor's
  is, :class:`forkq.connection.KeptRedis`) back to back, N in all, with nothing around it:
  the most that many Python processes could do with this body;
- **forkq, no-op body**: the daemon drains N jobs of :data:`NOOP_CLASS` (registered by
  this module, which that daemon requires by its path), whose body only counts: forkq's own
  cost per job (fetch, decode, middleware, metrics, acknowledgement);
- **forkq, the body**: the daemon drains N benchmark jobs, as ``forkq bench`` does.

What the third costs beyond the sum of the first two is what the body and forkq cost
together (process switches, shared caches). Keys: those of :mod:`forkq.tools.bench_phases`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from forkq import client as clients
from forkq import registry
from forkq.connection import KeptRedis, connect
from forkq.embedded import server_url
from forkq.errors import ForkqError
from forkq.tools import bench, bench_jobs, bench_procs
from forkq.tools import bench_phases as phases
from forkq.tools.bench_jobs import DONE, JOB_CLASS, QUEUE
from forkq.tools.bench_systems import ForkqSystem

NOOP_CLASS = "forkq.bench.noop"
NOOP_EVERY = 1000


@registry.job(name=NOOP_CLASS, queue=QUEUE, retry=False)
def noop(n: int) -> None:
    """A body that does nothing but count: the job with ``n % NOOP_EVERY == NOOP_EVERY - 1``
    adds NOOP_EVERY to the done counter (one INCRBY per NOOP_EVERY jobs; staged jobs carry n
    from 0, so a drain of a multiple of NOOP_EVERY ends at the count)."""
    if n % NOOP_EVERY == NOOP_EVERY - 1:
        clients.default().redis.incrby(DONE, NOOP_EVERY)


@dataclass(frozen=True)
class Part:
    """One line of the table."""

    label: str
    drain: phases.Drain


def run(*, jobs: int, concurrency: int, redis_url: str | None) -> int:
    """Measure the three drains and print the table; the exit status."""
    jobs = -(-max(jobs, 1) // NOOP_EVERY) * NOOP_EVERY
    with tempfile.TemporaryDirectory(prefix="forkq-bench-") as tmp, \
            server_url(tmp, redis_url) as url:
        r: redis.Redis = connect(url)
        try:
            server_pid = bench.local_server_pid(r)
            _progress("job body alone ...")
            parts = [Part("job body alone", body_alone(r, url, jobs, concurrency, server_pid))]
            _progress("forkq, no-op body ...")
            parts.append(Part("forkq, no-op body", _daemon(r, tmp, url, jobs, concurrency,
                                                           server_pid, NOOP_CLASS)))
            _progress("forkq, the body ...")
            parts.append(Part("forkq, the body", _daemon(r, tmp, url, jobs, concurrency,
                                                         server_pid, JOB_CLASS)))
        finally:
            phases.clear(r)
            r.close()
    print(render(parts, jobs=jobs, concurrency=concurrency))
    return 0


def body_alone(r: redis.Redis, url: str, jobs: int, concurrency: int,
               server_pid: int | None) -> phases.Drain:
    """``concurrency`` forked processes each run the body for their share of ``jobs``."""
    phases.clear(r)
    server_before = bench_procs.cpu_seconds(server_pid) if server_pid else 0.0
    started = time.perf_counter()
    pids = [_fork_body(url, range(k, jobs, concurrency)) for k in range(concurrency)]
    cpu = 0.0
    for pid in pids:
        _, status, usage = os.wait4(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise ForkqError(f"a process running the job body failed ({status})")
        cpu += usage.ru_utime + usage.ru_stime
    elapsed = time.perf_counter() - started
    if phases.done(r) != jobs:
        raise ForkqError(f"the job body ran {phases.done(r)} times, not {jobs}")
    server = bench_procs.cpu_seconds(server_pid) - server_before if server_pid else None
    return phases.Drain(jobs / elapsed, cpu * 1000 / jobs,
                        None if server is None else server * 1000 / jobs)


def _fork_body(url: str, numbers: range) -> int:
    """Fork a process running the benchmark body once per number; its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        clients.configure(clients.Client(connect(url, redis_class=KeptRedis)))
        for n in numbers:
            bench_jobs.work(n % phases.BIT_RANGE)
        code = 0
    finally:
        os._exit(code)


def _daemon(r: redis.Redis, tmp: str, url: str, jobs: int, concurrency: int,
            server_pid: int | None, job_class: str) -> phases.Drain:
    """Drain ``jobs`` jobs of ``job_class`` with a daemon warmed up on the benchmark job (a
    no-op body counts only every NOOP_EVERY jobs)."""
    system = ForkqSystem(tmp, url, concurrency, job_class=job_class,
                         require=str(Path(__file__).resolve()))
    system.start()
    try:
        phases.warm_up(r, system, job_class=JOB_CLASS)
        return phases.drain(r, system, jobs, server_pid)
    finally:
        system.stop()


def render(parts: list[Part], *, jobs: int, concurrency: int) -> str:
    """The table: jobs/s and CPU ms per job of each part."""
    lines = [f"bench/split.py: {jobs} jobs, {concurrency} processes, job body: "
             "pipelined INCR + SETBIT",
             f"{'part':<20} {'jobs/s':>10} {'CPU ms/job workers':>19} {'server':>8}"]
    for part in parts:
        server = "-" if part.drain.server_cpu_ms is None else f"{part.drain.server_cpu_ms:.4f}"
        lines.append(f"{part.label:<20} {part.drain.jobs_per_second:>10,.0f} "
                     f"{part.drain.workers_cpu_ms:>19.4f} {server:>8}")
    return "\n".join(lines)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """``python bench/split.py [flags]``; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--jobs", type=int, default=20_000,
                        help="jobs per drain (rounded up to a multiple of 1,000)")
    parser.add_argument("-c", "--concurrency", type=int, default=4, help="processes")
    parser.add_argument("--redis-url", help="use this server (default: a private one)")
    args = parser.parse_args(argv)
    try:
        return run(jobs=args.jobs, concurrency=args.concurrency, redis_url=args.redis_url)
    except ForkqError as exc:
        raise SystemExit(f"bench/split.py: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
