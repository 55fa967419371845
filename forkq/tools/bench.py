"""``forkq bench``: forkq's own figures on this host, one table.

For each repetition, forkq at each concurrency in turn, all against one server (a private
throwaway one unless ``--redis-url`` is given). Each configuration is started once per
repetition and measured in :mod:`forkq.tools.bench_phases`: launch → first job, drain of N
jobs (jobs/s; CPU of the workers' process tree and of the server over the drain, from the
OS's accounting: jobs per CPU-second of the two, and CPU ms per job of each), PSS of the
tree after the drain, idle enqueue → start latency, measured in turns with the host's floor
for that latency, a bare redis-py waiter (:mod:`forkq.tools.bench_floor`) started beside
it: the floor's p50 and the system's p50 over it (pair by pair) are rows of the table, and
the floor's medians are printed under it. Just before each launch, the launch floor (a bare
Python process importing redis-py and taking one job, also in
:mod:`~forkq.tools.bench_floor`) is timed the same way: a row of the table. The table
(:mod:`forkq.tools.bench_table`) shows the median of the repetitions. Progress goes to
stderr, the table to stdout. The daemons under test import only the benchmark's job
(:mod:`forkq.tools.bench_jobs`).

``forkq bench --sidekiq`` (:func:`side_by_side`) compares forkq with Ruby's Sidekiq from the
same parts; that comparison, like the benchmarks of single features, lives in the
repository's ``bench/`` folder, next to the package of a clone, not in the package.
"""

from __future__ import annotations

import contextlib
import importlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import redis
from redis.utils import HIREDIS_AVAILABLE

import forkq
from forkq.connection import connect
from forkq.embedded import server_url
from forkq.errors import ForkqError
from forkq.tools import bench_floor, bench_procs
from forkq.tools import bench_phases as phases
from forkq.tools.bench_systems import ForkqSystem, System, compile_forkq
from forkq.tools.bench_table import Results, render

SIDE_BY_SIDE = "side_by_side.py"
CLONE = ("git clone <forkq's repository> forkq && cd forkq && "
         "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/forkq bench --sidekiq")


@dataclass(frozen=True)
class Options:
    """What ``forkq bench`` was asked to do."""

    jobs: int
    concurrencies: list[int]
    repeat: int
    latency_samples: int
    redis_url: str | None


@dataclass(frozen=True)
class Session:
    """Where one run measures: its scratch folder, the server (URL, a client, and its pid
    when it runs on this machine) and the floors seen beside each configuration."""

    tmp: str
    url: str
    r: redis.Redis
    server_pid: int | None
    floors: list[tuple[float, float]]


def run(options: Options) -> int:
    """Run every repetition and print the table; the exit status (errors raise ForkqError,
    after every process started has been stopped)."""
    with session(options) as here:
        systems: list[System] = [ForkqSystem(here.tmp, here.url, c)
                                 for c in options.concurrencies]
        results = Results()
        for system in systems:
            results.add_column(system.label, system.side)
        for number in range(1, options.repeat + 1):
            for system in systems:
                progress(f"repetition {number}/{options.repeat}: {system.label} ...")
                measure(system, options, results, here)
        print(render(results, header=header(options, here.r) + "\n" + versions(),
                     notes=[*notes(options, here), floor_note(here.floors)]))
    return 0


@contextlib.contextmanager
def session(options: Options) -> Iterator[Session]:
    """Compile forkq to bytecode (as an install would), start the private server (unless
    ``--redis-url`` names one) and connect; everything is stopped on leaving."""
    if not compile_forkq():
        progress("could not compile forkq's modules to bytecode (read-only?): its launch "
                 "figure includes compiling them")
    with tempfile.TemporaryDirectory(prefix="forkq-bench-") as tmp, \
            server_url(tmp, options.redis_url) as url:
        r: redis.Redis = connect(url)
        try:
            yield Session(tmp, url, r, local_server_pid(r), [])
        finally:
            r.close()


