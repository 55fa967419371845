"""What job metrics cost, and what a two-daemon cluster exposes to Prometheus; prints both.

Run from a clone: ``python bench/job_metrics.py [--redis-url URL] [--sample]``:

- the cost of counting one job in a child (:meth:`Recorder.record`, no I/O), and of the
  writes one beat adds to its round trip for 1, 5 and 20 job classes (median of 50 beats),
  against a private throwaway server unless ``--redis-url`` names one;
- with ``--sample``: starts two daemons (tags ``east`` and ``west``, one queue each) on
  that server, runs the example jobs (:mod:`forkq.examples`) on both, and prints the
  exposition :func:`forkq.metrics.prometheus.exposition` returns — what ``GET /metrics`` of
  ``forkq web`` serves. Both daemons are stopped by pid.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis

from forkq.client import Client
from forkq.embedded import server_url
from forkq.metrics import prometheus
from forkq.metrics.recorder import Recorder, job_class, queue_writes
from forkq.subprocesses import wait_for
from forkq.tools.driver import DaemonProcess

BEATS = 50
RUNS = 41  # the jobs sample() pushes to served queues (one fails)


def record_cost(jobs: int = 200_000) -> float:
    """Microseconds to count one job (class lookup included)."""
    recorder = Recorder()
    payload = {"class": "Bench", "args": []}
    start = time.perf_counter()
    for _ in range(jobs):
        recorder.record("default", job_class(payload), 0.0001, failed=False)
    return (time.perf_counter() - start) / jobs * 1e6


def flush_cost(client: redis.Redis, classes: int) -> tuple[int, float, float]:
    """(commands, ms of a beat with the metrics of ``classes`` classes, ms of a bare beat)."""
    with_metrics, bare, commands = [], [], 0
    for _ in range(BEATS):
        recorder = Recorder()
        for index in range(classes):
            for _ in range(100):
                recorder.record("default", f"C{index}", 0.003 * (index + 1), failed=False)
            recorder.record("default", f"C{index}", 0.05, failed=True)
        with_metrics.append(_timed_beat(client, recorder))
        commands = len(queue_writes(client.pipeline(transaction=False),
                                    _filled(classes).drain(), time.time()))
        bare.append(_timed_beat(client, Recorder()))
    return commands, statistics.median(with_metrics), statistics.median(bare)


def _filled(classes: int) -> Recorder:
    recorder = Recorder()
    for index in range(classes):
        recorder.record("default", f"C{index}", 0.003, failed=False)
        recorder.record("default", f"C{index}", 0.05, failed=True)
    return recorder


def _timed_beat(client: redis.Redis, recorder: Recorder) -> float:
    start = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    pipe.ping()  # stands for the beat script
    queue_writes(pipe, recorder.drain(), time.time())
    pipe.execute(raise_on_error=False)
    return (time.perf_counter() - start) * 1000


def sample(url: str, folder: Path) -> bytes:
    """Two daemons' work, as Prometheus would scrape it."""
    client = redis.Redis.from_url(url)
    daemons = []
    try:
        for tag, queue, concurrency in (("east", "critical", 2), ("west", "default", 3)):
            config = folder / f"{tag}.yml"
            config.write_text(f"redis_url: {url}\nrequire: forkq.examples\ntag: {tag}\n"
                              f"concurrency: {concurrency}\nqueues: [{queue}]\n")
            daemon = DaemonProcess(str(config), stderr=open(os.devnull, "wb"),  # noqa: SIM115
                                   cwd=str(folder))
            daemon.start()
            daemons.append(daemon)
        jobs = Client(client)
        before = _runs(client)  # the cost figures counted jobs of their own
        for n in range(20):
            jobs.push({"class": "forkq.examples.send_welcome", "args": [n], "queue": "critical"})
            jobs.push({"class": "HardWorker", "args": ["bob", n % 3], "queue": "default"})
        jobs.push({"class": "HardWorker", "args": ["fails: no count"], "queue": "default"})
        jobs.push({"class": "HardWorker", "args": ["nobody serves low", 1], "queue": "low"})
        if not wait_for(lambda: _runs(client) - before == RUNS, 30):
            raise SystemExit(f"the daemons ran {_runs(client) - before} jobs of {RUNS} in 30 s")
        return prometheus.exposition(client)
    finally:
        for daemon in daemons:
            daemon.stop(timeout=10)


def _runs(client: redis.Redis) -> int:
    """Job runs written to forkq's counters so far (they come with each daemon's beat)."""
    counts: dict[bytes, bytes] = client.hgetall("forkq:metrics:jobs")  # type: ignore[assignment]
    return sum(int(value) for name, value in counts.items() if name.endswith(b',"p"]'))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url")
    parser.add_argument("--sample", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fq-metrics-") as tmp, \
            server_url(tmp, args.redis_url) as url:
        client = redis.Redis.from_url(url)
        print(f"counting one job in a child: {record_cost():.2f} us")
        for classes in (1, 5, 20):
            commands, beat, bare = flush_cost(client, classes)
            print(f"one beat with the metrics of {classes} job classes: {commands} commands "
                  f"in its round trip, {beat:.2f} ms (the beat alone {bare:.2f} ms)")
    if args.sample:  # on a server of its own: the figures above counted jobs of their own
        with tempfile.TemporaryDirectory(prefix="fq-metrics-") as tmp, \
                server_url(tmp, args.redis_url) as url:
            sys.stdout.write(sample(url, Path(tmp)).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
