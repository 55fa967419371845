"""One entry of ``schedule``, ``retry`` or ``dead``: ``GET /<page>/<key>`` shows its job (the
fields, every argument, the error, the backtrace and the whole payload pretty-printed, or the
bytes of a member that is not a job); ``POST /<page>/<key>`` takes the action of the button
pressed (``retry``, ``delete``, ``kill``) on exactly that member.

The key (:func:`forkq.ops.set_pages.entry_key`) names the member by its score and a digest
of its bytes, so finding it is one ``ZRANGEBYSCORE`` (bounded work, whatever the set's size);
an entry retried, moved or deleted meanwhile answers 404 and the page says so.
"""

from __future__ import annotations

import json
from typing import Any

from forkq.errors import ForkqError
from forkq.ops import set_bulk, set_pages
from forkq.ops.records import SortedEntry
from forkq.web.routes import Request, Response, View, redirect, render, route
from forkq.web.views.sets import LABELS, PAGES, SetPage, describe

TIMES = ("created_at", "enqueued_at", "failed_at", "retried_at")
SHOWN_ELSEWHERE = frozenset({"class", "args", "queue", "jid", "error_class", "error_message",
                             "error_backtrace", "retry_count", *TIMES})


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
                  labels=LABELS[spec.path], problem="", **details(entry))


def details(entry: SortedEntry) -> dict[str, Any]:
    """What the job page shows beyond the entry's own properties."""
    item = entry.item
    args = item.get("args")
    return {
        "args": [pretty(arg) for arg in args] if isinstance(args, list) else [],
        "times": [(name, entry.time(name)) for name in TIMES if name in item],
        "others": [(name, pretty(value), isinstance(value, dict | list))
                   for name, value in item.items() if name not in SHOWN_ELSEWHERE],
        "payload": pretty(item) if item else "",
        "raw_text": "" if item else entry.raw.decode("utf-8", "backslashreplace"),
        "raw_size": len(entry.raw),
    }


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
