"""The master's side of its scheduler child: fork, watch, retire, reap, respawn.

One slot for one child (:class:`~forkq.daemon.children.scheduler.Scheduler`), kept filled while
the daemon is neither quiet nor stopping and ``scheduler`` is true. The child
beats like a processor (:mod:`forkq.daemon.children.beat_thread`) into ``forkq:beats:<identity>``,
with the count of its main loop's turns; a child whose loop has not turned for
``liveness_timeout`` (stopped, or stuck in a call) is SIGKILLed (a
stopped scheduler is harmless to the cluster — its lease expires and the
fenced scripts refuse it — but it must not hold this daemon's slot forever).
A quick abnormal death delays the next fork by 0.5, 1, 2 ... up to 30 s; a
scheduler that keeps dying never stops the daemon, whose processors still work.
Retiring (quiet, stop, a reload of scheduler settings) sends USR1: the child
releases its lease and exits.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from forkq.config import Config
from forkq.daemon.child_process import (
    MAX_BACKOFF,
    QUICK_DEATH,
    OsProcesses,
    Processes,
    describe,
    respawn_delay,
)
from forkq.daemon.children.scheduler import Scheduler
from forkq.daemon.master.effects import Clock, SystemClock
from forkq.daemon.master.heartbeats import LastBeat
from forkq.daemon.signals import STOP_SIGNAL
from forkq.registry import Registry

log = logging.getLogger(__name__)


@dataclass
class _Running:
    pid: int
    started: float  # monotonic
    seen: float  # monotonic time its main loop last turned, as its heartbeat said
    loops: int = -1
    retiring: bool = False
    killed: bool = False


class SchedulerSlot:
    """The scheduler child of one master. Build in the master; every method is non-blocking."""

    def __init__(self, config: Config, *, identity: str, registry: Registry,
                 in_child: Callable[[], None], processes: Processes | None = None,
                 clock: Clock | None = None) -> None:
        self.config = config
        self.identity = identity
        self.registry = registry
        self._in_child = in_child
        self._child: _Running | None = None
        self._quick_deaths = 0
        self._not_before = 0.0
        self._processes = processes or OsProcesses()
        self._clock = clock or SystemClock()

    @property
    def pid(self) -> int | None:
        """The scheduler child's pid, if one is running."""
        return self._child.pid if self._child else None

    def next_wake(self, now: float) -> float | None:
        """When the backoff before the next fork ends, if it is still running."""
        return self._not_before if self._child is None and self._not_before > now else None

    def top_up(self, now: float) -> None:
        """Fork a scheduler if there is none, it is enabled and the backoff has passed."""
        if self._child is None and self.config.scheduler and now >= self._not_before:
            self._spawn(now)

    def _spawn(self, now: float) -> None:
        try:
            pid = self._processes.fork(self._become_scheduler)
        except OSError as exc:
            log.error("cannot fork the scheduler: %s; retrying in %.0fs", exc, MAX_BACKOFF)
            self._not_before = now + MAX_BACKOFF
            return
        self._child = _Running(pid, now, seen=now)
        log.debug("scheduler started, pid %d", pid)

    def _become_scheduler(self) -> int:
        """In the forked child: drop the master's state and run the Scheduler; its exit code."""
        self._in_child()
        return Scheduler(self.config, identity=self.identity, registry=self.registry).run()

    def retire(self) -> None:
        """Ask the scheduler to hand over its lease and exit."""
        if self._child is not None and not self._child.retiring:
            self._child.retiring = True
            self._processes.kill(self._child.pid, STOP_SIGNAL)

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the scheduler, if one runs (TTIN, USR2)."""
        if self._child is not None:
            self._processes.kill(self._child.pid, signum)

    def kill(self, reason: str) -> None:
        """SIGKILL the scheduler (stop deadline, or stale heartbeat)."""
        if self._child is not None and not self._child.killed:
            log.warning("scheduler (pid %d) killed: %s", self._child.pid, reason)
            self._child.killed = True
            self._processes.kill(self._child.pid, signal.SIGKILL)

    def watch(self, beats: dict[int, LastBeat], now: float) -> None:
        """Take in the scheduler's heartbeat; cull it when its main loop has not turned for
        ``liveness_timeout`` (it turns at least once a second, in any state)."""
        child = self._child
        if child is None:
            return
        beat = beats.get(child.pid)
        if beat is not None and beat.loops != child.loops:
            child.loops, child.seen = beat.loops, now
        silent = now - child.seen
        if silent > self.config.liveness_timeout:
            self.kill(f"no heartbeat for {silent:.0f}s "
                      f"(liveness_timeout {self.config.liveness_timeout:g}s)")

    def trust_again(self, now: float) -> None:
        """After a Redis outage: a full liveness timeout from now."""
        if self._child is not None:
            self._child.seen = now

    def reap(self, *, block: bool = False) -> int | None:
        """Collect the scheduler if it has exited; its pid, or None."""
        child = self._child
        if child is None:
            return None
        status = self._processes.wait(child.pid, block=block)
        if status is None:
            return None
        self._child = None
        now = self._clock.monotonic()
        code = os.waitstatus_to_exitcode(status)
        abnormal = code != 0 or child.killed
        if abnormal:
            log.warning("scheduler (pid %d) %s", child.pid, describe(status))
        quick = abnormal and now - child.started < QUICK_DEATH
        self._quick_deaths = self._quick_deaths + 1 if quick else 0
        if self._quick_deaths:
            delay = respawn_delay(self._quick_deaths)
            self._not_before = now + delay
            log.warning("scheduler respawns in %.1fs", delay)
        return child.pid
