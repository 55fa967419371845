"""Logging: one line per event, with pid and role.

Format: ``2026-11-21T06:27:00.123Z pid=4242 processor-1 INFO: message``. Under
journald (``JOURNAL_STREAM`` set) the timestamp is left out, as journald adds
its own. The role is per process: ``master``, ``processor-<slot>``.
"""

from __future__ import annotations

import logging
import os
import sys
import time

_role = "master"


class _RoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.role = _role
        return True


class _Formatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"


def configure(level: str = "info") -> None:
    """Send forkq's log lines to stderr at ``level`` (debug, info, warning, error)."""
    journald = bool(os.environ.get("JOURNAL_STREAM"))
    fmt = "pid=%(process)d %(role)s %(levelname)s: %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(fmt if journald else "%(asctime)s " + fmt))
    handler.addFilter(_RoleFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def set_role(role: str) -> None:
    """Name this process's role in every following log line (called after fork)."""
    global _role
    _role = role
