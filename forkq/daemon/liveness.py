"""A daemon's liveness: the short-TTL key by which the leader tells a dead host in seconds.

Sidekiq's process record lives 60 s after its last write, so a daemon whose host stopped
would hold its in-flight jobs for a minute. Every forkq daemon also keeps
``forkq:alive:<identity>`` (:func:`forkq.keys.alive`) with a TTL of 2/3 of
``host_failover``: its master sets it before forking, and renews it every third of the TTL;
once the master is gone, each heartbeat of its children renews it while it exists (they
finish their jobs). The leader recovers the jobs
of a forkq daemon whose key has lapsed (``owner_alive`` in guard.lua), looking at least every
fifth of ``host_failover`` (:func:`sweep_interval`): a stopped host's jobs run again within
``host_failover`` seconds.

A daemon that was only frozen (SIGSTOP, a VM paused) or cut off from Redis longer than the
TTL finds on return that its key lapsed. Its processors fetch nothing while it is absent
(fetch.lua). The master then :meth:`Liveness.turn` claims the key back, atomically with the
leader's recoveries (alive.lua): when the leader took none of its jobs meanwhile, it carries
on; when it took some, the jobs still running here may run elsewhere too (at least once),
so the master logs that, retires every processor after its current job (:meth:`Pool.retire
<forkq.daemon.master.pool.Pool.retire>`), and sets the key again only once none of them is
left: no processor of this daemon can fetch a job that one of its own is still running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from forkq.config import Config
from forkq.wording import counted

log = logging.getLogger(__name__)


def ttl(config: Config) -> float:
    """The liveness key's TTL, seconds: 2/3 of ``host_failover``."""
    return config.host_failover * 2 / 3


def renewal(config: Config) -> float:
    """How often a master renews its liveness key, seconds: a third of its TTL."""
    return ttl(config) / 3


def sweep_interval(config: Config) -> float:
    """How often the leader looks for dead daemons: ``orphan_sweep_interval``, at most a
    fifth of ``host_failover`` (TTL + this + the sweep itself fit in ``host_failover``)."""
    return min(config.orphan_sweep_interval, config.host_failover / 5)


def lease_ttl(config: Config) -> float:
    """The leader's lease, seconds: ``leader_lease_ttl``, at most the liveness key's TTL (a
    leader on a host that stopped is replaced as soon as that host's jobs may be taken)."""
    return min(config.leader_lease_ttl, ttl(config))


def renew_interval(config: Config) -> float:
    """How often the leader renews its lease: ``leader_renew_interval``, at most half of
    :func:`lease_ttl`."""
    return min(config.leader_renew_interval, lease_ttl(config) / 2)


class Keeper(Protocol):
    """The Redis steps on the liveness key (the master's store)."""

    def keep_alive(self, ttl_ms: int) -> bool:
        """Renew the key; False when it has lapsed (it stays absent)."""

    def claim_alive(self, ttl_ms: int, *, restore: bool = False) -> int:
        """Set the key again (alive.lua): 0, or with ``restore`` false and jobs of this
        daemon recovered by the leader, how many lists it took (the key stays absent)."""


class Liveness:
    """The master's side: renew, notice a lapse, and come back without running a job twice."""

    def __init__(self, config: Config) -> None:
        self.configure(config)
        self.next_at = 0.0  # monotonic: the next renewal
        self.waiting_for: set[int] | None = None
        """After a lapse in which jobs were taken: the processors that were running then;
        the key is set again once every one of them is gone."""

    def configure(self, config: Config) -> None:
        """Take ``host_failover`` from ``config`` (at start and on reload)."""
        self.ttl_ms = int(ttl(config) * 1000)
        self.interval = renewal(config)

    def due(self, now: float) -> bool:
        """Whether a renewal is due at ``now`` (monotonic): :meth:`turn` then talks to Redis
        (a caller that counts Redis steps, as the master's outage guard, asks first)."""
        return now >= self.next_at

    def start(self, keeper: Keeper) -> None:
        """Before the first fork: the key exists, so the processors may fetch."""
        keeper.claim_alive(self.ttl_ms, restore=True)

    def turn(self, keeper: Keeper, now: float, running: set[int],
             retire: Callable[[], int]) -> None:
        """Renew the key when due (``now``, monotonic). ``running`` are the processors alive
        now; ``retire`` retires them all after their current job (the count)."""
        if not self.due(now):
            return
        self.next_at = now + self.interval
        if self.waiting_for is None:
            if keeper.keep_alive(self.ttl_ms):
                return
            taken = keeper.claim_alive(self.ttl_ms)
            if not taken:
                log.warning("this daemon's liveness key had lapsed (no heartbeat reached Redis "
                            "for %.0fs: a freeze or a cut-off); the leader recovered none of its "
                            "jobs: carrying on", self.ttl_ms / 1000)
                return
            log.warning("this daemon's liveness key had lapsed (no heartbeat reached Redis for "
                        "%.0fs: a freeze or a cut-off) and the leader recovered the jobs of %s "
                        "of its processors: they run elsewhere, so the jobs still running here "
                        "may run twice. Retiring %s after their current job; fetching nothing "
                        "until they are gone", self.ttl_ms / 1000, counted(taken, "list"),
                        counted(retire(), "processor"))
            self.waiting_for = set(running)
        self.waiting_for &= running
        if not self.waiting_for:
            keeper.claim_alive(self.ttl_ms, restore=True)
            self.waiting_for = None
            log.info("liveness restored: the processors from before the lapse are gone; "
                     "fetching again")
