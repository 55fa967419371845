"""One watcher per daemon: the idle lane of several queues that listens to Redis.

Lanes of one queue wait inside Redis (:mod:`forkq.daemon.children.blocking_wait`). Lanes of
several queues wait on a key watch (:mod:`forkq.daemon.children.queuewatch`), which Redis
sends to every watching connection; so that a push wakes one of them, only the idle lane
holding this token watches. The others wait on a doorbell, and take the token when the
watcher goes busy (it rings) or dies (the master rings when it reaps a child); each still
fetches on its own every ``IDLE_WAIT`` seconds, so a lost ring costs at most that.

The token is a POSIX record lock (``lockf``) on an unlinked file the master opens before it
forks: such locks belong to a process, are not inherited by a fork, and the kernel drops
them when the process dies, so a dead watcher never keeps the token. Within a process the
token is one lane's at a time (the thread that took it). The doorbell is a non-blocking
pipe; a ring is one byte, and a waiter drains what it finds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading

from forkq.daemon import pipes


class WatchToken:
    """The token and the doorbell of one daemon's processors (create in the master)."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the daemon
        self._bell_read, self._bell_write = pipes.pipe(nonblocking=True)
        self._lock = threading.Lock()
        self._holder: int | None = None  # the thread of this process holding the token

    def take(self) -> bool:
        """Try to become the watcher (no waiting); True when this thread holds the token."""
        me = threading.get_ident()
        with self._lock:
            if self._holder is None:
                try:
                    fcntl.lockf(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return False
                self._holder = me
            return self._holder == me

    def held(self) -> bool:
        """Whether this thread holds the token."""
        return self._holder == threading.get_ident()

    def release(self) -> None:
        """Stop being the watcher (if this thread is) and ring, so a waiting lane takes over."""
        with self._lock:
            if self._holder != threading.get_ident():
                return
            fcntl.lockf(self._file.fileno(), fcntl.LOCK_UN)
            self._holder = None
        self.ring()

    def ring(self) -> None:
        """Wake the lanes waiting for the token (safe anywhere; a full pipe rings)."""
        with contextlib.suppress(OSError):
            os.write(self._bell_write, b"!")

    def wait(self, timeout: float, wake_fd: int) -> bool:
        """Wait up to ``timeout`` for a ring or for ``wake_fd``; True when ``wake_fd`` is
        readable. A ring is consumed (all of it: every waiter woke and tries the token)."""
        readable = pipes.readable([self._bell_read, wake_fd], max(timeout, 0.0))
        if self._bell_read in readable:
            with contextlib.suppress(OSError):
                os.read(self._bell_read, 4096)
        return wake_fd in readable

    def close(self) -> None:
        """Drop the token's file and doorbell (a child that never watches, at exit)."""
        self._file.close()
        for fd in (self._bell_read, self._bell_write):
            with contextlib.suppress(OSError):
                os.close(fd)
