"""Reliable fetch: queue order, the batch a processor takes and holds, the ack-and-fetch
round trip, and how far the processor got through its batch (shared with its master).

Order (Sidekiq's semantics): strict tries the queues as configured; weighted
shuffles a list in which each queue appears ``weight`` times and keeps the
first occurrence of each (:func:`shuffled_once`), so a queue of weight w is tried first
w/sum(w) of the time. :meth:`Fetcher.orders` draws them, as the 1-based indexes fetch.lua
takes.

Mechanism: :file:`scripts/fetch.lua` acknowledges the jobs completed since the last
fetch and moves the next one (or a batch from a deep queue, one queue order per job), each
with its queue name, into the processor's in-flight list, atomically. A job is therefore
always in a queue or in exactly one in-flight list until it is acknowledged, filed as a
failure (:mod:`forkq.daemon.children.failures`), given back or requeued
(:mod:`forkq.daemon.held_jobs`). A deep queue costs a processor one round trip per batch.

Keys: ``queue:<name>``, ``forkq:inflight:<identity>:<pid>``, ``forkq:inflight``,
``stat:processed`` and its daily key, ``forkq:paused`` (queues paused across the cluster are
skipped, in the script: no extra round trip).

Batch size (:class:`BatchSize`, pure: run times are given to it, no clock, no I/O). A
processor holds the jobs of a batch behind the one it runs. For short jobs a big batch saves
round trips and server work per job; for long ones every held job waits, and at the end of
a drain one processor may still hold a queue's last jobs while the others are idle. So the
size adapts to the jobs this processor runs:

- at most ``limit`` (the ``fetch_batch`` setting);
- no more than :data:`HOLD_BUDGET` seconds of expected work held behind the running job,
  by a moving average of the run times of the jobs it ran (:data:`WEIGHT` for the newest):
  ``1 + floor(HOLD_BUDGET / average)``: jobs of 10 ms take up to 6, of 50 ms or more 1;
- one before it has run any job (the first job it runs tells how long they take).

Progress (:class:`Progress`). A processor that holds a batch does not tell Redis each time
it completes one of its jobs: it writes the count to a small shared mapping that the master
created for its slot before the fork, and Redis hears of the completed jobs with the next
fetch (one acknowledgement for all of them). When the processor dies, the master reads the
mapping (:meth:`Progress.read`): the first ``done`` pairs of the in-flight list are jobs
that completed, *if* the list still begins with the job the mapping names (``head``, a
digest of its bytes), else none are (the acknowledgement reached Redis already). So only
the job that was running runs again (:mod:`forkq.daemon.held_jobs`). Layout: 16 bytes of
BLAKE2b digest of the first held job, then ``done`` as an unsigned 32-bit integer. The
writer is the one child of the slot, the reader the master after that child was reaped: no
lock. Each write is ordered so that a child killed between two writes leaves a state that
claims nothing wrongly (``done`` is cleared before ``head`` changes).
"""

from __future__ import annotations

import hashlib
import mmap
import random
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from forkq import keys
from forkq.connection import Direct, text
from forkq.daemon.refusal import Recurring
from forkq.scripts import script

Queues = Sequence[tuple[str, int]]


def shuffled_once(expanded: list[str], rng: random.Random) -> list[str]:
    """A shuffle of ``expanded`` keeping the first occurrence of each item (``expanded`` is
    not changed)."""
    order = expanded[:]
    rng.shuffle(order)
    return list(dict.fromkeys(order))


class Fetched(NamedTuple):
    """A job now held in the processor's in-flight list (a tuple: made for every job, in the
    processor's hot path)."""

    queue: str
    raw: bytes


@dataclass(frozen=True)
class Fetch:
    """What one fetch found: the jobs now held, in the order to run them (none, one, or a
    batch from a deep queue), and the queue keys it skipped because they hold another type
    than a list, each with that type (the other queues keep flowing)."""

    jobs: list[Fetched]
    skipped: list[tuple[str, str]]
    paused: bool = False  # asked to arm, but the queue is paused; or the daemon's liveness
    # lapsed (nothing fetched until its master sets it again)
    unregistered: str = ""  # the type the in-flight registry holds instead of a set

    @property
    def armed(self) -> bool:
        """Whether a fetch asked to arm the list for a blocking move did (nothing found,
        skipped or paused)."""
        return not (self.jobs or self.skipped or self.paused)


NOTHING = Fetch([], [])


