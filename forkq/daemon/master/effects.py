"""The master's effects on the world, as collaborators it is given.

The supervisor, the pool and the scheduler slot decide; what they do to the world goes
through these: :class:`~forkq.daemon.child_process.Processes` (fork, wait, kill, RSS),
:class:`Clock`, :class:`Wakeup` (the self-pipe wait) and :class:`Store` (every Redis step
of the master). :class:`RedisStore` and the system clock are the real ones; the unit tier
(``tests/test_master.py``) drives the master with stand-ins, without forking or a server.
"""

from __future__ import annotations

import contextlib
import random
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import redis
from setproctitle import setproctitle

from forkq import keys
from forkq.connection import raw, text
from forkq.daemon.child_process import OsProcesses, Processes
from forkq.daemon.children import lease
from forkq.daemon.children.queuewatch import QueueWatch
from forkq.daemon.master import dead_child, heartbeats, restart_recovery
from forkq.daemon.master.dead_child import Gone, Settled
from forkq.daemon.master.heartbeats import Beat, LastBeat
from forkq.registry import Registry
from forkq.scripts import script


class Clock(Protocol):
    """Time as the master reads it."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (deadlines, liveness)."""

    def time(self) -> float:
        """Epoch seconds (what jobs and Redis records carry)."""


class SystemClock:
    """The real :class:`Clock`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


class Wakeup(Protocol):
    """The master's one blocking call: wait for a signal or a readable boot pipe."""

    def wait(self, timeout: float, *, also: Iterable[int] = ()
             ) -> tuple[list[signal.Signals], list[int]]:
        """The signals received and the ``also`` descriptors readable, within ``timeout``."""

    def close(self) -> None:
        """Restore the signal handlers and close the pipe."""


class Store(Protocol):
    """Every Redis step of the master, for one daemon ``identity``. Each may raise a Redis
    error; the master guards them."""

    def ping(self) -> None:
        """Check the connection and credentials."""

    def settle(self, gone: Gone, *, max_retries: int, now: float) -> Settled | None:
        """Settle the job a gone child held (:func:`~forkq.daemon.master.dead_child.settle`)."""

    def read_beats(self) -> dict[int, LastBeat]:
        """The children's last heartbeats by pid."""

    def forget_children(self, pids: list[int]) -> None:
        """Drop the beats of children that are gone."""

    def write_record(self, *, info: str, busy: dict[str, str], quiet: bool, rss_kb: int,
                     concurrency: int, failover: float) -> Beat:
        """Write the process record (``failover``: its liveness key's TTL); pop one remote
        signal."""

    def leads(self) -> bool:
        """Whether this daemon's scheduler holds the cluster's lease."""

    def reclaim(self, *, now: float) -> None:
        """Take back the jobs of this host's gone incarnations (restart recovery)."""

    def clear(self) -> None:
        """Clean exit: leave ``processes``, drop the liveness key."""

    def keep_alive(self, ttl_ms: int) -> bool:
        """Renew the liveness key; False when it has lapsed (:mod:`.liveness`)."""

    def claim_alive(self, ttl_ms: int, *, restore: bool = False) -> int:
        """Set the liveness key again (alive.lua); see :class:`.liveness.Keeper`."""

    def cancel_watch_fds(self) -> list[int]:
        """Descriptors readable when a job's cancellation is asked (none while the watch
        cannot be opened: the master then looks every second)."""

    def cancel_asked(self, ready: list[int]) -> bool:
        """Whether one of :meth:`cancel_watch_fds` was in ``ready`` (what arrived is read)."""

    def pending_cancels(self, now: float) -> set[str]:
        """The jids whose cancellation is asked and still stands."""

    def read_lists(self, inflight_keys: list[str]) -> dict[str, list[bytes]]:
        """The elements of each in-flight list (a key of another type reads empty)."""

    def withdraw_cancel(self, jid: str) -> bool:
        """Forget the request to cancel ``jid`` (its job ended: nothing is left to do);
        whether it still stood."""


