"""The benchmark's job: all that a daemon under ``forkq bench`` imports (``require:
forkq.tools.bench_jobs``), as Sidekiq's side of the comparison (``bench/side_by_side.py`` in
a clone) loads only ``bench/ruby/bench_worker.rb``, so launch -> first job times forkq and
the job, not the benchmark's own machinery.

Registers the benchmark job :data:`JOB_CLASS` (the same body as ``bench_worker.rb``'s) on
:data:`QUEUE`, and names the keys it writes.
"""

from __future__ import annotations

import time

from forkq import client as clients
from forkq import registry

QUEUE = "forkq-bench"
JOB_CLASS = "forkq.bench.work"
DONE = "forkq:bench:done"
BITS = "forkq:bench:bits"
LATENCY = "forkq:bench:latency"


@registry.job(name=JOB_CLASS, queue=QUEUE, retry=False)
def work(n: int, pushed: float | None = None) -> None:
    """The benchmark's job body, the same as ``bench_worker.rb``'s: one pipelined INCR
    + SETBIT (and, with ``pushed``, an RPUSH of its latency) on the processor's own client."""
    now = time.time()
    pipe = clients.default().redis.pipeline(transaction=False)
    pipe.incr(DONE)
    pipe.setbit(BITS, n, 1)
    if pushed is not None:
        pipe.rpush(LATENCY, repr(now - pushed))
    pipe.execute()
