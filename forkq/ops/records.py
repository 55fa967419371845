"""One job as the operator's API shows it: :class:`JobRecord` (in a queue) and
:class:`SortedEntry` (in ``schedule``, ``retry`` or ``dead``). Read-only; no I/O.

A record keeps the **raw bytes** it was read as: every action finds the job by
those bytes (``LREM``, ``ZREM``, ``ZADD XX``), never by re-encoding it, so an
action cannot duplicate a job whose JSON another client wrote differently.

Readers accept what every Sidekiq version writes (docs/sidekiq-wire.md §1, §10):
timestamps as float seconds (6.x, 7.x, forkq) or integer milliseconds (8.x);
``error_backtrace`` as MIME or strict base64 of zlib'd JSON. A member that is not
a JSON object is kept with ``item`` empty, so it can still be listed and deleted.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

from forkq import payload as payloads
from forkq import wirejson


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        item = wirejson.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {}
    return item if isinstance(item, dict) else {}


def finite(value: float | None) -> float | None:
    """``value``, or None for infinity and NaN (which JSON cannot carry)."""
    return value if value is None or math.isfinite(value) else None


def decode_backtrace(value: Any) -> list[str]:
    """Sidekiq's ``error_backtrace`` (base64 of zlib'd JSON lines) → the lines; [] if unreadable."""
    if not isinstance(value, str):
        return []
    try:
        lines = json.loads(zlib.decompress(base64.b64decode(value)))
    except (binascii.Error, zlib.error, ValueError, RecursionError):
        return []
    return [str(line) for line in lines] if isinstance(lines, list) else []


@dataclass(frozen=True)
class JobRecord:
    """A job as read from a queue list: ``raw`` bytes, ``item`` the parsed JSON object."""

    raw: bytes
    queue_key: str = ""
    item: dict[str, Any] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "item", _parse(self.raw))

    @property
    def jid(self) -> str:
        return str(self.item.get("jid", ""))

    @property
    def klass(self) -> str:
        """The job's class name (``display_class`` / ``wrapped`` first, as Sidekiq's UI)."""
        for key in ("display_class", "wrapped", "class"):
            if isinstance(self.item.get(key), str):
                return str(self.item[key])
        return ""

    @property
    def args(self) -> list[Any]:
        args = self.item.get("args")
        return list(args) if isinstance(args, list) else []

    @property
    def queue(self) -> str:
        return str(self.item.get("queue", ""))

    def time(self, name: str) -> float | None:
        """A timestamp field (``created_at``, ``enqueued_at``, ``failed_at``, ``retried_at``)
        in epoch seconds, whichever unit it was written in; None when absent."""
        return payloads.epoch_seconds(self.item.get(name))

    @property
    def created_at(self) -> float | None:
        return self.time("created_at") or self.time("enqueued_at")

    @property
    def enqueued_at(self) -> float | None:
        return self.time("enqueued_at")

    def latency(self, now: float) -> float:
        """Seconds since it was enqueued (else created); 0 when it has neither."""
        since = self.enqueued_at or self.created_at
        return max(0.0, now - since) if since is not None else 0.0

    @property
    def retry_count(self) -> int | None:
        count = self.item.get("retry_count")
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    @property
    def error_class(self) -> str | None:
        value = self.item.get("error_class")
        return value if isinstance(value, str) else None

    @property
    def error_message(self) -> str | None:
        value = self.item.get("error_message")
        return value if isinstance(value, str) else None

    @property
    def error_backtrace(self) -> list[str]:
        return decode_backtrace(self.item.get("error_backtrace"))

    def summary(self) -> dict[str, Any]:
        """The JSON-ready view the CLI prints (``--json``)."""
        return {
            "jid": self.jid, "class": self.klass, "args": self.args, "queue": self.queue,
            "created_at": finite(self.created_at), "enqueued_at": finite(self.enqueued_at),
            "retry_count": self.retry_count, "error_class": self.error_class,
            "error_message": self.error_message,
        }


@dataclass(frozen=True)
class SortedEntry(JobRecord):
    """A member of ``schedule``, ``retry`` or ``dead`` with its score (epoch seconds: when it is
    due, or when it died)."""

    score: float = 0.0
    set_name: str = ""

    @property
    def at(self) -> float:
        return self.score

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "at": finite(self.score), "set": self.set_name}