class Fetcher:
    """One processor's view of the queues: fetch (up to ``batch`` jobs, or the ``take`` asked
    for, from a queue that still holds at least that many times ``spread`` jobs: every one
    of the ``spread`` processors sharing the queues could take as many), acknowledge. Built
    after the fork.

    The queue orders are drawn here, one per job that may be taken: strict order and a
    single queue never change (built once), a weighted order is a shuffle of a prepared
    list. The jobs of a batch are acknowledged together, with the next fetch (the processor
    keeps count of them in :class:`Progress`)."""

    def __init__(
        self,
        redis_client: Any,
        inflight_key: str,
        *,
        queues: Queues,
        strict: bool,
        rng: random.Random,
        batch: int = 1,
        spread: int = 1,
        alive: str = "",
    ) -> None:
        self._fetch = script(redis_client, "fetch")
        self._alive = alive
        self._direct = Direct(redis_client)
        self._inflight = inflight_key
        self._rng = rng
        self._batch = batch
        self._spread = max(spread, 1)
        names = list(dict.fromkeys(name for name, _ in queues))
        self._keys = [keys.queue(name) for name in names]
        self._names = {keys.queue(name).encode(): name for name in names}  # UTF-8 (config)
        position = {name: str(i + 1) for i, name in enumerate(names)}
        self._expanded = [position[name] for name, weight in queues for _ in range(weight)]
        fixed = strict or len(names) == 1
        self._fixed = ",".join(position[name] for name in names) if fixed else None
        self._date_until = 0.0
        self._daily = ""

    @property
    def single_queue(self) -> str | None:
        """The one queue key fetched from, or None when there are several."""
        return self._keys[0] if len(self._keys) == 1 else None

    def orders(self, take: int) -> list[str]:
        """One queue order for each of the ``take`` jobs this fetch may take: 1-based indexes
        into the queue keys, comma-separated (fetch.lua's ARGV[8..])."""
        if self._fixed is not None:
            return [self._fixed] * take
        return [",".join(shuffled_once(self._expanded, self._rng)) for _ in range(take)]

    def _daily_key(self) -> str:
        now = time.time()
        if now >= self._date_until:
            self._daily = keys.daily(keys.STAT_PROCESSED, keys.utc_date(now))
            self._date_until = now - now % 86400 + 86400  # the next UTC midnight
        return self._daily

    def ack_and_fetch(self, *, ack: bytes | None, fetch: bool = True, arm: bool = False,
                      acked: int = 1, take: int | None = None, value: str = "") -> Fetch:
        """Acknowledge the first ``acked`` jobs held, the last of which is ``ack`` (its bytes)
        and returned ``value`` (JSON, for its workflow; "" for none), then fetch (``fetch``)
        up to ``take`` jobs (1 .. ``batch``; default ``batch``).

        With ``arm`` (a single queue), finding nothing and skipping nothing leaves the
        in-flight list armed for :class:`~forkq.daemon.children.blocking_wait.BlockingWait`.
        Safe to call again after a lost reply (see fetch.lua): the same jobs come back.
        Raises redis.ResponseError naming the key when the in-flight list holds another type
        (nothing is fetched then); a registry of another type fetches all the same
        (:attr:`Fetch.unregistered`).
        """
        size = self._batch if take is None else max(1, min(take, self._batch))
        result = self._direct.evalsha(
            self._fetch, [*_script_keys(self._inflight, self._daily_key()), *self._keys],
            _script_args(ack, acked, fetch=fetch, arm=arm, deep=str(size * self._spread),
                         orders=self.orders(size), value=value, alive=self._alive))
        if not result:
            return NOTHING
        count = int(result[0])
        held, rest = result[1:1 + 2 * count], result[1 + 2 * count:]
        names = self._names  # a key read back from the in-flight list may be any bytes
        jobs = [Fetched(names.get(held[i]) or keys.queue_name(text(held[i])), held[i + 1])
                for i in range(0, len(held), 2)]
        pairs = [(text(rest[i]), text(rest[i + 1])) for i in range(0, len(rest), 2)]
        unregistered = pairs.pop()[1] if pairs and pairs[-1][0] == keys.INFLIGHT_REGISTRY else ""
        skipped = [(key, kind) for key, kind in pairs if kind not in ("paused", "lapsed")]
        return Fetch(jobs, skipped, paused=len(skipped) < len(pairs), unregistered=unregistered)

    def close(self) -> None:
        """Drop the fetch connection."""
        self._direct.close()


