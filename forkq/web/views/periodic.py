"""The Periodic page (``GET /periodic``): every configured cron entry (``periodic:`` of the
configuration ``forkq web -C`` read, or the entries given to :func:`forkq.web.make_app`) with
its schedule, time zone, missed policy, last tick handled (``forkq:periodic``) and next tick;
names found in ``forkq:periodic`` that this configuration does not have are listed too.

Action (POST, admin only): ``/periodic/enqueue`` pushes the entry's job now, once, with its
args and queue (and the registered job's options when the app is imported), marked
``periodic``: the entry's schedule and last tick are left as they are.

Bounded work: one HMGET for the configured names and one HGETALL of ``forkq:periodic`` (a
field per periodic name).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from forkq import cron, keys
from forkq import payload as payloads
from forkq.client import Client
from forkq.connection import text
from forkq.web import damage
from forkq.web.routes import Request, Response, redirect, render, route

OTHER_NAMES = 100


@dataclass(frozen=True)
class Row:
    entry: cron.Periodic
    last: float | None
    next: float | None
    problem: str = ""


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


@route("GET", "/periodic")
def periodic(request: Request) -> Response:
    entries: tuple[cron.Periodic, ...] = request.settings.get("periodic", ())
    now = time.time()
    client = request.redis
    lasts: list[Any]
    if damage.fixed(request, keys.PERIODIC):  # named on the page: show the entries anyway
        lasts, others = [None] * len(entries), []
    else:
        lasts = client.hmget(keys.PERIODIC, [e.name for e in entries]) if entries else []
        others = _other_names(client, {e.name for e in entries})
    rows = []
    for entry, last in zip(entries, lasts, strict=True):
        try:
            rows.append(Row(entry, _float(last), cron.next_tick(entry, now)))
        except (ValueError, KeyError) as exc:  # a schedule croniter cannot follow
            rows.append(Row(entry, _float(last), None, str(exc)))
    return render(request, "periodic.html", rows=rows, at=now, others=others)


def _other_names(client: redis.Redis, known: set[str]) -> list[tuple[str, float | None]]:
    """Entries ``forkq:periodic`` remembers that the configuration does not name (another
    deployment's, or removed ones), at most :data:`OTHER_NAMES`. The hash holds one field per
    periodic name ever configured (a handful), so it is read whole, with the commands the
    least-privilege ACL of docs/redis.md allows."""
    found: dict[Any, Any] = client.hgetall(keys.PERIODIC)
    others = [(text(name), _float(value)) for name, value in found.items()
              if text(name) not in known]
    return sorted(others)[:OTHER_NAMES]


@route("POST", "/periodic/enqueue")
def enqueue_now(request: Request) -> Response:
    name = request.field("name")
    entries: tuple[cron.Periodic, ...] = request.settings.get("periodic", ())
    entry = next((e for e in entries if e.name == name), None)
    if entry is None:
        return redirect(request, "/periodic", flash=f"no periodic entry {name!r} configured")
    now = time.time()
    registry = request.settings.get("registry")
    if registry is not None and registry.find(entry.job) is not None:
        item: dict[str, Any] = dict(cron.payload_for(entry, registry, now, now))
    else:
        item = dict(payloads.build(entry.job, list(entry.args), queue=entry.queue or "default",
                                   options={"periodic": entry.name, "periodic_at": now}, now=now))
    for field in ("jid", "created_at", "enqueued_at"):
        item.pop(field, None)  # the client sets them
    jid = Client(request.redis).push(item)
    queue = item.get("queue", "default")
    return redirect(request, "/periodic",
                    flash=f"enqueued {entry.job} ({entry.name}) as {jid} to queue {queue}")
