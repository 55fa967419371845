"""The master: fork processor children, reap, respawn, stop. One loop, one signal table.

Loop, in a fixed order: wait on the self-pipe (≤ 1 s) → act on the signals
received (:data:`ACTIONS`) → reap → stop or top up. The master never runs a job
and never blocks on a child.

No loss: when a child is gone (exit, crash, SIGKILL) its in-flight job is put
back at the front of its queue *before* a replacement is forked; if Redis is
unreachable at that moment the slot waits until the requeue succeeds.

Stopping (TERM / INT): children get USR1 (finish the current job, then exit)
and the master waits until ``timeout`` after the signal. Children still running
then are killed, reaped, and their jobs pushed back, unchanged, to the front of
their queues; then the embedded server, if any, is stopped and the master exits
0. A second TERM / INT goes straight to that last step.

Keys: ``forkq:inflight:<identity>:<pid>`` and ``forkq:inflight`` (via
:func:`forkq.fetch.requeue`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Final

import redis
from setproctitle import setproctitle

from forkq import __version__, fetch, keys
from forkq.config import Config
from forkq.connection import EMBEDDED, connect
from forkq.embedded import EmbeddedServer
from forkq.errors import EXIT_CHILD_BOOT, EXIT_OK
from forkq.processor import STOP_SIGNAL, Processor, ServerChain
from forkq.registry import Registry
from forkq.signals import SelfPipe

log = logging.getLogger(__name__)

LOOP_WAIT = 1.0
QUICK_DEATH = 5.0  # a child that dies sooner than this counts toward its slot's backoff
MAX_BACKOFF = 30.0

ACTIONS: Final[dict[signal.Signals, str]] = {
    signal.SIGTERM: "stop",
    signal.SIGINT: "stop",
    signal.SIGCHLD: "reap",
}
"""Signal → name of the Supervisor method (``on_<name>``) that handles it."""


def new_identity(pid: int | None = None) -> str:
    """Sidekiq's process identity: ``<hostname>:<pid>:<12 lowercase hex>``."""
    host = os.environ.get("DYNO") or socket.gethostname()
    return f"{host}:{os.getpid() if pid is None else pid}:{secrets.token_hex(6)}"


@dataclass
class Child:
    """A forked processor."""

    pid: int
    slot: int
    started: float

    def inflight_key(self, identity: str) -> str:
        """The child's in-flight list."""
        return keys.inflight(identity, self.pid)


