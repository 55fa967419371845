"""A job's pages. One entry of ``schedule``, ``retry`` or ``dead``: ``GET /<page>/<key>``
shows its job (the fields, every argument, the error, the backtrace and the whole payload
pretty-printed, or the bytes of a member that is not a job); ``POST /<page>/<key>`` takes the
action of the button pressed (``retry``, ``delete``, ``kill``) on exactly that member.

The key (:func:`forkq.ops.set_pages.entry_key`) names the member by its score and a digest
of its bytes, so finding it is one ``ZRANGEBYSCORE`` (bounded work, whatever the set's size);
an entry retried, moved or deleted meanwhile answers 404 and the page says so.

``GET /job/<jid>`` finds a job by its jid wherever it is (:func:`forkq.ops.lookup.find_job`,
as ``forkq job``): each place it is in (scheduled, queued, running, in-flight, waiting in a
concurrency limit's line, retry, dead) with a link to that place's page, then the job as
the entry page shows it. What the lookup could not read (a key of another type) is named in
the page's notice. Unlike the other pages this one costs O(jobs): the lookup searches every
queue and set on the server, so the page does not refresh itself (``data-norefresh``);
reloading it looks again. Not found: 404.

Both pages show the job's unique lock when its payload names one (``unique_digest``:
``forkq:unique:<digest>``, :mod:`forkq.unique`), read now: held by this job, by another
(linked) or free, and its time left; one pipelined ``GET`` + ``PTTL``. They show its
workflow too (:mod:`forkq.web.workflows`): its batch when the payload names one (``bid``,
linked to its page), its chain's steps when it is a chain's step (``chain``), and the
progress it reported (:func:`forkq.progress`), which the 404 page of a job found nowhere
shows as well (a job that finished keeps it 24 h).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import redis

from forkq import batches, canvas, unique
from forkq.connection import is_wrong_type, text
from forkq.errors import ForkqError
from forkq.ops import set_bulk, set_pages
from forkq.ops.lookup import Place, find_job
from forkq.ops.records import JobRecord, SortedEntry
from forkq.web import damage, workflows
from forkq.web.routes import Request, Response, View, redirect, render, route
from forkq.web.views.sets import LABELS, PAGES, SetPage, describe

TIMES = ("created_at", "enqueued_at", "failed_at", "retried_at")
SHOWN_ELSEWHERE = frozenset({"class", "args", "queue", "jid", "error_class", "error_message",
                             "error_backtrace", "retry_count", *TIMES})
SET_PAGES = {"scheduled": "scheduled", "retry": "retries", "dead": "dead"}  # place → page


@dataclass(frozen=True)
class LockState:
    """A job's unique lock as read now: its ``key``, the jid holding it (``holder``, "" when
    free) and the seconds it has left (None: no TTL, or free)."""

    key: str
    holder: str
    ttl: float | None

    def held_by(self, jid: str) -> str:
        """``mine`` (held by ``jid``), ``other`` or ``free``."""
        if not self.holder:
            return "free"
        return "mine" if self.holder == jid else "other"


@dataclass(frozen=True)
class PlaceRow:
    """One place a looked-up job is in: what it says of it and the page showing that place
    (``link`` a path inside the app, "" when none; ``label`` the link's text)."""

    kind: str
    headline: str
    link: str
    label: str
    place: Place


def pretty(value: Any) -> str:
    """A JSON value as indented text (shown escaped)."""
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=False, default=repr)


def job_view(spec: SetPage) -> View:
    def view(request: Request) -> Response:
        return show_job(request, spec)

    return view


def act_view(spec: SetPage) -> View:
    def view(request: Request) -> Response:
        return act(request, spec)

    return view


def show_job(request: Request, spec: SetPage) -> Response:
    key = request.params["key"]
    try:
        entry = set_pages.resolve(spec.set_for(request), key)
    except ForkqError as exc:
        return render(request, "job.html", spec=spec, key=key, entry=None,
                      labels=LABELS[spec.path], problem=str(exc))
    if entry is None:
        return render(request, "job.html", status=404, spec=spec, key=key, entry=None,
                      labels=LABELS[spec.path], problem="")
    return render(request, "job.html", spec=spec, key=key, entry=entry,
                  labels=LABELS[spec.path], problem="", **details(request, entry))


