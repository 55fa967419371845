"""The benchmark's jobs: all that a daemon under ``forkq bench`` imports (``require:
forkq.tools.bench_jobs``), as Sidekiq's side of the benchmark loads only
``ruby/bench_worker.rb``, so launch -> first job times forkq and the job, not the benchmark's
own machinery.

Registers the benchmark job :data:`JOB_CLASS` (the same body as ``bench_worker.rb``'s) and the
no-op body :data:`NOOP_CLASS` (:mod:`forkq.tools.bench_split`), both on :data:`QUEUE`, and
names the keys they write.
"""

from __future__ import annotations

import time

from forkq import client as clients
from forkq import registry

QUEUE = "forkq-bench"
JOB_CLASS = "forkq.bench.work"
NOOP_CLASS = "forkq.bench.noop"
NOOP_EVERY = 1000
DONE = "forkq:bench:done"
BITS = "forkq:bench:bits"
LATENCY = "forkq:bench:latency"


@registry.job(name=JOB_CLASS, queue=QUEUE, retry=False)
def work(n: int, pushed: float | None = None) -> None:
    """The benchmark's job body, the same as ``ruby/bench_worker.rb``'s: one pipelined INCR
    + SETBIT (and, with ``pushed``, an RPUSH of its latency) on the processor's own client."""
    now = time.time()
    pipe = clients.default().redis.pipeline(transaction=False)
    pipe.incr(DONE)
    pipe.setbit(BITS, n, 1)
    if pushed is not None:
        pipe.rpush(LATENCY, repr(now - pushed))
    pipe.execute()


@registry.job(name=NOOP_CLASS, queue=QUEUE, retry=False)
def noop(n: int) -> None:
    """A body that does nothing but count, for ``forkq bench --split``: the job with
    ``n % NOOP_EVERY == NOOP_EVERY - 1`` adds NOOP_EVERY to the done counter (one INCRBY per
    NOOP_EVERY jobs; staged jobs carry n from 0, so a drain of a multiple of NOOP_EVERY
    ends at the count)."""
    if n % NOOP_EVERY == NOOP_EVERY - 1:
        clients.default().redis.incrby(DONE, NOOP_EVERY)
