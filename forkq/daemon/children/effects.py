"""The processor child's effects on the world, as the one collaborator it is given.

:class:`~forkq.daemon.children.processor.Processor` decides: what its lanes run next, when
held jobs go back, how long a lane backs off, when to stop. Every step it takes against
Redis, its signal pipe, the clock and the job's code goes through an :class:`Effects`.
:class:`RedisEffects` is the real one, built after the fork; the unit tier
(``tests/test_processor_loop.py``) drives the processor with a stand-in, without a fork or a
server. Lanes are named by their number (0 .. N-1).

The idle wait, the one wait path of a lane that found nothing:

- **one queue**: the fetch that found nothing *armed* the lane's in-flight list, and the
  lane waits inside Redis with a blocking move into it
  (:class:`~forkq.daemon.children.blocking_wait.BlockingWait`, :data:`BLOCK_WAIT` at a
  time): a push by any client is handed to exactly one waiting lane, and lands in its list
  in the same step. An idle lane costs Redis one command per :data:`BLOCK_WAIT`;
- **several queues**: the lane holding the daemon's :class:`~forkq.daemon.watch_token.WatchToken`
  waits on the child's key watch (:class:`~forkq.daemon.children.queuewatch.QueueWatch`);
  every other idle lane waits on the token's doorbell, and fetches when it takes the token
  or every :data:`IDLE_WAIT` seconds.

In a child of several lanes one idle lane listens (an in-process lock, taken at the fetch
that arms its list); its other idle lanes wait until it takes a job or :data:`IDLE_WAIT` has
passed, so a child holds one waiting connection, not one per lane. A lane that takes a job
wakes one idle lane of its child, so a burst fills the lanes one by one.

A stop wakes every wait: the signal pipe in a child of one lane (the lane is the main
thread), the lanes' wake pipe (:meth:`RedisEffects.wake_lanes`) in a child of several.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from typing import Protocol

import redis

from forkq import keys
from forkq.config import Config
from forkq.daemon import pipes
from forkq.daemon.child_process import Basics
from forkq.daemon.children import failures, job_run
from forkq.daemon.children.blocking_wait import WAKE, BlockingWait
from forkq.daemon.children.fetch import Fetch, Fetched, Fetcher
from forkq.daemon.children.queuewatch import QUEUE_WATCH, QueueWatch
from forkq.daemon.signals import STOP_SIGNAL
from forkq.daemon.watch_token import WatchToken
from forkq.scripts import script

log = logging.getLogger(__name__)

IDLE_WAIT = 2.0
"""Seconds an idle lane waits before it fetches again on its own (several queues, or a
queue it cannot wait on)."""
BLOCK_WAIT = 30
"""Seconds one blocking move waits. One that waited all of it changed nothing: the lane's
list is still armed and the move is sent again, with no fetch in between; a move that ends
earlier without a job (``CLIENT UNBLOCK`` by a pause, a connection closed by a take-back or
the server) is followed by a fetch, which sees the pause, the liveness key and the list."""


class Effects(Protocol):
    """What a processor does to the world."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""

    def register(self) -> None:
        """List the lanes' in-flight keys in the registry and arm the key watch (before the
        first fetch). Raises redis.RedisError (an outage: tried again)."""

    def fetch(self, lane: int, *, ack: bytes | None, acked: int, fetch: bool,
              take: int, value: str = "") -> Fetch:
        """Acknowledge the lane's first ``acked`` jobs (the last is ``ack``, which returned
        ``value`` for its workflow) and, with ``fetch``, take up to ``take`` jobs
        (:meth:`Fetcher.ack_and_fetch`)."""

    def run(self, lane: int, fetched: Fetched) -> failures.Failure | job_run.Completed | None:
        """Run a job through the server middleware; None (or what it returned, for its
        workflow) when it completed."""

    def file(self, lane: int, failure: failures.Failure, job: bytes) -> bool:
        """File a job's failure (retry, dead or drop); False when the job was no longer held."""

    def give_back(self, lane: int, jobs: list[bytes]) -> int:
        """Put held jobs, not started, back at the front of their queues; how many."""

    def admit(self, lane: int, fetched: Fetched) -> bool:
        """Take a concurrency slot for a job a blocking move brought (admit.lua): False when
        its slots are all taken (it went to its waiting line) or it is held no more."""

    def busy(self, lane: int) -> None:
        """The lane took a job: it stops listening (another idle lane listens instead)."""

    def idle(self, lane: int) -> Fetched | None:
        """Wait for work after a fetch found nothing: the job a blocking move brought into
        the lane's list, or None when it is time to fetch again (a change, a timeout, a
        stop)."""

    def rest(self, seconds: float) -> None:
        """Back off ``seconds`` (a Redis error); a stop ends it early."""

    def stop_requested(self, timeout: float = 0.0) -> bool:
        """Whether the child was told to stop (its stop signal: from the master, or from its
        heartbeat thread when the master is gone), waiting
        up to ``timeout`` for it. Reads the signal pipe only when a signal arrived."""

    def stop_pending(self) -> bool:
        """A stop signal not read yet, or the master is gone (from any thread, no read)."""

    def wake_lanes(self) -> None:
        """End every lane's wait (the child stops)."""

    def close(self) -> None:
        """Drop the connections (at exit)."""


