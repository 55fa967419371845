"""Finding one job wherever it is: :func:`find_job`, behind ``forkq job JID`` and
:func:`forkq.api.find_job`. Read only: nothing here writes to Redis.

Each place the job is found in is a :class:`Place`; the places are looked at in the order a
job travels (schedule, queues, processors, retry, dead), so a job moving on while it is
looked for is usually met again further on:

- ``scheduled`` — in ``schedule``; ``at`` = when it is due;
- ``queued`` — in ``queue:<name>``, for every name in ``queues`` and in the live processes'
  ``info.queues``; ``position`` = how many jobs of that queue run before it (0: the next);
- ``running`` — a processor runs it: a forkq processor's in-flight list
  ``forkq:inflight:<identity>:<pid>`` (pairs ``[queue key, job, ...]``) whose heartbeat in
  ``forkq:beats:<identity>`` names it (``at`` = when it started), or an entry of a Sidekiq
  process's busy hash ``<identity>:workers`` / ``:work`` (``at`` = ``run_at``). A forkq
  daemon's busy hash is not read: it is its master's copy of the children's beats, written
  every 5 s from beats up to 2 s old, so it can still show a job that finished seconds ago;
  its in-flight lists hold every job it runs until the job is acknowledged.
  ``identity``, ``hostname`` and ``pid`` name the daemon, ``worker`` the child pid (forkq)
  or the thread id (Sidekiq);
- ``in-flight`` — in a forkq processor's in-flight list, not running; ``state`` says why:
  ``held`` (fetched in a batch, runs after the running job), ``completed`` (done, to be
  acknowledged with the processor's next fetch), ``fetched`` (just taken; its heartbeat does
  not name it yet), ``orphaned`` (the process is gone: the scheduler leader requeues it);
- ``blocked`` — in the waiting line of a concurrency limit
  (``forkq:slots:<class>:<key>:blocked``, :mod:`forkq.concurrency`): its key's slots are
  all taken; ``position`` = how many jobs of the line are ahead of it;
- ``retry`` — ``at`` = the next try; ``dead`` — ``at`` = when it died.

A job is normally in one place; at-least-once delivery and races can show it in two.

**Cost: O(total jobs).** Every queue and sorted set is searched whole, but on the server:
lists a window of :data:`WINDOW` elements per call of ``search.lua`` (the server is held for
one window at a time), sorted sets by ``ZSCAN MATCH *"<jid>"*`` (glob characters in the
jid escaped); only the members holding ``"<jid>"`` cross the wire, and each is parsed to
check its ``jid`` field. A queued job's position is then read with ``LPOS`` (Redis 6.0.6+).
Fine for an operator's lookup, not for a hot path.

**Hostile data** is reported in :attr:`Lookup.problems` and the lookup goes on: a key of
another type (named), a member or element holding the jid that is not a job, an unreadable
process record, beat or busy entry. A Redis that does not answer raises, as everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from forkq import keys
from forkq.concurrency import SLOTS_PREFIX
from forkq.connection import raw, text
from forkq.ops import tables
from forkq.ops.processes import FIELDS, Process
from forkq.ops.records import JobRecord, finite
from forkq.ops.sorted_sets import DeadSet, JobSet, RetrySet, ScheduledSet, quoted_jid
from forkq.printable import printable
from forkq.scripts import script
from forkq.wording import counted

WINDOW = 1000  # list elements searched per call of search.lua

_STATES = {
    "held": "fetched in a batch; runs after the job running there",
    "completed": "completed; acknowledged with that processor's next fetch",
    "fetched": "just fetched by that processor; its heartbeat (every ~2 s) does not name it "
               "yet",
    "orphaned": "its process is gone; the scheduler leader puts it back in its queue",
}


@dataclass(frozen=True)
class Place:
    """Where the job sits: ``kind`` (see the module docstring), the Redis ``key`` holding it,
    and the ``job`` as read there (raw bytes and parsed item)."""

    kind: str
    key: str
    job: JobRecord
    at: float | None = None
    queue: str = ""
    position: int | None = None
    state: str = ""
    identity: str = ""
    hostname: str = ""
    pid: int | None = None
    worker: str = ""

    def summary(self) -> dict[str, Any]:
        """The JSON-ready view (``forkq job --json``): the whole payload, error and backtrace."""
        return {
            "place": self.kind, "key": self.key, "at": finite(self.at), "queue": self.queue,
            "position": self.position, "state": self.state, "identity": self.identity,
            "hostname": self.hostname, "pid": self.pid, "worker": self.worker,
            "job": {**self.job.summary(), "error_backtrace": self.job.error_backtrace},
            "payload": self.job.raw.decode("utf-8", "replace"),
        }

    def headline(self, now: float) -> str:
        """One line saying where it is and since or until when (what Redis said of it
        escaped: :mod:`forkq.printable`)."""
        return printable(self._headline(now))

    def _headline(self, now: float) -> str:
        when = tables.moment(self.at, now)
        process = f"{self.identity} (host {self.hostname or '?'}, pid {self.pid or '?'})"
        if self.kind == "scheduled":
            return f"scheduled, due {when}"
        if self.kind == "queued":
            return (f"queued in {self.queue}, position {self.position} "
                    f"({counted(self.position or 0, 'job')} run before it)")
        if self.kind == "running":
            return f"running in {process}, processor {self.worker}, since {when}"
        if self.kind == "in-flight":
            return (f"in-flight in {process}, processor {self.worker}: "
                    f"{_STATES.get(self.state, self.state)}")
        if self.kind == "blocked":
            return (f"waiting for a concurrency slot of {self.job.klass} "
                    f"(key {self.job.item.get('concurrency_key', '')!r}), "
                    f"{counted(self.position or 0, 'job')} ahead of it in its line")
        if self.kind == "retry":
            return f"in the retry set, next try {when}"
        return f"dead since {when}"


@dataclass
class Lookup:
    """What :func:`find_job` found: the ``places`` (empty: not found) and the ``problems`` met."""

    jid: str
    places: list[Place] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def found(self) -> bool:
        return bool(self.places)


def find_job(client: redis.Redis, jid: str) -> Lookup:
    """Every place job ``jid`` is in (see the module docstring for the places, the cost and
    the reporting of hostile data). Not found: ``places`` is empty."""
    found = Lookup(jid)
    needle = quoted_jid(jid)
    if needle is None:
        found.problems.append(f"{jid!r} cannot be a jid (empty, or not valid UTF-8)")
        return found
    search = _Search(client, found, needle.encode())
    search.sorted_set(ScheduledSet(client), "scheduled")
    processes = search.processes()
    for name in search.queue_names(processes):
        search.queue(name)
    search.lines()
    search.in_flight(processes)
    search.busy(processes)
    search.sorted_set(RetrySet(client), "retry")
    search.sorted_set(DeadSet(client), "dead")
    return found


class _Search:
    """One lookup's steps; each records what it finds in ``found`` and what it cannot read in
    ``found.problems``."""

    def __init__(self, client: redis.Redis, found: Lookup, needle: bytes) -> None:
        self.redis = client
        self.found = found
        self.jid = found.jid
        self.needle = needle  # the jid as a JSON string, quotes included

    @contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """Report a refusal (a key of another type) as a problem, and go on."""
        try:
            yield
        except redis.ResponseError as exc:
            self.found.problems.append(f"{what}: not searched further: {exc}")

    def _is_job(self, record: JobRecord, where: str) -> bool:
        """Whether ``record`` is the job; one holding the jid without being a job is reported
        (one whose args mention the jid is another job, and passed over)."""
        if record.jid == self.jid:
            return True
        if not record.item or "class" not in record.item:
            self.found.problems.append(f"{where} holds {self.jid!r} in something that is not "
                                       f"a job: {tables.short(record.raw[:200], 120)}")
        return False

    def _add(self, place: Place) -> None:
        if not any((p.kind, p.key, p.job.raw, p.worker) == (place.kind, place.key,
                                                            place.job.raw, place.worker)
                   for p in self.found.places):
            self.found.places.append(place)

    # --- schedule, retry, dead ------------------------------------------------------------

    def sorted_set(self, jobs: JobSet, kind: str) -> None:
        held = text(self.redis.type(jobs.name))
        if held not in ("zset", "none"):
            self.found.problems.append(f"key {jobs.name!r} holds a {held}, not a zset; "
                                       "not searched")
            return
        with self._reading(f"the {jobs.name} set"):
            for entry in jobs.candidates(self.jid):
                if self._is_job(entry, f"the {jobs.name} set"):
                    self._add(Place(kind, jobs.name, entry, at=entry.score, queue=entry.queue))

    # --- queues ---------------------------------------------------------------------------

    def queue_names(self, processes: dict[str, Process]) -> list[str]:
        """The names in ``queues`` and in the live processes' ``info.queues``."""
        names = {name for process in processes.values() for name in process.queues}
        with self._reading(f"key {keys.QUEUES!r}"):
            names.update(text(name) for name in self.redis.sscan_iter(keys.QUEUES, count=1000))
        return sorted(names)

    def queue(self, name: str) -> None:
        key = keys.queue(name)
        with self._reading(f"queue {name!r}"):
            for _, element in self._search_list(key):
                record = JobRecord(element, key)
                if self._is_job(record, f"queue {name!r}"):
                    position = self._position(key, element)
                    if position is not None:  # None: taken meanwhile, met further on
                        self._add(Place("queued", key, record, at=record.enqueued_at,
                                        queue=name, position=position))

    def lines(self) -> None:
        """The waiting lines of concurrency limits (:mod:`forkq.concurrency`)."""
        with self._reading("the concurrency lines"):
            for line in self.redis.scan_iter(match=f"{SLOTS_PREFIX}*:blocked", count=1000):
                key = text(line)
                if text(self.redis.type(key)) != "list":
                    continue
                with self._reading(f"the concurrency line {key!r}"):
                    for index, element in self._search_list(key):
                        record = JobRecord(element, key)
                        if self._is_job(record, f"the concurrency line {key!r}"):
                            self._add(Place("blocked", key, record, at=record.enqueued_at,
                                            queue=record.queue, position=index))

    def _search_list(self, key: str) -> Iterator[tuple[int, bytes]]:
        """The elements of list ``key`` holding the quoted jid, with their index, a window
        at a time from the left: pops at the right end shift nothing, a push at the left may
        show an element twice, none is skipped."""
        lua = script(self.redis, "search")
        start = 0
        while True:
            reply = cast(list[Any], lua(keys=[key], args=[self.needle, start, WINDOW]))
            for i in range(1, len(reply), 2):
                yield int(reply[i]), raw(reply[i + 1])
            start += WINDOW
            if start >= int(reply[0]):
                return

    def _position(self, key: str, element: bytes) -> int | None:
        """How many jobs run before ``element`` (the one nearest the right end, which runs
        first); None when it is no longer there."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpos(key, element, rank=-1)  # type: ignore[arg-type]
            pipe.llen(key)
            index, length = pipe.execute()
        return None if index is None else int(length) - 1 - int(index)

    # --- processes: in-flight lists, beats, busy hashes ----------------------------------------

    def processes(self) -> dict[str, Process]:
        """The live processes by identity (a record that expired is skipped, one that cannot
        be read reported); unlike :meth:`ProcessSet.live`, prunes nothing."""
        identities: list[str] = []
        with self._reading(f"key {keys.PROCESSES!r}"):
            identities = sorted(text(i) for i in self.redis.sscan_iter(keys.PROCESSES))
        with self.redis.pipeline(transaction=False) as pipe:
            for identity in identities:
                pipe.hmget(identity, list(FIELDS))
            records = pipe.execute(raise_on_error=False)
        found: dict[str, Process] = {}
        for identity, values in zip(identities, records, strict=True):
            if isinstance(values, Exception):
                self.found.problems.append(f"process record {identity!r}: {values}")
            elif values[0] is not None:
                found[identity] = Process.from_hash(identity, values, leader="")
        return found

    def in_flight(self, processes: dict[str, Process]) -> None:
        """The jobs in forkq's in-flight lists (listed in ``forkq:inflight``)."""
        lists: list[str] = []
        with self._reading(f"key {keys.INFLIGHT_REGISTRY!r}"):
            lists = sorted(text(k) for k in self.redis.sscan_iter(keys.INFLIGHT_REGISTRY,
                                                                  count=1000))
        for key in lists:
            owner = keys.inflight_owner(key)
            if owner is None:
                self.found.problems.append(f"{keys.INFLIGHT_REGISTRY!r} lists {key!r}, which "
                                           "is not an in-flight list")
                continue
            with self._reading(f"in-flight list {key!r}"):
                for index, element in self._search_list(key):
                    self._in_flight_job(key, owner, index, element, processes.get(owner))

    def _in_flight_job(self, key: str, owner: str, index: int, element: bytes,
                       process: Process | None) -> None:
        queue_key = text(self.redis.lindex(key, index - 1) or b"") if index % 2 else ""
        record = JobRecord(element, queue_key)
        if not self._is_job(record, f"in-flight list {key!r}"):
            return
        tail = key.rpartition(":")[2]  # <pid>, or <pid>-<lane> (async_concurrency)
        child = str(keys.inflight_pid(tail) or tail)
        state, since = self._state(key, element, owner, child, alive=process is not None)
        if state != "running" and "-" in tail and process is not None:
            state = "running"  # a lane holds the one job it runs
        self._add(Place("running" if state == "running" else "in-flight", key, record,
                        at=since, queue=keys.queue_name(queue_key), state=state,
                        identity=owner, hostname=process.hostname if process else "",
                        pid=process.pid if process else None, worker=child))

    def _state(self, key: str, element: bytes, owner: str, child: str, *, alive: bool
               ) -> tuple[str, float | None]:
        """Whether the job in ``key`` runs (and since when), is held, completed, just
        fetched or orphaned, from its processor's heartbeat."""
        if not alive:
            return "orphaned", None
        job = self._beat_job(owner, child)
        if job is None:
            return "fetched", None
        if job.get("jid") == self.jid:
            started = job.get("started")
            return "running", float(started) if isinstance(started, int | float) else None
        running = job.get("payload")
        if not isinstance(running, str):
            return "fetched", None
        here = self.redis.lpos(key, element)  # type: ignore[arg-type]
        there = self.redis.lpos(key, running)
        if not isinstance(here, int) or not isinstance(there, int):
            return "fetched", None
        return ("held" if here > there else "completed"), None

    def _beat_job(self, owner: str, child: str) -> dict[str, Any] | None:
        """The job a forkq child's last heartbeat names, or None (idle, or unreadable)."""
        with self._reading(f"beat hash {keys.beats(owner)!r}"):
            beat = self.redis.hget(keys.beats(owner), child)
            try:
                job = json.loads(beat)["job"] if beat is not None else None
            except (ValueError, TypeError, KeyError, RecursionError):
                self.found.problems.append(f"beat of processor {child} of {owner!r} is not "
                                           "readable")
                return None
            return job if isinstance(job, dict) else None
        return None

    def busy(self, processes: dict[str, Process]) -> None:
        """The jobs the busy hashes ``:workers`` / ``:work`` of Sidekiq's processes show
        running, each (process, thread) once though both hashes name it (a forkq daemon's
        are passed over: its in-flight lists tell, up to date)."""
        for identity, process in processes.items():
            if process.is_forkq:
                continue
            for key in keys.workers(identity):
                with self._reading(f"busy hash {key!r}"):
                    for worker, value in self.redis.hgetall(key).items():
                        self._busy_entry(key, process, text(worker), raw(value))

    def _busy_entry(self, key: str, process: Process, worker: str, value: bytes) -> None:
        if self.jid.encode() not in value:
            return
        try:
            entry = json.loads(value)
            job = entry["payload"]
        except (ValueError, TypeError, KeyError, RecursionError):
            self.found.problems.append(f"busy hash {key!r}: entry {worker!r} is not readable")
            return
        payload = raw(job) if isinstance(job, str) else json.dumps(job).encode()
        record = JobRecord(payload, keys.queue(str(entry.get("queue", ""))))
        if record.jid != self.jid or any(
                p.kind == "running" and (p.identity, p.worker) == (process.identity, worker)
                for p in self.found.places):
            return
        run_at = entry.get("run_at")
        self._add(Place("running", key, record, queue=str(entry.get("queue", "")),
                        at=float(run_at) if isinstance(run_at, int | float) else None,
                        identity=process.identity, hostname=process.hostname,
                        pid=process.pid, worker=worker))
