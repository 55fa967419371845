"""The Queues pages: ``GET /queues`` (every queue's size, latency and paused state, a page of
names at a time) and ``GET /queues/<name>`` (one queue's jobs, newest first, a page at a time).

Actions (POST, admin only; the queue in the ``name`` field): ``/queues/pause``,
``/queues/resume`` (:meth:`forkq.ops.queues.Queue.pause`: across the cluster),
``/queues/clear`` (drops every job and unlists the queue), ``/queues/delete`` (one job,
matched by its exact bytes, sent back base64 in ``job``: ``LREM 1``, as
:meth:`forkq.ops.queues.Queue.delete`).

Bounded work: the list page reads the names (``SMEMBERS queues`` and ``forkq:paused``) and
then LLEN + LINDEX -1 for the names of its page only, in one pipeline; a queue's page reads
LLEN and one LRANGE of its page.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable

from forkq import keys
from forkq.connection import raw
from forkq.errors import ForkqError
from forkq.ops.queues import Queue
from forkq.ops.records import JobRecord
from forkq.web import damage
from forkq.web.routes import Request, Response, paginate, redirect, render, route
from forkq.wording import counted

QUEUES_PER_PAGE = 200
JOBS_PER_PAGE = 25


@route("GET", "/queues")
def queues(request: Request) -> Response:
    client = request.redis
    damage.fixed(request, keys.QUEUES, keys.PAUSED)
    try:
        paused = Queue.paused_names(client)
    except ForkqError:  # named by the check above
        paused = set()
    names = sorted(damage.members(request, keys.QUEUES) | paused)
    pager = paginate(len(names), request.int_arg("page", 1, low=1), QUEUES_PER_PAGE)
    shown = names[pager["start"]:pager["stop"]]
    with client.pipeline(transaction=False) as pipe:
        for name in shown:
            pipe.llen(keys.queue(name))
            pipe.lindex(keys.queue(name), -1)
        replies = pipe.execute(raise_on_error=False)
    now = time.time()
    rows = []
    for index, name in enumerate(shown):
        size, oldest = replies[2 * index], replies[2 * index + 1]
        wrong = isinstance(size, Exception)
        rows.append({"name": name, "size": 0 if wrong else int(size), "paused": name in paused,
                     "latency": 0.0 if wrong or not oldest or isinstance(oldest, Exception)
                     else JobRecord(raw(oldest)).latency(now),
                     "problem": f"{keys.queue(name)} is not a list" if wrong else ""})
    return render(request, "queues.html", rows=rows, pager=pager)


@route("GET", "/queues/<path:name>")
def queue(request: Request) -> Response:
    found = Queue(request.redis, request.params["name"])
    damaged = damage.check(request, {keys.QUEUES: damage.TYPES[keys.QUEUES],
                                     keys.PAUSED: damage.TYPES[keys.PAUSED], found.key: "list"})
    usable = found.key not in damaged  # a list of another type shows as empty, named
    size = found.size() if usable else 0
    pager = paginate(size, request.int_arg("page", 1, low=1), JOBS_PER_PAGE)
    members = request.redis.lrange(found.key, pager["start"], pager["stop"] - 1) if size else []
    jobs = [(JobRecord(raw(member), found.key), base64.b64encode(raw(member)).decode())
            for member in members]
    return render(request, "queue.html", queue=found, size=size, pager=pager, jobs=jobs,
                  latency=found.latency() if usable else 0.0,
                  paused=damage.guarded(request, found.is_paused, False, "the paused state"),
                  exists=not usable or damage.guarded(request, found.exists, size > 0,
                                                      "the queue list"),
                  at=time.time())


def _back(request: Request, name: str) -> str:
    return f"/queues/{name}" if request.field("back") == "queue" else "/queues"


def _named(request: Request) -> Queue | None:
    name = request.field("name")
    return Queue(request.redis, name) if name else None


@route("POST", "/queues/pause")
def pause(request: Request) -> Response:
    return _switch(request, "pause", Queue.pause, "it was paused already")


@route("POST", "/queues/resume")
def resume(request: Request) -> Response:
    return _switch(request, "resume", Queue.resume, "it was not paused")


def _switch(request: Request, verb: str, act: Callable[[Queue], bool],
            unchanged: str) -> Response:
    """``verb`` (pause or resume) the named queue with ``act`` (which answers whether it
    changed) and go back, saying what was done."""
    found = _named(request)
    if found is None:
        return redirect(request, "/queues", flash=f"{verb}: no queue named")
    note = "" if act(found) else f" ({unchanged})"
    return redirect(request, _back(request, found.name), flash=f"{verb}d {found.name}{note}")


@route("POST", "/queues/clear")
def clear(request: Request) -> Response:
    found = _named(request)
    if found is None:
        return redirect(request, "/queues", flash="clear: no queue named")
    dropped = found.clear()
    return redirect(request, "/queues",
                    flash=f"cleared {found.name}: {counted(dropped, 'job')} dropped")


@route("POST", "/queues/delete")
def delete(request: Request) -> Response:
    found = _named(request)
    if found is None:
        return redirect(request, "/queues", flash="delete: no queue named")
    try:
        member = base64.b64decode(request.field("job"), validate=True)
    except (binascii.Error, ValueError):
        return redirect(request, _back(request, found.name), flash="delete: unreadable job")
    job = JobRecord(member, found.key)
    done = found.delete(job)
    what = f"job {job.jid}" if job.jid else "the entry"
    message = f"deleted {what} from {found.name}" if done else \
        f"{what} is no longer in {found.name} (run, moved or deleted meanwhile)"
    return redirect(request, _back(request, found.name), flash=message)
