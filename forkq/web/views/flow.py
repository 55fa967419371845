"""The Flow control page: ``GET /flow`` shows what flow control holds now, as ``forkq limits``
and ``forkq uniques`` do (:mod:`forkq.ops.flow`): the concurrency limits' keys (jobs running
and waiting), the limiters in use, the groups waiting in queues with groups, and the unique
locks (the first :data:`LOCKS_SHOWN`, each with the job holding it and its time left).

A key of another type than its kind is skipped and named in the page's notice
(:mod:`forkq.web.damage`); the rest of the page shows.

Work: a ``SCAN`` of each prefix and one read per key found (a unique lock's for the locks
shown only): O(flow-control keys), as the commands. Read only: the page has no buttons.
"""

from __future__ import annotations

from forkq.connection import text
from forkq.ops import flow
from forkq.web import damage
from forkq.web.routes import Request, Response, render, route

LOCKS_SHOWN = 100


@route("GET", "/flow")
def flow_control(request: Request) -> Response:
    found = flow.Reading()
    flow.concurrency_keys(request.redis, found)
    flow.limiters(request.redis, found)
    flow.queue_groups(request.redis, found)
    locks_total = flow.unique_locks(request.redis, found, LOCKS_SHOWN)
    report_damaged(request, found.damaged)
    return render(request, "flow.html", found=found, locks_total=locks_total,
                  locks_shown=LOCKS_SHOWN)


def report_damaged(request: Request, names: list[str]) -> None:
    """Name each key of ``names`` (skipped by the reading: another type than its kind) in the
    page's notice, with the type it holds (one pipelined ``TYPE``)."""
    if not names:
        return
    with request.redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.type(name)
        kinds = pipe.execute(raise_on_error=False)
    for name, kind in zip(names, kinds, strict=True):
        held = f" (it is a {text(kind)})" if isinstance(kind, bytes | str) else ""
        damage.note(request, f"key {name!r} holds another type than its kind{held}: skipped")
