"""The master: one loop, one signal table, the process record, systemd.

Loop, in a fixed order: wait on the self-pipe and the children's boot pipes
(≤ 1 s) → act on the signals received (:attr:`Supervisor.actions`) → reap → watch the
children's heartbeats (cull, job timeouts, memory) → stop or top up → beat
(process record, remote signals) → title and sd_notify. The master never runs
a job and never blocks: its Redis client has a 5 s socket timeout and every
Redis step is guarded, so an outage is logged once and waited out.

Signals (docs/operating.md, "Signals"): TERM / INT stop (a second one stops at once); TSTP /
USR1 quiet; TTIN dumps stacks; HUP reloads the YAML; USR2 reopens the log
file; CHLD only wakes the loop. Sidekiq's remote signals (``<identity>-signals``:
TSTP, TERM, TTIN; also USR1, USR2, HUP) are popped at each beat and go through
the same table.

Stopping: children get USR1 (finish the current job, then exit) and the master
waits until ``timeout`` after the signal, beating with ``quiet "true"``.
Children still running then are killed and their jobs pushed back, unchanged,
to the front of their queues; the process record is cleared, the embedded
server (if any) stopped, and the master exits 0 — or 79 when it stopped because
children kept failing to boot.

systemd (:mod:`forkq.daemon.master.sdnotify`): READY=1 once every child has registered and is
fetching; STATUS= with the busy count; RELOADING=1 ... READY=1 around a HUP;
STOPPING=1; WATCHDOG=1 from the loop only while the children are healthy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import sys
from collections.abc import Callable
from typing import Final, TypeVar

import psutil
import redis

from forkq import __version__, cron, keys, scripts
from forkq.config import Config
from forkq.connection import EMBEDDED, NotASentinelError, connect
from forkq.daemon import liveness, logs
from forkq.daemon.master import heartbeats, pidfile, reload
from forkq.daemon.master.effects import Effects, RedisStore, Store
from forkq.daemon.master.pool import Pool
from forkq.daemon.master.scheduler_slot import SchedulerSlot
from forkq.daemon.master.sdnotify import Notifier
from forkq.daemon.outage import Outage
from forkq.daemon.refusal import Recurring
from forkq.daemon.signals import SelfPipe
from forkq.embedded import EmbeddedServer
from forkq.errors import EXIT_CHILD_BOOT, EXIT_OK, ConfigError
from forkq.middleware import ServerChain
from forkq.redis_url import redact
from forkq.registry import Registry
from forkq.wording import counted

log = logging.getLogger(__name__)
T = TypeVar("T")

LOOP_WAIT = 1.0
STALL_SLACK = 5.0  # a turn that begins later than this after its wait was due: a stall
WATCH_INTERVAL = 1.0  # read the children's heartbeats while one of them runs a job
IDLE_WATCH_INTERVAL = 2.0  # ... while every child was idle at the last read
BEAT_INTERVAL = 5.0  # write the process record (Sidekiq 6: 5 s)
REQUEUE_GRACE = 10.0  # after the stop deadline, how long to keep retrying Redis

REMOTE: Final = frozenset({"TSTP", "TERM", "TTIN", "USR1", "USR2", "HUP"})
"""Signal names accepted from ``<identity>-signals``."""


def new_identity(pid: int | None = None) -> str:
    """Sidekiq's process identity: ``<hostname>:<pid>:<12 lowercase hex>``."""
    return f"{heartbeats.hostname()}:{os.getpid() if pid is None else pid}:{secrets.token_hex(6)}"


