"""Pipes for the daemon's wakeups and reports, made the same way on every POSIX system, and
the one way the daemon waits for any of several fds (:func:`readable`).

``os.pipe2`` exists on Linux and the BSDs but not on macOS; ``os.pipe`` gives close-on-exec
ends everywhere (PEP 446: through ``pipe2(O_CLOEXEC)`` where it exists), and
``os.set_blocking`` makes them non-blocking, so developers on macOS can run the daemon.
"""

from __future__ import annotations

import errno
import os
import select
from collections.abc import Iterable

LONGEST_WAIT = 86400.0
"""The longest :func:`readable` waits, in seconds (``poll`` takes at most ~24.8 days)."""


def pipe(*, nonblocking: bool = False) -> tuple[int, int]:
    """A new pipe ``(read_fd, write_fd)``, both ends close-on-exec (inherited by a fork, not
    by an exec), both non-blocking when ``nonblocking``."""
    read_fd, write_fd = os.pipe()
    if nonblocking:
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
    return read_fd, write_fd


def readable(fds: Iterable[int], timeout: float) -> list[int]:
    """The fds of ``fds`` that became readable within ``timeout`` seconds (0 or less: a
    check that does not block; at most :data:`LONGEST_WAIT`); a hang-up or an error counts
    as readable (the read then tells which). OSError(EBADF) when one of ``fds`` is not open,
    as ``select`` raised. ``poll``, not ``select``: a job that holds a thousand files leaves
    the daemon's next connection at an fd number past ``select``'s limit of 1024, where
    ``select`` raises ValueError."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    events = poller.poll(min(max(timeout, 0.0), LONGEST_WAIT) * 1000)
    for fd, event in events:
        if event & select.POLLNVAL:
            raise OSError(errno.EBADF, f"fd {fd} is not open")
    return [fd for fd, _ in events]