def measure(system: System, options: Options, results: Results, here: Session) -> None:
    """Start ``system`` once, measure it, stop it (also on failure), record its figures in
    ``results`` and the floor's (p50, p99) beside it in ``here.floors``."""
    r = here.r
    try:
        launch_floor = bench_floor.launch_floor(r, here.url)
        launch = phases.launch(r, system)
        phases.warm_up(r, system)
        drained = phases.drain(r, system, options.jobs, here.server_pid,
                               progress=_drain_progress(options.jobs))
        pss = bench_procs.tree_pss_mb(system.roots())
        delays, floor = _latency_beside_floor(r, system, options.latency_samples, url=here.url)
    finally:
        system.stop()
        phases.clear(r)
    p50, p99 = phases.percentiles(delays)
    floor_p50, floor_p99 = phases.percentiles(floor)
    over = statistics.median(mine - bare for mine, bare in zip(delays, floor, strict=True))
    figures = {"launch": launch, "launch_floor": launch_floor, "drain": drained.jobs_per_second,
               "per_cpu": drained.jobs_per_cpu_second, "cpu_workers": drained.workers_cpu_ms,
               "cpu_server": drained.server_cpu_ms, "pss": pss, "p50": p50, "p99": p99,
               "floor_p50": floor_p50, "over_floor": over}
    for key, value in figures.items():
        results.record(system.label, key, value)
    here.floors.append((floor_p50, floor_p99))
    server = "-" if drained.server_cpu_ms is None else f"{drained.server_cpu_ms:.3f}"
    bare = "-" if launch_floor is None else f"{launch_floor:.2f}"
    progress(f"  {system.label}: launch {launch:.2f} s (bare {bare} s), drain "
             f"{drained.jobs_per_second:,.0f} jobs/s, CPU ms/job workers "
             f"{drained.workers_cpu_ms:.3f} server {server}, "
             f"PSS {pss:.1f} MB, latency p50 {p50:.2f} ms p99 {p99:.2f} ms (floor beside "
             f"p50 {floor_p50:.2f} ms p99 {floor_p99:.2f} ms; over it, pair by pair, "
             f"{over:+.2f} ms)")


def floor_note(floors: Sequence[tuple[float, float]]) -> str:
    """The note line of the floor: the medians of its p50 and p99 beside each configuration
    of each repetition."""
    p50 = statistics.median(p50 for p50, _ in floors)
    p99 = statistics.median(p99 for _, p99 in floors)
    return (f"host floor: idle latency p50 {p50:.2f} ms p99 {p99:.2f} ms of a bare redis-py "
            "BLMOVE waiter (no job system) pushed to in turns with each system: no Python "
            "worker starts sooner here")


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
            progress(f"    drained {count}/{jobs}")
    return show


def progress(line: str) -> None:
    """A progress line, on stderr."""
    print(line, file=sys.stderr, flush=True)


def local_server_pid(r: redis.Redis) -> int | None:
    """The server's pid when it runs on this machine (its command name says so)."""
    pid = int(r.info("server")["process_id"])
    name = bench_procs.command_name(pid) or ""
    return pid if ("redis" in name or "valkey" in name) else None


def header(options: Options, r: redis.Redis) -> str:
    """The table's first line: the run's size and the server."""
    info = r.info("server")
    server = (f"valkey {info['valkey_version']}" if "valkey_version" in info
              else f"redis {info['redis_version']}")
    private = " (private)" if options.redis_url is None else ""
    return (f"forkq bench: {options.jobs} jobs/drain, {options.repeat} alternated "
            f"repetition{'s' if options.repeat != 1 else ''} (median), job body: pipelined "
            f"INCR + SETBIT, server {server}{private}")


def versions() -> str:
    """The runtime and Redis client libraries of forkq's job body: their per-command cost is
    part of every drain figure (redis-py's differs by ~50 % between 7.1 and 8.1)."""
    parser = "used" if HIREDIS_AVAILABLE else "not used"
    return (f"forkq: python {platform.python_version()}, redis-py {redis.__version__}, "
            f"hiredis {_distribution_version('hiredis')} ({parser} by redis-py)")


def _distribution_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def notes(options: Options, here: Session) -> list[str]:
    """The lines under the table that say how its figures were taken."""
    found = [f"latency: {options.latency_samples} single pushes to the idle system; "
             "CPU: the worker process tree's and the server's, over each drain only",
             "launch floor: a bare Python process (import redis, connect, BLMOVE one job, "
             "INCR), spawned just before each launch and timed alike: no Python worker on "
             "redis-py runs its first job sooner here"]
    if here.server_pid is None:
        found.append("the server is not a process on this machine: no server CPU figure")
    return found


def bench_folder() -> Path:
    """Where a clone keeps its benchmarks: ``bench/`` beside the package's folder (an
    install from a clone in editable mode imports the package from the clone)."""
    return Path(forkq.__file__).resolve().parent.parent / "bench"


def side_by_side(options: Options) -> int:
    """``forkq bench --sidekiq``: run ``bench/side_by_side.py`` of the clone forkq is
    installed from; ForkqError naming the clone command when there is none."""
    folder = bench_folder()
    if not (folder / SIDE_BY_SIDE).is_file():
        raise ForkqError(f"bench --sidekiq runs bench/{SIDE_BY_SIDE} of a clone of forkq's "
                         f"repository, and this forkq (in {Path(forkq.__file__).parent}) is "
                         f"not installed from one: {CLONE}")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # as `python bench/side_by_side.py` would have it
    module = importlib.import_module(SIDE_BY_SIDE.removesuffix(".py"))
    status: int = module.run(options)
    return status
