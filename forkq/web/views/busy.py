"""The Busy page (``GET /busy``): every live process (host, tag, pid, concurrency, busy,
quiet, leader, RSS, started, version, queues) and what each busy processor runs, for how long.

Actions (POST, admin only): ``/busy/quiet`` and ``/busy/stop`` send Sidekiq's remote signal to
the process named by ``identity`` (or to every live process with ``all=1``), acted on at its
next heartbeat (:meth:`forkq.ops.processes.ProcessSet.signal`); ``/busy/cancel`` cancels the
job ``jid`` (:func:`forkq.ops.cancel.cancel`: its processor is stopped, the job filed to dead).

Bounded work: one pipelined read of the process records and one of the busy hashes of the
processes whose record counts a busy processor (two HGETALLs per such process, each holding
at most its concurrency). The processes table shows :data:`PROCESSES_PER_PAGE` at a time
(the totals count them all), so a fleet of a thousand daemons is a page, not a megabyte.
"""

from __future__ import annotations

import time

from forkq import keys
from forkq.errors import ForkqError, NotFoundError
from forkq.ops import cancel
from forkq.ops.processes import ProcessSet
from forkq.web import damage
from forkq.web.routes import Request, Response, paginate, redirect, render, route

_VERBS = {"quiet": "asked {} to quiet", "stop": "asked {} to stop"}
PROCESSES_PER_PAGE = 100


@route("GET", "/busy")
def busy(request: Request) -> Response:
    damage.fixed(request, keys.PROCESSES, keys.DEAR_LEADER)  # live() reads them as empty
    processes = ProcessSet(request.redis)
    live = processes.live()
    work = processes.work(live)
    pager = paginate(len(live), request.int_arg("page", 1, low=1), PROCESSES_PER_PAGE)
    return render(request, "busy.html", processes=live[pager["start"]:pager["stop"]],
                  pager=pager, work=work, at=time.time(),
                  capacity=sum(p.concurrency for p in live),
                  busy_total=sum(p.busy for p in live))


def _signal(request: Request, action: str) -> Response:
    processes = ProcessSet(request.redis)
    live = processes.live()
    if request.field("all") == "1":
        targets = [p for p in live if not p.embedded]
    else:
        try:
            targets = [processes.find(request.field("identity"), live)]
        except NotFoundError as exc:
            return redirect(request, "/busy", flash=str(exc))
    done, problems = [], []
    for process in targets:
        try:
            processes.signal(process, action)
        except ForkqError as exc:
            problems.append(str(exc))
        else:
            done.append(process.identity)
    told = [_VERBS[action].format(", ".join(done)) + " (acted on at the next heartbeat)"]
    message = "; ".join((told if done else []) + problems) or "no live processes"
    return redirect(request, "/busy", flash=message)


@route("POST", "/busy/quiet")
def quiet(request: Request) -> Response:
    return _signal(request, "quiet")


@route("POST", "/busy/stop")
def stop(request: Request) -> Response:
    return _signal(request, "stop")


@route("POST", "/busy/cancel")
def cancel_job(request: Request) -> Response:
    jid = request.field("jid")
    if not jid:
        return redirect(request, "/busy", flash="cancel: no jid given")
    return redirect(request, "/busy", flash=cancel.cancel(request.redis, jid).describe())
