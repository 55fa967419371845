"""The operator's commands on top of :mod:`forkq.api`: ``status``, ``quiet``, ``stop``,
``queues``, ``retries`` / ``dead`` / ``scheduled`` and ``enqueue``.

Each command is a function ``(client, args) -> Outcome``: the data printed with
``--json`` (one JSON object), the text printed otherwise, and the exit status:

- 0 — done;
- 2 — usage error (a missing or contradictory argument);
- 65 — unusable input (``enqueue`` arguments that are not JSON-encodable, a bad ``--at``);
- 66 — a named process, queue or jid is not there (the others named were still acted on);
- 69 — Redis did not answer (raised by the caller's connection, handled in :mod:`forkq.cli`);
- 1 — any other refusal (for instance retrying a set entry that is not a job).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis

from forkq import client as clients
from forkq import tables
from forkq.errors import EXIT_DATAERR, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, NotFoundError
from forkq.jobrecord import SortedEntry
from forkq.jobsets import SETS, JobSet
from forkq.processes import ProcessSet
from forkq.queues import Queue
from forkq.stats import Stats


@dataclass
class Outcome:
    """What a command prints and how it exits."""

    data: dict[str, Any]
    text: str
    code: int = EXIT_OK
    errors: list[str] = field(default_factory=list)


Command = Callable[[redis.Redis, argparse.Namespace], Outcome]


def usage(message: str) -> Outcome:
    return Outcome({"error": message}, "", EXIT_USAGE, [message])


# --- status ------------------------------------------------------------------------


def status(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """Processes, queues and totals in one view."""
    now = time.time()
    processes = ProcessSet(client).live()
    queues = [(q.name, q.size(), q.latency(now)) for q in Queue.all(client)]
    stats = Stats.read(client, now)
    data = {
        "processes": [p.summary() for p in processes],
        "queues": [{"name": n, "size": s, "latency": lat} for n, s, lat in queues],
        "stats": stats.summary(),
    }
    capacity = sum(p.concurrency for p in processes)
    text = "\n\n".join([
        f"Processes ({len(processes)})\n" + tables.table(
            ["IDENTITY", "TAG", "PID", "BUSY", "QUIET", "LEADER", "STARTED"],
            [[p.identity, p.tag, p.pid, f"{p.busy}/{p.concurrency}", tables.yes(p.quiet),
              tables.yes(p.leader), tables.moment(p.started_at, now)] for p in processes]),
        f"Queues ({len(queues)})\n" + _queue_table(queues),
        "Totals\n" + tables.table(
            ["PROCESSED", "FAILED", "ENQUEUED", "SCHEDULED", "RETRIES", "DEAD", "BUSY"],
            [[stats.processed, stats.failed, stats.enqueued, stats.scheduled_size,
              stats.retry_size, stats.dead_size, f"{stats.workers_size}/{capacity}"]]),
    ])
    return Outcome(data, text)


def _queue_table(queues: list[tuple[str, int, float]]) -> str:
    return tables.table(["NAME", "SIZE", "LATENCY"],
                        [[n, s, tables.seconds(lat)] for n, s, lat in queues])


# --- quiet / stop ------------------------------------------------------------------------


def signal_processes(action: str) -> Command:
    """``quiet`` or ``stop``: the named processes (or ``--all``) get Sidekiq's remote signal."""

    def run(client: redis.Redis, args: argparse.Namespace) -> Outcome:
        if bool(args.identities) == bool(args.all):
            return usage(f"{action}: name one or more IDENTITY, or --all")
        processes = ProcessSet(client)
        targets, errors = [], []
        for wanted in args.identities:
            try:
                targets.append(processes.find(wanted))
            except NotFoundError as exc:
                errors.append(str(exc))
        if args.all:
            targets = processes.live()
        for process in targets:
            processes.signal(process, action)
        done = [p.identity for p in targets]
        verb = "quiet" if action == "quiet" else "stop"
        text = "\n".join(f"asked {i} to {verb} (it acts at its next heartbeat)" for i in done)
        if not done and not errors:
            text = "no live processes"
        return Outcome({"signalled": done, "signal": action}, text,
                       EXIT_NOT_FOUND if errors else EXIT_OK, errors)

    return run


# --- queues -------------------------------------------------------------------------------


