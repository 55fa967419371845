"""The host's floors for ``forkq bench``: no job system, only Python and redis-py.

**Idle latency.** :class:`FloorWaiter` runs ``python -m forkq.tools.bench_floor <url>``: a
process that waits in ``BLMOVE`` on its own queue (:data:`FLOOR_QUEUE`) with redis-py and,
the moment a job arrives, pushes ``now - pushed`` to :data:`FLOOR_LATENCY`, as the benchmark
job does first thing. It runs beside each system under test while that system's idle latency
is measured: :func:`~forkq.tools.bench_phases.latencies` pushes to the two in turns (forkq's
client, each push waited for), so each pair of delays is measured moments apart. So it
measures what the host, the server and redis-py cost between a push and a waiting Python
process's first statement, at the same moments: no Python job system can start an idle job
sooner on that host, and a system's delay minus the floor's, pair by pair, is what the
system itself adds (its hand-off, decode, lookup and middleware), whatever the host's speed
did meanwhile. On a host whose wake-ups are slow, the floor alone can exceed an absolute
latency target.

Keys, for a waiter on queue ``Q`` (:data:`FLOOR_QUEUE` unless told): ``queue:Q`` (taken
from), ``forkq:bench:floor:held:Q`` (where ``BLMOVE`` puts what it took, trimmed after each
job), ``forkq:bench:floor:ready:Q`` (its "connected"), and the list it reports to
(:data:`FLOOR_LATENCY` unless told).

**Launch.** :func:`launch_floor` times a bare Python process (:data:`LAUNCH_PROGRAM`: the
interpreter's start, ``import redis``, a connection, one ``BLMOVE`` of the job queued for it
and one ``INCR``) as a system's launch -> first job is timed: no Python worker on redis-py
runs its first job sooner on that host, whatever else it imports. Keys: the queue and held
list of :data:`FLOOR_QUEUE`, and :data:`LAUNCH_DONE`, deleted before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import redis

from forkq import keys, redis_url
from forkq.connection import connect, resolve_url
from forkq.errors import ForkqError
from forkq.subprocesses import terminate, wait_for
from forkq.tools.bench_phases import Target

FLOOR_QUEUE = "forkq-bench-floor"
FLOOR_LATENCY = "forkq:bench:floor:latency"
LAUNCH_DONE = "forkq:bench:floor:launched"
START_TIMEOUT = 60
STOP_TIMEOUT = 5.0
LAUNCH_PROGRAM = """\
import sys

import redis

url, source, held, done = sys.argv[1:]
client = redis.Redis.from_url(url)
client.blmove(source, held, 60, "RIGHT", "RIGHT")
client.incr(done)
"""
"""The bare launch: run as ``python -c LAUNCH_PROGRAM <url> <queue key> <held key> <done
key>``; it imports nothing of forkq."""


class FloorWaiter:
    """The bare waiter: one process, pushed to at :attr:`target`, stopped by its pid."""

    label = "floor"
    job_class = "forkq.bench.floor"  # never looked up: the waiter reads only args[1]

    def __init__(self, url: str, r: redis.Redis, *, queue: str = FLOOR_QUEUE,
                 reports_to: str = FLOOR_LATENCY) -> None:
        self._url = url
        self._r = r
        self._process: subprocess.Popen[bytes] | None = None
        self.target = Target(self.label, self.job_class, queue, reports_to)

    def start(self) -> None:
        """Spawn the waiter and return at once."""
        self._r.delete(*self._keys())
        self._process = subprocess.Popen([sys.executable, "-m", "forkq.tools.bench_floor",
                                          self._url, self.target.queue,
                                          self.target.reports_to], stdin=subprocess.DEVNULL)

    def ready(self) -> bool:
        """Wait until the waiter has connected (up to :data:`START_TIMEOUT` s); whether it
        did."""
        return self._r.blpop([ready_key(self.target.queue)],
                             timeout=START_TIMEOUT) is not None

    def roots(self) -> list[int]:
        """The waiter's pid."""
        return [] if self._process is None else [self._process.pid]

    def stop(self) -> None:
        """TERM the waiter by pid, KILL it after :data:`STOP_TIMEOUT` s."""
        if self._process is not None:
            terminate(self._process, STOP_TIMEOUT)
            self._process = None
        self._r.delete(*self._keys())

    def _keys(self) -> list[str]:
        queue = self.target.queue
        return [held_key(queue), ready_key(queue), self.target.reports_to, keys.queue(queue)]


