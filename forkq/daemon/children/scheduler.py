"""The scheduler child: campaigns for the cluster's leadership; the leader moves time along.

Every master forks one scheduler (unless ``scheduler: false``); all of them, on
every host sharing the Redis, campaign for one lease (:mod:`forkq.daemon.children.lease`). The
leader's term has three phases:

1. **take office** (:meth:`Scheduler._inaugurate`): log it, and sweep for orphans
   and look at the periodic jobs at once;
2. **act** (:meth:`Scheduler._act`), only while the lease holds: renew it every
   ``leader_renew_interval``; move due ``schedule`` / ``retry`` jobs
   (:mod:`forkq.daemon.children.due_jobs`); every ``orphan_sweep_interval`` recover the in-flight
   jobs
   of dead processes (:mod:`forkq.daemon.children.orphans`) and file the failures that
   waited in ``forkq:unfiled`` (:mod:`forkq.daemon.children.unfiled`); enqueue due periodic ticks
   (:mod:`forkq.daemon.children.periodic`). Every one of those scripts checks the lease token;
   once a minute, sample every queue's size and latency (:mod:`forkq.metrics.sampler`);
3. **hand over** (:meth:`Scheduler._hand_over`): on quiet, stop, reload or the
   master's death, release the lease so a follower takes it at once.

Timeliness: the leader sleeps until the earliest due score, the next renewal,
sweep or periodic tick, or at most :data:`MAX_SLEEP`; a change to ``schedule`` or
``retry`` wakes it at once (:class:`~forkq.daemon.children.queuewatch.QueueWatch`,
server-side key tracking, which sees Ruby clients' writes too). Redis is read only when
something is due or a watched key changed: an idle leader's turn sends nothing. A
follower asks the lease's remaining TTL (one ``PTTL``) when the term it saw should have
ended, and at once when a leader hands over (``PUBLISH`` on
:data:`~forkq.keys.LEADER_RELEASED`): it takes over within milliseconds of a release, and
within :data:`MAX_SLEEP` of an expiry.

Signals: as a processor child — INT, TERM, TSTP and HUP are ignored, USR1 means
hand over and exit, TTIN / USR2 are served by the heartbeat thread, which also
lets the master cull a stuck scheduler. Redis errors are logged once per outage;
the leader stops acting when its lease could have expired.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import redis

from forkq import cron, keys, middleware
from forkq.config import Config
from forkq.daemon import child_process, liveness
from forkq.daemon.children import due_jobs, orphans, periodic, unfiled
from forkq.daemon.children.lease import Lease, LeaseLostError
from forkq.daemon.children.queuewatch import CHANNEL, QueueWatch
from forkq.daemon.outage import Outage
from forkq.daemon.refusal import Recurring, describe
from forkq.daemon.signals import STOP_SIGNAL
from forkq.metrics import layout, sampler
from forkq.registry import Registry

log = logging.getLogger(__name__)

MAX_SLEEP = 1.0  # also how fast a scheduler notices its master is gone
RECONNECT_SETTLE = 12.0  # > a master beat (5 s) plus a child beat (2 s), with slack
SOCKET_TIMEOUT = 5.0
LEADER_WATCH = ("schedule", "retry")
"""What the leader's key watch follows: the sets it moves due jobs from."""
FOLLOWER_WATCH: tuple[str, ...] = ()
"""What a follower's key watch follows: no key, only the channel on which a leader hands
over (:data:`forkq.keys.LEADER_RELEASED`); it looks at the lease's TTL when that term should
end. So neither a renewal nor a write to ``schedule`` or ``retry`` wakes the fleet."""
FULL_SWEEP_EVERY = 10
"""Every this many sweeps, one also reads ``processes`` (dead processes that hold no
in-flight list are forgotten) and refiles the failures parked in ``forkq:unfiled``; the
others read only the in-flight registry."""


