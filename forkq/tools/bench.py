"""``forkq bench``: forkq (and with ``--sidekiq``, Sidekiq 6.4.1) side by side, one table.

For each repetition, in turn: forkq's Python client enqueueing, forkq at each concurrency,
then (``--sidekiq``) Sidekiq's Ruby client enqueueing, Sidekiq 1x10 and 2x10 — so the two
systems alternate on a noisy machine — all against one server (a private throwaway one
unless ``--redis-url`` is given). Each configuration is started once per repetition and
measured in :mod:`forkq.tools.bench_phases`: launch → first job, drain of N jobs (jobs/s,
CPU per job of the workers' process tree and of the server, from the OS's accounting), PSS
of the tree after the drain, idle enqueue → start latency, measured in turns with the
host's floor for that latency, a bare redis-py waiter (:mod:`forkq.tools.bench_floor`)
started beside it: the floor's p50 and the system's p50 over it (pair by pair) are rows of
the table, and the floor's medians are printed under it. Just before each launch, the
launch floor (a bare Python process importing redis-py and taking one job, also in
:mod:`~forkq.tools.bench_floor`) is timed the same way: a row of the table. The table
(:mod:`forkq.tools.bench_table`) shows the median of the repetitions. Progress goes to
stderr, the table to stdout.

The daemons under test import only the benchmark's jobs (:mod:`forkq.tools.bench_jobs`).
"""

from __future__ import annotations

import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

import redis
from redis.utils import HIREDIS_AVAILABLE

from forkq.connection import connect
from forkq.embedded import server_url
from forkq.errors import ForkqError
from forkq.tools import bench_floor, bench_procs, bench_sidekiq
from forkq.tools import bench_phases as phases
from forkq.tools.bench_systems import ForkqSystem, System, compile_forkq
from forkq.tools.bench_table import Results, render

SIDEKIQ_SHAPES = ((1, 10), (2, 10))  # (processes, threads)


@dataclass(frozen=True)
class Options:
    """What ``forkq bench`` was asked to do."""

    jobs: int
    concurrencies: list[int]
    repeat: int
    latency_samples: int
    sidekiq: bool
    redis_url: str | None


def run(options: Options) -> int:
    """Run every repetition and print the table; the exit status (errors raise ForkqError,
    after every process started has been stopped)."""
    if options.sidekiq:
        bench_sidekiq.check_installed()
    sides = _versions(options)
    if not compile_forkq():
        _progress("could not compile forkq's modules to bytecode (read-only?): its launch "
                  "figure includes compiling them")
    with tempfile.TemporaryDirectory(prefix="forkq-bench-") as tmp, \
            server_url(tmp, options.redis_url) as url:
        r: redis.Redis = connect(url)
        try:
            server_pid = local_server_pid(r)
            results = _columns(options, tmp, url, r)
            floors: list[tuple[float, float]] = []
            for repetition in range(1, options.repeat + 1):
                _repetition(options, results, tmp=tmp, url=url, r=r, server_pid=server_pid,
                            number=repetition, floors=floors)
            print(render(results, header=_header(options, r) + "\n" + sides,
                         notes=[*_notes(options, server_pid), floor_note(floors)]))
        finally:
            r.close()
    return 0


def _systems(options: Options, tmp: str, url: str, r: redis.Redis) -> list[System]:
    """Every configuration, forkq's first, in the order each repetition runs them."""
    systems: list[System] = [ForkqSystem(tmp, url, c) for c in options.concurrencies]
    if options.sidekiq:
        systems += [bench_sidekiq.SidekiqSystem(tmp, url, r, processes=p, threads=t)
                    for p, t in SIDEKIQ_SHAPES]
    return systems


def _columns(options: Options, tmp: str, url: str, r: redis.Redis) -> Results:
    results = Results()
    for system in _systems(options, tmp, url, r):
        results.add_column(system.label, system.side)
    return results


def _repetition(options: Options, results: Results, *, tmp: str, url: str, r: redis.Redis,
                server_pid: int | None, number: int,
                floors: list[tuple[float, float]]) -> None:
    """One repetition: each side's client enqueueing, then each of its configurations (the
    floor's (p50, p99) beside each is appended to ``floors``)."""
    for side in ("forkq", "sidekiq"):
        systems = [s for s in _systems(options, tmp, url, r) if s.side == side]
        if not systems:
            continue
        _enqueue(side, url, options.jobs, results, first_column=systems[0].label)
        for system in systems:
            _progress(f"repetition {number}/{options.repeat}: {system.label} ...")
            floors.append(_configuration(system, options, results, r=r, url=url,
                                         server_pid=server_pid))


def floor_note(floors: Sequence[tuple[float, float]]) -> str:
    """The note line of the floor: the medians of its p50 and p99 beside each configuration
    of each repetition."""
    p50 = statistics.median(p50 for p50, _ in floors)
    p99 = statistics.median(p99 for _, p99 in floors)
    return (f"host floor: idle latency p50 {p50:.2f} ms p99 {p99:.2f} ms of a bare redis-py "
            "BLMOVE waiter (no job system) pushed to in turns with each system: no Python "
            "worker starts sooner here")


def _enqueue(side: str, url: str, jobs: int, results: Results, *, first_column: str) -> None:
    """Time the side's own client; the figures go under the side's first column."""
    if side == "forkq":
        one, bulk = phases.python_enqueue(url, jobs)
    else:
        figures = bench_sidekiq.ruby_enqueue(url, jobs, phases.CHUNK)
        one, bulk = figures["one_by_one"], figures["bulk"]
    results.record(first_column, "enqueue_one", one)
    results.record(first_column, "enqueue_bulk", bulk)
    _progress(f"{side} client enqueue: one by one {one:,.0f} jobs/s, bulk {bulk:,.0f} jobs/s")