def held_key(queue: str) -> str:
    """Where the waiter on ``queue`` keeps the job it took."""
    return f"forkq:bench:floor:held:{queue}"


def ready_key(queue: str) -> str:
    """Where the waiter on ``queue`` says it has connected."""
    return f"forkq:bench:floor:ready:{queue}"


def launch_floor(r: redis.Redis, url: str) -> float | None:
    """Seconds from spawning :data:`LAUNCH_PROGRAM`, with one item queued for it, until it
    has counted it (polled every millisecond, as a system's launch is); None for a
    ``redis+sentinel`` URL, which redis-py's ``from_url`` does not read (``embedded`` is
    resolved as the daemon resolves it). The process exits by
    itself and is stopped by its pid if it has not; ForkqError if it ends or
    :data:`START_TIMEOUT` passes without counting."""
    if redis_url.is_sentinel(url):
        return None
    source, held = keys.queue(FLOOR_QUEUE), held_key(FLOOR_QUEUE)
    r.delete(source, held, LAUNCH_DONE)
    r.lpush(source, b'{"class":"forkq.bench.floor","args":[0]}')
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", LAUNCH_PROGRAM, resolve_url(url), source,
                                held, LAUNCH_DONE], stdin=subprocess.DEVNULL)
    try:
        counted = wait_for(lambda: bool(r.exists(LAUNCH_DONE)) or process.poll() is not None,
                           START_TIMEOUT, interval=0.001) and bool(r.exists(LAUNCH_DONE))
        seconds = time.perf_counter() - started
        ended = process.poll()
    finally:
        status = terminate(process, STOP_TIMEOUT)
        r.delete(source, held, LAUNCH_DONE)
    if counted:
        return seconds
    if ended is not None:
        raise ForkqError(f"the bare launch (the launch floor) ended without taking its job "
                         f"(exit status {status}; its error is above)")
    raise ForkqError(f"the bare launch (the launch floor) did not take its job within "
                     f"{START_TIMEOUT} s")


def wait_and_stamp(client: redis.Redis, queue: str, reports_to: str) -> None:
    """The waiter's loop on ``queue``: take a job, stamp the time first, then push its
    latency to ``reports_to``; an item that is no benchmark push (``--redis-url`` names a
    server others write to) is dropped."""
    source, held = keys.queue(queue), held_key(queue)
    client.rpush(ready_key(queue), "1")
    while True:
        job = client.blmove(source, held, 5, "RIGHT", "RIGHT")
        now = time.time()
        if job is None:
            continue
        pushed = pushed_at(job)
        if pushed is not None:
            client.rpush(reports_to, repr(now - pushed))
        client.ltrim(held, 1, 0)


def pushed_at(job: bytes | str) -> float | None:
    """The push time a benchmark push carries (``args[1]``), None for any other bytes."""
    try:
        value = json.loads(job)["args"][1]
    except (ValueError, TypeError, LookupError):
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def main(argv: list[str] | None = None) -> int:
    """``python -m forkq.tools.bench_floor <url> <queue> <report list>``: wait and stamp
    until TERM."""
    url, queue, reports_to = sys.argv[1:] if argv is None else argv
    wait_and_stamp(connect(url), queue, reports_to)
    return 0


if __name__ == "__main__":
    sys.exit(main())
