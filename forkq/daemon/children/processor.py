"""The processor child: set up after fork, then fetch → server middleware → execute → ack.

Runs one job at a time and holds one, or a batch from a deep queue. The jobs sit in this
child's in-flight list (``forkq:inflight:<identity>:<pid>``) from the moment they are fetched
until they are acknowledged (all of a batch together, folded into the next fetch: one round
trip per batch), filed as a failure, given back, or requeued by the master after this child
is gone. How many of the batch completed is kept in the slot's shared
:class:`~forkq.daemon.progress.Progress`, so the master does not run them again.

Signals: the child ignores INT, TERM, TSTP and HUP (they reach it when sent to
the whole process group: a terminal's Ctrl-C, systemd's control-group kill);
only the master stops it, with USR1 = "finish the current job, then exit". A
child whose master has died stops the same way. TTIN (stack dump) and USR2
(reopen the log file) are served by the heartbeat thread (:mod:`forkq.daemon.children.beat_thread`).
A Redis outage is logged once, waited out with backoff, and its recovery logged
once; a finished job's acknowledgement is kept until it succeeds.

A failed job is logged as one line (class, jid, time, error, where it goes) followed by
its traceback in Python's format, at WARNING when it will be retried and at ERROR when it
goes dead or is dropped (:data:`~forkq.daemon.children.job_run.FAILURE_LEVELS`).

Boot report: the child writes ``ready`` to ``report_fd`` after its first
successful registration in Redis, or ``error <reason>`` if its setup failed (it
then exits with :data:`~forkq.errors.EXIT_CHILD_BOOT`). The master counts boot
failures and tells systemd READY from these.

Recycling: after ``max_jobs`` jobs, or once its RSS (checked at most once a
second, between jobs) exceeds ``max_memory_mb``, the child exits 0 after its
current job and the master forks a fresh one.
"""

from __future__ import annotations

import logging
import math
import os
import random
import threading
import time
from collections import deque
from typing import Any

import psutil
import redis

from forkq import hooks, keys
from forkq import payload as payloads
from forkq.config import Config
from forkq.daemon import child_process
from forkq.daemon.children import coroutines, failures, job_run
from forkq.daemon.children.batch_size import BatchSize
from forkq.daemon.children.blocking_wait import WAKE, BlockingWait
from forkq.daemon.children.fetch import Fetched, Fetcher, report_skipped
from forkq.daemon.children.queuewatch import QUEUE_WATCH, QueueWatch
from forkq.daemon.outage import Outage
from forkq.daemon.progress import Progress
from forkq.daemon.refusal import Recurring, is_refusal
from forkq.daemon.seat import BLOCKING_SEATS, HOLD_LIMIT, Seat
from forkq.errors import EXIT_CHILD_BOOT, JobError
from forkq.middleware import ServerChain
from forkq.registry import Registry
from forkq.scripts import script

log = logging.getLogger(__name__)

IDLE_WAIT = 2.0
MEMORY_CHECK_INTERVAL = 1.0
REFUSED_WAIT = 1.0  # between tries of a step Redis refused (a key of the wrong type, OOM)
HELD_WAIT_LIMIT = 5.0
"""Seconds a job may run before the jobs held behind it are given back to their queue (at
the next heartbeat turn, every ~2 s), so no job waits long behind one that turned out long."""


