"""The host's floor for ``forkq bench``'s idle latency: no job system, only redis-py waiting.

:class:`FloorWaiter` runs ``python -m forkq.tools.bench_floor <url>``: a process that waits
in ``BLMOVE`` on the benchmark's queue with redis-py and, the moment a job arrives, pushes
``now - pushed`` to the latency list, as the benchmark job does first thing. The pushes come
from :func:`~forkq.tools.bench_phases.idle_latency`, as for the systems under test (forkq's
client, 2-5 ms apart, each waited for). So it measures what the host, the server and redis-py
cost between a push and a waiting Python process's first statement: no Python job system can
start an idle job sooner on that host, and a system's latency minus this floor is what the
system itself adds (its hand-off, decode, lookup and middleware). On a host whose wake-ups
are slow, the floor alone can exceed an absolute latency target.

Keys: ``queue:<QUEUE>`` (taken from), :data:`HELD` (where ``BLMOVE`` puts what it took,
trimmed after each job), :data:`READY`, and ``LATENCY``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import redis

from forkq import keys
from forkq.connection import connect
from forkq.errors import ForkqError
from forkq.subprocesses import terminate
from forkq.tools import bench_phases as phases
from forkq.tools.bench_jobs import LATENCY, QUEUE

HELD = "forkq:bench:floor:held"
READY = "forkq:bench:floor:ready"
START_TIMEOUT = 60
STOP_TIMEOUT = 5.0


class FloorWaiter:
    """The bare waiter as a :class:`~forkq.tools.bench_systems.System`: one worker, stopped
    by its pid."""

    label = "floor"
    side = "floor"
    job_class = "forkq.bench.floor"  # never looked up: the waiter reads only args[1]
    workers = 1

    def __init__(self, url: str, r: redis.Redis) -> None:
        self._url = url
        self._r = r
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Spawn the waiter and return at once."""
        self._r.delete(READY, HELD)
        self._process = subprocess.Popen([sys.executable, "-m", "forkq.tools.bench_floor",
                                          self._url], stdin=subprocess.DEVNULL)

    def ready(self) -> bool:
        """Wait until the waiter has connected (up to :data:`START_TIMEOUT` s); whether it
        did."""
        return self._r.blpop([READY], timeout=START_TIMEOUT) is not None

    def roots(self) -> list[int]:
        """The waiter's pid."""
        return [] if self._process is None else [self._process.pid]

    def stop(self) -> None:
        """TERM the waiter by pid, KILL it after :data:`STOP_TIMEOUT` s."""
        if self._process is not None:
            terminate(self._process, STOP_TIMEOUT)
            self._process = None
        self._r.delete(HELD)


def measure(r: redis.Redis, url: str, samples: int) -> tuple[float, float]:
    """(p50, p99) in ms of ``samples`` pushes to the bare waiter; ForkqError when it does
    not start."""
    waiter = FloorWaiter(url, r)
    waiter.start()
    try:
        if not waiter.ready():
            raise ForkqError(f"the floor's waiter did not connect within {START_TIMEOUT} s")
        return phases.percentiles(phases.idle_latency(r, waiter, samples, url=url))
    finally:
        waiter.stop()


def wait_and_stamp(client: redis.Redis) -> None:
    """The waiter's loop: take a job, stamp the time first, then push its latency; an item
    that is no benchmark push (``--redis-url`` names a server others write to) is dropped."""
    queue = keys.queue(QUEUE)
    client.rpush(READY, "1")
    while True:
        job = client.blmove(queue, HELD, 5, "RIGHT", "RIGHT")
        now = time.time()
        if job is None:
            continue
        pushed = pushed_at(job)
        if pushed is not None:
            client.rpush(LATENCY, repr(now - pushed))
        client.ltrim(HELD, 1, 0)


def pushed_at(job: bytes | str) -> float | None:
    """The push time a benchmark push carries (``args[1]``), None for any other bytes."""
    try:
        value = json.loads(job)["args"][1]
    except (ValueError, TypeError, LookupError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def main(argv: list[str] | None = None) -> int:
    """``python -m forkq.tools.bench_floor <url>``: wait and stamp until TERM."""
    (url,) = sys.argv[1:] if argv is None else argv
    wait_and_stamp(connect(url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
