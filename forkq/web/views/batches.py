"""The Batches pages (:mod:`forkq.batches`). ``GET /batches`` lists the newest
:data:`~forkq.web.workflows.BATCHES_SHOWN` batches, newest first: bid, description,
created, total, pending, failures, progress, state (open, complete, succeeded) and whether
its death fired. ``GET /batch/<bid>`` shows one: its status, its callbacks (each event's
callback jid, and whether and when the event fired), its parent, and up to
:data:`~forkq.web.workflows.MEMBERS_SHOWN` of its failed and of its pending members, each
linked to its page (a job's, a child batch's, a chain's current step's job). A batch that
does not exist (never made, or expired) answers 404.

What is read, and how a key of another type is shown: :mod:`forkq.web.workflows`. Read
only (no buttons); both pages refresh themselves.
"""

from __future__ import annotations

from forkq.web import workflows
from forkq.web.routes import Request, Response, render, route


@route("GET", "/batches")
def batch_list(request: Request) -> Response:
    rows = workflows.recent(request)
    return render(request, "batches.html", rows=rows, shown=workflows.BATCHES_SHOWN)


@route("GET", "/batch/<path:bid>")
def batch_page(request: Request) -> Response:
    """Batch ``bid``; 404 when there is none."""
    page = workflows.batch_page(request, request.params["bid"])
    status = 404 if page.row is None and not page.problem else 200
    return render(request, "batch.html", status=status, page=page,
                  shown=workflows.MEMBERS_SHOWN)