class RedisEffects:
    """The real :class:`Effects` of one processor child, built after the fork."""

    def __init__(self, config: Config, basics: Basics, *, lane_keys: list[str],
                 runs: job_run.Runs, shows: list[job_run.Show], token: WatchToken, batch: int,
                 spread: int) -> None:
        self.redis = basics.redis
        self._pipe = basics.pipe
        self._master_pid = basics.master_pid
        self._told = False
        self._lane_keys = lane_keys
        self._runs = runs
        self._shows = shows  # per lane: tells the heartbeat the lane's job
        self._token = token
        owner = keys.inflight_owner(lane_keys[0]) or ""
        self._fetchers = [Fetcher(self.redis, key, queues=config.queues, strict=config.strict,
                                  rng=random.Random(), batch=batch, spread=spread,
                                  alive=keys.alive(owner))
                          for key in lane_keys]
        single = self._fetchers[0].single_queue
        self._single = keys.queue_name(single) if single else None
        self._blocking = [BlockingWait(self.redis, key, single) for key in lane_keys
                          ] if single else []
        self._armed = [False] * len(lane_keys)
        self._listener = threading.Lock()  # held by the idle lane of this child that listens
        self._listening = -1  # that lane
        self._idle_lanes = threading.Condition()  # the others wait on it
        self._stopped = False
        self._watch = QueueWatch(self.redis, prefixes=QUEUE_WATCH)
        self._giveback = script(self.redis, "giveback")
        self._admit = script(self.redis, "admit")
        self._one_lane = len(lane_keys) == 1  # the lane is the main thread: no lane pipe
        if self._one_lane:
            self._wake_fd, self._wake_write = self._pipe.fd, -1
        else:
            self._wake_fd, self._wake_write = pipes.pipe(nonblocking=True)

    monotonic = staticmethod(time.monotonic)  # no Python frame: called twice per job

    def register(self) -> None:
        try:
            self.redis.sadd(keys.INFLIGHT_REGISTRY, *self._lane_keys)
        except redis.ResponseError as exc:  # fetch.lua registers each list again
            log.warning("registering the in-flight lists refused (fetches register "
                        "them): %s", exc)
        if self._single is None:  # armed by the first lane to take the token
            self._watch.open()
            self._watch.pause()

    def fetch(self, lane: int, *, ack: bytes | None, acked: int, fetch: bool,
              take: int, value: str = "") -> Fetch:
        arm = fetch and self._single is not None and self._may_listen(lane)
        found = self._fetchers[lane].ack_and_fetch(ack=ack, fetch=fetch, arm=arm, acked=acked,
                                                   take=take, value=value)
        self._armed[lane] = arm and found.armed
        return found

    def run(self, lane: int, fetched: Fetched) -> failures.Failure | job_run.Completed | None:
        return job_run.run(fetched, self._runs, self._shows[lane])

    def file(self, lane: int, failure: failures.Failure, job: bytes) -> bool:
        return failures.file(self.redis, self._lane_keys[lane], failure, held=job)

    def give_back(self, lane: int, jobs: list[bytes]) -> int:
        return int(self._giveback(keys=[self._lane_keys[lane]], args=jobs))

    def admit(self, lane: int, fetched: Fetched) -> bool:
        return bool(self._admit(keys=[self._lane_keys[lane]], args=[fetched.raw]))

    def busy(self, lane: int) -> None:
        if self._single is None and self._token.held():
            self._watch.pause()
            self._token.release()
        if not self._one_lane:  # another idle lane of this child looks for the next job
            self._stop_listening(lane)

    def _may_listen(self, lane: int) -> bool:
        """Whether ``lane`` is (or now becomes) the one lane of this child that listens."""
        if self._one_lane or self._listening == lane:
            return True
        if not self._listener.acquire(blocking=False):
            return False
        self._listening = lane
        return True

    def _stop_listening(self, lane: int) -> None:
        """``lane`` no longer listens (it took a job, or its wait ended); an idle lane of
        this child is woken to fetch and listen in its place."""
        if self._listening == lane:
            self._listening = -1
            self._listener.release()
        with self._idle_lanes:
            self._idle_lanes.notify()

    def idle(self, lane: int) -> Fetched | None:
        if self._one_lane:
            return self._listen(lane)
        if not self._may_listen(lane):
            with self._idle_lanes:
                if not self._stopped:
                    self._idle_lanes.wait(IDLE_WAIT)
            return None
        try:
            return self._listen(lane)
        finally:
            self._stop_listening(lane)

    def _listen(self, lane: int) -> Fetched | None:
        """The lane's wait on Redis (see the module's doc)."""
        if self._single is None:
            self._watch_or_wait()
            return None
        if not self._armed[lane]:  # a queue key of another type, or a paused queue: poll
            self.rest(IDLE_WAIT)
            return None
        self._armed[lane] = False
        while True:
            began = time.monotonic()
            job = self._blocking[lane].wait(BLOCK_WAIT, self._wake_fd)
            if job is WAKE:
                self._woken()
            if job is not None or time.monotonic() - began < BLOCK_WAIT:
                break  # a job, a stop, or woken early (a pause, a take-back): fetch again
        return Fetched(self._single, job) if isinstance(job, bytes) else None

    def _watch_or_wait(self) -> None:
        """Several queues: the token holder waits on the key watch; the other idle lanes
        wait for the token, and return when they take it or after IDLE_WAIT seconds."""
        if self._token.take():
            if self._watch.wait(IDLE_WAIT, self._wake_fd):
                self._woken()
            return
        deadline = time.monotonic() + IDLE_WAIT
        while not self._told:
            if self._token.wait(deadline - time.monotonic(), self._wake_fd):
                self._woken()
            elif self._token.take():
                self._watch.arm()  # subscribed before the fetch that follows
                return
            if time.monotonic() >= deadline:
                return

    def _woken(self) -> None:
        """The wake fd became readable: in a child of one lane, read the signals."""
        if self._one_lane:
            self._told = self._told or STOP_SIGNAL in self._pipe.drain()

    def rest(self, seconds: float) -> None:
        if self._wake_fd in pipes.readable([self._wake_fd], seconds):
            self._woken()

    def stop_requested(self, timeout: float = 0.0) -> bool:
        if self._told:
            return True
        if timeout:
            received, _ = self._pipe.wait(timeout)
        elif self._pipe.pending:
            received = self._pipe.drain()
        else:
            return False
        self._told = STOP_SIGNAL in received
        return self._told

    def stop_pending(self) -> bool:
        return self._told or self._pipe.pending or os.getppid() != self._master_pid

    def wake_lanes(self) -> None:
        self._told = True
        if not self._one_lane:
            with contextlib.suppress(OSError):
                os.write(self._wake_write, b"!")
            with self._idle_lanes:
                self._stopped = True
                self._idle_lanes.notify_all()
        if self._single is None:
            self._token.release()

    def close(self) -> None:
        self._watch.close()
        self._token.release()
        for blocking in self._blocking:
            blocking.close()
        for fetcher in self._fetchers:
            fetcher.close()
