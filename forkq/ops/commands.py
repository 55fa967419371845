"""The operator's commands on top of :mod:`forkq.api`: ``status``, ``quiet``, ``stop``,
``dump``, ``reload``, ``queues``, ``retries`` / ``dead`` / ``scheduled``, ``job``,
``limits``, ``uniques`` and ``enqueue``; ``batches`` and ``batch`` are in
:mod:`forkq.ops.workflows`.

Each command is a function ``(client, args) -> Outcome`` (:mod:`forkq.ops.outcome`): the
data printed with ``--json`` (one JSON object on stdout), the text printed otherwise, the
messages for stderr, and the exit status:

- 0 — done;
- 2 — usage error (a missing or contradictory argument; argparse's own errors too);
- 65 — unusable input (an ``enqueue`` ARG that looks like JSON but does not parse, or a
  value JSON cannot carry such as NaN);
- 66 — a named process, queue, jid or batch is not there; the others named were still acted
  on, and ``--json`` lists the absent ones under ``missing`` (``job JID``: "job JID not
  found");
- 1 — something named was refused (a set entry that is not a job, a remote signal a
  process does not take); the rest were acted on, and ``--json`` lists them under
  ``refused``. Also ``status`` and ``queues [list]`` reading a damaged key (a queue that is
  no list, a counter that is no number, ``forkq:paused`` that is no set): it counts as empty,
  the rest is shown, and the key is named on stderr and under ``damaged``. Redis errors are
  handled in :mod:`forkq.cli` (69 when it does not answer, 77 for an ACL's refusal).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import redis

from forkq import client as clients
from forkq import keys, unique
from forkq.connection import text
from forkq.errors import (
    EXIT_DATAERR,
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    ForkqError,
    NotFoundError,
)
from forkq.ops import cancel, flow, tables, workflows
from forkq.ops.lookup import Place, find_job
from forkq.ops.outcome import Command, Outcome, damaged, failed
from forkq.ops.processes import ProcessSet, Work
from forkq.ops.queues import Queue
from forkq.ops.records import SortedEntry
from forkq.ops.sorted_sets import SETS, JobSet
from forkq.ops.stats import Stats, describe_damage, holds
from forkq.printable import json_text, printable
from forkq.wording import counted, duration


def _with_problems(data: dict[str, Any], missing: list[str], refused: list[str]
                   ) -> tuple[dict[str, Any], int]:
    """``data`` with ``missing`` and ``refused``, and the exit status they call for."""
    code = EXIT_NOT_FOUND if missing else EXIT_FAILURE if refused else EXIT_OK
    return {**data, "missing": missing, "refused": refused}, code


# --- status ------------------------------------------------------------------------


def status(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """Processes, what each busy processor runs, queues and totals in one view."""
    now = time.time()
    processes = ProcessSet(client)
    live = processes.live()
    work = processes.work(live)
    stats, paused, damage = _totals(client, now, busy=sum(p.busy for p in live))
    queues = _queue_rows(stats, paused)
    data = {"processes": [p.summary() for p in live], "busy": [w.summary() for w in work],
            "queues": queues, "stats": stats.summary(), "damaged": damage.keys}
    capacity = sum(p.concurrency for p in live)
    text = "\n\n".join([
        f"Processes ({len(live)})\n" + tables.table(
            ["IDENTITY", "TAG", "PID", "BUSY", "QUIET", "LEADER", "STARTED"],
            [[p.identity, p.tag, p.pid, f"{p.busy}/{p.concurrency}", tables.yes(p.quiet),
              tables.yes(p.leader), tables.moment(p.started_at, now)] for p in live]),
        f"Busy ({len(work)})\n" + _work_table(work, now),
        f"Queues ({len(queues)})\n" + _queue_table(queues),
        "Totals\n" + tables.table(
            ["PROCESSED", "FAILED", "ENQUEUED", "SCHEDULED", "RETRIES", "DEAD", "BUSY"],
            [[stats.processed, stats.failed, stats.enqueued, stats.scheduled_size,
              stats.retry_size, stats.dead_size, f"{stats.workers_size}/{capacity}"]]),
    ])
    return Outcome(data, text, damage.code, damage.notes)


@dataclass(frozen=True)
class Damage:
    """Keys a listing read as empty because they hold the wrong kind of value (written by
    another program, or a typo at ``redis-cli``): their names, a note for each, and the exit
    status (1 when there is any: what is shown is right, but incomplete)."""

    keys: list[str]
    notes: list[str]

    @property
    def code(self) -> int:
        return EXIT_FAILURE if self.keys else EXIT_OK


def _totals(client: redis.Redis, now: float | None = None, *,
            busy: int | None = None) -> tuple[Stats, set[str], Damage]:
    """The totals and the paused queues' names; a damaged key (a queue that is no list, a
    counter that is no number, a paused-queues key that is no set) reads as empty and is
    named, and the rest still shows (one bad key never hides the others)."""
    damaged: list[str] = []
    stats = Stats.read(client, now, damaged=damaged, busy=busy)
    try:
        paused = Queue.paused_names(client)
    except ForkqError:
        paused = set()
        damaged.append(keys.PAUSED)
    notes = [f"note: {describe_damage(client, name)}; read as empty" for name in damaged]
    return stats, paused, Damage(damaged, notes)


def _work_table(work: list[Work], now: float) -> str:
    return tables.table(
        ["IDENTITY", "PROCESSOR", "QUEUE", "CLASS", "JID", "RUNNING"],
        [[w.identity, w.thread, w.queue, w.payload.get("class"), w.payload.get("jid"),
          duration(now - w.run_at)] for w in work])


def _queue_rows(stats: Stats, paused: set[str]) -> list[dict[str, Any]]:
    """``{name, size, latency, paused}`` per listed queue."""
    return [{"name": name, "size": size, "latency": stats.latencies[name],
             "paused": name in paused} for name, size in stats.queues.items()]


def _queue_table(rows: list[dict[str, Any]]) -> str:
    return tables.table(["NAME", "SIZE", "LATENCY", "PAUSED"],
                        [[q["name"], q["size"], duration(q["latency"]),
                          "paused" if q["paused"] else ""] for q in rows])


# --- quiet / stop / dump / reload --------------------------------------------------------------

_ASKED = {"quiet": "asked {} to quiet", "stop": "asked {} to stop",
          "dump": "asked {} to log its stacks", "reload": "asked {} to reload its configuration"}


def signal_processes(action: str) -> Command:
    """The named processes (or ``--all``) get Sidekiq's remote signal for ``action``."""

    def run(client: redis.Redis, args: argparse.Namespace) -> Outcome:
        if bool(args.identities) == bool(args.all):
            return failed(EXIT_USAGE, f"{action}: name one or more IDENTITY, or --all")
        processes = ProcessSet(client)
        live = processes.live()
        targets = list(live) if args.all else []
        missing, refused, errors = [], [], []
        for wanted in args.identities:
            try:
                targets.append(processes.find(wanted, live))
            except NotFoundError as exc:
                missing.append(wanted)
                errors.append(str(exc))
        done = []
        for process in targets:
            try:
                processes.signal(process, action)
            except ForkqError as exc:
                refused.append(process.identity)
                errors.append(str(exc))
            else:
                done.append(process.identity)
        lines = [_ASKED[action].format(printable(i)) + " (it acts at its next heartbeat)"
                 for i in done]
        if not targets and not errors:
            lines = ["no live processes"]
        data, code = _with_problems({"signal": action, "signalled": done}, missing, refused)
        return Outcome(data, "\n".join(lines), code, errors)

    return run


