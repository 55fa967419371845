"""What a long drain leaves behind: the clients' output buffers, and the next job's start.

Run from a clone: ``python bench/backlog.py [-n N] [-c C] [--redis-url URL]`` (default
200,000 jobs, 4 processors).

Starts one forkq daemon (``-c``) on a private throwaway server (or the one given), drains N
staged jobs (:mod:`forkq.tools.bench_phases`) while sampling ``CLIENT LIST`` every
:data:`SAMPLE_INTERVAL` seconds for the largest output buffer (``omem``) and total memory
(``tot-mem``) of any connection, then, with the daemon idle, pushes single jobs and prints
how long each took from the push to its start (p50 and max).

Keys: those of :mod:`forkq.tools.bench_phases`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass

import redis

from forkq.connection import connect, text
from forkq.embedded import server_url
from forkq.errors import ForkqError
from forkq.tools import bench_phases as phases
from forkq.tools.bench_systems import ForkqSystem

SAMPLE_INTERVAL = 0.05


@dataclass
class Peak:
    """The largest value of one ``CLIENT LIST`` field seen, and whose it was."""

    field: str
    value: int = 0
    client: str = ""

    def see(self, clients: list[dict[str, str]]) -> None:
        """Keep the largest ``field`` among ``clients``."""
        for entry in clients:
            value = int(entry.get(self.field, 0))
            if value > self.value or not self.client:  # the first client seen, at least
                self.value = value
                self.client = (f"id={entry.get('id')} name={entry.get('name') or '-'} "
                               f"cmd={entry.get('cmd')} flags={entry.get('flags')}")


def run(*, jobs: int, concurrency: int, samples: int, redis_url: str | None) -> int:
    """Run the check and print its two figures; the exit status."""
    with tempfile.TemporaryDirectory(prefix="forkq-bench-") as tmp, \
            server_url(tmp, redis_url) as url:
        r: redis.Redis = connect(url)
        system = ForkqSystem(tmp, url, concurrency)
        try:
            phases.launch(r, system)
            phases.warm_up(r, system)
            omem, totmem, elapsed = _drain_watching_clients(r, system.job_class, jobs)
            (delays,) = phases.latencies(r, [phases.target(system)], samples, url=url)
        finally:
            system.stop()
            phases.clear(r)
            r.close()
    print(f"bench/backlog.py: forkq -c{concurrency}, {jobs} jobs drained in "
          f"{elapsed:.1f} s ({jobs / elapsed:,.0f} jobs/s)")
    p50, slowest = phases.percentiles(delays)[0], max(delays)
    print(f"after a {jobs}-job drain: a pushed job started in {p50:.2f} ms (p50 of {samples}; "
          f"max {slowest:.2f} ms); largest client output buffer during the drain: "
          f"{omem.value / 1024:,.1f} KB (client {omem.client})")
    print(f"largest client total memory (tot-mem) during the drain: {totmem.value / 1024:,.1f} "
          f"KB (client {totmem.client})")
    print("start delays in push order, ms: " + " ".join(f"{delay:.2f}" for delay in delays))
    return 0


def _drain_watching_clients(r: redis.Redis, job_class: str,
                            jobs: int) -> tuple[Peak, Peak, float]:
    """Drain ``jobs`` staged jobs, sampling every connection's buffers; the peaks and the
    drain's duration."""
    phases.clear(r)
    phases.stage(r, job_class, jobs)
    omem, totmem = Peak("omem"), Peak("tot-mem")
    started = phases.release(r)
    last_line = started
    while (count := phases.done(r)) < jobs:
        clients = [{k: text(v) for k, v in entry.items()} for entry in r.client_list()]
        omem.see(clients)
        totmem.see(clients)
        now = time.perf_counter()
        if now - started > max(60.0, jobs / 100):
            raise ForkqError(f"backlog: {count} of {jobs} jobs ran; gave up waiting")
        if now - last_line >= 1.0:
            last_line = now
            print(f"  drained {count}/{jobs}, largest omem so far {omem.value / 1024:,.1f} KB",
                  file=sys.stderr, flush=True)
        time.sleep(SAMPLE_INTERVAL)
    return omem, totmem, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    """``python bench/backlog.py [flags]``; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--jobs", type=int, default=200_000, help="jobs to drain")
    parser.add_argument("-c", "--concurrency", type=int, default=4, help="processors")
    parser.add_argument("--redis-url", help="use this server (default: a private one)")
    args = parser.parse_args(argv)
    try:
        return run(jobs=args.jobs, concurrency=args.concurrency, samples=20,
                   redis_url=args.redis_url)
    except ForkqError as exc:
        raise SystemExit(f"bench/backlog.py: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
