"""The OS's own accounting of the processes a benchmark runs: CPU time and PSS, from /proc.

A *tree* is some root pids and all their descendants, found by scanning the parent pid
of every ``/proc/<pid>/stat`` (a fresh scan per call, so children forked or reaped
between two samples are seen).

CPU is each process's CPU-time clock, read with ``clock_gettime`` (Linux names the clock of
process ``pid`` ``(~pid << 3) | 2``: its whole thread group, ended threads included, in
nanoseconds; clock ticks, 10 ms, are too coarse for a drain that lasts a second; where the
clock cannot be read, utime + stime in ticks), plus its reaped children's cutime + cstime
(``/proc/<pid>/stat`` fields 16-17), summed over the live tree: a child reaped between two
samples moves its time into its parent's, so the sum stays whole. PSS is the ``Pss:`` line
of ``/proc/<pid>/smaps_rollup`` (the process's share of every page it maps), summed over
the tree.

Linux only; a process that exits while it is read counts as zero.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 first), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    return text[text.rindex(")") + 2:].split()


def _parents() -> dict[int, int]:
    """Every live pid → its parent pid."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                parents[int(entry)] = int(fields[1])
    return parents


def tree(roots: Iterable[int]) -> list[int]:
    """The live pids among ``roots`` and all their descendants."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: list[int] = []
    pending = [pid for pid in roots if pid in parents]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` so far, its threads' and its reaped children's (0.0 if it is
    gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    reaped = sum(int(value) for value in fields[13:15]) / TICKS_PER_SECOND  # cutime, cstime
    try:
        own = time.clock_gettime(_cpu_clock(pid))
    except OSError:  # gone meanwhile, or a kernel without process clocks: ticks
        own = sum(int(value) for value in fields[11:13]) / TICKS_PER_SECOND
    return reaped + own


def _cpu_clock(pid: int) -> int:
    """The clock id of process ``pid``'s CPU time (Linux: MAKE_PROCESS_CPUCLOCK(pid,
    CPUCLOCK_SCHED))."""
    return (~pid << 3) | 2


def tree_cpu_seconds(roots: Iterable[int]) -> float:
    """CPU seconds of the whole tree under ``roots``."""
    return sum(cpu_seconds(pid) for pid in tree(roots))


def pss_kb(pid: int) -> int:
    """Proportional set size of ``pid`` in kB (0 if it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def tree_pss_mb(roots: Iterable[int]) -> float:
    """PSS of the whole tree under ``roots``, in MB (2**20 bytes)."""
    return sum(pss_kb(pid) for pid in tree(roots)) / 1024


def command_name(pid: int) -> str | None:
    """The command name of ``pid`` on this machine (``/proc/<pid>/comm``), None if there is
    no such process here (a server on another host, say)."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None