# --- queues -------------------------------------------------------------------------------


def queues(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """``queues [list]``, ``queues jobs NAME``, ``queues clear NAME``, ``queues pause|resume
    NAME`` (a queue with no jobs yet may be paused)."""
    if args.action == "list":
        if args.name:
            return failed(EXIT_USAGE, "queues list takes no NAME (use: forkq queues jobs NAME)")
        stats, paused, damage = _totals(client)
        rows = _queue_rows(stats, paused)
        return Outcome({"queues": rows, "damaged": damage.keys}, _queue_table(rows), damage.code,
                       damage.notes)
    if not args.name:
        return failed(EXIT_USAGE, f"queues {args.action} needs a queue NAME")
    queue = Queue(client, args.name)
    if args.action in ("pause", "resume"):
        return _pause(queue, args.action)
    kind = text(client.type(queue.key))
    if kind not in ("list", "none"):
        return failed(EXIT_FAILURE, f"queue {queue.name!r}: {holds(queue.key, kind, 'list')}; "
                                    "nothing done", damaged=[queue.key])
    if not queue.exists():
        known = ", ".join(printable(q.name) for q in Queue.all(client)) or "none"
        return failed(EXIT_NOT_FOUND, f"no queue {args.name!r} (known: {known})",
                      missing=[args.name])
    if args.action == "clear":
        dropped = queue.clear()
        return Outcome({"queue": queue.name, "cleared": dropped},
                       f"cleared queue {queue.name}: {counted(dropped, 'job')} dropped")
    now = time.time()
    jobs = queue.next_jobs(args.limit or queue.size())
    return Outcome(
        {"queue": queue.name, "size": queue.size(), "jobs": [j.summary() for j in jobs]},
        tables.table(["JID", "CLASS", "ARGS", "ENQUEUED"],
                     [[j.jid, j.klass, tables.short(json.dumps(j.args)),
                       tables.moment(j.enqueued_at, now)] for j in jobs]))


def _pause(queue: Queue, action: str) -> Outcome:
    changed = queue.pause() if action == "pause" else queue.resume()
    state = "paused" if action == "pause" else "resumed"
    note = "" if changed else f" (it was {'paused' if action == 'pause' else 'not paused'})"
    unknown = "" if queue.exists() else "; no such queue yet"
    return Outcome({"queue": queue.name, state: changed},
                   f"{state} queue {queue.name}{note}{unknown}")


# --- retries / dead / scheduled -----------------------------------------------------------------


def job_set(kind: str) -> Command:
    """``<kind> [list]``, ``<kind> retry|delete|kill JID...|--all``, ``<kind> clear``."""

    def run(client: redis.Redis, args: argparse.Namespace) -> Outcome:
        jobs = SETS[kind](client)
        if args.action == "list":
            return _list_set(jobs, kind, args.limit)
        if args.action == "clear":
            if args.jids or args.all:
                return failed(EXIT_USAGE, f"{kind} clear takes no JID and no --all")
            cleared = jobs.clear()
            return Outcome({"set": jobs.name, "cleared": cleared},
                           f"cleared {kind}: {counted(cleared, 'job')} dropped")
        if args.action == "kill" and kind == "dead":
            return failed(EXIT_USAGE, "dead jobs cannot be killed again (use: forkq dead delete)")
        if bool(args.jids) == bool(args.all):
            return failed(EXIT_USAGE, f"{kind} {args.action}: name one or more JID, or --all")
        return _act(jobs, kind, args.action, args.jids, every=args.all)

    return run


def _list_set(jobs: JobSet, kind: str, limit: int) -> Outcome:
    now = time.time()
    entries = list(jobs.entries(limit or None, reverse=kind == "dead"))
    when = {"scheduled": "DUE", "retries": "NEXT RETRY", "dead": "DIED"}[kind]
    rows = [[e.jid, e.klass, e.queue, tables.short(json.dumps(e.args), 40),
             tables.moment(e.score, now), e.retry_count if e.retry_count is not None else "",
             tables.short(f"{e.error_class}: {e.error_message}", 50) if e.error_class else ""]
            for e in entries]
    size = jobs.size()
    text = tables.table(["JID", "CLASS", "QUEUE", "ARGS", when, "RETRIES", "ERROR"], rows)
    shown = f" (the first {len(entries)}; --limit 0 lists all)" if len(entries) < size else ""
    return Outcome({"set": jobs.name, "size": size, "jobs": [e.summary() for e in entries]},
                   f"{kind}: {counted(size, 'job')}{shown}\n{text}")


_PAST = {"retry": "enqueued", "delete": "deleted", "kill": "killed"}


def _act(jobs: JobSet, kind: str, action: str, jids: list[str], *, every: bool) -> Outcome:
    """Apply ``action`` to each named jid (or every entry); absent and refused ones are
    reported, the others are still acted on."""
    targets: list[tuple[str, SortedEntry | None]]
    if every:
        targets = [(entry.jid or repr(entry.raw[:40]), entry) for entry in jobs.entries()]
    else:
        targets = [(jid, jobs.find_job(jid)) for jid in jids]
    method = {"retry": jobs.add_to_queue if kind == "scheduled" else jobs.retry,
              "delete": jobs.delete, "kill": jobs.kill}[action]
    done, missing, refused, errors = [], [], [], []
    for jid, entry in targets:
        try:
            # False: it left the set between the read and the action (run, moved or deleted)
            acted = entry is not None and method(entry)
        except ForkqError as exc:
            refused.append(jid)
            errors.append(str(exc))
            continue
        if acted:
            done.append(jid)
        else:
            missing.append(jid)
            errors.append(f"no job {jid!r} in {kind}")
    past = _PAST[action]
    text = "\n".join(f"{past} {jid}" for jid in done) or f"nothing {past}"
    data, code = _with_problems({"set": jobs.name, past: done}, missing, refused)
    return Outcome(data, text, code, errors)


# --- cancel -------------------------------------------------------------------------------


def cancel_jobs(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """``forkq cancel JID...``: each job removed where it waits, or a running one asked to
    stop, then killed after ``cancel_grace`` (waiting up to ``--wait`` seconds to see it
    done); not found: exit 66."""
    if not args.jids:
        return failed(EXIT_USAGE, "cancel: name one or more JID")
    results = [cancel.cancel(client, jid) for jid in args.jids]
    stopped = _wait_stopped(client, [r.jid for r in results if r.outcome == "stopping"],
                            args.wait)
    results = [cancel.settled(client, r.jid) if r.jid in stopped else r for r in results]
    lines = [result.describe() for result in results]
    data = {result.jid: result.outcome for result in results}
    missing = [jid for jid, outcome in data.items() if outcome in ("not found", "dead")]
    running = [jid for jid, outcome in data.items() if outcome == "stopping"]
    code = EXIT_NOT_FOUND if missing else EXIT_FAILURE if running else EXIT_OK
    errors = [f"{jid}: still running after {args.wait:g}s; the request stands for "
              f"{counted(keys.CANCEL_TTL // 60, 'minute')}" for jid in running]
    return Outcome({"cancelled": data}, "\n".join(lines), code, errors)


def _wait_stopped(client: redis.Redis, jids: list[str], wait: float) -> set[str]:
    """The ``jids`` whose cancellation a master carried out within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    left = set(jids)
    while left:
        left = {jid for jid in left if client.zscore(keys.CANCELS, jid) is not None}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return set(jids) - left


# --- job ----------------------------------------------------------------------------------


def job(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """``job JID``: every place the job is (see :mod:`forkq.ops.lookup`), with its whole
    payload, error message and backtrace; 66 and "job JID not found" when it is nowhere.
    What could not be searched is noted on stderr (``problems`` with --json)."""
    found = find_job(client, args.jid)
    notes = [f"note: {problem}" for problem in found.problems]
    data = {"jid": args.jid, "places": [p.summary() for p in found.places],
            "problems": found.problems}
    if not found.found:
        message = f"job {args.jid} not found"
        return Outcome({**data, "error": message}, "", EXIT_NOT_FOUND, [*notes, message])
    now = time.time()
    item = found.places[0].job.item
    lock = unique_lock(client, item)
    flows = workflows.of_job(client, item, args.jid)
    data.update(lock=lock, **flows.data)
    text = "\n\n".join(_place_text(place, now, lock=lock, flows=flows.fields)
                       for place in found.places)
    return Outcome(data, text, EXIT_OK, [*notes, *flows.notes])


def unique_lock(client: redis.Redis, item: dict[str, Any]) -> dict[str, Any] | None:
    """The unique lock a job names (:mod:`forkq.unique`), read now: its ``key``, the jid
    that ``holder`` holds it (None: free) and its ``ttl`` in seconds; None when the job
    names no lock."""
    lock = unique.lock_of(item)
    if lock is None:
        return None
    key = lock[0]
    with client.pipeline(transaction=False) as pipe:
        pipe.get(key)
        pipe.pttl(key)  # PTTL, as the documented ACL grants
        try:
            holder, ttl = pipe.execute()
        except redis.ResponseError:  # a key of another type: no lock there
            holder, ttl = None, -2
    return {"key": key, "holder": text(holder) if holder else None,
            "ttl": ttl // 1000 if ttl >= 0 else None}


def _lock_text(lock: dict[str, Any], jid: str) -> str:
    if lock["holder"] is None:
        return f"{lock['key']}: free"
    whose = "this job" if lock["holder"] == jid else f"job {lock['holder']}"
    left = f", {duration(lock['ttl'])} left" if lock["ttl"] is not None else ""
    return f"{lock['key']}: held by {whose}{left}"


def _place_text(place: Place, now: float, *, lock: dict[str, Any] | None = None,
                flows: list[tuple[str, str]] | None = None) -> str:
    """A job in one place: a headline, then its fields (its unique ``lock``, if it names
    one; its batch, chain and progress, ``flows``), the error and backtrace whole."""
    record = place.job
    fields = [("class", record.klass), ("args", json.dumps(record.args, ensure_ascii=False)),
              ("queue", place.queue or record.queue), ("key", place.key),
              ("created", tables.moment(record.created_at, now)),
              ("enqueued", tables.moment(record.enqueued_at, now))]
    if record.retry_count is not None:
        fields.append(("retries", str(record.retry_count)))
    if lock is not None:
        fields.append(("lock", _lock_text(lock, str(record.jid))))
    fields += flows or []
    if record.error_class or record.error_message:
        fields.append(("error", f"{record.error_class}: {record.error_message}"))
    if record.error_backtrace:
        fields.append(("backtrace", "\n".join(record.error_backtrace)))
    fields.append(("payload", record.raw.decode("utf-8", "replace")))
    lines = [f"job {printable(str(record.jid))}: {place.headline(now)}"]
    for name, value in fields:
        first, *rest = value.split("\n") or [""]
        lines.append(f"  {name:<10} {first}")
        lines += [f"  {'':<10} {line}" for line in rest]
    return "\n".join(lines)


# --- flow control -------------------------------------------------------------------------


def limits(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """``limits``: the concurrency limits' keys (running, waiting), the limiters in use and
    the groups waiting in queues with groups (:mod:`forkq.ops.flow`); a damaged key is
    named on stderr (exit 1)."""
    found = flow.Reading()
    flow.concurrency_keys(client, found)
    flow.limiters(client, found)
    flow.queue_groups(client, found)
    text = "\n\n".join([
        f"Concurrency limits ({len(found.slots)} keys)\n" + tables.table(
            ["CLASS:KEY", "RUNNING", "WAITING"],
            [[s.name, s.running, s.waiting] for s in found.slots]),
        f"Limiters ({len(found.limiters)})\n" + tables.table(
            ["KIND", "NAME", "IN USE"], [[u.kind, u.name, f"{u.used:g}"] for u in found.limiters]),
        f"Groups waiting ({len(found.groups)})\n" + tables.table(
            ["QUEUE", "GROUP", "WAITING"], [[g.queue, g.group, g.waiting] for g in found.groups]),
    ])
    data = {"slots": [vars(s) for s in found.slots],
            "limiters": [vars(u) for u in found.limiters],
            "groups": [vars(g) for g in found.groups], "damaged": found.damaged}
    return Outcome(data, text, *damaged(found.damaged))


def uniques(client: redis.Redis, args: argparse.Namespace) -> Outcome:
    """``uniques``: the unique jobs' locks, the job holding each and its time left."""
    found = flow.Reading()
    total = flow.unique_locks(client, found, args.limit)
    shown = f" (the first {len(found.locks)}; --limit 0 lists all)" if len(found.locks) < total \
        else ""
    text = f"Unique locks: {total}{shown}\n" + tables.table(
        ["LOCK", "JOB", "LEFT"], [[lock.key, lock.jid, duration(lock.ttl) if lock.ttl is not None
                                   else "no TTL"] for lock in found.locks])
    data = {"total": total, "locks": [vars(lock) for lock in found.locks],
            "damaged": found.damaged}
    return Outcome(data, text, *damaged(found.damaged))


# --- enqueue ------------------------------------------------------------------------------


def enqueue(client: redis.Redis, args: argparse.Namespace,
            defaults: dict[str, Any] | None = None) -> Outcome:
    """Push one job by name, with ``defaults`` (a registered job's options) under the flags.
    Each ARG is JSON when it parses as JSON, else a string (unless it looks like JSON)."""
    if args.in_seconds is not None and args.at is not None:
        return failed(EXIT_USAGE, "enqueue: give --in or --at, not both")
    item: dict[str, Any] = {**(defaults or {}), "class": args.name}
    try:
        item["args"] = [_arg(text) for text in args.args]
    except ValueError as exc:
        return failed(EXIT_DATAERR, f"enqueue: {exc}")
    if args.to_queue is not None:
        item["queue"] = args.to_queue
    if args.retry is not None:
        item["retry"] = args.retry
    now = time.time()
    at = now + args.in_seconds if args.in_seconds is not None else args.at
    if at is not None and at > now:
        item["at"] = at  # an epoch: above 1e9 once in the future, never read as an interval
    try:
        jid = clients.Client(client).push(item)
    except (TypeError, ValueError) as exc:
        return failed(EXIT_DATAERR, f"enqueue: {exc}")
    queue = item.get("queue", "default")
    scheduled = item.get("at")
    where = f"schedule (due {tables.moment(scheduled, now)})" if scheduled else f"queue {queue}"
    return Outcome({"jid": jid, "class": args.name, "queue": queue, "at": scheduled},
                   f"enqueued {args.name} {jid} to {where}")


_JSON_STARTS = ('"', "[", "{")


def _arg(text: str) -> Any:
    """JSON when ``text`` parses as JSON; else the string itself, unless it starts like a JSON
    string, array or object (then a typo must not silently become a string: ValueError)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        if text.lstrip().startswith(_JSON_STARTS):
            raise ValueError(f"ARG {tables.short(text, 40)!r} looks like JSON but does not "
                             f"parse: {exc}") from None
        return text


def command(name: str) -> Command:
    """The operator command ``name`` (each of ``forkq.cli.OPERATOR``); KeyError for another."""
    commands: dict[str, Command] = {
        "status": status, "queues": queues, "cancel": cancel_jobs, "job": job,
        "limits": limits, "uniques": uniques, "batches": workflows.batch_list,
        "batch": workflows.batch_show,
        **{action: signal_processes(action) for action in _ASKED},
        **{kind: job_set(kind) for kind in ("retries", "dead", "scheduled")}}
    return commands[name]


def emit(outcome: Outcome, *, as_json: bool) -> int:
    """Print ``outcome`` (JSON or text on stdout, errors on stderr); its exit status. Text
    reaches the terminal with its control characters escaped but for its own line breaks
    (what it shows may come from any client that writes to Redis; table cells, names in
    its one-line messages and each error have their newlines escaped too)."""
    if as_json:
        print(json_text(outcome.data))
    elif outcome.text:
        print(printable(outcome.text, lines=True))
    for error in outcome.errors:
        print(f"forkq: {printable(error)}", file=sys.stderr)
    return outcome.code