class Supervisor:
    """The master process. Build it in the master after importing the app; call :meth:`run`."""

    def __init__(self, config: Config, *, registry: Registry, middleware: ServerChain) -> None:
        self.config = config
        self.registry = registry
        self.middleware = middleware
        self.identity = new_identity()
        self.children: dict[int, Child] = {}
        self.stop_deadline: float | None = None
        self.done = False
        self._unrequeued: dict[int, str] = {}  # slot → in-flight key still to give back
        self._backoff: dict[int, tuple[int, float]] = {}  # slot → (quick deaths, not before)
        self._embedded: EmbeddedServer | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped; the exit code."""
        self._pipe = SelfPipe(ACTIONS)
        try:
            self._start_embedded()
            self.redis = connect(self.config.redis_url, embedded_dir=self.config.embedded_dir)
            log.info("forkq %s starting: identity %s, %d processors, queues %s%s",
                     __version__, self.identity, self.config.concurrency,
                     ", ".join(f"{n}:{w}" for n, w in self.config.queues),
                     " (strict)" if self.config.strict else "")
            while not self.done:
                self.loop_once(time.monotonic())
        finally:
            self._stop_embedded()
            self._pipe.close()
        log.info("Bye!")
        return EXIT_OK

    def loop_once(self, now: float) -> None:
        """One turn: wait for signals, act, reap, then finish stopping or top up."""
        received, _ = self._pipe.wait(self._wait_time(now))
        for signum in received:
            getattr(self, "on_" + ACTIONS[signum])()
        self.reap()
        now = time.monotonic()
        if self.stop_deadline is not None:
            self._continue_stop(now)
        else:
            self.top_up(now)
        self._title()

    def _wait_time(self, now: float) -> float:
        wake = [now + LOOP_WAIT]
        if self.stop_deadline is not None:
            wake.append(self.stop_deadline)
        wake.extend(until for _, until in self._backoff.values())
        return max(min(wake) - now, 0.0)

    # -- signal actions ----------------------------------------------------------------------

    def on_stop(self) -> None:
        """TERM / INT: graceful stop; the second one stops at once."""
        if self.stop_deadline is None:
            log.info("Shutting down: waiting up to %.1fs for %d processors to finish",
                     self.config.timeout, len(self.children))
            self.stop_deadline = time.monotonic() + self.config.timeout
            self._signal_children(STOP_SIGNAL)
        else:
            log.warning("Second stop signal: stopping now")
            self.stop_deadline = time.monotonic()

    def on_reap(self) -> None:
        """CHLD: reaping happens on every turn; the signal only wakes the loop."""

    # -- children ----------------------------------------------------------------------------

    def reap(self) -> None:
        """Collect exited children; give their in-flight jobs back; schedule respawns.

        Waits on each known pid rather than on -1, so the embedded server (also a
        child of the master) stays with its own Popen object.
        """
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                self._child_gone(self.children.pop(pid), status)

    def _child_gone(self, child: Child, status: int) -> None:
        how = _describe(status)
        if self.stop_deadline is None or os.waitstatus_to_exitcode(status) != 0:
            log.warning("processor-%d (pid %d) %s", child.slot, child.pid, how)
        self._unrequeued[child.slot] = child.inflight_key(self.identity)
        self._give_back(child.slot)
        if self.stop_deadline is None:
            self._schedule_respawn(child, time.monotonic())

    def _give_back(self, slot: int) -> bool:
        """Requeue the in-flight job of the child that last held ``slot``; False if Redis failed."""
        key = self._unrequeued.get(slot)
        if key is None:
            return True
        try:
            job = fetch.requeue(self.redis, key, unregister=True)
        except redis.RedisError as exc:
            log.error("cannot requeue the job of %s yet: %s", key, exc)
            return False
        del self._unrequeued[slot]
        if job is not None:
            log.warning("pushed 1 job back to its queue: %s", job[:200].decode("utf-8", "replace"))
        return True

    def _schedule_respawn(self, child: Child, now: float) -> None:
        quick, _ = self._backoff.get(child.slot, (0, 0.0))
        quick = quick + 1 if now - child.started < QUICK_DEATH else 0
        delay = 0.0 if quick == 0 else min(0.1 * 2 ** (quick - 1), MAX_BACKOFF)
        self._backoff[child.slot] = (quick, now + delay)
        if delay:
            log.warning("processor-%d respawns in %.1fs", child.slot, delay)

    def top_up(self, now: float) -> None:
        """Fork a child for every free slot whose backoff has passed and whose job is back."""
        busy = {child.slot for child in self.children.values()}
        for slot in range(self.config.concurrency):
            if slot in busy or self._backoff.get(slot, (0, 0.0))[1] > now:
                continue
            if self._give_back(slot):
                self.spawn(slot)

    def spawn(self, slot: int) -> None:
        """Fork one processor child for ``slot``."""
        pid = os.fork()
        if pid == 0:
            self._become_child(slot)
        self.children[pid] = Child(pid, slot, time.monotonic())
        log.debug("processor-%d started, pid %d", slot, pid)

    def _become_child(self, slot: int) -> None:
        """In the forked child: drop the master's state and run a Processor. Never returns."""
        code = EXIT_CHILD_BOOT
        try:
            self._pipe.close()
            processor = Processor(self.config, identity=self.identity, slot=slot,
                                  registry=self.registry, middleware=self.middleware)
            code = processor.run()
        except BaseException:  # noqa: BLE001 - the child's process boundary
            traceback.print_exc()
        finally:
            os._exit(code)

    def _signal_children(self, signum: signal.Signals) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    # -- stopping ----------------------------------------------------------------------------

    def _continue_stop(self, now: float) -> None:
        assert self.stop_deadline is not None
        if self.children and now >= self.stop_deadline:
            self._kill_remaining()
        if not self.children and all(self._give_back(s) for s in list(self._unrequeued)):
            self.done = True
        elif not self.children and now >= self.stop_deadline + 10:
            log.error("giving up requeueing %s: Redis unreachable", list(self._unrequeued.values()))
            self.done = True

    def _kill_remaining(self) -> None:
        log.warning("Terminating %d busy processors", len(self.children))
        for pid, child in list(self.children.items()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            del self.children[pid]
            self._unrequeued[child.slot] = child.inflight_key(self.identity)
            self._give_back(child.slot)

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

    def _title(self) -> None:
        tag = f" {self.config.tag}" if self.config.tag else ""
        state = " stopping" if self.stop_deadline is not None else ""
        setproctitle(f"forkq {__version__}{tag} [{len(self.children)} of "
                     f"{self.config.concurrency} processors]{state}")


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"
