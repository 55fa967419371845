"""One watcher per daemon: the idle processor of several queues that listens to Redis.

Processors of one queue wait inside Redis (:mod:`forkq.daemon.children.blocking_wait`).
Processors of several queues wait on a key watch (:mod:`forkq.daemon.children.queuewatch`),
which Redis sends to every watching connection; so that a push wakes one of them, only the
idle processor holding this token watches. The others wait on a doorbell, and take the
token when the watcher goes busy (it rings) or dies (the master rings when it reaps a
child); each still fetches on its own every ``IDLE_WAIT`` seconds, so a lost ring costs at
most that.

The token is a POSIX record lock (``lockf``) on an unlinked file the master opens before
it forks: such locks belong to a process, are not inherited by a fork, and the kernel
drops them when the process dies, so a dead watcher never keeps the token. The doorbell is
a non-blocking pipe; a ring is one byte, and a waiter drains what it finds.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile

from forkq.daemon import pipes


class WatchToken:
    """The token and the doorbell of one daemon's processors (create in the master)."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the daemon
        self._bell_read, self._bell_write = pipes.pipe(nonblocking=True)
        self.held = False

    def take(self) -> bool:
        """Try to become the watcher (no waiting); True when this process holds the token."""
        if not self.held:
            try:
                fcntl.lockf(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            self.held = True
        return True

    def release(self) -> None:
        """Stop being the watcher and ring, so a waiting processor takes over."""
        if self.held:
            fcntl.lockf(self._file.fileno(), fcntl.LOCK_UN)
            self.held = False
            self.ring()

    def ring(self) -> None:
        """Wake the processors waiting for the token (safe anywhere; a full pipe rings)."""
        with contextlib.suppress(OSError):
            os.write(self._bell_write, b"!")

    def wait(self, timeout: float, wake_fd: int) -> bool:
        """Wait up to ``timeout`` for a ring or for ``wake_fd``; True when ``wake_fd`` is
        readable. A ring is consumed (all of it: every waiter woke and tries the token)."""
        readable = pipes.readable([self._bell_read, wake_fd], timeout)
        if self._bell_read in readable:
            with contextlib.suppress(OSError):
                os.read(self._bell_read, 4096)
        return wake_fd in readable
