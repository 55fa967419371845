"""The benchmark's parts: the table's medians and (``bench/side_by_side.py``) ratio, jobs per
CPU-second, /proc accounting, -c parsing, forkq's bytecode compiled as an install would, the
host's floors (a bare waiter and a bare launch against the session's server), and where
``forkq bench --sidekiq`` finds the comparison."""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys
import threading
import time

import psutil
import pytest
import redis
import side_by_side

import forkq
from forkq import keys
from forkq.cli import _int_list
from forkq.embedded import EmbeddedServer
from forkq.errors import ForkqError
from forkq.tools import bench, bench_floor, bench_phases, bench_procs
from forkq.tools.bench_systems import compile_forkq
from forkq.tools.bench_table import ROWS, Results, render

from .conftest import ROOT, until

DRAIN = next(row for row in ROWS if row.key == "drain")
LATENCY = next(row for row in ROWS if row.key == "p50")


def _results() -> Results:
    results = Results()
    for label, side, drains, p50s in [("forkq -c2", "forkq", [90, 100, 300], [2, 1, 3]),
                                      ("forkq -c4", "forkq", [150, 50, 120], [5, 5, 5]),
                                      ("sidekiq 1x10", "sidekiq", [200, 200, 10], [0.5, 1, 2])]:
        results.add_column(label, side)
        for drain, p50 in zip(drains, p50s, strict=True):
            results.record(label, "drain", drain)
            results.record(label, "p50", p50)
    return results


def test_a_cell_is_the_median_of_the_repetitions() -> None:
    assert _results().median("forkq -c2", "drain") == 100
    assert _results().median("forkq -c2", "pss") is None


def test_the_ratio_takes_each_side_best_highest_rate_lowest_delay() -> None:
    assert side_by_side.ratio(_results(), DRAIN) == pytest.approx(120 / 200)
    assert side_by_side.ratio(_results(), LATENCY) == pytest.approx(2 / 1)


def test_without_sidekiq_there_is_no_ratio_column() -> None:
    results = Results()
    results.add_column("forkq -c2", "forkq")
    results.record("forkq -c2", "drain", 1234.4)
    table = render(results, header="h")
    assert "forkq/sidekiq" not in table
    assert "drain jobs/s" in table and "1,234" in table
    assert "enqueue" not in table, "forkq bench alone times no client"


def test_the_side_by_side_table_has_the_enqueue_rows_and_the_ratio_column() -> None:
    table = render(_results(), header="h", rows=side_by_side.TABLE_ROWS,
                   extra=(side_by_side.RATIO, lambda row: side_by_side._ratio_cell(_results(),
                                                                                  row)))
    lines = table.splitlines()
    assert lines[1].split() == ["figure", "forkq", "-c2", "forkq", "-c4", "sidekiq", "1x10",
                                "forkq/sidekiq"]
    drain = next(line for line in lines if line.startswith("drain jobs/s "))
    assert drain.split()[-4:] == ["100", "120", "200", "0.60"]
    assert any(line.startswith("enqueue bulk jobs/s ") for line in lines)


def test_jobs_per_cpu_second_counts_the_workers_and_the_server() -> None:
    drained = bench_phases.Drain(jobs_per_second=9000, workers_cpu_ms=0.075,
                                 server_cpu_ms=0.025)
    assert drained.jobs_per_cpu_second == pytest.approx(10_000)
    remote = bench_phases.Drain(jobs_per_second=9000, workers_cpu_ms=0.075, server_cpu_ms=None)
    assert remote.jobs_per_cpu_second is None, "no figure without the server's CPU"
    per_cpu = next(row for row in ROWS if row.key == "per_cpu")
    assert per_cpu.higher_is_better and "workers + redis" in per_cpu.label


@pytest.mark.process
def test_the_tree_holds_a_child_and_its_cpu_and_pss_are_read() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert child.pid in bench_procs.tree([os.getpid()])
        assert bench_procs.tree([child.pid]) == [child.pid]
        assert bench_procs.cpu_seconds(os.getpid()) > 0
        assert bench_procs.tree_pss_mb([child.pid]) > 1
        assert bench_procs.command_name(child.pid) is not None
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(10)
    assert bench_procs.tree([child.pid]) == []
    assert bench_procs.cpu_seconds(child.pid) == 0