class Scheduler:
    """The scheduler child. The constructor only stores; :meth:`run` works after fork."""

    def __init__(self, config: Config, *, identity: str, registry: Registry) -> None:
        self.config = config
        self.identity = identity
        self.registry = registry
        self.stopping = False
        self._outage = Outage(log)
        self._refused = Recurring(log)
        self._connected_since = 0.0  # monotonic: since when Redis has answered every call
        self._next_renew = 0.0  # monotonic
        self._next_sweep = 0.0  # monotonic
        self._sweeps = 0  # in this term: every FULL_SWEEP_EVERY-th one is full
        self._next_tick = 0.0  # epoch: when a periodic job is next due
        self._next_sample = 0.0  # epoch: when the queues are next sampled (once a minute)
        self._changed = True  # a watched key may have changed since the last turn
        self._due: float | None = None  # the earliest due score read, when still known
        self._due_known = False
        self._campaign_at = 0.0  # monotonic: when the lease a follower saw expires

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        """Set up, campaign and act until told to stop, hand over; the exit code."""
        self._setup()
        try:
            while not self.stopping:
                self._beat.loops += 1  # the master culls a scheduler whose loop stalls
                wait = self._guarded(lambda: self.loop_once(time.monotonic()))
                self._await_change(MAX_SLEEP if wait is None else wait)
                self._check_signals()
        finally:
            self._hand_over()
        self._beat.stop()
        self._watch.close()
        return 0

    def _setup(self) -> None:
        self._connected_since = time.monotonic()
        basics = child_process.setup(self.config, identity=self.identity, role="scheduler",
                                     state="follower", socket_timeout=SOCKET_TIMEOUT)
        self.master_pid, self._pipe, self.redis = basics.master_pid, basics.pipe, basics.redis
        self._beat = basics.beat
        self.lease = Lease(self.redis, identity=self.identity, pid=os.getpid(),
                           ttl=liveness.lease_ttl(self.config))
        self._watch = self._new_watch(FOLLOWER_WATCH)

    def _await_change(self, timeout: float) -> None:
        """Wait on the key watch up to ``timeout``; a wait that ended early (a watched key
        changed, a signal, a reopened watch) or a watch that polls marks the next turn as
        one that reads Redis again (:attr:`_changed`)."""
        began = time.monotonic()
        self._watch.wait(timeout, self._pipe.fd)
        self._changed = (self._watch.fileno() is None
                         or time.monotonic() - began < timeout)

    def _watch_for(self, prefixes: tuple[str, ...]) -> None:
        """Watch ``prefixes`` from now on (a new connection: its first wait returns at once,
        so the next turn reads what it must)."""
        self._watch.close()
        self._watch = self._new_watch(prefixes)

    def _new_watch(self, prefixes: tuple[str, ...]) -> QueueWatch:
        return QueueWatch(self.redis, prefixes,
                          channel=CHANNEL if prefixes else keys.LEADER_RELEASED)

    def _check_signals(self) -> None:
        if STOP_SIGNAL in self._pipe.drain():  # the master's, or the heartbeat thread's
            self.stopping = True
        elif os.getppid() != self.master_pid:  # at once: a lease handed over sooner
            log.warning("master (pid %d) is gone; handing over", self.master_pid)
            self.stopping = True

    def _hand_over(self) -> None:
        if self.lease.token is None:
            return
        try:
            self.lease.release()
            log.info("handed over the scheduler leadership")
        except redis.RedisError as exc:
            log.warning("could not release the lease (%s); it expires within %gs", exc,
                        self.lease.ttl)

    # -- one turn ----------------------------------------------------------------------------

    def loop_once(self, now: float) -> float:
        """Campaign or act once at monotonic ``now``; how long to wait before the next turn."""
        if not self.lease.holds(now):
            if self.lease.token is not None and not self.lease.renew():  # after a slow turn
                self._step_down("the lease expired before it was renewed")
            if self.lease.token is None:
                if not self._campaign(now):
                    return min(MAX_SLEEP, max(self._campaign_at - now, 0.01))
                self._inaugurate(now)
        try:
            return self._act(now)
        except LeaseLostError as exc:
            self._step_down(f"the lease was lost ({exc})")
            return 0.0

    def _campaign(self, now: float) -> bool:
        """A follower's turn: True once it took the lease. Redis is asked only when a leader
        handed over (its channel) or the term it saw should have ended: the remaining TTL
        first (one ``PTTL``), the lease only when it is free."""
        if not self._changed and now < self._campaign_at:
            return False
        remaining = self.lease.holder_ttl()
        if remaining <= 0 and self.lease.acquire():
            return True
        self._campaign_at = now + max(remaining, 0.01)
        return False

    def _inaugurate(self, now: float) -> None:
        log.info("took office as the scheduler leader (lease %gs, term %s)",
                 self.lease.ttl, self.lease.token)
        self._title("leader")
        self._next_renew = now + liveness.renew_interval(self.config)
        self._next_sweep = now
        self._sweeps = 0
        self._next_tick = 0.0
        self._due_known = False
        self._watch_for(LEADER_WATCH)

    def _step_down(self, why: str) -> None:
        log.warning("no longer the scheduler leader: %s", why)
        self.lease.step_down()
        self._watch_for(FOLLOWER_WATCH)
        self._title("follower")

    def _act(self, now: float) -> float:
        """The leader's work for this turn, fenced by the lease; the time to the next turn."""
        if now >= self._next_renew:
            if not self.lease.renew():
                raise LeaseLostError("renewal refused")
            self._next_renew = now + liveness.renew_interval(self.config)
        wall = time.time()
        earliest = self._move_due(wall)
        if now >= self._sweep_time():
            full = self._sweeps % FULL_SWEEP_EVERY == 0
            orphans.sweep(self.redis, self._token(), now=wall, own=self.identity, full=full)
            if full:
                unfiled.refile(self.redis, now=wall)
            self._sweeps += 1
            self._next_sweep = now + liveness.sweep_interval(self.config)
        if self.config.periodic and wall >= self._next_tick:
            self._periodic(wall)
        if wall >= self._next_sample:
            self._token()
            sampler.sample(self.redis, wall)
            self._next_sample = layout.minute_of(wall) + 60
        return self._sleep(now, wall, earliest)

    def _move_due(self, wall: float) -> float | None:
        """Move the due ``schedule`` / ``retry`` jobs; the earliest score left. The sets are
        read only when one changed, a job came due, or after a new term or a reconnection:
        an idle leader's turn sends nothing."""
        due = self._due
        if self._changed or not self._due_known or (due is not None and due <= wall):
            due = due_jobs.next_due(self.redis)
            if due is not None and due <= wall:
                moved = due_jobs.move_due(self.redis, self._token(), wall)
                log.debug("moved %d due jobs", moved)
                due = due_jobs.next_due(self.redis)
            self._due, self._due_known = due, True
        return due

    def _sweep_time(self) -> float:
        """When the next orphan sweep may run: its interval, and never before Redis has
        answered for :data:`RECONNECT_SETTLE` seconds in a row (more when the masters renew
        their liveness keys less often). After an outage every process hash and liveness key
        may have expired while its daemon lived on; they are written again within that time,
        and must not be taken for dead."""
        settle = max(RECONNECT_SETTLE, liveness.renewal(self.config) + RECONNECT_SETTLE / 2)
        return max(self._next_sweep, self._connected_since + settle)

    def _token(self) -> str:
        if self.lease.token is None or not self.lease.holds(time.monotonic()):
            raise LeaseLostError("term over")
        return self.lease.token

    def _sleep(self, now: float, wall: float, earliest: float | None) -> float:
        wake = [MAX_SLEEP, self._next_renew - now, self._sweep_time() - now,
                self._next_sample - wall]
        if self.config.periodic:
            wake.append(self._next_tick - wall)
        if earliest is not None:
            wake.append(earliest - wall)
        return max(min(wake), 0.0)

    # -- periodic jobs -----------------------------------------------------------------------

    def _periodic(self, wall: float) -> None:
        try:
            last = periodic.last_handled(self.redis)
        except redis.ResponseError as exc:
            self._refused.report(keys.PERIODIC, "periodic jobs wait: %s",
                                 describe(exc, keys.PERIODIC))
            self._next_tick = wall + MAX_SLEEP * 60
            return
        upcoming = []
        for entry in self.config.periodic:
            try:
                self._tick(entry, last.get(entry.name), wall)
                upcoming.append(cron.next_tick(entry, wall))
            except redis.ResponseError as exc:  # a key of the wrong type: this entry waits
                self._refused.report(entry.name, "periodic %s waits: %s", entry.name,
                                     describe(exc))
                upcoming.append(wall + MAX_SLEEP * 60)
            except (redis.RedisError, LeaseLostError):
                raise
            except Exception:  # one bad entry must not stop the cluster's scheduling
                log.exception("periodic %s: cannot be scheduled; skipped", entry.name)
        self._next_tick = min(upcoming, default=wall + MAX_SLEEP * 60)

    def _tick(self, entry: cron.Periodic, last: float | None, wall: float) -> None:
        ticks, mark = cron.due_ticks(entry, last, wall, grace=self.config.periodic_grace)
        for tick in ticks:
            self._fire(entry, tick, wall)
        if mark not in ticks and (last is None or mark > last):
            periodic.fire(self.redis, self._token(), name=entry.name, tick=mark, payload=None)
            if last is not None:
                log.warning("periodic %s: ticks up to %s were missed (policy %s)",
                            entry.name, cron.describe(mark), entry.missed)

    def _fire(self, entry: cron.Periodic, tick: float, wall: float) -> None:
        payload = cron.payload_for(entry, self.registry, tick, wall)
        try:
            pushed = middleware.CLIENT.run(payload, lambda: payload)
        except Exception:  # application middleware: log it, and count the tick as handled
            log.exception("periodic %s: client middleware failed; tick %s not enqueued",
                          entry.name, cron.describe(tick))
            pushed = None
        if periodic.fire(self.redis, self._token(), name=entry.name, tick=tick, payload=pushed):
            log.info("periodic %s: enqueued %s jid=%s for %s", entry.name, entry.job,
                     payload["jid"], cron.describe(tick))

    # -- plumbing ----------------------------------------------------------------------------

    def _guarded(self, step: Callable[[], float]) -> float | None:
        """Run a turn; None on a Redis error (the outage is logged once)."""
        return self._outage.guard(step, self._reconnected)

    def _reconnected(self) -> None:
        self._connected_since = time.monotonic()
        self._due_known = False

    def _title(self, state: str) -> None:
        child_process.set_title(self.config, "scheduler", state)
