"""A processor child that runs up to ``async_concurrency`` jobs at once (setting > 1).

Each of its N **lanes** is a thread with an in-flight list of its own,
``forkq:inflight:<identity>:<pid>-<lane>`` (:func:`forkq.keys.inflight_lanes`), and runs the
one-job cycle of a plain processor over it: fetch one job (fetch.lua, which also
acknowledges the lane's last job), run it through the server middleware, acknowledge or
file its failure. A coroutine job (``async def``) runs on the child's one event loop
(:class:`~forkq.daemon.children.coroutines.LoopThread`) while its lane waits for it, so up
to N coroutine jobs progress at once in one process; a plain job runs in its lane's thread
(as in Sidekiq's threads: concurrent, one Python thread at a time).

Delivery is what it is for one job: every job this child runs sits in its lane's list from
fetch to acknowledgement. A killed child gives back every job it held: the master settles
each lane's list as it settles a one-job child's (``dead_child``: the job is requeued and,
after a crash, its death counted — each job that was running counts, since any of them may
have killed the process), as does the scheduler leader for a dead daemon.

The main thread coordinates: it waits on the queue watch (a push to any watched queue) and
the stop signal, and rings the :class:`Doorbell` on a push or every ``IDLE_WAIT`` seconds; a
ring wakes one idle lane, which fetches and, when it got a job, rings again, so a burst of
jobs fills the lanes one by one and an empty queue costs one fetch. A stop (USR1, the
master's death, ``max_jobs``, ``max_memory_mb``) lets every lane finish its job and
acknowledge it; nothing new is fetched.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil
import redis

from forkq import hooks, keys
from forkq.config import Config
from forkq.daemon import child_process
from forkq.daemon.children import coroutines, failures, job_run
from forkq.daemon.children.fetch import Fetcher, report_skipped
from forkq.daemon.children.queuewatch import QUEUE_WATCH, QueueWatch
from forkq.daemon.outage import Outage
from forkq.daemon.refusal import Recurring, is_refusal
from forkq.errors import EXIT_CHILD_BOOT
from forkq.middleware import ServerChain
from forkq.registry import Registry

log = logging.getLogger(__name__)

IDLE_WAIT = 2.0
MEMORY_CHECK_INTERVAL = 1.0
REFUSED_WAIT = 1.0


class Doorbell:
    """Wakes one idle lane per ring. A ring while no lane waits is kept (one at most), so a
    push that lands between a lane's empty fetch and its wait is not missed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rung = False
        self._closed = False

    def ring(self) -> None:
        """Wake one waiting lane, or the next one to wait."""
        with self._cond:
            self._rung = True
            self._cond.notify()

    def wait(self) -> bool:
        """Wait for a ring; False once closed (the child stops)."""
        with self._cond:
            while not self._rung and not self._closed:
                self._cond.wait()
            self._rung = False
            return not self._closed

    def close(self) -> None:
        """Wake every lane for good."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


@dataclass
class Lane:
    """One lane's in-flight list and what it still owes Redis about its last job."""

    number: int
    key: str
    fetcher: Fetcher
    ack: bytes | None = None  # the last completed job, acknowledged with the next fetch
    failure: failures.Failure | None = None  # the last job's failure, to file
    failed_job: bytes = b""

    @property
    def owes(self) -> bool:
        return self.ack is not None or self.failure is not None