def queues(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """``queues [list]``, ``queues jobs NAME``, ``queues clear NAME``."""
    if args.action == "list":
        if args.name:
            return usage("queues list takes no NAME (use: forkq queues jobs NAME)")
        now = time.time()
        rows = [(q.name, q.size(), q.latency(now)) for q in Queue.all(client)]
        return Outcome({"queues": [{"name": n, "size": s, "latency": lat} for n, s, lat in rows]},
                       _queue_table(rows))
    if not args.name:
        return usage(f"queues {args.action} needs a queue NAME")
    queue = Queue(client, args.name)
    if not queue.exists():
        return _missing(f"no queue {args.name!r} (known: "
                        f"{', '.join(q.name for q in Queue.all(client)) or 'none'})")
    if args.action == "clear":
        dropped = queue.clear()
        return Outcome({"queue": queue.name, "cleared": dropped},
                       f"cleared queue {queue.name}: {dropped} jobs dropped")
    now = time.time()
    jobs = list(queue.jobs(args.limit))
    return Outcome(
        {"queue": queue.name, "size": queue.size(), "jobs": [j.summary() for j in jobs]},
        tables.table(["JID", "CLASS", "ARGS", "ENQUEUED"],
                     [[j.jid, j.klass, tables.short(json.dumps(j.args)),
                       tables.moment(j.enqueued_at, now)] for j in jobs]))


def _missing(message: str) -> Outcome:
    return Outcome({"error": message}, "", EXIT_NOT_FOUND, [message])


# --- retries / dead / scheduled -----------------------------------------------------------------


def job_set(kind: str) -> Command:
    """``<kind> [list]``, ``<kind> retry|delete|kill JID...|--all``, ``<kind> clear``."""

    def run(client: redis.Redis, args: argparse.Namespace) -> Outcome:
        jobs = SETS[kind](client)
        if args.action == "list":
            return _list_set(jobs, kind, args.limit)
        if args.action == "clear":
            if args.jids or args.all:
                return usage(f"{kind} clear takes no JID and no --all")
            cleared = jobs.clear()
            return Outcome({"set": jobs.name, "cleared": cleared},
                           f"cleared {kind}: {cleared} jobs dropped")
        if args.action == "kill" and kind == "dead":
            return usage("dead jobs cannot be killed again (use: forkq dead delete)")
        if bool(args.jids) == bool(args.all):
            return usage(f"{kind} {args.action}: name one or more JID, or --all")
        return _act(jobs, kind, args.action, args.jids, every=args.all)

    return run


def _list_set(jobs: JobSet, kind: str, limit: int | None) -> Outcome:
    now = time.time()
    entries = list(jobs.entries(limit, reverse=kind == "dead"))
    when = {"scheduled": "DUE", "retries": "NEXT RETRY", "dead": "DIED"}[kind]
    rows = [[e.jid, e.klass, e.queue, tables.short(json.dumps(e.args), 40),
             tables.moment(e.score, now), e.retry_count if e.retry_count is not None else "",
             tables.short(f"{e.error_class}: {e.error_message}", 50) if e.error_class else ""]
            for e in entries]
    text = tables.table(["JID", "CLASS", "QUEUE", "ARGS", when, "RETRIES", "ERROR"], rows)
    return Outcome({"set": jobs.name, "size": jobs.size(),
                    "jobs": [e.summary() for e in entries]},
                   f"{kind}: {jobs.size()} jobs\n{text}")


_PAST = {"retry": "enqueued", "delete": "deleted", "kill": "killed"}


def _act(jobs: JobSet, kind: str, action: str, jids: list[str], *, every: bool) -> Outcome:
    """Apply ``action`` to each named jid (or every entry); jids not found are reported."""
    targets: list[tuple[str, SortedEntry | None]]
    if every:
        targets = [(entry.jid, entry) for entry in jobs.entries()]
    else:
        targets = [(jid, jobs.find_job(jid)) for jid in jids]
    method = {"retry": jobs.add_to_queue if kind == "scheduled" else jobs.retry,
              "delete": jobs.delete, "kill": jobs.kill}[action]
    done: list[str] = []
    missing: list[str] = []
    for jid, entry in targets:
        # False: it left the set between the read and the action (run, moved or deleted)
        (done if entry is not None and method(entry) else missing).append(jid)
    errors = [f"no job {jid!r} in {kind}" for jid in missing]
    past = _PAST[action]
    text = "\n".join(f"{past} {jid}" for jid in done) or f"nothing {past}"
    return Outcome({"set": jobs.name, past: done, "missing": missing}, text,
                   EXIT_NOT_FOUND if missing else EXIT_OK, errors)


# --- enqueue ------------------------------------------------------------------------------


def enqueue(client: redis.Redis, args: argparse.Namespace,
            defaults: dict[str, Any] | None = None) -> Outcome:
    """Push one job by name, with ``defaults`` (a registered job's options) under the flags.
    Each ARG is JSON when it parses as JSON, else a string."""
    item: dict[str, Any] = dict(defaults or {})
    item["class"] = args.name
    item["args"] = [_arg(text) for text in args.args]
    if args.to_queue:
        item["queue"] = args.to_queue
    if args.retry is not None:
        item["retry"] = args.retry
    if args.in_seconds is not None and args.at is not None:
        return usage("enqueue: give --in or --at, not both")
    if args.in_seconds is not None:
        item["at"] = time.time() + args.in_seconds
    elif args.at is not None:
        item["at"] = args.at
    try:
        jid = clients.Client(client).push(item)
    except (TypeError, ValueError) as exc:
        return Outcome({"error": str(exc)}, "", EXIT_DATAERR, [f"enqueue: {exc}"])
    now = time.time()
    at = item["at"] if item.get("at") is not None and item["at"] > now else None
    queue = item.get("queue", "default")
    where = f"schedule (due {tables.moment(at, now)})" if at else f"queue {queue}"
    return Outcome({"jid": jid, "class": args.name, "queue": queue, "at": at},
                   f"enqueued {args.name} {jid} to {where}")


def _arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def retry_option(text: str) -> bool | int:
    """``--retry``: true, false or a number of retries (an argparse type)."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    count = int(text)
    if count < 0:
        raise ValueError(text)
    return count


def when_option(text: str) -> float:
    """``--at``: epoch seconds, or an ISO 8601 time (local time unless it has an offset)."""
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text).timestamp()


def emit(outcome: Outcome, *, as_json: bool) -> int:
    """Print ``outcome`` (JSON or text on stdout, errors on stderr); its exit status."""
    if as_json:
        print(json.dumps(outcome.data, ensure_ascii=False))
    elif outcome.text:
        print(outcome.text)
    for error in outcome.errors:
        print(f"forkq: {error}", file=sys.stderr)
    return outcome.code
