"""The optional pid file: the master's pid, written atomically, removed only if still ours."""

from __future__ import annotations

import contextlib
import os

from forkq.errors import ConfigError


def write(path: str, pid: int) -> None:
    """Write ``pid`` to ``path`` through a temporary file and a rename; ConfigError naming
    ``pid_file`` when that is not possible (a missing or read-only directory)."""
    temporary = f"{path}.{pid}.tmp"
    try:
        with open(temporary, "w", encoding="ascii") as file:
            file.write(f"{pid}\n")
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise ConfigError(f"pid_file: cannot write {path!r}: {exc.strerror or exc}") from None


def remove(path: str, pid: int) -> None:
    """Remove ``path`` if it still holds ``pid`` (a newer daemon may own it)."""
    with contextlib.suppress(OSError, ValueError):
        with open(path, encoding="ascii") as file:
            if int(file.read().strip()) != pid:
                return
        os.unlink(path)
