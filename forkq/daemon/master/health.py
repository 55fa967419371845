"""A processor child as the master knows it, and the verdict on its health. Pure; no I/O.

:func:`verdict` decides, from what the master last saw of a child, whether it must be
killed: its heartbeat has not changed for ``liveness_timeout`` (stopped, or stuck in C
code holding the GIL), its job ran past its ``timeout`` option (else ``job_timeout``; the
time the whole daemon was stalled does not count), or
its RSS is above 1.5 x ``max_memory_mb`` (it recycles itself between jobs above
``max_memory_mb``). The pool acts on the verdict; the clock and the RSS are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forkq.config import Config
from forkq.daemon.master.cancels import Asked
from forkq.daemon.master.dead_child import Cause, Gone

HARD_MEMORY_FACTOR = 1.5


@dataclass
class Child:
    """A forked processor, as the master knows it."""

    pid: int
    slot: int
    started: float  # monotonic
    report_fd: int | None
    seen: float  # monotonic time its heartbeat last changed (or its start)
    seq: int = -1
    job: dict[str, Any] | None = None
    booted: bool = False
    retiring: bool = False
    boot_error: str = ""
    killed: Gone | None = None  # set when the master SIGKILLs it, with the reason
    lanes: int = 0  # its lanes, each with an in-flight list (async_concurrency > 1)
    frozen: float = 0.0  # seconds its current job spent with the whole daemon stalled
    cancel_asked: Asked | None = None  # the cancelled job it runs, asked to stop since when


@dataclass(frozen=True)
class Kill:
    """Why a child must be SIGKILLed, and how its job is to be settled."""

    cause: Cause
    reason: str
    jid: str = ""
    timeout: float = 0.0


def verdict(child: Child, now: float, config: Config, *, wall: float, rss_mb: float
            ) -> Kill | None:
    """The kill a child has earned at monotonic ``now`` (``wall``: epoch seconds, what a job's
    ``started`` is in; ``rss_mb``: its resident memory), or None while it is healthy."""
    silent = now - child.seen
    if silent > config.liveness_timeout:
        return Kill("crash", f"no heartbeat for {silent:.0f}s "
                    f"(liveness_timeout {config.liveness_timeout:g}s)")
    job = child.job
    limit = (job or {}).get("timeout") or config.job_timeout
    if job and limit and wall - float(job["started"]) - child.frozen > limit:
        return Kill("timeout", f"{job['class']} jid={job['jid']} ran past its timeout of "
                    f"{limit:g}s", jid=str(job["jid"]), timeout=float(limit))
    ceiling = config.max_memory_mb * HARD_MEMORY_FACTOR
    if ceiling and rss_mb > ceiling:
        return Kill("crash", f"RSS above {ceiling:.0f} MB ({HARD_MEMORY_FACTOR:g} x max_memory_mb)")
    return None