class Lanes:
    """A processor child of ``config.async_concurrency`` lanes. The constructor only stores;
    :meth:`run` does the work after fork. Same boot report and exit codes as
    :class:`~forkq.daemon.children.processor.Processor`."""

    def __init__(self, config: Config, *, identity: str, slot: int, registry: Registry,
                 middleware: ServerChain, report_fd: int | None = None) -> None:
        self.config = config
        self.identity = identity
        self.slot = slot
        self.registry = registry
        self.middleware = middleware
        self.report_fd = report_fd
        self.stopping = False
        self._running: dict[int, dict[str, Any]] = {}  # lane -> its job (heartbeat entry)
        self._lock = threading.Lock()
        self._jobs_done = 0
        self._memory_checked = 0.0
        self._outage = Outage(log)  # one report per outage, not one per lane
        self._skipped = Recurring(log)  # keys the fetches skip (a queue of another type)

    def run(self) -> int:
        """Set up, run the lanes until told to stop, let them settle; the exit code."""
        try:
            self._setup()
        except Exception as exc:
            log.exception("processor-%d failed to boot", self.slot)
            if self.report_fd is not None:
                child_process.report(self.report_fd, f"error {type(exc).__name__}: {exc}")
            return EXIT_CHILD_BOOT
        self._register()
        threads = [threading.Thread(target=self._lane_loop, args=(lane,), daemon=True,
                                    name=f"forkq-lane-{lane.number}") for lane in self._lanes]
        self._threads = {lane.number: thread for lane, thread in zip(self._lanes, threads,
                                                                     strict=True)}
        self._beat.lanes = self._lanes_doing  # before any lane runs a job: a TTIN meanwhile
        for thread in threads:              # dumps the lanes, not the starting main thread
            thread.start()
        while not self.stopping:
            self._coordinate()
        self._doorbell.close()
        for thread in threads:
            thread.join()
        hooks.run("child_exit")
        self._beat.stop()
        self._watch.close()
        self._loop.close()
        for lane in self._lanes:
            lane.fetcher.close()
        return 0

    def _setup(self) -> None:
        basics = child_process.setup(self.config, identity=self.identity, role=self._role,
                                     state="idle")
        self.master_pid, self._pipe, self.redis = basics.master_pid, basics.pipe, basics.redis
        self._beat = basics.beat
        self._stop_check = basics.stop_check()
        self._beat.follow_job_in_title(
            lambda state: child_process.set_title(self.config, self._role, state))
        random.seed()
        pid = os.getpid()
        self._lanes = [
            Lane(number, key, Fetcher(self.redis, key, queues=self.config.queues,
                                      strict=self.config.strict, rng=random.Random()))
            for number, key in enumerate(keys.inflight_lanes(self.identity, pid,
                                                             self.config.async_concurrency))]
        self._doorbell = Doorbell()
        self._watch = QueueWatch(self.redis, prefixes=QUEUE_WATCH)
        self._loop = coroutines.LoopThread()
        self._runs = job_run.Runs(self.registry, self.middleware, self._loop.run,
                                  max_retries=self.config.max_retries,
                                  job_timeout=self.config.job_timeout, rng=random.Random(),
                                  redis=self.redis, metrics=self._beat.metrics)
        hooks.run("child_boot", strict=True)

    def _register(self) -> None:
        """List the lanes' in-flight keys in the registry and arm the queue watch (retried
        through an outage), then report ready. fetch.lua registers a lane's list again
        with every job it moves in."""
        outage = Outage(log)
        while not self.stopping:
            try:
                self._register_lists()
                self._watch.open()
            except redis.RedisError as exc:
                lasted = outage.failed(exc, "registering this processor's lanes")
                self._stop_if_told(self._pipe.wait(min(0.1 * 2 ** min(int(lasted), 5), 2.0))[0])
                continue
            outage.succeeded()
            break
        if self.report_fd is not None:
            child_process.report(self.report_fd, "ready")

    def _register_lists(self) -> None:
        """SADD the lanes' lists to the registry; a refusal (another type, maxmemory) is
        logged and does not keep the lanes from fetching (fetches register them again)."""
        try:
            self.redis.sadd(keys.INFLIGHT_REGISTRY, *(lane.key for lane in self._lanes))
        except redis.ResponseError as exc:
            log.warning("registering the lanes' in-flight lists refused (fetches register "
                        "them): %s", exc)
            self.report_fd = None

    # -- the main thread ---------------------------------------------------------------------

    def _coordinate(self) -> None:
        """One wait of the main thread: a stop signal, or a push (or the poll interval) that
        rings for an idle lane."""
        if self._watch.wait(IDLE_WAIT, self._pipe.fd):
            self._stop_if_told(self._pipe.drain())
        else:
            self._stop_if_told([])
            self._doorbell.ring()

    def _stop_if_told(self, received: list[Any]) -> None:
        if self._stop_check.told(received):
            self.stopping = True

    # -- a lane's thread ---------------------------------------------------------------------

    def _lane_loop(self, lane: Lane) -> None:
        """Fetch, run, acknowledge until the child stops; then settle what the lane owes."""
        while not self.stopping:
            self._guarded(lane, self._turn)
        while lane.owes:
            self._guarded(lane, self._settle)

    def _turn(self, lane: Lane) -> None:
        """Settle the last job and fetch the next in one round trip; run it, or wait."""
        self._file(lane)
        found = lane.fetcher.ack_and_fetch(ack=lane.ack, fetch=not self.stopping)
        lane.ack = None
        with self._lock:
            report_skipped(self._skipped, found)
        if not found.jobs:
            if not self.stopping:
                self._doorbell.wait()
            return
        self._doorbell.ring()  # another idle lane looks for the next job
        fetched = found.jobs[0]
        failure = job_run.run(fetched, self._runs, lambda job: self._show(lane.number, job))
        if failure is None:
            lane.ack = fetched.raw
        else:
            lane.failure, lane.failed_job = failure, fetched.raw
        self._count_job()

    def _settle(self, lane: Lane) -> None:
        """At exit: file the last failure, or acknowledge the last job."""
        self._file(lane)
        if lane.ack is not None:
            lane.fetcher.ack_and_fetch(ack=lane.ack, fetch=False)
            lane.ack = None

    def _file(self, lane: Lane) -> None:
        if lane.failure is None:
            return
        if not failures.file(self.redis, lane.key, lane.failure, held=lane.failed_job):
            log.warning("not filing the failure: the job was recovered while this "
                        "process was cut off from Redis, and is queued again")
        lane.failure = None

    def _guarded(self, lane: Lane, step: Any) -> None:
        """Run a lane's step; on a Redis error, log it (once per outage) and back off. The
        lane keeps what it owes (a failure to file, a job to acknowledge) for the next try."""
        try:
            step(lane)
        except redis.RedisError as exc:
            with self._lock:
                lasted = self._outage.failed(exc, "this processor's lanes")
            time.sleep(REFUSED_WAIT if is_refusal(exc) else min(0.1 * 2 ** min(int(lasted), 5),
                                                                 2.0))
            return
        with self._lock:
            self._outage.succeeded()

    def _show(self, lane: int, job: dict[str, Any] | None) -> None:
        """Keep the heartbeat's ``job`` on the longest-running job of the lanes (the one a
        ``job_timeout`` is judged by)."""
        with self._lock:
            if job is None:
                self._running.pop(lane, None)
            else:
                self._running[lane] = job
            self._beat.job = min(self._running.values(), key=lambda entry: entry["started"],
                                 default=None)

    def _lanes_doing(self) -> list[tuple[str, int]]:
        """For the TTIN dump (heartbeat thread): what each busy lane runs, and its thread."""
        with self._lock:
            running = dict(self._running)
        now = time.time()
        return [(f"lane {lane} running {job['class']} jid={job['jid']} from queue "
                 f"{job['queue']} for {now - job['started']:.1f}s",
                 self._threads[lane].ident or 0) for lane, job in sorted(running.items())
                ] or [("idle: no lane runs a job", threading.main_thread().ident or 0)]

    def _count_job(self) -> None:
        """After a job: stop after ``max_jobs`` jobs or above ``max_memory_mb``."""
        with self._lock:
            self._jobs_done += 1
            done = self._jobs_done
            now = time.monotonic()
            check = (self.config.max_memory_mb > 0
                     and now - self._memory_checked >= MEMORY_CHECK_INTERVAL)
            if check:
                self._memory_checked = now
        if self.config.max_jobs and done >= self.config.max_jobs and not self.stopping:
            log.info("recycling after %d jobs (max_jobs)", done)
            self.stopping = True
        if check:
            rss_mb = psutil.Process().memory_info().rss / 2**20
            if rss_mb > self.config.max_memory_mb and not self.stopping:
                log.info("recycling at %.0f MB RSS (max_memory_mb %d)", rss_mb,
                         self.config.max_memory_mb)
                self.stopping = True
        if self.stopping:
            self._doorbell.close()

    @property
    def _role(self) -> str:
        return f"processor-{self.slot}"
