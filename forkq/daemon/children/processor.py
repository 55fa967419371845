"""The processor child: set up after fork, then each lane runs fetch → execute → acknowledge.

A processor has ``async_concurrency`` **lanes** (1 unless set higher). Each lane has an
in-flight list of its own (``forkq:inflight:<identity>:<pid>``, or ``…:<pid>-<lane>`` with
several lanes: :func:`forkq.keys.inflight_lanes`) and runs the same turn over it: settle the
last job and fetch the next in one round trip (fetch.lua), run it through the server
middleware, acknowledge it with the next fetch or file its failure; when a fetch finds
nothing, wait (:mod:`forkq.daemon.children.effects`: inside Redis for one queue, on the
daemon's one key watch for several). A processor of one lane runs it in its main thread;
one of several runs each lane in a thread, and its main thread waits for a stop. A coroutine
job (``async def``) runs on the child's event loop, so up to N of them progress at once.

Jobs sit in a lane's in-flight list from the moment they are fetched until they are
acknowledged, filed as a failure, given back, or requeued by the master after this child is
gone. A one-lane processor takes a batch from a deep queue (:class:`~.fetch.BatchSize`) and
holds the jobs behind the one it runs; how many of the batch completed is kept in the slot's
shared :class:`~.fetch.Progress`, so the master does not run them again. Held jobs go
back to their queue at a stop, at the master's death, or when the running job has run
:data:`HELD_WAIT_LIMIT` seconds.

Signals: the child ignores INT, TERM, TSTP and HUP (they reach it when sent to the whole
process group: a terminal's Ctrl-C, systemd's control-group kill); only the master stops it,
with USR1 = "finish the current jobs, then exit". A child whose master has died stops the
same way. TTIN (stack dump) and USR2 (reopen the log file) are served by the heartbeat
thread (:mod:`forkq.daemon.children.beat_thread`). A Redis outage is logged once, waited out
with backoff, and its recovery logged once; a finished job's acknowledgement is kept until
it succeeds.

Boot report: the child writes ``ready`` to ``report_fd`` after its first successful
registration in Redis, or ``error <reason>`` if its setup failed (it then exits with
:data:`~forkq.errors.EXIT_CHILD_BOOT`). The master counts boot failures and tells systemd
READY from these.

Recycling: after ``max_jobs`` jobs, or once its RSS (checked at most once a second, between
jobs) exceeds ``max_memory_mb``, the child exits 0 after its current jobs and the master
forks a fresh one.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import redis

from forkq import concurrency, groups, hooks, keys, limiter
from forkq import payload as payloads
from forkq.config import Config
from forkq.daemon import child_process
from forkq.daemon.children import coroutines, failures, job_run
from forkq.daemon.children.effects import Effects, RedisEffects
from forkq.daemon.children.fetch import BatchSize, Fetched, Progress, report_skipped
from forkq.daemon.outage import Outage
from forkq.daemon.refusal import Recurring, is_refusal
from forkq.daemon.watch_token import WatchToken
from forkq.errors import EXIT_CHILD_BOOT, JobError
from forkq.middleware import ServerChain
from forkq.registry import Registry

log = logging.getLogger(__name__)

MEMORY_CHECK_INTERVAL = 1.0
REFUSED_WAIT = 1.0  # between tries of a step Redis refused (a key of the wrong type, OOM)
HELD_WAIT_LIMIT = 5.0
"""Seconds a job may run before the jobs held behind it are given back to their queue (at
the next heartbeat turn, every ~2 s), so no job waits long behind one that turned out long."""


def backoff(exc: redis.RedisError, lasted: float) -> float:
    """Seconds to wait before trying a step again after ``exc``, an outage ``lasted`` seconds
    long: :data:`REFUSED_WAIT` for a refusal, else 0.1 s doubling up to 2 s."""
    if is_refusal(exc):
        return REFUSED_WAIT
    return min(0.1 * 2.0 ** min(int(lasted), 5), 2.0)


@dataclass
class Lane:
    """One lane: its jobs held (fetched, not started) and what it still owes Redis."""

    number: int
    sizes: BatchSize
    progress: Progress
    held: deque[Fetched] = field(default_factory=deque)
    ack: bytes | None = None  # the last completed job, acknowledged with the next fetch
    done: int = 0  # completed jobs at the head of the in-flight list, not acknowledged
    value: str = ""  # what the last completed job returned, for its workflow (JSON)
    failure: failures.Failure | None = None  # the last job's failure, to file
    failed_job: bytes = b""
    started: float = math.inf  # monotonic start of the running job (inf: none)
    # a fetch and a give-back of held jobs never interleave: a fetch hands out again the
    # jobs the in-flight list still holds, which a give-back is about to requeue
    exchange: threading.Lock = field(default_factory=threading.Lock)

    @property
    def owes(self) -> bool:
        return self.ack is not None or self.failure is not None


class Processor:
    """One processor child. The constructor only stores; :meth:`run` sets up after fork and
    does the work. The unit tier calls :meth:`start` with stand-in effects and drives
    :meth:`turn` step by step."""

    def __init__(self, config: Config, *, identity: str, slot: int, registry: Registry,
                 middleware: ServerChain, token: WatchToken | None = None,
                 report_fd: int | None = None, progress: Progress | None = None) -> None:
        self.config = config
        self.identity = identity
        self.slot = slot
        self.registry = registry
        self.middleware = middleware
        self.report_fd = report_fd
        self.stopping = False
        self._token = token or WatchToken()
        self._progress = progress or Progress()
        self._lock = threading.Lock()
        self._running: dict[int, dict[str, Any]] = {}  # lane -> its job (heartbeat entry)
        self._jobs_done = 0
        self._recycles = bool(config.max_jobs or config.max_memory_mb)
        self._memory_checked = 0.0
        self._outage = Outage(log)  # one report per outage, not one per lane
        self._skipped = Recurring(log)  # keys the fetches skip (a queue of another type)
        self._beat: Any = None
        self._threads: dict[int, threading.Thread] = {}

    @property
    def lane_count(self) -> int:
        return max(1, self.config.async_concurrency)

    # -- life ------------------------------------------------------------------------------

    def run(self) -> int:
        """Set up, run the lanes until told to stop, let them settle; the exit code."""
        try:
            effects = self._setup()
        except Exception as exc:
            log.exception("processor-%d failed to boot", self.slot)
            self._report(f"error {type(exc).__name__}: {exc}")
            return EXIT_CHILD_BOOT
        self.start(effects)
        while not self._registered:
            if self.effects.stop_requested():
                self._stop()
                break
            self._guarded(self._register)
        else:
            self._report("ready")
        if len(self.lanes) == 1:
            self.lane_loop(self.lanes[0])
        else:
            self._run_lanes()
        hooks.run("child_exit")
        self._beat.stop()
        effects.close()
        self._loop.close()
        return 0

    def start(self, effects: Effects) -> None:
        """Take the effects and make the lanes (after :meth:`_setup`, or in a unit test)."""
        self.effects = effects
        one = self.lane_count == 1
        batch = self.config.fetch_batch if one else 1
        self.lanes = [Lane(number, BatchSize(batch), self._progress if one else Progress())
                      for number in range(self.lane_count)]
        self._registered = False

    def _setup(self) -> RedisEffects:
        basics = child_process.setup(self.config, identity=self.identity, role=self._role,
                                     state="idle")
        self._beat = basics.beat
        self._beat.follow_job_in_title(
            lambda state: child_process.set_title(self.config, self._role, state))
        random.seed()
        pid = os.getpid()
        limiter.set_holder(f"{self.identity}:{pid}")  # freed by the master if this dies
        one = self.lane_count == 1
        lane_keys = ([keys.inflight(self.identity, pid)] if one else
                     list(keys.inflight_lanes(self.identity, pid, self.lane_count)))
        self._loop = coroutines.EventLoop() if one else coroutines.LoopThread()
        runs = job_run.Runs(self.registry, self.middleware, self._loop.run,
                            max_retries=self.config.max_retries,
                            job_timeout=self.config.job_timeout, rng=random.Random(),
                            redis=basics.redis, metrics=self._beat.metrics)
        effects = RedisEffects(self.config, basics, lane_keys=lane_keys, runs=runs,
                               shows=[self._show_for(lane) for lane in range(self.lane_count)],
                               token=self._token,
                               batch=self.config.fetch_batch if one else 1,
                               spread=self.config.concurrency if one else 1)
        basics.pipe.on_signal = self._beat.wake
        self._beat.on_turn = self._on_beat_turn
        self._beat.held_jids = self._held_jids
        if not one:
            self._beat.lanes = self._lanes_doing
        hooks.run("child_boot", strict=True)
        return effects

    def _report(self, message: str) -> None:
        """Tell the master how the boot went (once), then close the report pipe."""
        if self.report_fd is not None:
            child_process.report(self.report_fd, message)
            self.report_fd = None

    def _register(self) -> None:
        self.effects.register()
        self._registered = True

    def _run_lanes(self) -> None:
        """Several lanes: each in a thread; the main thread waits for a stop, then wakes
        them and waits for each to settle what it owes."""
        for lane in self.lanes:
            self._threads[lane.number] = threading.Thread(
                target=self.lane_loop, args=(lane,), daemon=True,
                name=f"forkq-lane-{lane.number}")
        for thread in self._threads.values():
            thread.start()
        while not self.stopping:
            if self.effects.stop_requested(timeout=2.0):
                self._stop()
        for thread in self._threads.values():
            thread.join()

    def _stop(self) -> None:
        self.stopping = True
        self.effects.wake_lanes()

    # -- a lane ----------------------------------------------------------------------------

    def lane_loop(self, lane: Lane) -> None:
        """Turns until the child stops; then give back what the lane holds and settle what
        it owes (retried through an outage)."""
        one = len(self.lanes) == 1
        while not self.stopping:
            if one and self.effects.stop_requested():
                self._stop()
                break
            self._guarded(self.turn, lane)
        self.give_back_held(lane)
        while lane.owes:
            self._guarded(self._settle_last, lane)

    def turn(self, lane: Lane) -> None:
        """One turn of a lane: file the last failure; run a held job, or settle the last job
        and fetch the next in one round trip, or wait for work."""
        if lane.failure is not None:
            self._file_failure(lane)
        elif lane.value and lane.held:  # a workflow takes its value now, not after the batch
            self._settle(lane, fetch=False)
            self._restart_progress(lane)
        with self._lock:  # the heartbeat thread may be giving the held jobs back
            fetched = lane.held.popleft() if lane.held else None
        if fetched is None:
            fetched = self._settle(lane, fetch=not self.stopping)
        if fetched is None and not self.stopping:
            fetched = self._idle(lane)
        if fetched is not None:
            self._execute(lane, fetched)

    def _settle(self, lane: Lane, *, fetch: bool) -> Fetched | None:
        """Acknowledge the lane's completed jobs and/or fetch: the first job fetched (the
        others of a batch are held, to run next)."""
        if not fetch and lane.ack is None:
            return None
        with lane.exchange:
            found = self.effects.fetch(lane.number, ack=lane.ack, acked=max(lane.done, 1),
                                       fetch=fetch, take=lane.sizes.size(), value=lane.value)
            lane.ack, lane.done, lane.value = None, 0, ""
            if found.jobs:
                lane.progress.start(found.jobs[0].raw)
                with self._lock:
                    lane.held.extend(found.jobs[1:])
        with self._lock:
            report_skipped(self._skipped, found)
        if not found.jobs:
            return None
        self.effects.busy(lane.number)
        return found.jobs[0]

    def _idle(self, lane: Lane) -> Fetched | None:
        """Wait for work: the job a blocking move brought, or None to fetch again."""
        fetched = self.effects.idle(lane.number)
        if fetched is None:
            return None
        if ((concurrency.MARKER in fetched.raw or groups.MARKER in fetched.raw)
                and not self.effects.admit(lane.number, fetched)):
            return None  # its concurrency slots are all taken: it waits in its line
        self.effects.busy(lane.number)
        lane.progress.start(fetched.raw)
        return fetched

    def _execute(self, lane: Lane, fetched: Fetched) -> None:
        lane.started = started = self.effects.monotonic()
        outcome = self.effects.run(lane.number, fetched)
        lane.started = math.inf
        lane.sizes.ran(self.effects.monotonic() - started)
        if isinstance(outcome, failures.Failure):  # filed at the next turn
            lane.failed_job, lane.failure = fetched.raw, outcome
        else:
            lane.ack = fetched.raw  # Redis hears of it with the next fetch
            lane.done += 1
            if outcome is None:
                lane.progress.completed(lane.done)  # where the master reads it (no syscall)
            else:  # not told to the master, who would acknowledge it without its value:
                lane.value = outcome.value  # it runs again if this child dies before then
        if self._recycles:
            self._count_job()

    def _file_failure(self, lane: Lane) -> None:
        """File the failure planned for the lane's last job, after acknowledging the jobs of
        the batch that completed before it (fail.lua releases the first pair of the list)."""
        assert lane.failure is not None
        self._settle(lane, fetch=False)
        if not self.effects.file(lane.number, lane.failure, lane.failed_job):
            log.warning("not filing the failure: the job was recovered while this "
                        "process was cut off from Redis, and is queued again")
        lane.failure = None
        self._restart_progress(lane)

    def _restart_progress(self, lane: Lane) -> None:
        """The lane's acknowledged jobs left its list: its progress starts at the next held."""
        with self._lock:
            lane.progress.start(lane.held[0].raw if lane.held else b"")

    def _settle_last(self, lane: Lane) -> None:
        """At exit: file the last failure, acknowledge what completed."""
        if lane.failure is not None:
            self._file_failure(lane)
        self._settle(lane, fetch=False)

    def give_back_held(self, lane: Lane, why: str = "") -> None:
        """Give back at once the lane's jobs held without being started (a stop, the
        master's death, or a running job past :data:`HELD_WAIT_LIMIT`): from the lane's
        thread between jobs, or from the heartbeat thread while a job runs. If Redis refuses
        or is away, the master gives them back when this child has exited (the jobs are
        dropped from this child's hands either way)."""
        with lane.exchange:
            with self._lock:
                held, lane.held = list(lane.held), deque()
            if not held:
                return
            try:
                given = self.effects.give_back(lane.number, [job.raw for job in held])
            except redis.RedisError as exc:
                log.warning("could not give back %d held jobs now (%s); they go back when "
                            "this processor exits", len(held), exc)
                return
        log.info("gave back %d held jobs not started%s", given, why)

    def _on_beat_turn(self) -> None:
        """In the heartbeat thread: a stop request or the master's death gives back the held
        jobs at once, though a lane may be running a job for a long time; so does a job
        running longer than :data:`HELD_WAIT_LIMIT` (the jobs behind it run elsewhere)."""
        stop = self.effects.stop_pending()
        now = self.effects.monotonic()
        for lane in self.lanes:
            running = now - lane.started
            if stop:
                self.give_back_held(lane)
            elif lane.held and running >= HELD_WAIT_LIMIT:
                self.give_back_held(lane, f" (the job running has run for {running:.0f} s)")

    def _guarded(self, step: Callable[..., None], *args: Any) -> None:
        """Run a step; on a Redis error, log it (an outage once, a refusal once a minute) and
        back off, interruptibly. A step that fails keeps what it held (the job to file or to
        acknowledge), so the next turn tries it again."""
        try:
            step(*args)
        except redis.RedisError as exc:
            with self._lock:
                lasted = self._outage.failed(exc, "this processor's step")
            self.effects.rest(backoff(exc, lasted))
            return
        if self._outage.since is not None:  # an attribute read per turn; the lock only now
            with self._lock:
                self._outage.succeeded()

    # -- what the heartbeat shows ----------------------------------------------------------

    def _show_for(self, lane: int) -> job_run.Show:
        """What tells the heartbeat the job ``lane`` runs (or None): a processor of one lane
        sets the heartbeat's ``job`` (a ``setattr``: no Python frame, twice per job); one of
        several keeps it on the longest-running job of its lanes (:meth:`_show`)."""
        if self.lane_count == 1:
            return functools.partial(setattr, self._beat, "job")
        return functools.partial(self._show, lane)

    def _show(self, lane: int, job: dict[str, Any] | None) -> None:
        """Keep the heartbeat's ``job`` on the longest-running job of the lanes (the one a
        ``job_timeout`` is judged by)."""
        with self._lock:
            if job is None:
                self._running.pop(lane, None)
            else:
                self._running[lane] = job
            self._beat.job = min(self._running.values(),
                                 key=lambda entry: entry["started"], default=None)

    def _held_jids(self) -> list[str]:
        """The jids of the jobs held, not started (for the TTIN dump)."""
        with self._lock:
            held = [job for lane in self.lanes for job in lane.held]
        return [_jid_of(job.raw) for job in held]

    def _lanes_doing(self) -> list[tuple[str, int]]:
        """For the TTIN dump (heartbeat thread): what each busy lane runs, and its thread."""
        with self._lock:
            running = dict(self._running)
        now = time.time()
        return [(f"lane {lane} running {job['class']} jid={job['jid']} from queue "
                 f"{job['queue']} for {now - job['started']:.1f}s",
                 self._threads[lane].ident or 0) for lane, job in sorted(running.items())
                ] or [("idle: no lane runs a job", threading.main_thread().ident or 0)]

    # -- recycling -------------------------------------------------------------------------

    def _count_job(self) -> None:
        """After a job, with ``max_jobs`` or ``max_memory_mb`` set: stop after ``max_jobs``
        jobs or above ``max_memory_mb``."""
        with self._lock:
            self._jobs_done += 1
            done = self._jobs_done
        if self.config.max_jobs and done >= self.config.max_jobs and not self.stopping:
            log.info("recycling after %d jobs (max_jobs)", done)
            self._stop()
        if self.config.max_memory_mb and not self.stopping and self._memory_due():
            rss_mb = psutil.Process().memory_info().rss / 2**20
            if rss_mb > self.config.max_memory_mb:
                log.info("recycling at %.0f MB RSS (max_memory_mb %d)", rss_mb,
                         self.config.max_memory_mb)
                self._stop()

    def _memory_due(self) -> bool:
        now = self.effects.monotonic()
        with self._lock:
            if now - self._memory_checked < MEMORY_CHECK_INTERVAL:
                return False
            self._memory_checked = now
        return True

    @property
    def _role(self) -> str:
        return f"processor-{self.slot}"


def _jid_of(raw: bytes) -> str:
    try:
        return payloads.jid(payloads.decode(raw))
    except JobError:
        return "?"
