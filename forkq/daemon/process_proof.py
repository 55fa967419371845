"""Proving that a process on this host is gone, from what it recorded about itself.

A pid alone proves nothing: pids are reused. A process instance is named by its pid
*and* its start time, within one kernel run (``boot_id``) and one pid namespace. A
forkq master records these facts (:func:`facts`, in its process ``info`` under
``proof``) and each child records its start time in its heartbeat. Another process
can then prove an earlier incarnation gone (:func:`gone`) when it runs under the
same kernel run and pid namespace and the pid is not running, or runs with another
start time. Anything it cannot read proves nothing (False): on another host, in
another container, without ``/proc``, or for a process it may not inspect.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import psutil

START_TOLERANCE = 0.05  # seconds; start times are read in clock ticks (10 ms)


@dataclass(frozen=True)
class Host:
    """Which kernel run and pid namespace a process lives in; "" when unknown."""

    boot_id: str
    pid_ns: str

    def known(self) -> bool:
        """Whether both facts could be read (only then can anything be proved)."""
        return bool(self.boot_id and self.pid_ns)


def this_host() -> Host:
    """The kernel run and pid namespace of this process."""
    return Host(_read("/proc/sys/kernel/random/boot_id"), _link("/proc/self/ns/pid"))


def start_time(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, tick resolution); None if not running."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def facts(pid: int) -> dict[str, Any]:
    """What a process records so that others can later prove it gone."""
    host = this_host()
    return {"boot_id": host.boot_id, "pid_ns": host.pid_ns, "start": start_time(pid)}


def gone(pid: int, start: Any, recorded: Host, here: Host) -> bool:
    """True only when process ``pid``, recorded with start time ``start`` (None: unknown) on
    ``recorded``, provably no longer runs: same kernel run and pid namespace as ``here``,
    and the pid is free, a zombie (which runs no code), or names a process started at
    another time (which needs a known ``start``)."""
    if not here.known() or recorded != here or pid <= 0:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return True
        if isinstance(start, bool) or not isinstance(start, int | float):
            return False
        return abs(process.create_time() - start) > START_TOLERANCE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # AccessDenied: it may be alive
        return False


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as file:
            return file.read().strip()
    except (OSError, ValueError):
        return ""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""