def details(request: Request, entry: JobRecord, workflow: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    """What the job page shows beyond the entry's own properties: its unique lock read now,
    and its workflow (from ``workflow``, the payload fields naming it; the entry's own
    payload when not given)."""
    item = entry.item
    args = item.get("args")
    flow = workflows.job_flow(request, entry.jid, item if workflow is None else workflow)
    linked = {name for name, shown in ((batches.FIELD, flow.bid), (canvas.FIELD, flow.chain_id))
              if shown and item.get(name) == shown}  # its own row links it
    return {
        "args": [pretty(arg) for arg in args] if isinstance(args, list) else [],
        "times": [(name, entry.time(name)) for name in TIMES if name in item],
        "others": [(name, pretty(value), isinstance(value, dict | list))
                   for name, value in item.items()
                   if name not in SHOWN_ELSEWHERE and name not in linked],
        "payload": pretty(item) if item else "",
        "raw_text": "" if item else entry.raw.decode("utf-8", "backslashreplace"),
        "raw_size": len(entry.raw),
        "lock": unique_lock(request, item),
        "flow": flow,
    }


def unique_lock(request: Request, item: dict[str, Any]) -> LockState | None:
    """The unique lock the job's payload names (``unique_digest``), read now; None when it
    names none. A lock key of another type is named in the page's notice and shown free."""
    named = unique.lock_of(item)
    if named is None:
        return None
    key = named[0]
    with request.redis.pipeline(transaction=False) as pipe:
        pipe.get(key)
        pipe.pttl(key)  # PTTL: the documented ACL grants it (not TTL)
        holder, left = pipe.execute(raise_on_error=False)
    for reply in (holder, left):
        if isinstance(reply, Exception) and not (isinstance(reply, redis.ResponseError)
                                                  and is_wrong_type(reply)):
            raise reply
    if isinstance(holder, Exception):  # WRONGTYPE: another type at the lock's name
        damage.check(request, {key: "string"})
        return LockState(key, "", None)
    if not holder:
        return LockState(key, "", None)
    seconds = left / 1000 if isinstance(left, int) and left >= 0 else None
    return LockState(key, text(holder), seconds)


# --- a job by its jid ------------------------------------------------------------------------


@route("GET", "/job/<path:jid>")
def by_jid(request: Request) -> Response:
    """Every place job ``jid`` is in, and the job as found in the first (404: nowhere)."""
    jid = request.params["jid"]
    found = find_job(request.redis, jid)
    for problem in found.problems:
        damage.note(request, problem)
    now = time.time()
    places = [place_row(place, now) for place in found.places]
    if not places:
        return render(request, "job.html", status=404, spec=None, jid=jid, places=[],
                      entry=None, problem="", flow=workflows.job_flow(request, jid, {}))
    first = found.places[0].job
    return render(request, "job.html", spec=None, jid=jid, places=places, entry=first,
                  problem="", **details(request, first, workflow_fields(found.places)))


WORKFLOW_FIELDS = (batches.FIELD, canvas.FIELD, canvas.STEP)


def workflow_fields(places: list[Place]) -> dict[str, Any]:
    """The payload fields naming the job's workflow, each from the first place whose job
    has it (a job found in two places is usually the same payload)."""
    found: dict[str, Any] = {}
    for place in places:
        for name in WORKFLOW_FIELDS:
            if name not in found and name in place.job.item:
                found[name] = place.job.item[name]
    return found


def place_row(place: Place, now: float) -> PlaceRow:
    """``place`` as the page lists it, linked to the page showing that place."""
    headline = place.headline(now)
    page = SET_PAGES.get(place.kind)
    if page is not None and isinstance(place.job, SortedEntry):
        return PlaceRow(place.kind, headline, f"/{page}/{set_pages.entry_key(place.job)}",
                        f"its entry in {PAGES[page].title}", place)
    if place.kind == "queued":
        return PlaceRow(place.kind, headline, "/queues/" + quote(place.queue, safe=""),
                        f"queue {place.queue}", place)
    if place.kind in ("running", "in-flight"):
        return PlaceRow(place.kind, headline, "/busy", "Busy", place)
    if place.kind == "blocked":
        return PlaceRow(place.kind, headline, "/flow", "Flow control", place)
    return PlaceRow(place.kind, headline, "", "", place)


def act(request: Request, spec: SetPage) -> Response:
    """The pressed button's action on this one member; back to the list with what happened."""
    action = next((name for name in LABELS[spec.path] if name in request.form), None)
    if action is None:
        return redirect(request, f"/{spec.path}", flash="no such action")
    label = LABELS[spec.path][action].lower()
    try:
        outcome = set_bulk.act_on_keys(spec.set_for(request), action, [request.params["key"]])
    except ForkqError as exc:  # the set is of another type: say so on the list
        return redirect(request, f"/{spec.path}", flash=f"{label}: {exc}")
    return redirect(request, f"/{spec.path}", flash=describe(outcome, label, False))


for _spec in PAGES.values():
    route("GET", f"/{_spec.path}/<key>")(job_view(_spec))
    route("POST", f"/{_spec.path}/<key>")(act_view(_spec))
