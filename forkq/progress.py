"""A running job's progress: ``forkq.progress(done, total=None, note=None)``.

    @forkq.job
    def import_file(path):
        rows = read(path)
        for i, row in enumerate(rows, 1):
            store(row)
            forkq.progress(i, total=len(rows), note=f"row {i}")

Each call writes ``forkq:progress:<jid>`` (a hash: ``done``, ``total``, ``note``, ``at``;
kept 24 h after the last call) in one round trip, for ``forkq job JID``, the dashboard's
job page and the batch page. A call closer than :data:`MIN_INTERVAL` seconds to the last
one written is skipped (a loop may call it for every row), except the one where ``done``
reaches ``total``. A Redis error is
swallowed: progress is a report, never a reason for a job to fail. Outside a job it
raises ValueError; in a testing mode it is kept in :attr:`forkq.testing.Mode.progress`.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from forkq import client as clients
from forkq import keys
from forkq.middleware import current_job

MIN_INTERVAL = 0.5


def progress(done: float, total: float | None = None, note: str | None = None) -> None:
    """Report the running job's progress (see the module's doc)."""
    context = current_job()
    if context is None:
        raise ValueError("forkq.progress() is called inside a job")
    for name, value in (("done", done), ("total", total)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TypeError(f"progress: {name} must be a number, got {value!r}")
    if note is not None and not isinstance(note, str):
        raise TypeError(f"progress: note must be a string, got {note!r}")
    now = time.time()
    report: dict[str, Any] = {"done": done, "at": round(now, 3)}
    if total is not None:
        report["total"] = total
    if note is not None:
        report["note"] = note
    diversion = clients.diverted()
    if diversion is not None:
        diversion.progress(context.jid, report)
        return
    if now - context.progress_at < MIN_INTERVAL and total != done:
        return
    context.progress_at = now
    write(clients.default(), context.jid, report)


def write(client: clients.Client, jid: str, report: dict[str, Any]) -> None:
    """Store ``report`` as the progress of ``jid`` (a Redis error is swallowed)."""
    key = keys.progress(jid)
    try:
        with client.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={k: str(v) for k, v in report.items()})
            pipe.expire(key, keys.PROGRESS_TTL)
            pipe.execute()
    except redis.RedisError:
        pass


def read(client: Any, jid: str) -> dict[str, Any] | None:
    """The progress job ``jid`` reported last, or None."""
    try:
        found = client.hgetall(keys.progress(jid))
    except redis.RedisError:
        return None
    if not isinstance(found, dict) or not found:
        return None
    report: dict[str, Any] = {}
    for raw_key, raw_value in found.items():
        name = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
        value = raw_value.decode(errors="replace") if isinstance(raw_value, bytes) else raw_value
        if name in ("done", "total", "at"):
            try:
                report[name] = float(value)
            except ValueError:
                continue
        elif name == "note":
            report[name] = value
    return report
