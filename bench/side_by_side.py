"""forkq and Ruby's Sidekiq 6.4.1 side by side, one table: ``forkq bench --sidekiq``.

Run from a clone: ``forkq bench --sidekiq [-n N] [-c C,...] [--repeat N]
[--latency-samples N] [--redis-url URL]`` (forkq installed from the clone in editable mode,
so that it finds this folder), or ``python bench/side_by_side.py`` with the same flags.
It needs Debian's ``ruby-sidekiq``.

For each repetition, in turn: forkq's Python client enqueueing, forkq at each concurrency,
then Sidekiq's Ruby client enqueueing, Sidekiq 1x10 and 2x10 — so the two systems alternate
on a noisy machine — all against one server (a private throwaway one unless ``--redis-url``
is given). Each configuration is measured as ``forkq bench`` measures forkq alone
(:func:`forkq.tools.bench.measure`), with the same job body on both sides (one pipelined
``INCR`` + ``SETBIT``; Sidekiq's in ``ruby/bench_worker.rb``): drain rate, jobs per
CPU-second of the workers' process tree and the server together, CPU ms per job of each
(from /proc, over the drain only), idle latency beside the host's floor, launch -> first job
beside the launch floor, PSS. The table adds each side's own client enqueueing (one by one,
in bulk: :func:`python_enqueue`, ``ruby/bench_enqueue.rb``) and a last column, forkq's best
over Sidekiq's best (:func:`ratio`).
"""

from __future__ import annotations

import sys
import time

import sidekiq_side

from forkq import keys
from forkq.client import Client
from forkq.tools import bench
from forkq.tools import bench_phases as phases
from forkq.tools.bench_jobs import JOB_CLASS, QUEUE
from forkq.tools.bench_systems import ForkqSystem, System
from forkq.tools.bench_table import ROWS, Results, Row, render

SIDEKIQ_SHAPES = ((1, 10), (2, 10))  # (processes, threads)
ENQUEUE_ROWS = (
    Row("enqueue_one", "enqueue one-by-one jobs/s", 0, True),
    Row("enqueue_bulk", "enqueue bulk jobs/s", 0, True),
)
TABLE_ROWS = (*ROWS, *ENQUEUE_ROWS)
RATIO = "forkq/sidekiq"


def run(options: bench.Options) -> int:
    """Run every repetition and print the table; the exit status (errors raise ForkqError,
    after every process started has been stopped)."""
    sidekiq_side.check_installed()
    runtimes = f"{bench.versions()}; sidekiq side: {sidekiq_side.versions()}"
    with bench.session(options) as here:
        sides: dict[str, list[System]] = {
            "forkq": [ForkqSystem(here.tmp, here.url, c) for c in options.concurrencies],
            "sidekiq": [sidekiq_side.SidekiqSystem(here.tmp, here.url, here.r, processes=p,
                                                   threads=t) for p, t in SIDEKIQ_SHAPES]}
        results = Results()
        for systems in sides.values():
            for system in systems:
                results.add_column(system.label, system.side)
        for number in range(1, options.repeat + 1):
            for side, systems in sides.items():
                _enqueue(side, here.url, options.jobs, results, column=systems[0].label)
                for system in systems:
                    bench.progress(f"repetition {number}/{options.repeat}: {system.label} ...")
                    bench.measure(system, options, results, here)
        print(render(results, header=bench.header(options, here.r) + "\n" + runtimes,
                     rows=TABLE_ROWS, extra=(RATIO, lambda row: _ratio_cell(results, row)),
                     notes=[*bench.notes(options, here), *_notes(options),
                            bench.floor_note(here.floors)]))
    return 0


def _enqueue(side: str, url: str, jobs: int, results: Results, *, column: str) -> None:
    """Time the side's own client; the figures go under the side's first column."""
    if side == "forkq":
        one, bulk = python_enqueue(url, jobs)
    else:
        figures = sidekiq_side.ruby_enqueue(url, jobs, phases.CHUNK)
        one, bulk = figures["one_by_one"], figures["bulk"]
    results.record(column, "enqueue_one", one)
    results.record(column, "enqueue_bulk", bulk)
    bench.progress(f"{side} client enqueue: one by one {one:,.0f} jobs/s, bulk {bulk:,.0f} "
                   "jobs/s")


def python_enqueue(url: str, jobs: int) -> tuple[float, float]:
    """(one by one, bulk) jobs/s of forkq's Python client pushing ``jobs`` jobs to the
    benchmark's queue with nothing consuming it; the queue is deleted after each part."""
    client = Client(url=url)
    try:
        client.redis.delete(keys.queue(QUEUE))  # also opens the connection before the clock
        item = {"class": JOB_CLASS, "queue": QUEUE, "retry": False}
        started = time.perf_counter()
        for n in range(jobs):
            client.push({**item, "args": [n]})
        one_by_one = jobs / (time.perf_counter() - started)
        client.redis.delete(keys.queue(QUEUE))
        started = time.perf_counter()
        for first in range(0, jobs, phases.CHUNK):
            stop = min(jobs, first + phases.CHUNK)
            client.push_bulk({**item, "args": [[n] for n in range(first, stop)]})
        bulk = jobs / (time.perf_counter() - started)
        client.redis.delete(keys.queue(QUEUE))
        return one_by_one, bulk
    finally:
        client.redis.close()


def ratio(results: Results, row: Row) -> float | None:
    """forkq's best column over Sidekiq's best column, "best" being the highest for rates
    and the lowest for costs and delays; None without both, or when Sidekiq's best is not
    above zero (a delay over the floor can be 0 or less)."""
    best = max if row.higher_is_better else min
    sides: dict[str, list[float]] = {"forkq": [], "sidekiq": []}
    for label in results.columns:
        value = results.median(label, row.key)
        if value is not None:
            sides[results.sides[label]].append(value)
    if not sides["forkq"] or not sides["sidekiq"] or best(sides["sidekiq"]) <= 0:
        return None
    return best(sides["forkq"]) / best(sides["sidekiq"])


def _ratio_cell(results: Results, row: Row) -> str:
    value = ratio(results, row)
    return "-" if value is None else f"{value:.2f}"


def _notes(options: bench.Options) -> list[str]:
    return [f"enqueue: {options.jobs} jobs by the side's own client (forkq: Python, sidekiq: "
            "Ruby), nothing consuming, shown under the side's first column",
            "jobs per CPU-second: drained jobs over the CPU seconds the worker process tree "
            "(forkq: master and processors; sidekiq: its Ruby processes) and redis-server "
            "spent during the drain, from /proc",
            f"{RATIO}: forkq's best column over Sidekiq's best (highest rate, lowest cost or "
            "delay)"]


def main(argv: list[str] | None = None) -> int:
    """``python bench/side_by_side.py [flags]``: ``forkq bench --sidekiq [flags]``."""
    from forkq.cli import main as forkq

    return forkq(["bench", "--sidekiq", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
