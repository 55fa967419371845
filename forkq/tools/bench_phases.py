"""The measurements of ``forkq bench``, the same for every system under test
(:class:`~forkq.tools.bench_systems.System`).

The benchmark job (forkq's in :mod:`forkq.tools.bench_jobs`; Sidekiq's, for the comparison
run from a clone, in ``bench/ruby/bench_worker.rb``) takes ``[n]`` or ``[n, pushed]`` and
runs one pipelined ``INCR`` of ``DONE`` + ``SETBIT`` of ``BITS`` bit ``n``; with ``pushed``
it also RPUSHes ``now - pushed`` to ``LATENCY`` (the keys are named in
:mod:`~forkq.tools.bench_jobs`). The phases read the end of their work from that counter and
that list, never from ``stat:processed`` (Sidekiq writes it only every 5 s).

Keys: ``DONE``, ``BITS``, ``LATENCY``, :data:`STAGING`, ``queue:<QUEUE>`` (all
cleared by :func:`clear`), and ``queues`` (``SADD`` only).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from forkq import client as clients
from forkq import keys
from forkq import payload as payloads
from forkq.errors import ForkqError
from forkq.subprocesses import wait_for
from forkq.tools import bench_procs
from forkq.tools.bench_jobs import BITS, DONE, LATENCY, QUEUE
from forkq.tools.bench_systems import System

STAGING = "forkq:bench:staging"
BIT_RANGE = 2**20
CHUNK = 1000
START_TIMEOUT = 60.0
DRAIN_POLL = 0.005  # the end of a drain is read to within 5 ms; polling costs CPU too
SETTLE = 0.3  # after the warm-up, for every worker to be back in its fetch


def clear(r: redis.Redis) -> None:
    """Delete the benchmark's keys (and nothing else)."""
    r.delete(DONE, BITS, LATENCY, STAGING, keys.queue(QUEUE))


def done(r: redis.Redis) -> int:
    """How many benchmark jobs have run since :func:`clear`."""
    return int(r.get(DONE) or 0)


def encoded(job_class: str, first: int, count: int, now: float) -> list[str]:
    """``count`` payloads with args ``[n]`` (n from ``first``), encoded as forkq's Client
    encodes an immediate push (``enqueued_at`` = ``now``)."""
    jobs = []
    for n in range(first, first + count):
        payload = payloads.build(job_class, [n % BIT_RANGE], queue=QUEUE, retry=False, now=now)
        payload["enqueued_at"] = now
        jobs.append(payloads.encode(payload))
    return jobs


def stage(r: redis.Redis, job_class: str, jobs: int) -> None:
    """Put ``jobs`` payloads into :data:`STAGING`, where no worker looks."""
    now = time.time()
    pipe = r.pipeline(transaction=False)
    for first in range(0, jobs, CHUNK):
        pipe.lpush(STAGING, *encoded(job_class, first, min(CHUNK, jobs - first), now))
    pipe.execute()


def release(r: redis.Redis) -> float:
    """Make the staged jobs visible to the workers in one command; the moment it returned
    (``perf_counter``)."""
    r.sadd(keys.QUEUES, QUEUE)
    r.rename(STAGING, keys.queue(QUEUE))
    return time.perf_counter()


def launch(r: redis.Redis, system: System) -> float:
    """With one job queued, start ``system``; seconds from the spawn until the job ran."""
    clear(r)
    clients.Client(r).push({"class": system.job_class, "args": [0], "queue": QUEUE,
                            "retry": False})
    started = time.perf_counter()
    system.start()
    if not wait_for(lambda: done(r) >= 1, START_TIMEOUT, interval=0.001):
        raise ForkqError(f"{system.label}: the first job did not run within "
                         f"{START_TIMEOUT:.0f} s")
    return time.perf_counter() - started


def warm_up(r: redis.Redis, system: System, job_class: str | None = None) -> None:
    """Wait until every worker is up, run a few jobs per worker (of ``job_class``, default
    the system's), let them go idle."""
    if not wait_for(system.ready, START_TIMEOUT):
        raise ForkqError(f"{system.label}: its workers did not all start")
    base = done(r)
    count = 4 * system.workers
    clients.Client(r).push_bulk({"class": job_class or system.job_class,
                                 "args": [[n] for n in range(count)],
                                 "queue": QUEUE, "retry": False})
    if not wait_for(lambda: done(r) >= base + count, START_TIMEOUT, interval=0.01):
        raise ForkqError(f"{system.label}: the warm-up jobs did not run")
    time.sleep(SETTLE)