@pytest.mark.process
def test_cpu_time_is_read_finer_than_a_clock_tick() -> None:
    # 2 ms of CPU in a thread that has ended: under one 10 ms clock tick, yet counted
    before = bench_procs.cpu_seconds(os.getpid())
    spent = threading.Thread(target=_spin, args=(0.002,))
    spent.start()
    spent.join()
    grew = bench_procs.cpu_seconds(os.getpid()) - before
    assert 0.002 <= grew < 0.5, grew


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_concurrencies_are_a_comma_list_of_positive_integers() -> None:
    assert _int_list("2,4,8") == [2, 4, 8]
    for bad in ("", "2,,4", "0", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            _int_list(bad)


def test_forkq_is_compiled_to_bytecode_current_with_each_source() -> None:
    assert compile_forkq()
    sources = list(pathlib.Path(forkq.__file__).parent.rglob("*.py"))
    assert len(sources) > 100
    for source in sources:
        cached = pathlib.Path(importlib.util.cache_from_source(str(source)))
        header = cached.read_bytes()[:16]
        assert header[:4] == importlib.util.MAGIC_NUMBER, source
        assert int.from_bytes(header[8:12], "little") == int(source.stat().st_mtime), source


@pytest.mark.process
def test_the_floor_waiter_stamps_each_push_and_is_stopped_by_its_pid(
        server: EmbeddedServer, r: redis.Redis) -> None:
    waiter = bench_floor.FloorWaiter(server.url, r)
    waiter.start()
    (pid,) = waiter.roots()
    queue = keys.queue(bench_floor.FLOOR_QUEUE)
    held = bench_floor.held_key(bench_floor.FLOOR_QUEUE)
    try:
        assert waiter.ready()
        r.lpush(queue, *HOSTILE)  # another writer's items on a shared server: dropped
        until(lambda: r.llen(queue) == 0 and r.llen(held) == 0, 10)
        assert r.llen(bench_floor.FLOOR_LATENCY) == 0
        (delays,) = bench_phases.latencies(r, [waiter.target], 20, url=server.url)
    finally:
        waiter.stop()
    assert len(delays) == 20 and all(0 < delay < 10_000 for delay in delays)
    assert not psutil.pid_exists(pid) and waiter.roots() == []
    assert r.llen(held) == 0


@pytest.mark.process
def test_latency_pushes_go_to_the_targets_in_turns_each_to_its_own_queue(
        server: EmbeddedServer, r: redis.Redis) -> None:
    """Two bare waiters, as a system and its floor: each gets only its own pushes."""
    waiters = [bench_floor.FloorWaiter(server.url, r),
               bench_floor.FloorWaiter(server.url, r, queue="forkq-bench-other",
                                       reports_to="forkq:bench:other:latency")]
    try:
        for waiter in waiters:
            waiter.start()
        assert all(waiter.ready() for waiter in waiters)
        delays = bench_phases.latencies(r, [waiter.target for waiter in waiters], 10,
                                        url=server.url)
    finally:
        for waiter in waiters:
            waiter.stop()
    assert [len(mine) for mine in delays] == [10, 10]
    assert all(0 < delay < 10_000 for mine in delays for delay in mine)
    assert all(r.llen(waiter.target.reports_to) == 0 for waiter in waiters)


def test_a_report_that_is_no_delay_is_a_clear_error(server: EmbeddedServer,
                                                    r: redis.Redis) -> None:
    junk = bench_phases.Target("junk", "forkq.bench.none", "forkq-bench-none",
                               "forkq:bench:junk")
    r.rpush(junk.reports_to, b"\xff not a number")  # another writer on a shared server
    with pytest.raises(ForkqError, match=r"junk: forkq:bench:junk held .*not a delay"):
        bench_phases.latencies(r, [junk], 1, url=server.url)


def test_each_target_is_pushed_to_first_in_turn() -> None:
    assert [bench_phases.turns(n, 2) for n in range(3)] == [[0, 1], [1, 0], [0, 1]]
    assert [bench_phases.turns(n, 3) for n in range(3)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert bench_phases.turns(5, 1) == [0]


@pytest.mark.process
def test_the_launch_floor_times_a_bare_process_taking_its_one_job(
        server: EmbeddedServer, r: redis.Redis) -> None:
    seconds = bench_floor.launch_floor(r, server.url)
    assert seconds is not None and 0 < seconds < bench_floor.START_TIMEOUT
    queue = keys.queue(bench_floor.FLOOR_QUEUE)
    assert r.exists(queue, bench_floor.held_key(bench_floor.FLOOR_QUEUE),
                    bench_floor.LAUNCH_DONE) == 0


@pytest.mark.process
def test_a_bare_launch_that_cannot_take_its_job_is_a_clear_error(
        tmp_path: pathlib.Path, r: redis.Redis) -> None:
    """The bare process is pointed at a socket no server listens on: it ends at once (its
    traceback on stderr) and the error names the launch floor and its exit status."""
    started = time.monotonic()
    ended = r"the bare launch .* ended without taking its job \(exit status 1;"
    with pytest.raises(ForkqError, match=ended):
        bench_floor.launch_floor(r, f"unix://{tmp_path}/none.sock")
    assert time.monotonic() - started < bench_floor.START_TIMEOUT
    assert r.exists(keys.queue(bench_floor.FLOOR_QUEUE)) == 0


def test_no_launch_floor_for_a_sentinel_url(r: redis.Redis) -> None:
    assert bench_floor.launch_floor(r, "redis+sentinel://localhost:26379/mymaster") is None


HOSTILE = [b"\xff\xfe not utf-8", b"[1, 2]", b'{"args": 5}', b'{"args": [1]}',
           b'{"args": [1, "soon"]}', b'{"args": [1, true]}', b"{}", b""]


def test_only_a_benchmark_push_has_a_push_time() -> None:
    assert [bench_floor.pushed_at(item) for item in HOSTILE] == [None] * len(HOSTILE)
    assert bench_floor.pushed_at(b'{"class": "x", "args": [3, 1700000000.5]}') == 1700000000.5


def test_the_floor_note_gives_the_medians_of_the_repetitions() -> None:
    note = bench.floor_note([(0.5, 2.0), (0.3, 1.0), (0.4, 9.0)])
    assert note.startswith("host floor: idle latency p50 0.40 ms p99 2.00 ms ")


def test_the_side_by_side_is_found_in_the_clone_forkq_is_installed_from() -> None:
    assert bench.bench_folder() == ROOT / "bench"
    assert (bench.bench_folder() / bench.SIDE_BY_SIDE).is_file()
