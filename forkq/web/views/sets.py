"""The Scheduled, Retries and Dead pages: ``GET /scheduled``, ``/retries``, ``/dead`` (a page
of the set, or a search), ``POST /<page>/bulk`` (retry / delete / kill the selected entries,
or every entry matching the search).

Bounded work per request (:mod:`forkq.ops.set_pages`, :mod:`forkq.ops.set_search`,
:mod:`forkq.ops.set_bulk`): a page is one ``ZCARD`` and one ``ZRANGE`` by index; a search one
bounded run of ``ZSCAN`` calls, whose cursor the "more…" link carries on; a bulk action on a
selection resolves each key by its score; "all matching" acts in batches up to
:data:`forkq.ops.set_bulk.BULK_CAP` entries per press, and the message says when more match.

A search's page does not refresh itself (``data-norefresh``): each refresh would scan again,
and the matches of a ``ZSCAN`` are no stable page.

Order: Scheduled and Retries show the next due first (the score is when it is due, as in
Sidekiq's Web), Dead the latest death first; ``?order=asc|desc`` turns it round. A member
that is not a job (any bytes) is listed as such, with its bytes, and can be deleted; a set
key of another type is reported on the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forkq.errors import ForkqError
from forkq.ops import set_bulk, set_pages, set_search
from forkq.ops.records import SortedEntry
from forkq.ops.sorted_sets import DeadSet, JobSet, RetrySet, ScheduledSet
from forkq.web.routes import Request, Response, View, redirect, render, route

PER_PAGE = (25, 50, 100)
RAW_SHOWN = 300


@dataclass(frozen=True)
class SetPage:
    """One of the three pages: its path segment, title, set and how it lists."""

    path: str
    title: str
    jobset: type[JobSet]
    newest_first: bool
    when: str
    failures: bool

    def set_for(self, request: Request) -> JobSet:
        return self.jobset(request.redis)


PAGES = {
    "scheduled": SetPage("scheduled", "Scheduled", ScheduledSet, False, "due", False),
    "retries": SetPage("retries", "Retries", RetrySet, False, "next retry", True),
    "dead": SetPage("dead", "Dead", DeadSet, True, "died", True),
}
LABELS = {
    "scheduled": {"retry": "Enqueue now", "delete": "Delete", "kill": "Kill"},
    "retries": {"retry": "Retry now", "delete": "Delete", "kill": "Kill"},
    "dead": {"retry": "Retry now", "delete": "Delete"},
}

ALL_LABELS = {page: {action: ("Enqueue" if page == "scheduled" and action == "retry"
                              else action.capitalize()) + " all" for action in labels}
              for page, labels in LABELS.items()}


@dataclass(frozen=True)
class Row:
    """An entry as a row shows it: its key (for links and checkboxes) and, for a member that
    is not a job, its bytes as text."""

    key: str
    entry: SortedEntry
    raw_text: str


def row(entry: SortedEntry) -> Row:
    shown = "" if entry.item else entry.raw[:RAW_SHOWN].decode("utf-8", "backslashreplace")
    if not entry.item and len(entry.raw) > RAW_SHOWN:
        shown += "…"
    return Row(set_pages.entry_key(entry), entry, shown)


def list_view(spec: SetPage) -> View:
    def view(request: Request) -> Response:
        return show_list(request, spec)

    return view


def bulk_view(spec: SetPage) -> View:
    def view(request: Request) -> Response:
        return bulk(request, spec)

    return view


def show_list(request: Request, spec: SetPage) -> Response:
    """The set's page ``page`` or, with ``q``, one bounded search from ``cursor``."""
    order = request.arg("order")
    newest_first = spec.newest_first if order not in ("asc", "desc") else order == "desc"
    per = request.int_arg("per", PER_PAGE[0], low=1, high=PER_PAGE[-1])
    query, field = request.arg("q"), request.arg("field", "any")
    field = field if field in set_search.FIELDS else "any"
    context: dict[str, Any] = {
        "spec": spec, "labels": LABELS[spec.path], "all_labels": ALL_LABELS[spec.path],
        "query": query, "field": field, "fields": set_search.FIELDS,
        "order": "desc" if newest_first else "asc", "per": per, "per_choices": PER_PAGE,
        "rows": [], "problem": "", "page": None, "found": None, "size": 0}
    jobset = spec.set_for(request)
    try:
        with set_pages.sorted_set_read(jobset.name):
            context["size"] = jobset.size()
        if query:
            found = set_search.search(jobset, query, field=field, want=per,
                                      cursor=request.int_arg("cursor", 0, high=2**64 - 1),
                                      newest_first=newest_first)
            context.update(found=found, rows=[row(e) for e in found.entries])
        else:
            page = set_pages.page(jobset, request.int_arg("page", 1, low=1), size=per,
                                  newest_first=newest_first)
            context.update(page=page, rows=[row(e) for e in page.entries])
    except ForkqError as exc:
        context["problem"] = str(exc)
    return render(request, "sets.html", **context)


def chosen_action(request: Request, spec: SetPage) -> tuple[str, bool] | None:
    """(action, on everything matching) from the button pressed: ``retry``, ``delete``,
    ``kill``, or the same with ``_all``; None for a button this page does not have."""
    for action in LABELS[spec.path]:
        if action in request.form:
            return action, False
        if f"{action}_all" in request.form:
            return action, True
    return None


def bulk(request: Request, spec: SetPage) -> Response:
    """Act on the checked entries (``key`` fields) or on every entry matching ``q`` and
    ``field``; back to the list with a message saying what was done."""
    chosen = chosen_action(request, spec)
    query, field = request.field("q"), request.field("field", "any")
    field = field if field in set_search.FIELDS else "any"
    back = {"q": query, "field": field if query else ""}
    if chosen is None:
        return redirect(request, f"/{spec.path}", flash="no such action", **back)
    action, everything = chosen
    jobset = spec.set_for(request)
    label = LABELS[spec.path][action].lower()
    try:
        if everything:
            outcome = set_bulk.act_on_matching(jobset, action, query, field=field)
        else:
            outcome = set_bulk.act_on_keys(jobset, action, request.fields("key"))
    except ForkqError as exc:  # the set is of another type: say so on the list
        return redirect(request, f"/{spec.path}", flash=f"{label}: {exc}", **back)
    return redirect(request, f"/{spec.path}", flash=describe(outcome, label, everything), **back)


def describe(outcome: set_bulk.Outcome, label: str, everything: bool) -> str:
    """What a bulk action did, in one line for the flash message."""
    parts = [f"{label}: {outcome.acted} done"]
    if outcome.gone:
        parts.append(f"{outcome.gone} no longer there")
    if outcome.refused:
        parts.append(f"{outcome.refused} refused ({'; '.join(outcome.reasons)})")
    if outcome.more:
        parts.append(f"more match: press again (at most {set_bulk.BULK_CAP:,} per press)")
    elif everything and not outcome.acted and not outcome.refused:
        parts.append("nothing matched")
    return ", ".join(parts)


for _spec in PAGES.values():
    route("GET", f"/{_spec.path}")(list_view(_spec))
    route("POST", f"/{_spec.path}/bulk")(bulk_view(_spec))
