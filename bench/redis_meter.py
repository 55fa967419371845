"""What a Redis server did between two readings: commands (as clients sent them, and every
command run, scripts' inner calls included), per-command counts, and the server's CPU.

Readings come from ``INFO`` only (``total_commands_processed``, ``commandstats``, ``cpu``):
nothing is reset, so a meter may watch a server others use; the meter's own ``INFO``
calls are subtracted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

OWN_CALLS = 3  # INFO stats, INFO commandstats, INFO cpu per reading


@dataclass(frozen=True)
class Reading:
    """One reading of the server's counters."""

    at: float  # time.monotonic()
    processed: int  # total_commands_processed: what clients sent (a script is one)
    calls: dict[str, int]  # commandstats calls per command, scripts' inner calls included
    cpu: float  # used_cpu_sys + used_cpu_user, seconds
    usec: int = 0  # commandstats usec but INFO's: time running commands (at most: a script's
    # inner commands count in their own rows and in the script's)


@dataclass(frozen=True)
class Usage:
    """The rates between two readings."""

    seconds: float
    sent_per_second: float  # commands clients sent
    run_per_second: float  # every command run, scripts' inner calls included
    cpu_percent: float  # of one core
    command_percent: float  # of one core, running commands, at most (the rest: I/O, timers)
    per_command: dict[str, float]  # command -> calls per second, busiest first


def read(r: redis.Redis) -> Reading:
    """The server's counters now."""
    stats = r.info("stats")
    commands = r.info("commandstats")
    cpu = r.info("cpu")
    calls = {name.removeprefix("cmdstat_"): int(fields["calls"])
             for name, fields in commands.items()}
    usec = sum(int(fields["usec"]) for name, fields in commands.items()
               if name != "cmdstat_info")
    return Reading(time.monotonic(), int(stats["total_commands_processed"]), calls,
                   float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), usec)


def between(first: Reading, second: Reading) -> Usage:
    """The usage from ``first`` to ``second`` (the meter's own INFO calls left out)."""
    seconds = second.at - first.at
    calls = {name: count - first.calls.get(name, 0) for name, count in second.calls.items()}
    calls["info"] = calls.get("info", 0) - OWN_CALLS
    per_command = {name: count / seconds for name, count in
                   sorted(calls.items(), key=lambda item: -item[1]) if count > 0}
    sent = second.processed - first.processed - OWN_CALLS
    return Usage(seconds, sent / seconds, sum(per_command.values()),
                 100.0 * (second.cpu - first.cpu) / seconds,
                 100.0 * (second.usec - first.usec) / 1e6 / seconds, per_command)


def breakdown(usage: Usage, top: int = 40) -> str:
    """``NAME rate, ...`` of the busiest commands."""
    return ", ".join(f"{name.upper()} {rate:.2f}" for name, rate in
                     list(usage.per_command.items())[:top])
