"""The cost of fair tenants: a queue with groups drained beside a plain one.

Run from a clone: ``python bench/groups.py [-n N] [-c C] [--groups G] [--repeat R]
[--against DIR] [--redis-url URL]`` (default 20,000 jobs, 4 processors, 100 groups, 3
repetitions).

One daemon (``forkq bench``'s job and settings) on a private throwaway server or the one
given. Each repetition drains, in turn, N plain jobs and N jobs spread over G groups at
random (each payload naming its group, indexed as ``push.lua`` indexes it), staged where no
processor looks and released at once, as ``forkq bench`` drains
(:func:`forkq.tools.bench_phases.drain`). With ``--against DIR`` (a checkout of another
forkq, say the commit before groups: ``git worktree add /tmp/base <commit>``), a second
daemon running DIR's code drains the same plain jobs in each repetition too, alternated,
so the plain path's cost is compared on one host at one time. Prints each drain's jobs/s
and CPU ms per job, the medians, and the ratios.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import redis

from forkq import groups, keys
from forkq import payload as payloads
from forkq.tools import bench, bench_phases
from forkq.tools.bench_jobs import JOB_CLASS, QUEUE
from forkq.tools.bench_systems import ForkqSystem
from forkq.tools.driver import DaemonProcess

STAGING_ROTATION = "forkq:bench:staging-rotation"


class CheckoutSystem(ForkqSystem):
    """``forkq bench``'s daemon running the forkq of another checkout (``PYTHONPATH``; the
    working directory is the temporary one, so this clone's code is not on the path)."""

    def __init__(self, tmp: str, url: str, concurrency: int, checkout: str) -> None:
        super().__init__(os.path.join(tmp, "against"), url, concurrency)
        os.makedirs(self._tmp, exist_ok=True)
        self.label = f"{os.path.basename(checkout.rstrip('/'))} -c{concurrency}"
        self._checkout = os.path.abspath(checkout)

    def start(self) -> None:
        path = os.path.join(self._tmp, "against.yml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"concurrency: {self.workers}\nqueues: [{QUEUE}]\n"
                    f"require: {self.require}\nredis_url: {self._url}\n"
                    "log_level: warning\nscheduler: false\n")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONPATH": self._checkout}
        self._daemon = DaemonProcess(path, env=env, stderr=self._log, cwd=self._tmp)
        self._daemon.start()


def stage_grouped(r: redis.Redis, jobs: int, group_count: int, seed: int) -> None:
    """Stage ``jobs`` benchmark jobs spread over ``group_count`` groups at random: the
    queue's list under :data:`~forkq.tools.bench_phases.STAGING`, each group's index at
    its place, the rotation under :data:`STAGING_ROTATION` (released with the queue)."""
    rng = random.Random(seed)
    now = time.time()
    names = [f"tenant-{n}" for n in range(group_count)]
    encoded: list[str] = []
    index: dict[str, list[str]] = {name: [] for name in names}
    for n in range(jobs):
        payload = payloads.build(JOB_CLASS, [n % bench_phases.BIT_RANGE], queue=QUEUE,
                                 retry=False, now=now)
        payload["enqueued_at"] = now
        payload[groups.FIELD] = name = rng.choice(names)
        encoded.append(payloads.encode(payload))
        index[name].append(encoded[-1])
    pipe = r.pipeline(transaction=False)
    for first in range(0, jobs, bench_phases.CHUNK):
        pipe.lpush(bench_phases.STAGING, *encoded[first:first + bench_phases.CHUNK])
    for name, entries in index.items():
        pipe.delete(groups.group_key(QUEUE, name))
        for first in range(0, len(entries), bench_phases.CHUNK):
            pipe.lpush(groups.group_key(QUEUE, name),
                       *entries[first:first + bench_phases.CHUNK])
    pipe.delete(STAGING_ROTATION)
    pipe.rpush(STAGING_ROTATION, "", *[name for name in names if index[name]])
    pipe.execute()


