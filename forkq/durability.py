"""Durable enqueue: a push that returns only once its jobs are on replicas or on disk.

Redis acknowledges a write once it is in memory: a primary that crashes a moment later (AOF
``everysec`` loses up to a second) or fails over to a replica that had not received it loses
an acknowledged push. ``perform_async(..., durable=True)`` (or ``Client.push(item,
durable=True)``) appends to the push's round trip ``WAIT replicas timeout``, or with
``fsync`` ``WAITAOF 1 replicas timeout`` (Redis 7.2+, Valkey; the server must have
``appendonly yes``), and raises :class:`~forkq.errors.EnqueueError` with every job's fate
*unknown* and the reason when the server cannot confirm within ``timeout``: the jobs were
pushed but may not survive a crash (a retry may enqueue them twice).

What ``durable=True`` asks for: the daemon's ``durability`` setting in its processes,
:func:`configure` in any process, else ``FORKQ_DURABILITY_REPLICAS`` (default 1),
``FORKQ_DURABILITY_FSYNC`` (default false) and ``FORKQ_DURABILITY_TIMEOUT`` (seconds,
default 1). A :class:`Durability` passed as ``durable=`` is used as it is.

Only pushes need it: the daemon's own moves of a job (fetch, acknowledge, retry, recover) are
single atomic scripts, so a write lost with a crashed primary leaves the job where it was, to
run again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forkq.errors import EnqueueError


@dataclass(frozen=True)
class Durability:
    """How a durable push is confirmed: by ``replicas`` replicas (``WAIT``), and with
    ``fsync`` also on the server's own disk and theirs (``WAITAOF``), within ``timeout``
    seconds."""

    replicas: int = 1
    fsync: bool = False
    timeout: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) \
                or self.replicas < 0:
            raise ValueError(f"durability replicas must be an integer >= 0, got "
                             f"{self.replicas!r}")
        if not isinstance(self.fsync, bool):
            raise ValueError(f"durability fsync must be true or false, got {self.fsync!r}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) \
                or not 0 < self.timeout < 3600:
            raise ValueError(f"durability timeout must be seconds > 0, got {self.timeout!r}")
        if not self.replicas and not self.fsync:
            raise ValueError("durability confirms nothing with replicas 0 and fsync false")

    def command(self) -> tuple[Any, ...]:
        """The command appended to the push's round trip."""
        ms = max(1, round(self.timeout * 1000))
        return ("WAITAOF", 1, self.replicas, ms) if self.fsync else ("WAIT", self.replicas, ms)

    def shortfall(self, reply: Any) -> str:
        """Why ``reply`` (of :meth:`command`) does not confirm the push, naming every part
        that fell short; "" when it confirms it."""
        name = "WAITAOF" if self.fsync else "WAIT"
        if isinstance(reply, Exception):
            return f"the server refused {name}: {reply}"
        missing = []
        if self.fsync:
            local, replicas = (reply if isinstance(reply, list) and len(reply) == 2
                               else (0, 0))
            if int(local) < 1:
                missing.append("the server did not fsync its AOF")
        else:
            replicas = reply
        if int(replicas) < self.replicas:
            missing.append(f"{int(replicas)} of {self.replicas} replica(s) confirmed")
        if not missing:
            return ""
        return f"{' and '.join(missing)} within {self.timeout:g}s ({name})"

    def check(self, reply: Any, jids: list[str]) -> None:
        """Raise :class:`EnqueueError` (every job's fate unknown) unless ``reply``
        confirms the push of ``jids``."""
        reason = self.shortfall(reply)
        if reason:
            raise EnqueueError(f"enqueued, durability unknown: {reason}", enqueued=[],
                               not_enqueued=[], unknown=jids)


def read(value: object) -> Durability:
    """A ``durability`` mapping (YAML: ``replicas``, ``fsync``, ``timeout``) → a level;
    ValueError naming the problem."""
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping with replicas, fsync, timeout; got {value!r}")
    unknown = sorted(set(map(str, value)) - {"replicas", "fsync", "timeout"})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; known: fsync, replicas, timeout")
    return Durability(**{str(key): item for key, item in value.items()})


_configured: Durability | None = None


def configure(level: Durability | None) -> None:
    """What ``durable=True`` asks for in this process (None: the environment's)."""
    global _configured
    _configured = level


def resolve(durable: bool | Durability | None) -> Durability | None:
    """The level a push with ``durable`` waits for; None for a plain push."""
    if isinstance(durable, Durability):
        return durable
    if not durable:
        return None
    return _configured or from_env(os.environ)


def from_env(environ: Mapping[str, str]) -> Durability:
    """The level ``FORKQ_DURABILITY_*`` give; ValueError naming a bad variable."""
    fsync = environ.get("FORKQ_DURABILITY_FSYNC", "").strip().lower()
    if fsync not in ("", "0", "1", "true", "false", "yes", "no"):
        raise ValueError(f"FORKQ_DURABILITY_FSYNC={fsync!r}: expected true or false")
    try:
        replicas = int(environ.get("FORKQ_DURABILITY_REPLICAS") or 1)
        timeout = float(environ.get("FORKQ_DURABILITY_TIMEOUT") or 1)
    except ValueError as exc:
        raise ValueError(f"FORKQ_DURABILITY_REPLICAS / _TIMEOUT: {exc}") from None
    return Durability(replicas, fsync in ("1", "true", "yes"), timeout)