def _configuration(system: System, options: Options, results: Results, *, r: redis.Redis,
                   url: str, server_pid: int | None) -> tuple[float, float]:
    """Start ``system`` once, measure it, stop it (also on failure), record its figures; the
    floor's (p50, p99) beside it."""
    try:
        launch_floor = bench_floor.launch_floor(r, url)
        launch = phases.launch(r, system)
        phases.warm_up(r, system)
        drained = phases.drain(r, system, options.jobs, server_pid,
                               progress=_drain_progress(options.jobs))
        pss = bench_procs.tree_pss_mb(system.roots())
        delays, floor = _latency_beside_floor(r, system, options.latency_samples, url=url)
    finally:
        system.stop()
        phases.clear(r)
    p50, p99 = phases.percentiles(delays)
    floor_p50, floor_p99 = phases.percentiles(floor)
    over = statistics.median(mine - bare for mine, bare in zip(delays, floor, strict=True))
    figures = {"launch": launch, "launch_floor": launch_floor, "drain": drained.jobs_per_second,
               "cpu_workers": drained.workers_cpu_ms, "cpu_server": drained.server_cpu_ms,
               "pss": pss, "p50": p50, "p99": p99, "floor_p50": floor_p50, "over_floor": over}
    for key, value in figures.items():
        results.record(system.label, key, value)
    server = "-" if drained.server_cpu_ms is None else f"{drained.server_cpu_ms:.3f}"
    bare = "-" if launch_floor is None else f"{launch_floor:.2f}"
    _progress(f"  {system.label}: launch {launch:.2f} s (bare {bare} s), drain "
              f"{drained.jobs_per_second:,.0f} jobs/s, CPU ms/job workers "
              f"{drained.workers_cpu_ms:.3f} server {server}, "
              f"PSS {pss:.1f} MB, latency p50 {p50:.2f} ms p99 {p99:.2f} ms (floor beside "
              f"p50 {floor_p50:.2f} ms p99 {floor_p99:.2f} ms; over it, pair by pair, "
              f"{over:+.2f} ms)")
    return floor_p50, floor_p99


def _latency_beside_floor(r: redis.Redis, system: System, samples: int, *,
                          url: str) -> tuple[list[float], list[float]]:
    """The idle system's delays and the floor's, ``samples`` each, pushed in turns (the
    floor's waiter started for this and stopped by its pid)."""
    waiter = bench_floor.FloorWaiter(url, r)
    waiter.start()
    try:
        if not waiter.ready():
            raise ForkqError(f"the floor's waiter did not connect within "
                             f"{bench_floor.START_TIMEOUT} s")
        delays, floor = phases.latencies(r, [phases.target(system), waiter.target], samples,
                                         url=url)
    finally:
        waiter.stop()
    return delays, floor


def _drain_progress(jobs: int) -> Callable[[int], None]:
    """A callback showing the drain's progress on stderr about once a second."""
    last = [time.monotonic()]

    def show(count: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0:
            last[0] = now
            _progress(f"    drained {count}/{jobs}")
    return show


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def local_server_pid(r: redis.Redis) -> int | None:
    """The server's pid when it runs on this machine (its command name says so)."""
    pid = int(r.info("server")["process_id"])
    name = bench_procs.command_name(pid) or ""
    return pid if ("redis" in name or "valkey" in name) else None


def _header(options: Options, r: redis.Redis) -> str:
    info = r.info("server")
    server = (f"valkey {info['valkey_version']}" if "valkey_version" in info
              else f"redis {info['redis_version']}")
    private = " (private)" if options.redis_url is None else ""
    return (f"forkq bench: {options.jobs} jobs/drain, {options.repeat} alternated "
            f"repetition{'s' if options.repeat != 1 else ''} (median), job body: pipelined "
            f"INCR + SETBIT, server {server}{private}")


def _versions(options: Options) -> str:
    """The runtimes and Redis client libraries of the job bodies: their per-command cost is
    part of every drain figure (redis-py's differs by ~50 % between 7.1 and 8.1)."""
    parser = "used" if HIREDIS_AVAILABLE else "not used"
    line = (f"forkq: python {platform.python_version()}, redis-py {redis.__version__}, "
            f"hiredis {_distribution_version('hiredis')} ({parser} by redis-py)")
    if options.sidekiq:
        line += f"; sidekiq side: {bench_sidekiq.versions()}"
    return line


def _distribution_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _notes(options: Options, server_pid: int | None) -> list[str]:
    notes = [f"latency: {options.latency_samples} single pushes to the idle system; "
             f"enqueue: {options.jobs} jobs by the side's own client (forkq: Python, "
             "sidekiq: Ruby), nothing consuming, shown under the side's first column",
             "launch floor: a bare Python process (import redis, connect, BLMOVE one job, "
             "INCR), spawned just before each launch and timed alike: no Python worker on "
             "redis-py runs its first job sooner here"]
    if options.sidekiq:
        notes.append("forkq/sidekiq: forkq's best column over Sidekiq's best (highest rate, "
                     "lowest cost or delay)")
    if server_pid is None:
        notes.append("the server is not a process on this machine: no server CPU figure")
    return notes
