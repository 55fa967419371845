"""The operator's view of workflows, read only: ``forkq batches`` (the newest batches),
``forkq batch BID`` (one batch: its figures, events, callbacks and some of its members) and
what ``forkq job JID`` adds for a job that takes part in one (:func:`of_job`: its batch,
its chain, its progress). On :mod:`forkq.batches`, :mod:`forkq.canvas` and
:mod:`forkq.progress`.

A batch's **state** is ``succeeded`` once its success event fired, else ``complete`` once
its complete event fired (every member ran; some failed their last run), else ``open``.

Reads, all bounded: ``forkq:batches`` (ZREVRANGE of the newest ``--limit``, ZCARD), each
listed batch's record and the sizes of its ``:pending`` and ``:failed`` sets (one
pipeline); for one batch, up to ``--limit`` members of each set (SSCAN) and whether each
shown member is a child batch or a chain (EXISTS of their records, one pipeline); for a
job, its batch's record, its chain's record and ``forkq:progress:<jid>``. A key of another
type is named on stderr (exit 1) and the rest is shown; an ACL's refusal is raised (the
CLI exits 77).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from forkq import batches, canvas, keys
from forkq import client as clients
from forkq.connection import is_wrong_type, text
from forkq.errors import EXIT_FAILURE, EXIT_NOT_FOUND
from forkq.ops import tables
from forkq.ops.outcome import Outcome, damaged, failed
from forkq.ops.stats import holds
from forkq.printable import printable
from forkq.progress import read as read_progress
from forkq.wording import counted, duration


def state_of(status: batches.BatchStatus) -> str:
    """``succeeded``, ``complete`` or ``open`` (see the module's doc)."""
    return "succeeded" if status.success else "complete" if status.complete else "open"


def _summary(status: batches.BatchStatus) -> dict[str, Any]:
    return {**status.as_dict(), "state": state_of(status)}


def _percent(status: batches.BatchStatus) -> str:
    return f"{status.progress:.0%}"


# --- forkq batches -------------------------------------------------------------------------


def batch_list(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """``batches [--limit N]``: the newest batches (0: all), newest first."""
    broken: list[str] = []
    try:
        limit = args.limit or int(client.zcard(keys.BATCHES))
        found = batches.recent(clients.Client(client), limit)
        size = int(client.zcard(keys.BATCHES))
    except redis.ResponseError as exc:
        if not is_wrong_type(exc):
            raise
        found, size, broken = [], 0, [keys.BATCHES]
    now = time.time()
    rows = [[s.bid, state_of(s), s.total, s.pending, s.failures, _percent(s),
             tables.moment(s.created_at, now), tables.short(s.description, 40)] for s in found]
    shown = f" (the newest {len(found)}; --limit 0 lists all)" if len(found) < size else ""
    listing = tables.table(["BID", "STATE", "TOTAL", "PENDING", "FAILURES", "PROGRESS",
                            "CREATED", "DESCRIPTION"], rows)
    data = {"size": size, "batches": [_summary(s) for s in found], "damaged": broken}
    return Outcome(data, f"Batches: {size}{shown}\n{listing}", *damaged(broken))


# --- forkq batch BID ------------------------------------------------------------------------


def batch_show(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """``batch BID [--limit N]``: one batch whole, with up to N of its pending and of its
    failed members (0: all); 66 when there is no such batch, 1 when a key of it holds
    another type."""
    found = batches.read(clients.Client(client), [args.bid])
    meta = keys.batch(args.bid)
    if not found:
        kind = text(client.type(meta))
        if kind != "none":
            return failed(EXIT_FAILURE, f"batch {args.bid}: {holds(meta, kind, 'hash')}",
                          damaged=[meta])
        return failed(EXIT_NOT_FOUND, f"batch {args.bid} not found (never made, or expired "
                      "and dropped)", missing=[args.bid])
    status = found[0]
    broken: list[str] = []
    members = _members(client, status, args.limit, broken)
    kinds = _kinds(client, {*members.pending, *members.failed})
    now = time.time()
    data = {"batch": _summary(status),
            "members": {"pending": [_member(m, kinds) for m in members.pending],
                        "failed": [_member(m, kinds) for m in members.failed],
                        "more": members.more},
            "damaged": broken}
    page = "\n\n".join([
        _batch_text(status, now),
        "Events\n" + tables.table(["EVENT", "CALLBACK JID", "FIRED"], [
            [event, status.callbacks.get(event, "(none)"),
             tables.moment(status.fired[event], now) if event in status.fired else "not yet"]
            for event in batches.EVENTS]),
        _members_text("Failed members", members.failed, status.failures, kinds),
        _members_text("Pending members", members.pending, status.pending, kinds),
    ])
    return Outcome(data, page, *damaged(broken))


def _batch_text(status: batches.BatchStatus, now: float) -> str:
    fields = [("description", status.description or "-"),
              ("created", tables.moment(status.created_at, now)),
              ("members", f"{status.total}: {status.succeeded} succeeded, {status.pending} "
                          f"pending ({status.failures} of them failed their last run)"),
              ("progress", f"{_percent(status)} succeeded")]
    if status.parent:
        fields.append(("parent", status.parent))
    lines = [f"batch {printable(status.bid)}: {state_of(status)}"]
    lines += [f"  {name:<12} {printable(value)}" for name, value in fields]
    return "\n".join(lines)


def _members(client: redis.Redis, status: batches.BatchStatus, limit: int,
             broken: list[str]) -> batches.Members:
    """Up to ``limit`` (0: all) pending and failed members; none, and the set(s) of another
    type appended to ``broken``, when Redis refuses the scan for a key's type."""
    try:
        return batches.members(clients.Client(client), status.bid,
                               limit or max(status.pending, 1))
    except redis.ResponseError as exc:
        if not is_wrong_type(exc):
            raise
    meta = keys.batch(status.bid)
    broken += [name for name in (f"{meta}:pending", f"{meta}:failed")
               if text(client.type(name)) not in ("set", "none")]
    return batches.Members([], [], False)


def _kinds(client: redis.Redis, members: set[str]) -> dict[str, str]:
    """Each member's kind: ``batch`` (a child batch), ``chain`` or ``job`` (one round trip)."""
    names = sorted(members)
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.exists(keys.batch(name))
            pipe.exists(keys.chain(name))
        found = pipe.execute()
    return {name: "batch" if found[2 * i] else "chain" if found[2 * i + 1] else "job"
            for i, name in enumerate(names)}


def _member(name: str, kinds: dict[str, str]) -> dict[str, str]:
    return {"member": name, "kind": kinds.get(name, "job")}


def _members_text(title: str, shown: list[str], count: int, kinds: dict[str, str]) -> str:
    more = (f"; the first {len(shown)} shown, --limit 0 lists all" if len(shown) < count
            else "")
    rows = [[name, kinds.get(name, "job")] for name in shown]
    return f"{title} ({count}{more})\n" + tables.table(["MEMBER", "KIND"], rows)


# --- forkq job JID ------------------------------------------------------------------------


@dataclass
class JobFlows:
    """What ``forkq job`` adds for a job of a workflow: ``data`` (``batch``, ``chain``,
    ``progress``: each None when the job has none), ``fields`` (name, text) for its text,
    ``notes`` for stderr (a key of another type)."""

    data: dict[str, Any] = field(default_factory=dict)
    fields: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def of_job(client: redis.Redis, item: dict[str, Any], jid: str) -> JobFlows:
    """The batch, chain and progress of the job ``item`` (``jid``). A chain's step names
    its chain, not the batch the chain belongs to: that batch is shown through the chain."""
    flows = JobFlows({"batch": None, "chain": None, "progress": None})
    bid = item.get(batches.FIELD)
    chained = JobFlows()
    chain = _chain(client, item, chained)
    through = ""
    if not (isinstance(bid, str) and bid) and chain is not None and chain.bid:
        bid, through = chain.bid, " (its chain's batch)"
    if isinstance(bid, str) and bid:
        _batch_of_job(client, bid, flows, through)
    flows.data["chain"] = chained.data.get("chain")
    flows.fields += chained.fields
    flows.notes += chained.notes
    report = read_progress(client, jid)
    if report is not None:
        flows.data["progress"] = report
        flows.fields.append(("progress", _progress_text(report, time.time())))
    return flows


def _batch_of_job(client: redis.Redis, bid: str, flows: JobFlows, through: str) -> None:
    found = batches.read(clients.Client(client), [bid])
    if not found:
        kind = text(client.type(keys.batch(bid)))
        gone = "no longer in Redis: expired, or never committed"
        if kind != "none":
            flows.notes.append(f"note: {holds(keys.batch(bid), kind, 'hash')}; skipped")
            gone = f"its record holds a {kind}"
        flows.data["batch"] = {"bid": bid, "state": None}
        flows.fields.append(("batch", f"{printable(bid)} ({gone}){through}"))
        return
    status = found[0]
    flows.data["batch"] = _summary(status)
    flows.fields.append(("batch", f"{printable(bid)}: {state_of(status)}, {status.succeeded} "
                                  f"of {status.total} succeeded ({_percent(status)}), "
                                  f"{status.pending} pending, {status.failures} failed"
                                  f"{through}"))


def _chain(client: redis.Redis, item: dict[str, Any], flows: JobFlows
           ) -> canvas.ChainStatus | None:
    cid, step = item.get(canvas.FIELD), item.get(canvas.STEP)
    if not (isinstance(cid, str) and cid):
        return None
    gone = "no longer in Redis"
    try:
        chain = canvas.chain_status(cid, client=clients.Client(client))
    except redis.ResponseError as exc:
        if not is_wrong_type(exc):
            raise
        kind = text(client.type(keys.chain(cid)))
        flows.notes.append(f"note: {holds(keys.chain(cid), kind, 'hash')}; skipped")
        chain, gone = None, f"its record holds a {kind}"
    this = step if isinstance(step, int) and not isinstance(step, bool) else None
    if chain is None:
        flows.data["chain"] = {"cid": cid, "state": None, "this_step": this}
        flows.fields.append(("chain", f"{printable(cid)} ({gone})"))
        return None
    flows.data["chain"] = {**chain.as_dict(), "this_step": this}
    flows.fields.append(("chain", _chain_text(chain, this)))
    return chain


def _chain_text(chain: canvas.ChainStatus, this: int | None) -> str:
    count = len(chain.steps)
    where = {"running": f"at step {chain.step} of {count}",
             "failed": f"failed at step {chain.failed_step} of {count}",
             "succeeded": f"all {counted(count, 'step')} succeeded"}.get(chain.state, "")
    mine = f"; this job is step {this}" if this is not None else ""
    rows = [[index, name, jid, _step_state(chain, index)]
            for index, (name, jid) in enumerate(chain.steps, start=1)]
    return (f"{printable(chain.cid)}: {printable(chain.state)}, {where}{mine}\n"
            + tables.table(["STEP", "CLASS", "JID", "STATE"], rows))


def _step_state(chain: canvas.ChainStatus, index: int) -> str:
    """What became of step ``index``: succeeded, current (pushed: queued, running or
    retrying), failed, waiting or not run (after a failed step)."""
    if chain.state == "succeeded":
        return "succeeded"
    stop = chain.failed_step if chain.state == "failed" and chain.failed_step else chain.step
    if index < stop:
        return "succeeded"
    if index == stop:
        return "failed" if chain.state == "failed" else "current"
    return "not run" if chain.state == "failed" else "waiting"


def _progress_text(report: dict[str, Any], now: float) -> str:
    done, total = report.get("done"), report.get("total")
    figure = f"{done:g}" if isinstance(done, float) else "?"
    if isinstance(total, float):
        share = f" ({done / total:.0%})" if isinstance(done, float) and total > 0 else ""
        figure = f"{figure}/{total:g}{share}"
    note = f": {printable(report['note'])}" if report.get("note") else ""
    at = report.get("at")
    when = f", {duration(now - at)} ago" if isinstance(at, float) else ""
    return f"{figure}{note}{when}"
