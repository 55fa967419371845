"""``forkq bench --split``: where a drain's CPU goes — the job's body alone, forkq alone, both.

Three drains of N jobs (``-n``, rounded up to a multiple of 1,000) with ``-c`` processes on
one server (a private throwaway one unless ``--redis-url`` is given), each measured as
``forkq bench`` measures a drain (jobs/s; CPU ms per job of the workers and of the server,
from the OS's accounting):

- **job body alone**: ``-c`` forked processes run the benchmark job's body
  (:func:`forkq.tools.bench_jobs.work`, on a client of their own) back to back, N in all, with
  nothing around it: the most that many Python processes could do with this body;
- **forkq, no-op body**: the daemon drains N jobs of :data:`~forkq.tools.bench_jobs.NOOP_CLASS`,
  whose body only counts: forkq's own cost per job (fetch, decode, middleware, metrics,
  acknowledgement);
- **forkq, the body**: the daemon drains N benchmark jobs, as ``forkq bench`` does.

What the third costs beyond the sum of the first two is what the body and forkq cost
together (process switches, shared caches). Keys: those of :mod:`forkq.tools.bench_phases`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass

import redis

from forkq import client as clients
from forkq.connection import connect
from forkq.embedded import server_url
from forkq.errors import ForkqError
from forkq.tools import bench, bench_jobs, bench_procs
from forkq.tools import bench_phases as phases
from forkq.tools.bench_jobs import JOB_CLASS
from forkq.tools.bench_systems import ForkqSystem


@dataclass(frozen=True)
class Part:
    """One line of the table."""

    label: str
    drain: phases.Drain


def run(*, jobs: int, concurrency: int, redis_url: str | None) -> int:
    """Measure the three drains and print the table; the exit status."""
    jobs = -(-max(jobs, 1) // bench_jobs.NOOP_EVERY) * bench_jobs.NOOP_EVERY
    with tempfile.TemporaryDirectory(prefix="forkq-bench-") as tmp, \
            server_url(tmp, redis_url) as url:
        r: redis.Redis = connect(url)
        try:
            server_pid = bench.local_server_pid(r)
            _progress("job body alone ...")
            parts = [Part("job body alone", body_alone(r, url, jobs, concurrency, server_pid))]
            _progress("forkq, no-op body ...")
            parts.append(Part("forkq, no-op body", _daemon(r, tmp, url, jobs, concurrency,
                                                           server_pid, bench_jobs.NOOP_CLASS)))
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
        clients.configure(clients.Client(connect(url)))
        for n in numbers:
            bench_jobs.work(n % phases.BIT_RANGE)
        code = 0
    finally:
        os._exit(code)


def _daemon(r: redis.Redis, tmp: str, url: str, jobs: int, concurrency: int,
            server_pid: int | None, job_class: str) -> phases.Drain:
    """Drain ``jobs`` jobs of ``job_class`` with a daemon warmed up on the benchmark job (a
    no-op body counts only every NOOP_EVERY jobs)."""
    system = ForkqSystem(tmp, url, concurrency, job_class=job_class)
    system.start()
    try:
        phases.warm_up(r, system, job_class=JOB_CLASS)
        return phases.drain(r, system, jobs, server_pid)
    finally:
        system.stop()


def render(parts: list[Part], *, jobs: int, concurrency: int) -> str:
    """The table: jobs/s and CPU ms per job of each part."""
    lines = [f"forkq bench --split: {jobs} jobs, {concurrency} processes, job body: "
             "pipelined INCR + SETBIT",
             f"{'part':<20} {'jobs/s':>10} {'CPU ms/job workers':>19} {'server':>8}"]
    for part in parts:
        server = "-" if part.drain.server_cpu_ms is None else f"{part.drain.server_cpu_ms:.4f}"
        lines.append(f"{part.label:<20} {part.drain.jobs_per_second:>10,.0f} "
                     f"{part.drain.workers_cpu_ms:>19.4f} {server:>8}")
    return "\n".join(lines)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