@dataclass(frozen=True)
class Drain:
    """One drain: jobs/s, and CPU ms per job of the workers' trees and of the server."""

    jobs_per_second: float
    workers_cpu_ms: float
    server_cpu_ms: float | None  # None when the server is not a process on this machine

    @property
    def jobs_per_cpu_second(self) -> float | None:
        """Jobs per CPU-second of the workers and the server together (None without the
        server's figure)."""
        if self.server_cpu_ms is None or self.workers_cpu_ms + self.server_cpu_ms <= 0:
            return None
        return 1000 / (self.workers_cpu_ms + self.server_cpu_ms)


def drain(r: redis.Redis, system: System, jobs: int, server_pid: int | None, *,
          progress: Callable[[int], None] | None = None,
          staging: Callable[[redis.Redis, str, int], None] = stage,
          releasing: Callable[[redis.Redis], float] = release) -> Drain:
    """Stage ``jobs`` jobs (:func:`stage`, or ``staging``), release them to the idle
    workers (:func:`release`, or ``releasing``), wait until the last has run. CPU is read
    from the OS just before the release and just after the last job is seen done: the
    drain window only (staging and the warm-up are not in it)."""
    clear(r)
    staging(r, system.job_class, jobs)
    roots = system.roots()
    workers_before = bench_procs.tree_cpu_seconds(roots)
    server_before = bench_procs.cpu_seconds(server_pid) if server_pid else 0.0
    started = releasing(r)
    while (count := done(r)) < jobs:
        if time.perf_counter() - started > max(60.0, jobs / 100):
            raise ForkqError(f"{system.label}: {count} of {jobs} jobs ran; gave up waiting")
        if progress is not None:
            progress(count)
        time.sleep(DRAIN_POLL)
    elapsed = time.perf_counter() - started
    workers = bench_procs.tree_cpu_seconds(roots) - workers_before
    server = bench_procs.cpu_seconds(server_pid) - server_before if server_pid else None
    return Drain(jobs / elapsed, _ms_per_job(workers, jobs),
                 None if server is None else _ms_per_job(server, jobs))


def _ms_per_job(seconds: float, jobs: int) -> float:
    return seconds * 1000 / jobs


@dataclass(frozen=True)
class Target:
    """Where a latency push goes (``job_class`` on ``queue``) and the list its job pushes
    ``now - pushed`` to."""

    label: str
    job_class: str
    queue: str = QUEUE
    reports_to: str = LATENCY


def target(system: System) -> Target:
    """The latency target of a system under test (the benchmark job on :data:`QUEUE`)."""
    return Target(system.label, system.job_class)


def latencies(r: redis.Redis, targets: Sequence[Target], samples: int, *,
              url: str) -> list[list[float]]:
    """Job start minus push time, in ms, of ``samples`` single pushes to each of the idle
    ``targets``, per target in order: one round pushes once to each, in turns (the first
    pushed rotates from round to round), each push waited for and followed by a pause, so
    that each target waits 2-5 ms between its pushes whatever their number, and the i-th
    delays of the targets were measured moments apart (a host slowing down shows in all).
    The pushes go through forkq's client built from ``url``, as ``forkq.push`` builds its
    own."""
    clear(r)
    client = clients.Client(url=url)
    delays: list[list[float]] = [[] for _ in targets]
    try:
        for n in range(samples):
            for index in turns(n, len(targets)):
                delays[index].append(_one_push(r, client, targets[index], n))
                time.sleep(random.uniform(0.002, 0.005) / len(targets))
        return delays
    finally:
        client.redis.close()


def turns(round_: int, count: int) -> list[int]:
    """The order in which round ``round_`` pushes to ``count`` targets: from target
    ``round_ % count`` on, so each target is pushed to first in turn."""
    return [(round_ + turn) % count for turn in range(count)]


def _one_push(r: redis.Redis, client: clients.Client, to: Target, n: int) -> float:
    """Push one latency job to ``to`` and wait for its report; the delay in ms."""
    client.push({"class": to.job_class, "args": [n, time.time()], "queue": to.queue,
                 "retry": False})
    reply = r.blpop([to.reports_to], timeout=10)
    if reply is None:
        raise ForkqError(f"{to.label}: a latency job did not run within 10 s")
    try:
        return float(reply[1]) * 1000
    except ValueError:
        raise ForkqError(f"{to.label}: {to.reports_to} held {reply[1]!r}, not a delay "
                         "(another writer on this server?)") from None


def percentiles(values: list[float]) -> tuple[float, float]:
    """(p50, p99) of ``values`` (nearest rank for p99)."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
