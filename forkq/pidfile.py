"""The optional pid file: the master's pid, written atomically, removed only if still ours."""

from __future__ import annotations

import contextlib
import os


def write(path: str, pid: int) -> None:
    """Write ``pid`` to ``path`` through a temporary file and a rename."""
    temporary = f"{path}.{pid}.tmp"
    with open(temporary, "w", encoding="ascii") as file:
        file.write(f"{pid}\n")
    os.replace(temporary, path)


def remove(path: str, pid: int) -> None:
    """Remove ``path`` if it still holds ``pid`` (a newer daemon may own it)."""
    with contextlib.suppress(OSError, ValueError):
        with open(path, encoding="ascii") as file:
            if int(file.read().strip()) != pid:
                return
        os.unlink(path)
