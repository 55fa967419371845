"""A forked child's life, shared by the processor and the scheduler children.

Master side: :class:`OsProcesses` forks with :data:`FORK_BLOCKED` blocked (so no signal
meets the master's handlers in the child, or a default action before the child's own
handlers are in place), runs the child's body behind its process boundary (the child
always ends with ``os._exit``), waits for and signals children by pid. It is the one
place the master touches processes: :class:`Processes` is what the pool and the
scheduler slot are given, and what a unit test replaces. :func:`respawn_delay` is the
quick-death backoff both slots apply; :func:`describe` words a wait status.

Child side: :func:`setup` takes the steps every child takes after fork (role in the
log, signals, its own Redis connection, the default client, process title, heartbeat
thread; the heartbeat starts last and unblocks the signals: every handler is in place
by then). :func:`report` writes the one-line boot report a processor sends its master.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

import psutil
import redis
from setproctitle import setproctitle

from forkq import __version__
from forkq import client as clients
from forkq.config import Config
from forkq.connection import KeptRedis, connect
from forkq.daemon import liveness, logs, pipes
from forkq.daemon.children.beat_thread import BeatThread
from forkq.daemon.signals import STOP_SIGNAL, SelfPipe
from forkq.errors import EXIT_SOFTWARE

IGNORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGTSTP, signal.SIGHUP)
"""Sent to the whole process group by a terminal or systemd; only the master acts on them."""
FORK_BLOCKED = frozenset({*IGNORED_SIGNALS, STOP_SIGNAL, signal.SIGTTIN, signal.SIGUSR2})
"""Blocked by the master around fork and by the child until its own handlers are in place, so
no signal meets the master's handlers (and wakeup pipe) or a default action in the child."""

QUICK_DEATH = 5.0  # an abnormal death this soon after the fork counts toward the backoff
BACKOFF_BASE = 0.5
MAX_BACKOFF = 30.0  # also the wait after a failed fork


# -- master side ------------------------------------------------------------------------------


class Processes(Protocol):
    """The master's effects on processes: what the pool and the scheduler slot are given."""

    def fork(self, body: Callable[[], int]) -> int:
        """Fork; in the child run ``body`` and exit with its code. The child's pid (OSError)."""

    def fork_reporting(self, body: Callable[[int], int]) -> tuple[int, int]:
        """Fork with a boot-report pipe: the child runs ``body(write_fd)`` (see :func:`report`);
        the master gets the child's pid and the pipe's non-blocking read end (OSError)."""

    def wait(self, pid: int, *, block: bool = False) -> int | None:
        """The wait status of child ``pid`` once it exited (0 if it is not ours), else None."""

    def kill(self, pid: int, signum: int) -> None:
        """Send ``signum`` to ``pid``; a process already gone is no error."""

    def rss_mb(self, pid: int) -> float:
        """The resident memory of ``pid`` in MB; 0 when it is gone."""


class OsProcesses:
    """The real :class:`Processes`: ``os.fork``, ``os.waitpid``, ``os.kill``."""

    def __init__(self) -> None:
        self._master_pid = os.getpid()

    def fork(self, body: Callable[[], int]) -> int:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORK_BLOCKED)
        try:
            pid = os.fork()
        finally:
            if os.getpid() == self._master_pid:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if pid == 0:
            _run_child(body)
        return pid

    def fork_reporting(self, body: Callable[[int], int]) -> tuple[int, int]:
        read_fd, write_fd = pipes.pipe()

        def child() -> int:
            os.close(read_fd)
            return body(write_fd)

        try:
            pid = self.fork(child)
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            raise
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        return pid, read_fd

    def wait(self, pid: int, *, block: bool = False) -> int | None:
        try:
            done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return 0
        return status if done else None

    def kill(self, pid: int, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    def rss_mb(self, pid: int) -> float:
        try:
            return float(psutil.Process(pid).memory_info().rss) / 2**20
        except psutil.Error:
            return 0.0


def _run_child(body: Callable[[], int]) -> None:
    """The forked child's process boundary: run ``body``, then exit. Never returns.

    Everything the child inherited (the application and forkq, imported by the master) is
    moved out of the garbage collector's sight first (``gc.freeze``): the child's
    collections then walk only what it allocated itself, and do not write to (and so
    copy) the pages it shares with the master."""
    gc.freeze()
    code = EXIT_SOFTWARE
    try:
        code = body()
    except BaseException:  # noqa: BLE001 - the child's process boundary
        try:  # through the log's format (a JSON log stays one object per line)
            logging.getLogger(__name__).exception("the child ended on an exception")
        except BaseException:  # noqa: BLE001 - logging itself broke: the raw traceback
            traceback.print_exc()
    finally:
        os._exit(code)


def respawn_delay(quick_deaths: int) -> float:
    """Seconds before a respawn after ``quick_deaths`` quick abnormal deaths in a row."""
    return 0.0 if quick_deaths == 0 else min(BACKOFF_BASE * 2 ** (quick_deaths - 1), MAX_BACKOFF)


def describe(status: int) -> str:
    """``killed by signal SIGKILL`` / ``exited with status 1`` for a wait status."""
    if os.WIFSIGNALED(status):
        return f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


# -- child side -------------------------------------------------------------------------------


@dataclass
class Basics:
    """What every child has once :func:`setup` ran."""

    master_pid: int
    pipe: SelfPipe  # wakes on STOP_SIGNAL
    redis: redis.Redis
    beat: BeatThread


def setup(config: Config, *, identity: str, role: str, state: str,
          socket_timeout: float | None = None) -> Basics:
    """In a freshly forked child: the steps every child takes before its own."""
    master_pid = os.getppid()
    logs.set_role(role)
    pipe = child_signals()
    client = connect(config.redis_url, embedded_dir=config.embedded_dir,
                     socket_timeout=socket_timeout, redis_class=KeptRedis)
    clients.configure(clients.Client.keeping(client))
    set_title(config, role, state)
    return Basics(master_pid, pipe, client, start_beat(config, identity, master_pid))


def child_signals() -> SelfPipe:
    """Ignore the group-wide signals (a no-op handler, not SIG_IGN, which programs that jobs
    start would inherit) and return the self-pipe of STOP_SIGNAL."""
    for signum in IGNORED_SIGNALS:
        signal.signal(signum, _ignore)
    return SelfPipe([STOP_SIGNAL])


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Handler of the signals a child ignores (the wakeup fd byte is dropped by SelfPipe)."""


def start_beat(config: Config, identity: str, master_pid: int) -> BeatThread:
    """Start the child's heartbeat thread (its own connection), then unblock the signals the
    master blocked around fork: every handler is in place now."""
    beat = BeatThread(connect(config.redis_url, embedded_dir=config.embedded_dir,
                              socket_timeout=2),
                      identity, os.getpid(), master_pid=master_pid, orphan_grace=config.timeout,
                      alive_ttl=liveness.ttl(config), keepalive=config.liveness_timeout / 3)
    beat.start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORK_BLOCKED)
    return beat


def set_title(config: Config, role: str, state: str) -> None:
    """``forkq 0.1.0 [tag] processor-2 busy``: what ``ps`` shows of a child."""
    tag = f" {config.tag}" if config.tag else ""
    setproctitle(f"forkq {__version__}{tag} {role} {state}")


def report(fd: int, message: str) -> None:
    """Write one boot-report line to the master (best effort) and close the pipe."""
    with contextlib.suppress(OSError):
        os.write(fd, message.encode("utf-8", "replace")[:4000] + b"\n")
    os.close(fd)
