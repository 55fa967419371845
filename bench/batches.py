"""The cost of batches: N jobs drained as one batch beside the same N jobs without one.

Run from a clone: ``python bench/batches.py [-n N] [-c C] [--repeat R] [--redis-url URL]``
(default 100,000 jobs, 4 processors, 3 repetitions).

One daemon (``forkq bench``'s job and settings) on a private throwaway server or the one
given. Each repetition drains, in turn, N plain jobs and N jobs of one committed batch
(each payload naming its ``bid``, every jid a pending member, as ``forkq.batch()`` writes
them, with an ``on_success`` callback), staged where no processor looks and released at
once, as ``forkq bench`` drains (:func:`forkq.tools.bench_phases.drain`). Prints each
drain's jobs/s and CPU ms per job, the medians, the ratio, and the Redis memory an open
batch costs per job (``used_memory`` with the batch staged, less with the plain jobs
staged, over N: its pending member and the ``bid`` field of its payload).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import redis

from forkq import batches, keys
from forkq import payload as payloads
from forkq.tools import bench, bench_phases
from forkq.tools.bench_jobs import QUEUE
from forkq.tools.bench_systems import ForkqSystem

BID = "bench0batch0000000000000"


def stage_batched(r: redis.Redis, job_class: str, jobs: int) -> None:
    """Stage ``jobs`` benchmark jobs of one committed batch under
    :data:`~forkq.tools.bench_phases.STAGING` (the batch's record and members are written
    at once: none of its jobs can run before the release)."""
    meta = keys.batch(BID)
    r.delete(meta, f"{meta}:pending", f"{meta}:failed")
    now = time.time()
    pipe = r.pipeline(transaction=False)
    for first in range(0, jobs, bench_phases.CHUNK):
        encoded, jids = [], []
        for n in range(first, min(first + bench_phases.CHUNK, jobs)):
            payload = payloads.build(job_class, [n % bench_phases.BIT_RANGE], queue=QUEUE,
                                     retry=False, now=now)
            payload["enqueued_at"] = now
            payload[batches.FIELD] = BID
            encoded.append(payloads.encode(payload))
            jids.append(payload["jid"])
        pipe.lpush(bench_phases.STAGING, *encoded)
        pipe.sadd(f"{meta}:pending", *jids)
    callback = payloads.encode(payloads.build(job_class, [], queue="bench-callbacks", now=now))
    head, _, tail = callback.partition("[]")
    pipe.hset(meta, mapping={"committed": "1", "total": jobs, "created_at": now,
                             "cb:success": f"bench-callbacks\0{head}[\0]{tail}"})
    pipe.execute()


def memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


Staging = Callable[[redis.Redis, str, int], None]


def measuring(staging: Staging, into: list[int]) -> Staging:
    """``staging`` that also appends to ``into`` the Redis memory its staged jobs take."""
    def staged(client: redis.Redis, job_class: str, count: int) -> None:
        before = memory(client)
        staging(client, job_class, count)
        into.append(memory(client) - before)
    return staged


STAGINGS: dict[str, Staging] = {"plain": bench_phases.stage, "batch": stage_batched}


def run(args: argparse.Namespace) -> int:
    """Run the repetitions (plain first in odd ones, the batch first in even ones), print
    every drain and the summary; 0."""
    options = bench.Options(jobs=args.jobs, concurrencies=[args.concurrency], repeat=args.repeat,
                            latency_samples=0, redis_url=args.redis_url)
    with bench.session(options) as here:
        system = ForkqSystem(here.tmp, here.url, args.concurrency)
        rates: dict[str, list[float]] = {kind: [] for kind in STAGINGS}
        cpu: dict[str, list[float]] = {kind: [] for kind in STAGINGS}
        staged: dict[str, list[int]] = {kind: [] for kind in STAGINGS}
        print(f"bench/batches.py: {args.jobs} jobs per drain, -c {args.concurrency}, "
              f"{args.repeat} repetitions; {bench.versions()}")
        for number in range(1, args.repeat + 1):
            system.start()
            try:
                bench_phases.warm_up(here.r, system)
                for kind in sorted(STAGINGS, reverse=number % 2 == 1):
                    drain = bench_phases.drain(here.r, system, args.jobs, here.server_pid,
                                               staging=measuring(STAGINGS[kind], staged[kind]))
                    rates[kind].append(drain.jobs_per_second)
                    cpu[kind].append(drain.workers_cpu_ms + (drain.server_cpu_ms or 0.0))
                    print(f"  #{number} {kind}: {drain.jobs_per_second:,.0f} jobs/s, "
                          f"{cpu[kind][-1]:.3f} CPU ms/job ({drain.server_cpu_ms or 0:.3f} "
                          "server)", flush=True)
                succeeded = here.r.hexists(keys.batch(BID), "success_at")
                print(f"  #{number} the batch's on_success fired: {bool(succeeded)}")
            finally:
                system.stop()
        _summary(rates, cpu, staged, args.jobs)
    return 0


def _summary(rates: dict[str, list[float]], cpu: dict[str, list[float]],
             staged: dict[str, list[int]], jobs: int) -> None:
    print("\nmedian jobs/s, CPU ms per job (workers + server)")
    for kind in STAGINGS:
        print(f"  {kind:<6} {statistics.median(rates[kind]):>9,.0f}  "
              f"{statistics.median(cpu[kind]):.3f}")
    ratio = statistics.median(rates["batch"]) / statistics.median(rates["plain"])
    print(f"batch / plain: {ratio:.2f}")
    extra = statistics.median(staged["batch"]) - statistics.median(staged["plain"])
    print(f"Redis memory per open batch job: {extra / jobs:.0f} bytes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/batches.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--jobs", type=int, default=100_000, help="jobs per drain")
    parser.add_argument("-c", "--concurrency", type=int, default=4, help="processors")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions")
    parser.add_argument("--redis-url", help="use this server (default: a private one)")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
