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


def run(args: argparse.Namespace) -> int:
    """Run the repetitions, print every drain and the summary; 0."""
    options = bench.Options(jobs=args.jobs, concurrencies=[args.concurrency], repeat=args.repeat,
                            latency_samples=0, redis_url=args.redis_url)
    with bench.session(options) as here:
        system = ForkqSystem(here.tmp, here.url, args.concurrency)
        plain: list[float] = []
        batched: list[float] = []
        cpu = {"plain": [], "batch": []}  # type: dict[str, list[float]]
        staged = {"plain": [], "batch": []}  # type: dict[str, list[int]]
        print(f"bench/batches.py: {args.jobs} jobs per drain, -c {args.concurrency}, "
              f"{args.repeat} repetitions; {bench.versions()}")
        for number in range(1, args.repeat + 1):
            system.start()
            try:
                bench_phases.warm_up(here.r, system)
                for kind, staging in (("plain", bench_phases.stage), ("batch", stage_batched)):
                    def measured(client: redis.Redis, job_class: str, count: int,
                                 staging=staging, kind=kind) -> None:  # noqa: ANN001
                        before = memory(client)
                        staging(client, job_class, count)
                        staged[kind].append(memory(client) - before)
                    drain = bench_phases.drain(here.r, system, args.jobs, here.server_pid,
                                               staging=measured)
                    (plain if kind == "plain" else batched).append(drain.jobs_per_second)
                    cpu[kind].append(drain.workers_cpu_ms + (drain.server_cpu_ms or 0.0))
                    print(f"  #{number} {kind}: {drain.jobs_per_second:,.0f} jobs/s, "
                          f"{cpu[kind][-1]:.3f} CPU ms/job ({drain.server_cpu_ms or 0:.3f} "
                          "server)", flush=True)
                succeeded = here.r.hexists(keys.batch(BID), "success_at")
                print(f"  #{number} the batch's on_success fired: {bool(succeeded)}")
            finally:
                system.stop()
        per_job = (statistics.median(staged["batch"]) - statistics.median(staged["plain"])
                   ) / args.jobs
        print("\nmedian jobs/s, CPU ms per job (workers + server)")
        print(f"  plain  {statistics.median(plain):>9,.0f}  {statistics.median(cpu['plain']):.3f}")
        print(f"  batch  {statistics.median(batched):>9,.0f}  {statistics.median(cpu['batch']):.3f}")
        print(f"batch / plain: {statistics.median(batched) / statistics.median(plain):.2f}")
        print(f"Redis memory per open batch job: {per_job:.0f} bytes")
    return 0


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