@dataclass
class Figures:
    """One kind of drain's results over the repetitions."""

    rates: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)

    server_ms: list[float] = field(default_factory=list)

    def add(self, drain: bench_phases.Drain) -> None:
        self.rates.append(drain.jobs_per_second)
        self.cpu_ms.append(drain.workers_cpu_ms + (drain.server_cpu_ms or 0.0))
        self.server_ms.append(drain.server_cpu_ms or 0.0)

    def cpu(self) -> str:
        """Median CPU ms per job: workers + server (server)."""
        return (f"{statistics.median(self.cpu_ms):.3f} ms "
                f"({statistics.median(self.server_ms):.3f} server)")

    def median(self) -> float:
        return statistics.median(self.rates)


def grouped_drain(r: redis.Redis, system: ForkqSystem, jobs: int, group_count: int,
                  server_pid: int | None, seed: int) -> bench_phases.Drain:
    """:func:`~forkq.tools.bench_phases.drain` of jobs of groups: the rotation is released
    with the queue (one MULTI)."""
    def release(client: redis.Redis) -> float:
        pipe = client.pipeline(transaction=True)
        pipe.sadd(keys.QUEUES, QUEUE)
        pipe.rename(bench_phases.STAGING, keys.queue(QUEUE))
        pipe.rename(STAGING_ROTATION, groups.rotation_key(QUEUE))
        pipe.execute()
        return time.perf_counter()

    def stage(client: redis.Redis, job_class: str, count: int) -> None:
        stage_grouped(client, count, group_count, seed)

    return bench_phases.drain(r, system, jobs, server_pid, staging=stage, releasing=release)


def run(args: argparse.Namespace) -> int:
    """Run the repetitions, print every drain and the summary; 0."""
    options = bench.Options(jobs=args.jobs, concurrencies=[args.concurrency], repeat=args.repeat,
                            latency_samples=0, redis_url=args.redis_url)
    with bench.session(options) as here:
        systems = [ForkqSystem(here.tmp, here.url, args.concurrency)]
        if args.against:
            systems.append(CheckoutSystem(here.tmp, here.url, args.concurrency, args.against))
        plain = {system.label: Figures() for system in systems}
        grouped = Figures()
        print(f"bench/groups.py: {args.jobs} jobs per drain, -c {args.concurrency}, "
              f"{args.groups} groups, {args.repeat} repetitions; {bench.versions()}")
        for number in range(1, args.repeat + 1):
            for system in systems:
                system.start()
                try:
                    bench_phases.warm_up(here.r, system)
                    drain = bench_phases.drain(here.r, system, args.jobs, here.server_pid)
                    plain[system.label].add(drain)
                    print(f"  #{number} {system.label} plain: {drain.jobs_per_second:,.0f} "
                          f"jobs/s", flush=True)
                    if system is systems[0]:
                        drain = grouped_drain(here.r, system, args.jobs, args.groups,
                                              here.server_pid, seed=number)
                        grouped.add(drain)
                        print(f"  #{number} {system.label} {args.groups} groups: "
                              f"{drain.jobs_per_second:,.0f} jobs/s", flush=True)
                finally:
                    system.stop()
        _summary(plain, grouped, systems[0].label, args.groups)
    return 0


def _summary(plain: dict[str, Figures], grouped: Figures, own: str, group_count: int) -> None:
    print("\nmedian jobs/s, CPU per job of the workers and the server")
    for label, figures in plain.items():
        print(f"  {label:<24} plain      {figures.median():>9,.0f}  {figures.cpu()}")
    print(f"  {own:<24} {group_count} groups {grouped.median():>9,.0f}  {grouped.cpu()}")
    print(f"groups / plain: {grouped.median() / plain[own].median():.2f}")
    for label, figures in plain.items():
        if label != own:
            print(f"plain, this checkout / {label}: {plain[own].median() / figures.median():.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/groups.py", description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("-c", "--concurrency", type=int, default=4, help="processors")
    parser.add_argument("--groups", type=int, default=100, help="groups of the grouped drain")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions")
    parser.add_argument("--against", metavar="DIR",
                        help="also drain plain jobs with the forkq checked out in DIR")
    parser.add_argument("--redis-url", help="use this server (default: a private one)")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