class Supervisor:
    """The master process. Build it in the master after importing the app; call :meth:`run`.

    ``reload`` builds the configuration anew for HUP (the CLI passes one that
    re-reads flags, environment and file); without it HUP is refused.
    """

    def __init__(
        self,
        config: Config,
        *,
        registry: Registry,
        middleware: ServerChain,
        reload: Callable[[], Config] | None = None,
        effects: Effects | None = None,
    ) -> None:
        self.config = config
        self._effects = effects or Effects()
        self._clock = self._effects.clock
        self.registry = registry
        self.middleware = middleware
        self.identity = new_identity()
        self.quiet = False
        self.stop_deadline: float | None = None
        self.done = False
        self._reload = reload
        self._embedded: EmbeddedServer | None = None
        self._started_at = self._clock.time()
        self._next_watch = 0.0
        self._next_beat = 0.0
        self._outage = Outage(log, "; not culling processors while their beats cannot be read")
        self._beats_unread = False  # the last read of the children's beats failed
        self._awake: float | None = None  # monotonic: the last turn's stall check
        self._ready_sent = False
        self._refused = Recurring(log)  # keys of the process record Redis refuses
        self._status = ""
        self._leader = False
        self._cancels_pending = True  # the last read of forkq:cancels found some (or none yet)
        self._liveness = liveness.Liveness(config)
        self.actions: dict[signal.Signals, Callable[[], None]] = {
            signal.SIGTERM: self.on_stop,
            signal.SIGINT: self.on_stop,
            signal.SIGTSTP: self.on_quiet,
            signal.SIGUSR1: self.on_quiet,
            signal.SIGTTIN: self.on_dump,
            signal.SIGHUP: self.on_reload,
            signal.SIGUSR2: self.on_reopen,
            signal.SIGCHLD: self.on_reap,
        }
        """The signal table: each signal the master acts on → its handler, run by the loop."""

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped; the exit code."""
        try:
            self.start()
            while not self.done:
                self.loop_once(self._clock.monotonic())
            self._guarded(self.store.clear, "clearing the process record")
        finally:
            self.close()
            if self.config.pid_file:
                pidfile.remove(self.config.pid_file, os.getpid())
        return self.exit_code()

    def start(self) -> None:
        """Everything before the first turn of the loop: signals, the embedded server, Redis,
        the pool and the scheduler slot, restart recovery, the first process record. Uses the
        given effects.

        The record is written before the first child forks: its ``info.proof`` is what lets
        the next daemon on this host prove this one gone (:mod:`.restart_recovery`), and a
        child may take a job, and the whole daemon be killed, before the first turn's beat."""
        self._pipe = self._effects.wakeup or SelfPipe(self.actions)
        self._notify = Notifier.from_environ()
        if self.config.pid_file:  # now that a signal sent to the pid it names is handled
            pidfile.write(self.config.pid_file, os.getpid())
        self._start_embedded()
        scripts.preload()  # once here, not in every child
        self.store = self._effects.store or self._connect()
        processes = self._effects.processes
        self.pool = Pool(self.config, store=self.store, identity=self.identity,
                         registry=self.registry, middleware=self.middleware,
                         in_child=self._in_child, processes=processes, clock=self._clock)
        self.scheduler = SchedulerSlot(self.config, identity=self.identity,
                                       registry=self.registry,
                                       in_child=self._in_scheduler_child,
                                       processes=processes, clock=self._clock)
        self._info = self._process_info()
        self._check_credentials()
        self._guarded(lambda: self._liveness.start(self.store), "setting the liveness key")
        self._reclaim()
        self._beat()
        log.info("forkq %s starting: identity %s, %s, queues %s%s",
                 __version__, self.identity, counted(self.config.concurrency, "processor"),
                 _queues(self.config), " (strict)" if self.config.strict else "")

    def _connect(self) -> Store:
        client = connect(self.config.redis_url, embedded_dir=self.config.embedded_dir,
                         socket_timeout=5)
        return RedisStore(client, self.identity, self.registry)

    def close(self) -> None:
        """After the last turn: stop the embedded server, restore the signal handlers, close
        the children's watch token."""
        self._stop_embedded()
        if hasattr(self, "pool"):
            self.pool.close()
        if hasattr(self, "_pipe"):
            self._pipe.close()
            self._notify.close()

    def exit_code(self) -> int:
        """0 after a stop; 79 when children kept failing to boot."""
        if self.pool.halt_reason:
            log.error("giving up: %s", self.pool.halt_reason)
            return EXIT_CHILD_BOOT
        log.info("Bye!")
        return EXIT_OK

    def _check_credentials(self) -> None:
        """Fail at once (no restart under systemd) when Redis refuses the password or ACL
        user (exit 77), or a Sentinel URL names a server that is no sentinel (exit 78); a
        Redis that does not answer yet is waited for, as any outage."""
        try:
            self.store.ping()
        except (redis.AuthenticationError, redis.exceptions.NoPermissionError):
            raise
        except NotASentinelError as exc:
            raise ConfigError(f"redis_url {redact(self.config.redis_url)}: {exc}") from exc
        except redis.RedisError as exc:
            log.warning("Redis does not answer yet (%s); waiting for it", exc)

    def _reclaim(self) -> None:
        """Before forking: take back the jobs of this host's gone incarnations at once."""
        try:
            self.store.reclaim(now=self._clock.time())
        except redis.RedisError as exc:
            log.warning("restart recovery skipped (%s): the leader's orphan sweep takes those "
                        "jobs back once their records expire", exc)

    def _in_child(self) -> None:
        """Run in a freshly forked child: drop what belongs to the master."""
        self._pipe.close()
        self._notify.close()
        self.pool.close_reports()
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            os.environ.pop(name, None)

    def _in_scheduler_child(self) -> None:
        """Run in a freshly forked scheduler: drop what belongs to the master, and the
        processors' watch token (the scheduler never waits for jobs)."""
        self._in_child()
        self.pool.close_token()

    def loop_once(self, now: float) -> None:
        """One turn: signals → reap → watch → stop or top up → beat → title and notify."""
        planned = self._wait_time(now) if self._awake is not None else 0.0  # fork at once
        watches = self._cancel_watch_fds()
        received, ready = self._pipe.wait(planned, also=self.pool.report_fds() + watches)
        for signum in received:
            self.dispatch(signum)
        self.pool.read_reports(ready)
        if watches and self.store.cancel_asked(ready):
            self._stop_cancelled()
        respawn = self.stop_deadline is None and not self.quiet
        gone = [child.pid for child in self.pool.reap(respawn=respawn)]
        scheduler = self.scheduler.reap()
        if scheduler is not None:
            gone.append(scheduler)
        if gone:
            self._guarded(lambda: self.store.forget_children(gone),
                          "forgetting gone children's beats")
        now = self._clock.monotonic()
        self._check_stall(now, planned)  # before the children are judged
        if now >= self._next_watch:
            self._next_watch = now + self._watch_interval()
            self._watch(now)
        if self.pool.halt_reason and self.stop_deadline is None:
            self.on_stop()
        if self.stop_deadline is not None:
            self._continue_stop(now)
        else:
            self.pool.settle_all()  # slots that are not refilled (quiet, shrunk) settle too
            if not self.quiet:
                self.pool.top_up(now)
                self.scheduler.top_up(now)
        if self.stop_deadline is None and self._liveness.due(now):  # else no Redis step: a
            # guarded call that does nothing would count as Redis answering again
            self._guarded(lambda: self._liveness.turn(
                self.store, now, set(self.pool.children), self.pool.retire),
                f"renewing the liveness key {keys.alive(self.identity)}")
        if now >= self._next_beat:
            self._next_beat = now + BEAT_INTERVAL
            self._beat()
        self._report(now)

    def _wait_time(self, now: float) -> float:
        wake = [now + min(LOOP_WAIT, self._notify.watchdog_interval or LOOP_WAIT)]
        if self.stop_deadline is not None and self.stop_deadline > now:
            wake.append(self.stop_deadline)
        for backoff in (self.pool.next_wake(now), self.scheduler.next_wake(now)):
            if backoff is not None:
                wake.append(backoff)
        return max(min(wake) - now, 0.0)

    def dispatch(self, signum: signal.Signals) -> None:
        """Run the action of ``signum`` from :attr:`actions` (other signals are ignored)."""
        action = self.actions.get(signum)
        if action is not None:
            action()

    # -- signal actions ----------------------------------------------------------------------

    def on_stop(self) -> None:
        """TERM / INT: graceful stop; the second one stops at once."""
        if self.stop_deadline is None:
            log.info("Shutting down: waiting up to %.1fs for %s to finish",
                     self.config.timeout, counted(len(self.pool.children), "processor"))
            self._notify.stopping()
            self.stop_deadline = self._clock.monotonic() + self.config.timeout
            self.pool.retire()
            self.scheduler.retire()
            self._next_beat = 0.0
        else:
            log.warning("Second stop signal: stopping now")
            self.stop_deadline = self._clock.monotonic()

    def on_quiet(self) -> None:
        """TSTP / USR1: no new jobs; running ones finish; keep beating with quiet true."""
        if self.quiet or self.stop_deadline is not None:
            log.info("Already quiet")
            return
        self.quiet = True
        self.scheduler.retire()
        count = self.pool.retire()
        log.info("Received TSTP, no longer accepting new work: %s their current "
                 "job and exit", counted(count, "processor finishes", "processors finish"))
        self._next_beat = 0.0

    def on_dump(self) -> None:
        """TTIN: log the master's stack and ask every child for its own."""
        for thread_id, frame in sys._current_frames().items():
            log.warning("TTIN: master thread %d\n%s", thread_id, logs.stack(frame),
                        extra=logs.MULTILINE)
        log.warning("TTIN: asking %s for their stacks",
                    counted(len(self.pool.children), "processor"))
        self.pool.signal_all(signal.SIGTTIN)
        self.scheduler.signal(signal.SIGTTIN)

    def on_reload(self) -> None:
        """HUP: re-read the configuration; apply it, or keep the old one if it is invalid."""
        if self.stop_deadline is not None:
            log.warning("stopping: reload ignored")
            return
        self._notify.reloading()
        try:
            self._apply(self._load_new())
        except ConfigError as exc:
            log.error("reload rejected, the running configuration stays: %s", exc)
        self._notify.ready(self._status_text())

    def on_reopen(self) -> None:
        """USR2: reopen the log file here and in every child."""
        if logs.reopen():
            log.info("log file reopened")
        self.pool.signal_all(signal.SIGUSR2)
        self.scheduler.signal(signal.SIGUSR2)

    def on_reap(self) -> None:
        """CHLD: reaping happens on every turn; the signal only wakes the loop."""

    # -- reload ------------------------------------------------------------------------------

    def _load_new(self) -> Config:
        if self._reload is None:
            raise ConfigError("this daemon was started without a way to reload its configuration")
        new = self._reload()
        cron.check_jobs(new, self.registry)
        return new

    def _apply(self, new: Config) -> None:
        merged, ignored = reload.merge(self.config, new)
        for name in ignored:
            log.warning("reload: %s changes only on restart; keeping %r", name,
                        getattr(self.config, name))
        diff = reload.changes(self.config, merged)
        if not diff:
            log.info("reload: no changes")
            return
        log.info("reload: %s", reload.describe(diff))
        old = self.config
        self.config = self.scheduler.config = merged
        self.pool.configure(merged)
        self._liveness.configure(merged)
        logs.set_level(merged.log_level)
        self._info = self._process_info()
        self._next_beat = 0.0
        if reload.needs_new_scheduler(diff):
            self.scheduler.retire()  # a new one starts with the new settings (or none)
        if reload.needs_new_children(diff):
            count = self.pool.retire()
            log.info("reload: replacing %s after their current job",
                     counted(count, "processor"))
        elif merged.concurrency < old.concurrency:
            self.pool.retire(range(merged.concurrency, old.concurrency))

    # -- heartbeats --------------------------------------------------------------------------

    def _watch(self, now: float) -> None:
        """Read the children's beats and judge them. Only this read pauses culling: while it
        fails the children cannot be judged (nor, most likely, write their beats), and once
        it succeeds again every child gets a full ``liveness_timeout``."""
        key = keys.beats(self.identity)
        beats = self._guarded(self.store.read_beats,
                              f"reading the children's beats ({key}); not culling processors "
                              "until it succeeds")
        if beats is None:
            self._beats_unread = True
            return
        if self._beats_unread:
            self._beats_unread = False
            self._fresh_window(now)
        self.pool.watch(beats, now)
        self.scheduler.watch(beats, now)
        if self._cancels_pending or not self._cancel_watch_fds():
            self._stop_cancelled()  # else a new request rings the cancel watch

    def _watch_interval(self) -> float:
        """How long until the children's beats are read again: :data:`WATCH_INTERVAL` while
        one runs a job (its ``job_timeout``, a cancellation's grace), a cancellation stands,
        or the cancel watch cannot be opened; else :data:`IDLE_WATCH_INTERVAL` (a job that
        starts is seen within it)."""
        if self.pool.busy_count() or self._cancels_pending or not self._cancel_watch_fds():
            return WATCH_INTERVAL
        return IDLE_WATCH_INTERVAL

    def _cancel_watch_fds(self) -> list[int]:
        # not guarded: it swallows its own Redis errors, so the guard would count every call
        # as a success and end (then restart) an outage each turn, logging both
        return self.store.cancel_watch_fds()

    def _stop_cancelled(self) -> None:
        """Kill the children running a job someone cancelled (:mod:`.cancels`)."""
        def stop() -> None:
            pending = self.store.pending_cancels(self._clock.time())
            self._cancels_pending = bool(pending)
            self.pool.stop_cancelled(pending)

        self._guarded(stop, f"looking for cancelled jobs ({keys.CANCELS})")

    def _check_stall(self, now: float, planned: float) -> None:
        """A turn that reaches this check more than STALL_SLACK later than its wait of
        ``planned`` seconds allows, counted from the previous turn's check, means this master
        was stopped (a SIGSTOP of its process group, a cgroup freeze, a paused VM) along
        with its children, in its wait or anywhere else since that check: their silence
        meanwhile is not theirs, so they get a fresh liveness window before they are judged.
        (A turn held up by Redis calls that time out counts too: the children cannot beat
        then either.)"""
        stalled = overslept(None if self._awake is None else self._awake + planned, now)
        self._awake = now
        if stalled:
            log.warning("the master was stalled for %.0fs (the daemon was stopped or frozen, or "
                        "Redis calls timed out): giving the processors a fresh liveness window",
                        stalled)
            self._fresh_window(now, stalled)

    def _beat(self) -> None:
        self._guarded(self._check_leader, "reading the leader")
        rss = self.pool.rss_kb() + _own_rss_kb()
        wrote = self._guarded(lambda: self.store.write_record(
            info=self._info, busy=self.pool.busy(),
            quiet=self.quiet or self.stop_deadline is not None, rss_kb=rss,
            concurrency=self.config.concurrency, failover=liveness.ttl(self.config)),
            "writing the process record")
        if wrote is None:
            return
        for key, error in wrote.refused:
            self._refused.report(key, "cannot write the process record to %r: %s", key, error)
        for key in set(self._refused.subjects) - {key for key, _ in wrote.refused}:
            self._refused.clear(key, "the process record is written to %r again", key)
        if wrote.signal:
            self._remote(wrote.signal)

    def _check_leader(self) -> None:
        """Show in the process info whether this daemon's scheduler leads. Not logged here:
        the master only looks at each beat (5 s), so its line would come late, even after the
        scheduler handed over; the scheduler child logs taking office, stepping down and
        handing over as they happen (:mod:`forkq.daemon.children.scheduler`)."""
        leader = self.store.leads()
        if leader != self._leader:
            self._leader = leader
            self._info = self._process_info()

    def _remote(self, name: str) -> None:
        if name not in REMOTE:
            log.warning("ignoring remote signal %r", name)
            return
        log.info("Received remote %s", name)
        self.dispatch(signal.Signals["SIG" + name])
        self._next_beat = 0.0

    def _guarded(self, step: Callable[[], T], name: str) -> T | None:
        """Run the Redis step ``name``; None on a Redis error (an outage is logged once, a
        refusal once a minute, by :class:`~forkq.daemon.outage.Outage`)."""
        return self._outage.guard(step, name=name)

    def _fresh_window(self, now: float, stalled: float = 0.0) -> None:
        """The children's beats could not be written or read meanwhile: judge them afresh
        (and a stall of ``stalled`` seconds does not count toward their jobs' timeouts)."""
        self.pool.trust_again(now, stalled)
        self.scheduler.trust_again(now)

    def _process_info(self) -> str:
        return heartbeats.process_info(self.config, self.identity, os.getpid(), self._started_at,
                                      leader=self._leader)

    # -- stopping ----------------------------------------------------------------------------

    def _continue_stop(self, now: float) -> None:
        assert self.stop_deadline is not None
        if (self.pool.children or self.scheduler.pid) and now >= self.stop_deadline:
            self._kill_remaining()
        if self.pool.children or self.scheduler.pid:
            return
        if self.pool.settle_all():
            self.done = True
        elif now >= self.stop_deadline + REQUEUE_GRACE:
            log.error("giving up requeueing %s: Redis unreachable", self.pool.pending())
            self.done = True

    def _kill_remaining(self) -> None:
        log.warning("Terminating %s", counted(len(self.pool.children), "busy processor"))
        for child in list(self.pool.children.values()):
            self.pool.kill(child, "exit", "still running at the stop deadline")
            self.pool.reap_now(child)
        if self.scheduler.pid:
            self.scheduler.kill("still running at the stop deadline")
            self.scheduler.reap(block=True)

    # -- reporting ---------------------------------------------------------------------------

    def _status_text(self) -> str:
        busy = f"{self.pool.busy_count()} of {self.config.concurrency} busy"
        return f"{busy}{self._state()}; queues {_queues(self.config)}"

    def _state(self) -> str:
        return " stopping" if self.stop_deadline is not None else " quiet" if self.quiet else ""

    def _report(self, now: float) -> None:
        """Process title, and systemd's READY, STATUS and WATCHDOG."""
        tag = f" {self.config.tag}" if self.config.tag else ""
        self._effects.title(f"forkq {__version__}{tag} [{self.pool.busy_count()} of "
                     f"{self.config.concurrency} busy]{self._state()}")
        status = self._status_text()
        if not self._ready_sent and self.pool.all_booted():
            self._ready_sent = True
            log.info("ready: %s fetching", counted(self.config.concurrency, "processor"))
            self._notify.ready(status)
        elif status != self._status:
            self._notify.status(status)
        self._status = status
        outage = self._beats_unread  # heartbeats unreadable: not the children's fault
        if self.stop_deadline is None and (self.quiet or outage or self.pool.healthy(now)):
            self._notify.watchdog(now)

    # -- embedded server ---------------------------------------------------------------------

    def _start_embedded(self) -> None:
        if self.config.redis_url != EMBEDDED:
            return
        self._embedded = EmbeddedServer(self.config.embedded_dir)
        self._embedded.start()
        log.info("embedded server running at %s", self._embedded.url)

    def _stop_embedded(self) -> None:
        if self._embedded is not None:
            self._embedded.stop()
            log.info("embedded server stopped")


def overslept(due: float | None, now: float, slack: float = STALL_SLACK) -> float:
    """How long past ``due`` (when the loop was to reach its stall check; None before the
    first) it reached it at ``now``, when that is more than ``slack`` seconds; else 0."""
    late = 0.0 if due is None else now - due
    return late if late > slack else 0.0


def _queues(config: Config) -> str:
    return ", ".join(f"{name}:{weight}" for name, weight in config.queues)


def _own_rss_kb() -> int:
    with contextlib.suppress(psutil.Error):
        return int(psutil.Process().memory_info().rss // 1024)
    return 0
