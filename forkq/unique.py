"""Unique jobs: a push of the same job while an earlier one holds its lock is dropped.

``@job(unique_for=600)`` (or ``unique_for`` in a push): the push takes a lock named after
the job's class, queue and arguments, ``forkq:unique:<digest>``, holding the job's jid, for
``unique_for`` seconds (a scheduled job's for its wait too). A push of the same (class,
queue, args) while the lock is held is dropped: ``push`` and ``perform_async`` return None,
``push_bulk`` leaves its jid out. The lock and the push are one atomic step
(``push.lua``), so a lock is never taken for a job that was not pushed.

The lock goes with the job, never with a process:

- ``unique_until="success"`` (the default): released when the job succeeds (with its
  acknowledgement, ``fetch.lua``), goes to ``dead``, is dropped (``retry: false``) or is
  cancelled (``fail.lua``), or is buried as a poison pill (``recover.lua``); a retry keeps
  it. A job whose process is SIGKILLed goes back to its queue with its lock, in the same
  step;
- ``unique_until="start"``: released when the job starts (one round trip, by the
  processor, before the body runs).

``unique_for`` is a safety TTL only: a lock outlives its job only when the job outlives
the TTL. The payload carries the lock's digest (``unique_digest``), so every script that
settles a job can release its lock (``release_unique`` in ``guard.lua``); a lock is
released only while it holds that job's jid.

Digest: SHA-1 of the JSON ``[class, queue, args]`` as forkq writes it (Ruby's bytes).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from forkq import keys, wirejson
from forkq import payload as payloads

FOR = "unique_for"
UNTIL = "unique_until"
DIGEST = "unique_digest"
UNTIL_VALUES = ("success", "start")


def check(options: dict[str, Any]) -> None:
    """ValueError/TypeError naming the option when ``unique_for`` / ``unique_until`` in
    ``options`` (job options or a push's fields) are not what they must be."""
    if FOR in options:
        value = options[FOR]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"unique_for must be a number of seconds, got {value!r}")
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"unique_for must be a positive number of seconds, got {value!r}")
    if UNTIL in options and options[UNTIL] not in UNTIL_VALUES:
        raise ValueError(f"unique_until must be 'success' or 'start', got {options[UNTIL]!r}")
    if UNTIL in options and FOR not in options:
        raise ValueError("unique_until needs unique_for (the lock's safety TTL, in seconds)")


def digest(name: str, queue: str, args: list[Any]) -> str:
    """The lock's digest of a job: SHA-1 hex of ``[class, queue, args]`` as JSON."""
    return hashlib.sha1(wirejson.dumps([name, queue, args]).encode()).hexdigest()


def lock_key(job_digest: str) -> str:
    """The lock of the jobs whose digest is ``job_digest``."""
    return keys.UNIQUE_PREFIX + job_digest


def ttl(payload: payloads.Payload, at: float | None, now: float) -> int:
    """Seconds the lock of ``payload`` lives: ``unique_for``, plus the wait of a job due at
    ``at`` (whole seconds, at least 1)."""
    seconds = float(payload[FOR])
    if at is not None and at > now:
        seconds += at - now
    return max(1, math.ceil(seconds))


def lock_of(payload: payloads.Payload) -> tuple[str, str] | None:
    """The lock a fetched job holds and what it holds (its key and the job's jid), or None
    when the job holds none (no unique fields, or fields of the wrong shape: any client can
    write any payload)."""
    found = payload.get(DIGEST)
    jid = payloads.jid(payload)
    if not (isinstance(found, str) and len(found) == 40 and jid):
        return None
    try:
        int(found, 16)
    except ValueError:
        return None
    return lock_key(found), jid