def report_skipped(recurring: Recurring, found: Fetch) -> None:
    """Log each key a fetch skipped (once a minute per key), and once when it is fetched
    from again: a queue key of another type than a list, a paused-queues key that is no
    set (nothing is paused then), or an in-flight registry that is no set (jobs are
    fetched unregistered until the leader's sweep rebuilds it)."""
    skipped = found.skipped
    if found.unregistered:
        skipped = [*skipped, (keys.INFLIGHT_REGISTRY, found.unregistered)]
    for key, kind in skipped:
        if key == keys.INFLIGHT_REGISTRY:
            recurring.report(key, "key %r holds a %s, not a set; fetching goes on (the "
                             "leader's orphan sweep rebuilds it)", key, kind)
            continue
        if key == keys.PAUSED:
            recurring.report(key, "key %r holds a %s, not a set; no queue is paused", key, kind)
        else:
            recurring.report(key, "queue key %r holds a %s, not a list; skipped (the other "
                             "queues keep flowing)", key, kind)
    for key in set(recurring.subjects) - {key for key, _ in skipped}:
        recurring.clear(key, "key %r is read again", key)


def acknowledge(client: Any, inflight_key: str, *, last: bytes, count: int) -> None:
    """Acknowledge the first ``count`` jobs held in ``inflight_key``, the last of which is
    ``last`` (fetch.lua acknowledging only; nothing happens unless pair ``count`` is
    ``last``): for whoever settles the list of a processor that is gone."""
    daily = keys.daily(keys.STAT_PROCESSED, keys.utc_date(time.time()))
    script(client, "fetch")(keys=_script_keys(inflight_key, daily),
                            args=_script_args(last, count, fetch=False, arm=False, deep="1",
                                              orders=[]))


def _script_keys(inflight_key: str, daily: str) -> list[str]:
    """fetch.lua's KEYS[1..5] (the queue keys follow)."""
    return [inflight_key, keys.STAT_PROCESSED, daily, keys.INFLIGHT_REGISTRY, keys.PAUSED]


def _script_args(ack: bytes | None, acked: int, *, fetch: bool, arm: bool, deep: str,
                 orders: list[str], value: str = "", alive: str = "") -> list[Any]:
    """fetch.lua's ARGV (see its header)."""
    return [ack or b"", "1" if fetch else "0", keys.DAILY_STAT_TTL, "1" if arm else "0", deep,
            acked, value, alive, *orders]


# -- the batch's size --------------------------------------------------------------------

HOLD_BUDGET = 0.05
"""Seconds of expected work a processor may hold, not started, behind its running job."""

WEIGHT = 0.2
"""The weight of the newest run time in the moving average."""


class BatchSize:
    """One processor's batch size: :meth:`size` for the next fetch, :meth:`ran` after each job."""

    def __init__(self, limit: int, budget: float = HOLD_BUDGET) -> None:
        self.limit = max(1, limit)
        self._budget = budget
        self._average: float | None = None
        self._size = 1

    def ran(self, seconds: float) -> None:
        """A job ran for ``seconds`` (wall time, from start to outcome)."""
        seconds = max(0.0, seconds)
        average = self._average
        average = seconds if average is None else average + WEIGHT * (seconds - average)
        self._average = average
        if average * (self.limit - 1) <= self._budget:
            self._size = self.limit
        else:
            self._size = 1 + int(self._budget / average)

    def size(self) -> int:
        """How many jobs the next fetch may take (1 .. ``limit``)."""
        return self._size


# -- the batch's progress, shared with the master --------------------------------------

_LAYOUT = struct.Struct("=16sI")
_COUNT = struct.Struct("=I")


def digest(job: bytes) -> bytes:
    """The 16-byte digest naming a job's bytes."""
    return hashlib.blake2b(job, digest_size=16).digest()


@dataclass(frozen=True)
class Done:
    """What a gone processor had completed: the first ``count`` pairs of its list, if the
    list begins with the job whose digest is ``head``."""

    head: bytes = b""
    count: int = 0


class Progress:
    """The shared mapping of one processor slot (create before fork)."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, _LAYOUT.size)

    def start(self, head: bytes) -> None:
        """A new batch begins with the job ``head`` (its bytes); nothing completed yet."""
        self.completed(0)
        self._map[:16] = digest(head)

    def completed(self, count: int) -> None:
        """``count`` jobs of the batch, from its start, completed."""
        _COUNT.pack_into(self._map, 16, count)

    def read(self) -> Done:
        """What the mapping says now (``Done()`` when nothing completed)."""
        head, count = _LAYOUT.unpack(self._map[:_LAYOUT.size])
        return Done(head, count) if count else Done()