CANCEL_WATCH = "forkq-cancel-watch"
"""The name of a master's connection that watches ``forkq:cancels``."""


@dataclass
class RedisStore:
    """The real :class:`Store`, over the master's Redis client."""

    client: redis.Redis
    identity: str
    registry: Registry
    rng: random.Random = field(default_factory=random.Random)
    rtt_us: int = 0
    cancel_watch: QueueWatch = field(init=False)

    def __post_init__(self) -> None:
        self.cancel_watch = QueueWatch(self.client, prefixes=(keys.CANCELS,),
                                       name=CANCEL_WATCH)

    def ping(self) -> None:
        self.client.ping()

    def settle(self, gone: Gone, *, max_retries: int, now: float) -> Settled | None:
        return dead_child.settle(self.client, gone, registry=self.registry,
                                 max_retries=max_retries, rng=self.rng, now=now)

    def read_beats(self) -> dict[int, LastBeat]:
        return heartbeats.read_children(self.client, self.identity)

    def forget_children(self, pids: list[int]) -> None:
        heartbeats.forget_children(self.client, self.identity, pids)

    def write_record(self, *, info: str, busy: dict[str, str], quiet: bool, rss_kb: int,
                     concurrency: int, failover: float) -> Beat:
        wrote = heartbeats.beat(self.client, self.identity, info=info, busy=busy, quiet=quiet,
                                rss_kb=rss_kb, concurrency=concurrency, failover=failover,
                                rtt_us=self.rtt_us)
        self.rtt_us = wrote.rtt_us  # the record's rtt_us: the round trip of the one before
        return wrote

    def leads(self) -> bool:
        return lease.leads(lease.holder(self.client), self.identity)

    def reclaim(self, *, now: float) -> None:
        restart_recovery.reclaim(self.client, self.identity, now=now)

    def clear(self) -> None:
        heartbeats.clear(self.client, self.identity)
        self.cancel_watch.close()

    def keep_alive(self, ttl_ms: int) -> bool:
        return bool(self.client.pexpire(keys.alive(self.identity), ttl_ms))

    def claim_alive(self, ttl_ms: int, *, restore: bool = False) -> int:
        return int(script(self.client, "alive")(
            keys=[keys.alive(self.identity), keys.recovered(self.identity)],
            args=[ttl_ms, "restore" if restore else "claim"]))

    def cancel_watch_fds(self) -> list[int]:
        with contextlib.suppress(redis.RedisError):
            self.cancel_watch.open()
        fd = self.cancel_watch.fileno()
        return [] if fd is None else [fd]

    def cancel_asked(self, ready: list[int]) -> bool:
        fd = self.cancel_watch.fileno()
        return fd is not None and fd in ready and self.cancel_watch.consume()

    def pending_cancels(self, now: float) -> set[str]:
        found: list[bytes] = self.client.zrangebyscore(keys.CANCELS, now, "+inf")  # type: ignore[assignment]
        return {text(jid) for jid in found}

    def withdraw_cancel(self, jid: str) -> bool:
        return bool(self.client.zrem(keys.CANCELS, jid))

    def read_lists(self, inflight_keys: list[str]) -> dict[str, list[bytes]]:
        with self.client.pipeline(transaction=False) as pipe:
            for key in inflight_keys:
                pipe.lrange(key, 0, -1)
            replies = pipe.execute(raise_on_error=False)
        return {key: [raw(element) for element in reply] if isinstance(reply, list) else []
                for key, reply in zip(inflight_keys, replies, strict=True)}


@dataclass
class Effects:
    """What the master is given to act with; the defaults are the real ones. The store and
    the wakeup are made when the master starts (they need the connection and the signals)
    unless given."""

    processes: Processes = field(default_factory=OsProcesses)
    clock: Clock = field(default_factory=SystemClock)
    title: Callable[[str], None] = setproctitle
    store: Store | None = None
    wakeup: Wakeup | None = None