class Processor:
    """One processor child. The constructor only stores; :meth:`run` does the work after fork."""

    def __init__(
        self,
        config: Config,
        *,
        identity: str,
        slot: int,
        registry: Registry,
        middleware: ServerChain,
        seat: Seat,
        report_fd: int | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.config = config
        self.report_fd = report_fd
        self.identity = identity
        self.slot = slot
        self.registry = registry
        self.middleware = middleware
        self.stopping = False
        self._ack_pending: bytes | None = None  # the last completed job, until acknowledged
        self._done = 0  # completed jobs at the head of the in-flight list, not acknowledged
        self.progress = progress or Progress()
        self._seat = seat  # shared with the daemon's other processors (the master's)
        self._failure: failures.Failure | None = None
        self._failed_job = b""  # the bytes of the job self._failure files
        self._outage = Outage(log)
        self._skipped = Recurring(log)
        self._jobs_done = 0
        self._memory_checked = 0.0

    def run(self) -> int:
        """Set up, loop until told to stop, settle the last job; the exit code."""
        try:
            self._setup()
        except Exception as exc:
            log.exception("processor-%d failed to boot", self.slot)
            self._report(f"error {type(exc).__name__}: {exc}")
            return EXIT_CHILD_BOOT
        while not self.stopping:
            self._guarded(self.loop_once)
        self._leave_seat()
        self._give_back_held()
        while self._ack_pending is not None or self._failure is not None:
            self._guarded(self._finish)
        hooks.run("child_exit")
        self._beat.stop()
        self._watch.close()
        self._fetcher.close()
        self._loop.close()
        if self._blocking is not None:
            self._blocking.close()
        return 0

    def _report(self, message: str) -> None:
        """Tell the master how the boot went (once), then close the report pipe."""
        if self.report_fd is not None:
            child_process.report(self.report_fd, message)
            self.report_fd = None

    def _setup(self) -> None:
        basics = child_process.setup(self.config, identity=self.identity, role=self._role,
                                     state="idle")
        self.master_pid, self._pipe, self.redis = basics.master_pid, basics.pipe, basics.redis
        self._beat = basics.beat
        self._stop_check = basics.stop_check()
        self._beat.follow_job_in_title(
            lambda state: child_process.set_title(self.config, self._role, state))
        random.seed()
        self._rng = random.Random()
        self.inflight_key = keys.inflight(self.identity, os.getpid())
        self._fetcher = Fetcher(
            self.redis,
            self.inflight_key,
            queues=self.config.queues,
            strict=self.config.strict,
            rng=self._rng,
            batch=self.config.fetch_batch,
            spread=self.config.concurrency,
        )
        self._sizes = BatchSize(self.config.fetch_batch)
        self._held: deque[Fetched] = deque()  # fetched with the running job, not started
        self._held_lock = threading.Lock()
        # a fetch and a give-back of held jobs never interleave: a fetch hands out again the
        # jobs the in-flight list still holds, which a give-back is about to requeue
        self._exchange = threading.Lock()
        self._job_started = math.inf  # monotonic start of the running job (inf: none)
        self._pipe.on_signal = self._beat.wake
        self._beat.on_turn = self._on_beat_turn
        self._beat.held_jids = self._held_jids
        single = self._fetcher.single_queue
        self._blocking = BlockingWait(self.redis, self.inflight_key, single) if single else None
        self._seat_count = BLOCKING_SEATS if single else 1  # how many idle processors listen
        self._single = keys.queue_name(single or "")  # the queue a blocking move takes from
        self._watch = QueueWatch(self.redis, prefixes=QUEUE_WATCH)
        self._loop = coroutines.EventLoop()
        self._runs = job_run.Runs(self.registry, self.middleware, self._loop.run,
                                  max_retries=self.config.max_retries,
                                  job_timeout=self.config.job_timeout, rng=self._rng,
                                  redis=self.redis, metrics=self._beat.metrics)
        self._armed = False
        self._registered = False
        hooks.run("child_boot", strict=True)

    def _register(self) -> None:
        """Before the first fetch: list our in-flight key in the registry, arm the queue watch.

        A refused registration (Redis at maxmemory with noeviction) does not keep the child
        from fetching: fetch.lua registers the list again with every job it moves in."""
        try:
            self.redis.sadd(keys.INFLIGHT_REGISTRY, self.inflight_key)
        except redis.ResponseError as exc:
            self._outage.refused(exc, "registering the in-flight list (fetches register it)")
        if self._blocking is None:
            self._watch.open()
            seats = self._seats
            if seats and not self._seat.take(seats):
                self._watch.pause()  # another processor listens (see _idle_watching)
        self._registered = True
        self._report("ready")

    def loop_once(self) -> None:
        """One turn: settle the last job and fetch the next in one round trip; run it or wait."""
        self._check_signals()
        if self.stopping:
            return
        if not self._registered:
            self._register()
        self._file_failure()
        fetched = self._take_held() or self._settle(fetch=True) or self._idle()
        if fetched is not None:
            self._execute(fetched)

    def _take_held(self) -> Fetched | None:
        """The next job of the batch fetched, if any is still held (not given back)."""
        with self._held_lock:
            return self._held.popleft() if self._held else None

    def _give_back_held(self, why: str = "") -> None:
        """Give back at once the jobs held without being started (a stop, quiet, the
        master's death, or a running job past :data:`HELD_WAIT_LIMIT`): from the main
        thread between jobs, or from the heartbeat thread while a job runs. If Redis refuses
        or is away, the master gives them back when this child has exited (the jobs are
        dropped from this child's hands either way)."""
        with self._exchange:
            with self._held_lock:
                held, self._held = list(self._held), deque()
            if not held:
                return
            try:
                given = script(self.redis, "giveback")(keys=[self.inflight_key],
                                                       args=[job.raw for job in held])
            except redis.RedisError as exc:
                log.warning("could not give back %d held jobs now (%s); they go back when "
                            "this processor exits", len(held), exc)
                return
        log.info("gave back %d held jobs not started%s", int(given), why)

    def _on_beat_turn(self) -> None:
        """In the heartbeat thread: a stop request or the master's death gives back the held
        jobs at once, though the main thread may be running a job for a long time; so does
        a job running longer than :data:`HELD_WAIT_LIMIT` (the jobs behind it run elsewhere).
        A job running longer than :data:`~forkq.daemon.seat.HOLD_LIMIT` on a processor that
        kept its seat hands the seat on (a parked processor listens in its place)."""
        if self._pipe.pending or os.getppid() != self.master_pid:
            self._give_back_held()
            return
        running = time.monotonic() - self._job_started
        if self._held and running >= HELD_WAIT_LIMIT:
            self._give_back_held(f" (the job running has run for {running:.0f} s)")
        if self._seats and running >= HOLD_LIMIT:
            # the job may end meanwhile and the main thread listen again with the seat: then
            # three listen until its next job, when it finds it has none (harmless)
            self._seat.hand_on()

    def _held_jids(self) -> list[str]:
        """The jids of the jobs held, not started (for the TTIN dump)."""
        with self._held_lock:
            held = list(self._held)
        return [_jid_of(job.raw) for job in held]

    def _finish(self) -> None:
        """At exit: acknowledge what completed, file the last failure."""
        self._file_failure()
        self._settle(fetch=False)

    def _file_failure(self) -> None:
        """File the failure planned for the last job, after acknowledging the jobs of the
        batch that completed before it (fail.lua releases the first pair of the list)."""
        if self._failure is None:
            return
        self._settle(fetch=False)
        if not failures.file(self.redis, self.inflight_key, self._failure,
                             held=self._failed_job):
            log.warning("not filing the failure: the job was recovered while this "
                        "process was cut off from Redis, and is queued again")
        self._failure = None
        with self._held_lock:
            self.progress.start(self._held[0].raw if self._held else b"")

    def _idle(self) -> Fetched | None:
        """Wait for work: the job a blocking move brought (single queue), or None when it is
        time to fetch again (a queue changed, a timeout, a signal)."""
        if self._blocking is not None:
            if not self._armed:  # a queue key of another type was skipped: poll
                self._stop_if_told(self._pipe.wait(IDLE_WAIT)[0])
                return None
            self._armed = False
            if not self._seated():
                return None
            self._seat.listen()
            job = self._blocking.wait(int(IDLE_WAIT), self._pipe.fd)
            if job is WAKE:
                self._stop_if_told(self._pipe.drain())
            if not isinstance(job, bytes):
                return None
            self._leave_seat(busy=True)
            self.progress.start(job)
            return Fetched(self._single, job)
        self._idle_watching()
        return None

    def _idle_watching(self) -> None:
        """Several queues: the seat holder waits on its key watch; the others park. Returns
        when it is time to fetch again."""
        if self._seated():
            self._seat.listen()
            if self._watch.wait(IDLE_WAIT, self._pipe.fd):
                self._stop_if_told(self._pipe.drain())
        elif self._seat.held:
            self._watch.arm()  # subscribed before the fetch that follows

    @property
    def _seats(self) -> int:
        """How many seats the idle processors of this daemon share now: 0 (every idle one
        listens) while there are no more processors than seats (the master says how many
        there are: a reload may change it)."""
        count = self._seat_count
        return count if self._seat.sharing > count else 0

    def _seated(self) -> bool:
        """True when this processor holds a seat (:mod:`forkq.daemon.seat`) and may listen
        now. Else it parks until it is rung, a signal arrives, or IDLE_WAIT has passed, takes
        a seat if one is free, and returns False: the caller fetches before it listens.
        Always True when there are no more processors than seats."""
        seats = self._seats
        if not seats:
            if self._seat.held:  # a reload left no more processors than seats
                self._seat.release(self._seat_count)
            return True
        if self._seat.take(seats):
            return True
        self._seat.park(self.slot)
        try:
            if self._seat.take(seats):  # a holder left between the two tries
                return True
            if self._seat.wait(self.slot, IDLE_WAIT, self._pipe.fd) == "woken":
                self._stop_if_told(self._pipe.drain())
            self._seat.take(seats)
        finally:
            self._seat.leave(self.slot)
        return False

    def _leave_seat(self, *, busy: bool = False) -> None:
        """Stop listening (``busy``: to run a job; else stopping, or backing off after an
        error): pause the key watch, so no invalidations pile up for a connection nobody
        reads, and give up the seat, unless it is ``busy`` and another holder listens (it
        listens again after the job, see :meth:`Seat.busy`); if no one listens now, a
        parked processor is rung."""
        if self._blocking is None:
            self._watch.pause()
        seats = self._seats
        if seats:
            if busy:
                self._seat.busy(seats)
            else:
                self._seat.release(seats)

    def _settle(self, *, fetch: bool) -> Fetched | None:
        """Acknowledge the last job and/or fetch: the first job fetched (the others of a
        batch are held, to run next)."""
        if not fetch and self._ack_pending is None:
            return None
        arm = fetch and self._blocking is not None
        with self._exchange:
            found = self._fetcher.ack_and_fetch(ack=self._ack_pending, fetch=fetch, arm=arm,
                                                acked=max(self._done, 1),
                                                take=self._sizes.size())
            self._ack_pending, self._done = None, 0
            if found.jobs:
                self.progress.start(found.jobs[0].raw)
                with self._held_lock:
                    self._held.extend(found.jobs[1:])
        report_skipped(self._skipped, found)
        self._armed = arm and found.armed
        if not found.jobs:
            return None
        self._leave_seat(busy=True)
        return found.jobs[0]

    def _execute(self, fetched: Fetched) -> None:
        self._job_started = started = time.monotonic()
        failure = job_run.run(fetched, self._runs, self._show)
        self._job_started = math.inf
        self._sizes.ran(time.monotonic() - started)
        if failure is None:
            self._acknowledge(fetched.raw)
        else:  # filed at the next settle
            self._failed_job, self._failure = fetched.raw, failure
        self._jobs_done += 1
        self._check_recycle()

    def _show(self, job: dict[str, Any] | None) -> None:
        self._beat.job = job

    def _acknowledge(self, raw: bytes) -> None:
        """Count the job completed where the master can read it (no system call, no round
        trip); Redis hears of it with the next fetch."""
        self._ack_pending = raw
        self._done += 1
        self.progress.completed(self._done)

    def _check_recycle(self) -> None:
        """Between jobs: stop after ``max_jobs`` jobs or above ``max_memory_mb``."""
        if self.config.max_jobs and self._jobs_done >= self.config.max_jobs:
            log.info("recycling after %d jobs (max_jobs)", self._jobs_done)
            self.stopping = True
            return
        now = time.monotonic()
        if not self.config.max_memory_mb or now - self._memory_checked < MEMORY_CHECK_INTERVAL:
            return
        self._memory_checked = now
        rss_mb = psutil.Process().memory_info().rss / 2**20
        if rss_mb > self.config.max_memory_mb:
            log.info("recycling at %.0f MB RSS (max_memory_mb %d)", rss_mb,
                     self.config.max_memory_mb)
            self.stopping = True

    def _check_signals(self) -> None:
        """Act on a stop request: read the pipe only when a watched signal arrived (a
        system call per job costs throughput), and the master at most twice a second."""
        self._stop_if_told(self._pipe.drain() if self._pipe.pending else [])

    def _stop_if_told(self, received: list[Any]) -> None:
        if self._stop_check.told(received):
            self.stopping = True

    def _guarded(self, step: Any) -> None:
        """Run a step; on a Redis error, log it (an outage once, a refusal once a minute) and
        back off, interruptibly. A step that fails keeps what it held (the job to file or to
        acknowledge), so the next turn tries it again."""
        try:
            step()
        except redis.RedisError as exc:
            self._leave_seat()  # not listening while it backs off: another processor will
            lasted = self._outage.failed(exc, "this processor's step")
            backoff = REFUSED_WAIT if is_refusal(exc) else min(0.1 * 2 ** min(int(lasted), 5),
                                                                2.0)
            self._stop_if_told(self._pipe.wait(backoff)[0])
            return
        self._outage.succeeded()

    @property
    def _role(self) -> str:
        return f"processor-{self.slot}"


def _jid_of(raw: bytes) -> str:
    try:
        return payloads.jid(payloads.decode(raw))
    except JobError:
        return "?"

