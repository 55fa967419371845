"""The master's processor children: fork, watch, kill, reap, settle, respawn.

Slots: ``concurrency`` numbered slots; each holds at most one child. A child
told to stop (``retire``: quiet, stop, reload, shrink) keeps its slot until it
exits, so the pool never runs more than ``concurrency`` jobs at once.

Watching (:meth:`Pool.watch`, fed with the children's Redis heartbeats):

- a child whose heartbeat ``seq`` has not changed for ``liveness_timeout`` is
  culled (SIGKILL). The clock restarts for every child when the master's Redis
  comes back after an outage (:meth:`Pool.trust_again`), so an outage never
  culls a healthy child;
- a job running longer than its ``timeout`` option, else ``job_timeout``, gets
  its child SIGKILLed and the job is failed with a timeout error;
- a child above 1.5 x ``max_memory_mb`` RSS is killed (it recycles itself
  between jobs above ``max_memory_mb``).

No loss: a gone child's job is settled (:mod:`forkq.daemon.master.dead_child`) *before* its slot
gets a new child; when Redis is unreachable the slot waits.

Backoff and crash loop: a child that dies abnormally within
:data:`QUICK_DEATH` seconds of its start delays its slot's next fork by 0.5, 1,
2, ... up to 30 s. A slot whose children fail to boot :data:`BOOT_ATTEMPTS`
times in a row sets :attr:`Pool.halt_reason`; the supervisor then stops.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace

import redis

from forkq import keys
from forkq.config import Config
from forkq.daemon.child_process import (
    MAX_BACKOFF,
    QUICK_DEATH,
    OsProcesses,
    Processes,
    describe,
    respawn_delay,
)
from forkq.daemon.children.fetch import Done, Progress
from forkq.daemon.children.processor import Processor
from forkq.daemon.master.cancels import Asked, Holder, decide, to_stop
from forkq.daemon.master.dead_child import Cause, Gone
from forkq.daemon.master.effects import Clock, Store, SystemClock
from forkq.daemon.master.health import Child, verdict
from forkq.daemon.master.heartbeats import LastBeat, busy_entry
from forkq.daemon.refusal import Recurring
from forkq.daemon.refusal import describe as describe_error
from forkq.daemon.signals import STOP_SIGNAL
from forkq.daemon.watch_token import WatchToken
from forkq.middleware import ServerChain
from forkq.registry import Registry
from forkq.wording import counted

log = logging.getLogger(__name__)

BOOT_ATTEMPTS = 5
HEALTH_SLACK = 3.0  # seconds a stale child may wait for the next watch to cull it (2 s apart
# while every child is idle)


class Pool:
    """The children of one master. Build in the master; every method is non-blocking."""

    def __init__(
        self,
        config: Config,
        *,
        store: Store,
        identity: str,
        registry: Registry,
        middleware: ServerChain,
        in_child: Callable[[], None],
        processes: Processes | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self._store = store
        self.identity = identity
        self.registry = registry
        self.middleware = middleware
        self.children: dict[int, Child] = {}
        self.halt_reason: str | None = None
        self._in_child = in_child
        self._processes = processes or OsProcesses()
        self._clock = clock or SystemClock()
        self._pending: dict[int, Gone] = {}  # slot -> a gone child's job still to settle
        self._progress: dict[int, Progress] = {}  # slot -> memory shared with its child
        self._token = WatchToken()  # which idle lane of several queues watches
        self._backoff: dict[int, tuple[int, float]] = {}  # slot -> (quick deaths, not before)
        self._boot_failures: dict[int, int] = {}
        self._unsettled = Recurring(log)

    # -- queries -----------------------------------------------------------------------------

    def report_fds(self) -> list[int]:
        """The boot-report pipes still open, for the master's wait."""
        return [c.report_fd for c in self.children.values() if c.report_fd is not None]

    def next_wake(self, now: float) -> float | None:
        """The monotonic time the earliest backoff still running ends, if any."""
        return min((until for _, until in self._backoff.values() if until > now), default=None)

    def busy(self) -> dict[str, str]:
        """The ``:workers`` hash: child pid → busy entry, for children running a job."""
        return {str(c.pid): busy_entry(c.job) for c in self.children.values() if c.job}

    def busy_count(self) -> int:
        """How many children run a job (as their last heartbeat said)."""
        return sum(1 for c in self.children.values() if c.job)

    def all_booted(self) -> bool:
        """Every slot has a child that reported ready."""
        booted = sum(1 for c in self.children.values() if c.booted and not c.retiring)
        return booted >= self.config.concurrency

    def healthy(self, now: float) -> bool:
        """No child is overdue for culling and at least one has booted."""
        limit = self.config.liveness_timeout + HEALTH_SLACK
        fresh = all(now - c.seen <= limit for c in self.children.values())
        return fresh and any(c.booted for c in self.children.values())

    def rss_kb(self) -> int:
        """RSS of the children in KB (for the process record)."""
        return int(sum(self._processes.rss_mb(pid) for pid in self.children) * 1024)

    def configure(self, config: Config) -> None:
        """Take a reloaded configuration (children forked from now on run with it)."""
        self.config = config

    # -- forking -----------------------------------------------------------------------------

    def top_up(self, now: float) -> None:
        """Fork a child for every free slot whose backoff has passed and whose job is settled."""
        taken = {child.slot for child in self.children.values()}
        for slot in range(self.config.concurrency):
            if slot in taken or self._backoff.get(slot, (0, 0.0))[1] > now:
                continue
            if self._settle(slot):
                self.spawn(slot)

    def spawn(self, slot: int) -> None:
        """Fork one processor child for ``slot``."""
        self._progress.setdefault(slot, Progress())
        try:
            pid, read_fd = self._processes.fork_reporting(
                lambda write_fd: self._become_child(slot, write_fd))
        except OSError as exc:
            self._cannot_fork(slot, exc)
            return
        now = self._clock.monotonic()
        lanes = self.config.async_concurrency if self.config.async_concurrency > 1 else 0
        self.children[pid] = Child(pid, slot, now, read_fd, seen=now, lanes=lanes)
        log.debug("processor-%d started, pid %d", slot, pid)

    def _cannot_fork(self, slot: int, exc: OSError) -> None:
        log.error("cannot fork processor-%d: %s; retrying in %.0fs", slot, exc, MAX_BACKOFF)
        self._backoff[slot] = (0, self._clock.monotonic() + MAX_BACKOFF)

    def _become_child(self, slot: int, report_fd: int) -> int:
        """In the forked child: drop the master's state and run a Processor; its exit code.
        The signals stay blocked until its handlers are installed."""
        self._in_child()
        self.close_reports()
        return Processor(self.config, identity=self.identity, slot=slot,
                         registry=self.registry, middleware=self.middleware,
                         token=self._token, report_fd=report_fd,
                         progress=self._progress[slot]).run()

    def close(self) -> None:
        """After the last turn: close the watch token (no child of this pool is left)."""
        self._token.close()

    def close_token(self) -> None:
        """In a freshly forked child that never waits for jobs (the scheduler): close the
        watch token's file and doorbell."""
        self._token.close()

    def close_reports(self) -> None:
        """In a freshly forked child: close the master's ends of the boot-report pipes."""
        for child in self.children.values():
            if child.report_fd is not None:
                os.close(child.report_fd)
                child.report_fd = None

    def read_reports(self, ready: list[int]) -> None:
        """Read the boot reports of the children whose pipes are readable."""
        for child in self.children.values():
            if child.report_fd is not None and child.report_fd in ready:
                self._read_report(child)

    def _read_report(self, child: Child, *, exited: bool = False) -> None:
        """Read ``child``'s boot report and close its pipe; nothing written yet leaves the
        pipe of a child that has not ``exited`` open."""
        if child.report_fd is None:
            return
        try:
            data = os.read(child.report_fd, 4096)
        except BlockingIOError:
            if not exited:
                return
            data = b""
        if data.startswith(b"ready"):
            child.booted = True
            self._boot_failures.pop(child.slot, None)
        elif data.startswith(b"error "):
            child.boot_error = data[6:].decode("utf-8", "replace").strip()
        os.close(child.report_fd)
        child.report_fd = None

    # -- telling and killing -----------------------------------------------------------------

    def signal_all(self, signum: signal.Signals) -> None:
        """Send ``signum`` to every child."""
        for pid in list(self.children):
            self._processes.kill(pid, signum)

    def retire(self, slots: range | None = None) -> int:
        """Tell the children in ``slots`` (all by default) to exit after their current job."""
        count = 0
        for child in self.children.values():
            if child.retiring or (slots is not None and child.slot not in slots):
                continue
            child.retiring = True
            count += 1
            self._processes.kill(child.pid, STOP_SIGNAL)
        return count

    def kill(self, child: Child, cause: Cause, reason: str, *, jid: str = "",
             timeout: float = 0.0) -> None:
        """SIGKILL ``child``; its job is settled per ``cause``
        (see :mod:`forkq.daemon.master.dead_child`)."""
        if child.killed is not None:
            return
        log.warning("processor-%d (pid %d) killed: %s", child.slot, child.pid, reason)
        child.killed = self._gone(child, cause, reason, jid, timeout)
        if child.job and child.job.get("jid") == jid:  # when the job began, for its metrics
            child.killed = replace(child.killed, started=_epoch(child.job.get("started")))
        self._processes.kill(child.pid, signal.SIGKILL)

    def stop_cancelled(self, pending: set[str]) -> None:
        """Ask, then kill, each child running a job whose cancellation is asked (``pending``
        jids): the job sees the request at once and has ``cancel_grace`` seconds to stop on
        its own before its child is killed (see :mod:`~forkq.daemon.master.cancels`);
        reading the in-flight lists may raise a Redis error."""
        children = [child for child in self.children.values() if child.killed is None]
        if not pending:
            for child in children:
                child.cancel_asked = None  # every request was carried out or expired
            return
        if not children:
            return
        lists = {child.pid: self._gone(child, "cancel", "").each_list() for child in children}
        read = self._store.read_lists([gone.inflight_key for each in lists.values()
                                       for gone in each])
        holders = {pid: Holder([read[gone.inflight_key] for gone in each], self._done(pid))
                   for pid, each in lists.items()}
        now, grace = self._clock.monotonic(), self.config.cancel_grace
        asked = {child.pid: child.cancel_asked for child in children if child.cancel_asked}
        decision = decide(to_stop(pending, holders), asked, now=now, grace=grace)
        for pid, jid in decision.ended.items():
            self.children[pid].cancel_asked = None
            # filing a cancelled job withdraws its request; one still standing completed
            if jid in pending and self._store.withdraw_cancel(jid):
                log.info("job %s completed within its cancel grace; the request is withdrawn",
                         jid)
        for pid, jid in decision.asked.items():
            child = self.children[pid]
            child.cancel_asked = Asked(jid, now)
            if pid not in decision.kill:
                log.info("job %s was cancelled: processor-%d (pid %d) is asked to stop it "
                         "(forkq.cancel_requested()); killed in %gs if it has not", jid,
                         child.slot, pid, grace)
        for pid, jid in decision.kill.items():
            why = f" and did not stop within cancel_grace ({grace:g}s)" if grace else ""
            self.kill(self.children[pid], "cancel", f"job {jid} was cancelled{why}", jid=jid)

    def _done(self, pid: int) -> Done:
        slot = self.children[pid].slot
        return self._progress[slot].read() if slot in self._progress else Done()

    # -- watching ----------------------------------------------------------------------------

    def trust_again(self, now: float, stalled: float = 0.0) -> None:
        """After a Redis outage or a stall: give every child a full liveness timeout from
        now; the ``stalled`` seconds do not count toward a running job's timeout."""
        for child in self.children.values():
            child.seen = now
            if child.job:
                child.frozen += stalled

    def watch(self, beats: dict[int, LastBeat], now: float) -> None:
        """Take in the children's heartbeats; cull the stale, the overdue and the oversized."""
        for child in list(self.children.values()):
            beat = beats.get(child.pid)
            if beat is not None and beat.seq != child.seq:
                if beat.job != child.job:
                    child.frozen = 0.0
                child.seq, child.seen, child.job = beat.seq, now, beat.job
            if child.killed is None:
                self._check(child, now)

    def _check(self, child: Child, now: float) -> None:
        watched = self.config.max_memory_mb > 0  # read the RSS only when it is judged
        kill = verdict(child, now, self.config, wall=self._clock.time(),
                       rss_mb=self._processes.rss_mb(child.pid) if watched else 0.0)
        if kill is not None:
            self.kill(child, kill.cause, kill.reason, jid=kill.jid, timeout=kill.timeout)

    # -- reaping and settling ----------------------------------------------------------------

    def reap(self, *, respawn: bool) -> list[Child]:
        """Collect exited children, settle their jobs, schedule respawns; the children reaped.

        Waits on each known pid rather than on -1, so other children of the
        master (the embedded server) stay with their owners.
        """
        gone = []
        for pid in list(self.children):
            status = self._processes.wait(pid)
            if status is not None:
                child = self.children.pop(pid)
                self._child_gone(child, status, respawn=respawn)
                gone.append(child)
        return gone

    def reap_now(self, child: Child) -> None:
        """Wait for a child just SIGKILLed and settle its job (graceful stop deadline)."""
        status = self._processes.wait(child.pid, block=True) or 0
        del self.children[child.pid]
        self._child_gone(child, status, respawn=False)

    def _child_gone(self, child: Child, status: int, *, respawn: bool) -> None:
        self._read_report(child, exited=True)  # it may have written since the last wait
        code = os.waitstatus_to_exitcode(status)
        how = describe(status)
        told = code == 0 and child.retiring  # a child exiting 0 unasked held no job, or its
        gone = child.killed or self._gone(child, "exit" if told else "crash", how)
        if child.slot in self._progress:
            gone = replace(gone, done=self._progress[child.slot].read())
        self._token.ring()  # if it was the watcher, another idle lane takes over
        if code != 0 and not child.booted and child.killed is None:
            self._boot_failed(child, how)
        elif code != 0 or child.killed is not None:
            log.warning("processor-%d (pid %d) %s", child.slot, child.pid, how)
        self._pending[child.slot] = gone
        self._settle(child.slot)
        if respawn:
            self._schedule_respawn(child, code, self._clock.monotonic())

    def _gone(self, child: Child, cause: Cause, how: str, jid: str = "",
              timeout: float = 0.0) -> Gone:
        """The record of ``child`` gone: its in-flight list (and its lanes') to settle."""
        lanes = keys.inflight_lanes(self.identity, child.pid, child.lanes)
        return Gone(keys.inflight(self.identity, child.pid), cause, how, jid, timeout,
                    lanes=lanes)

    def _boot_failed(self, child: Child, how: str) -> None:
        failures = self._boot_failures.get(child.slot, 0) + 1
        self._boot_failures[child.slot] = failures
        reason = child.boot_error or how
        log.error("processor-%d (pid %d) failed to boot (%d of %d): %s", child.slot, child.pid,
                  failures, BOOT_ATTEMPTS, reason)
        if failures >= BOOT_ATTEMPTS:
            self.halt_reason = (f"processor-{child.slot} failed to boot "
                                f"{counted(failures, 'time')} in a row: {reason}")

    def _schedule_respawn(self, child: Child, code: int, now: float) -> None:
        cancelled = child.killed is not None and child.killed.cause == "cancel"
        abnormal = not cancelled and (code != 0 or child.killed is not None)
        quick, _ = self._backoff.get(child.slot, (0, 0.0))
        quick = quick + 1 if abnormal and now - child.started < QUICK_DEATH else 0
        delay = respawn_delay(quick)
        self._backoff[child.slot] = (quick, now + delay)
        if delay:
            log.warning("processor-%d respawns in %.1fs", child.slot, delay)

    def _settle(self, slot: int) -> bool:
        """Settle the job of the child that last held ``slot``; False if Redis failed."""
        gone = self._pending.get(slot)
        if gone is None:
            return True
        try:
            every = [self._store.settle(one, max_retries=self.config.max_retries,
                                        now=self._clock.time()) for one in gone.each_list()]
        except redis.RedisError as exc:  # settled lists are empty now: settling again is a no-op
            self._unsettled.report(gone.inflight_key, "cannot settle the job of %s yet: %s; "
                                   "processor-%d waits", gone.inflight_key, describe_error(exc),
                                   slot)
            return False
        self._unsettled.clear(gone.inflight_key, "settled the job of %s", gone.inflight_key)
        del self._pending[slot]
        for settled in every:
            if settled is not None:
                detail = f" ({settled.detail})" if settled.detail else ""
                log.warning("job %s%s: %s", settled.outcome, detail,
                            settled.job[:200].decode("utf-8", "replace"))
        return True

    def settle_all(self) -> bool:
        """Settle every pending job; True when none is left."""
        return all(self._settle(slot) for slot in list(self._pending))

    def pending(self) -> list[str]:
        """In-flight keys still to settle."""
        return [gone.inflight_key for gone in self._pending.values()]


def _epoch(value: object) -> float:
    """A heartbeat's ``started``, or 0 when it is no number."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
