"""Pipes for the daemon's wakeups and reports, made the same way on every POSIX system.

``os.pipe2`` exists on Linux and the BSDs but not on macOS; ``os.pipe`` gives close-on-exec
ends everywhere (PEP 446: through ``pipe2(O_CLOEXEC)`` where it exists), and
``os.set_blocking`` makes them non-blocking, so developers on macOS can run the daemon.
"""

from __future__ import annotations

import os


def pipe(*, nonblocking: bool = False) -> tuple[int, int]:
    """A new pipe ``(read_fd, write_fd)``, both ends close-on-exec (inherited by a fork, not
    by an exec), both non-blocking when ``nonblocking``."""
    read_fd, write_fd = os.pipe()
    if nonblocking:
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
    return read_fd, write_fd
