"""The operator's view of the daemons: :class:`ProcessSet`, :class:`Process` (list, quiet,
stop, dump stacks) and :func:`work` (what every processor is running).

Reads the records of forkq and of every Sidekiq version alike (docs/sidekiq-wire.md §7,
§10): ``processes`` → the ``<identity>`` hash (``info`` JSON, ``busy``, ``beat``,
``quiet``, ``rss``, ``concurrency``: the hash field, written since Sidekiq 8.1.2,
wins over ``info.concurrency``); queue names from ``info.queues``, else from
8.x's ``info.capsules``; busy jobs from both ``<identity>:workers`` (6.4.1) and
``<identity>:work`` (6.4.2+). Listing drops from ``processes`` the identities
whose hash has expired, as Sidekiq's ``ProcessSet.new`` does.

Quiet and stop are Sidekiq's remote signals: ``LPUSH <identity>-signals`` with a
60 s TTL. A forkq or Sidekiq process pops one per heartbeat (5 s; 10 s in 7.x),
so it acts within one beat. Processes marked ``embedded`` (Sidekiq 7's embedded
mode) refuse them, as Sidekiq's API does.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import redis

from forkq import keys
from forkq.connection import raw, text
from forkq.errors import ForkqError, NotFoundError
from forkq.ops.records import finite
from forkq.printable import printable
from forkq.wording import counted

log = logging.getLogger(__name__)

FIELDS = ("info", "busy", "beat", "quiet", "rss", "rtt_us", "concurrency")
FIELD_BYTES = tuple(name.encode() for name in FIELDS)
SIGNALS = {"quiet": "TSTP", "stop": "TERM", "dump": "TTIN", "reload": "HUP"}
FORKQ_ONLY = frozenset({"reload"})  # Sidekiq does not trap HUP: it would die of it


def _int(value: Any) -> int:
    try:
        return int(text(value)) if value is not None else 0
    except ValueError:
        return 0


def _float(value: Any) -> float:
    try:
        return float(text(value)) if value is not None else 0.0
    except ValueError:
        return 0.0


def _queues(info: dict[str, Any]) -> list[str]:
    """Queue names: ``info.queues``, else the capsules' weights (Sidekiq 8.0.9+)."""
    queues = info.get("queues")
    if isinstance(queues, list):
        return [str(q) for q in queues]
    names: list[str] = []
    capsules = info.get("capsules")
    if isinstance(capsules, dict):
        for capsule in capsules.values():
            weights = capsule.get("weights") if isinstance(capsule, dict) else None
            if isinstance(weights, dict):
                names += [str(q) for q in weights if str(q) not in names]
    return names


@dataclass(frozen=True)
class Process:
    """One daemon's record: ``info`` as written, plus the hash's live fields."""

    identity: str
    info: dict[str, Any]
    busy: int
    beat: float
    quiet: bool
    rss_kb: int
    concurrency: int
    leader: bool = False

    @classmethod
    def from_hash(cls, identity: str, values: list[Any], *, leader: str) -> Process:
        """Build from ``HMGET <identity> FIELDS`` (an unreadable ``info`` reads as empty)."""
        record = dict(zip(FIELDS, values, strict=True))
        try:
            info = json.loads(record["info"])
        except (TypeError, ValueError, RecursionError):
            info = None
        if not isinstance(info, dict):
            info = {}
        hashed = record["concurrency"]
        return cls(
            identity=identity,
            info=info,
            busy=_int(record["busy"]),
            beat=_float(record["beat"]),
            quiet=text(record["quiet"] or b"") == "true",
            rss_kb=_int(record["rss"]),
            concurrency=_int(hashed) if hashed is not None else _int(info.get("concurrency")),
            leader=bool(leader) and leader == identity,
        )

    @property
    def hostname(self) -> str:
        return str(self.info.get("hostname", ""))

    @property
    def pid(self) -> int | None:
        pid = self.info.get("pid")
        return pid if isinstance(pid, int) else None

    @property
    def tag(self) -> str:
        return str(self.info.get("tag") or "")

    @property
    def labels(self) -> list[str]:
        labels = self.info.get("labels")
        return [str(x) for x in labels] if isinstance(labels, list) else []

    @property
    def queues(self) -> list[str]:
        return _queues(self.info)

    @property
    def started_at(self) -> float | None:
        """Epoch seconds: every Sidekiq version reads ``info.started_at`` as seconds."""
        value = self.info.get("started_at")
        return None if isinstance(value, bool) or not isinstance(value, int | float) else value

    @property
    def is_forkq(self) -> bool:
        """A forkq daemon (its ``info`` carries ``forkq``: the version), not a Sidekiq process."""
        return isinstance(self.info.get("forkq"), str)

    @property
    def version(self) -> str:
        return str(self.info.get("version") or "")

    @property
    def embedded(self) -> bool:
        return self.info.get("embedded") is True

    def summary(self) -> dict[str, Any]:
        """The JSON-ready view the CLI prints (``--json``)."""
        return {
            "identity": self.identity, "hostname": self.hostname, "pid": self.pid,
            "tag": self.tag, "labels": self.labels, "queues": self.queues,
            "concurrency": self.concurrency, "busy": self.busy, "quiet": self.quiet,
            "leader": self.leader, "beat": finite(self.beat),
            "started_at": finite(self.started_at),
            "rss_kb": self.rss_kb, "version": self.version,
        }


@dataclass(frozen=True)
class Work:
    """One busy processor: which process, which thread or child, the job and when it started."""

    identity: str
    thread: str
    queue: str
    payload: dict[str, Any]
    run_at: float

    def summary(self) -> dict[str, Any]:
        return {"identity": self.identity, "thread": self.thread, "queue": self.queue,
                "jid": self.payload.get("jid"), "class": self.payload.get("class"),
                "args": self.payload.get("args"), "run_at": finite(self.run_at)}


class ProcessSet:
    """The live processes of the server behind ``client``."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def live(self) -> list[Process]:
        """Every live process, by identity; identities whose record expired are unlisted.

        A wrong-typed ``processes`` key, record or ``dear-leader`` is logged and read as
        absent (a damaged record is left in place, not dropped as expired)."""
        try:
            members = self.redis.smembers(keys.PROCESSES)
        except redis.ResponseError as exc:
            log.warning("%s is unreadable (%s): no process listed", keys.PROCESSES, exc)
            return []
        identities = sorted(text(i) for i in members)
        with self.redis.pipeline(transaction=False) as pipe:
            for identity in identities:  # HGETALL: one argument to encode, not eight
                pipe.hgetall(identity)
            pipe.get(keys.DEAR_LEADER)
            *hashes, leader = pipe.execute(raise_on_error=False)
        records = [found if isinstance(found, Exception) else _fields(found)
                   for found in hashes]
        if not isinstance(leader, bytes | str):
            leader = b""
        found: list[Process] = []
        gone: list[str] = []
        for identity, values in zip(identities, records, strict=True):
            if isinstance(values, Exception):
                log.warning("process record %r is unreadable (%s): skipped", identity, values)
            elif values[0] is None:  # no info: the record expired, the process is gone
                gone.append(identity)
            else:
                found.append(Process.from_hash(identity, values, leader=text(leader)))
        if gone:
            self.redis.srem(keys.PROCESSES, *gone)
        return found

    def find(self, wanted: str, processes: list[Process] | None = None) -> Process:
        """The process named by its identity, or by its first parts (``host:pid``, ``host``) when
        they name only one.

        Looks among ``processes`` when given (one read for many names), else the live ones.
        Raises :class:`~forkq.errors.NotFoundError` naming the known identities otherwise."""
        processes = self.live() if processes is None else processes
        exact = [p for p in processes if p.identity == wanted]
        matches = exact or [p for p in processes if wanted and p.identity.startswith(wanted + ":")]
        if len(matches) == 1:
            return matches[0]
        known = ", ".join(printable(p.identity) for p in processes) or "none"
        if matches:
            found = counted(len(matches), "process", "processes")
            raise NotFoundError(f"{wanted!r} matches {found}: "
                                f"{', '.join(printable(p.identity) for p in matches)}")
        raise NotFoundError(f"no live process {wanted!r} (live: {known})")

    def signal(self, process: Process, action: str) -> None:
        """Ask ``process`` to ``quiet``, ``stop``, ``dump`` its stacks or ``reload`` its
        configuration (a remote signal, acted on at its next heartbeat). Raises ForkqError,
        sending nothing, for an embedded Sidekiq process and for ``reload`` to a Sidekiq one."""
        named = printable(process.identity)
        if process.embedded:
            raise ForkqError(f"{named} is an embedded Sidekiq process: it does not take remote "
                             "signals")
        if action in FORKQ_ONLY and not process.is_forkq:
            raise ForkqError(f"{named} is not a forkq process: it cannot {action}")
        key = keys.signals(process.identity)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, SIGNALS[action])
            pipe.expire(key, keys.PROCESS_TTL)
            pipe.execute()

    def total_concurrency(self) -> int:
        return sum(p.concurrency for p in self.live())

    def leader(self) -> str:
        """The identity in ``dear-leader`` (forkq's scheduler leader), or ""."""
        try:
            return text(self.redis.get(keys.DEAR_LEADER) or b"")
        except redis.ResponseError:  # wrong-typed: no leader to name
            return ""

    def work(self, processes: list[Process] | None = None) -> list[Work]:
        """Every busy processor of ``processes`` (default: the live ones), oldest job first, in
        one round trip; both busy hashes are read (6.4.1 writes ``:workers``, 6.4.2+ ``:work``;
        forkq writes both), of the processes whose record counts a busy one (a record and
        its busy hashes are written in the same step): an idle fleet costs no read."""
        identities = [p.identity for p in (self.live() if processes is None else processes)
                      if p.busy]
        owners = [identity for identity in identities for _ in keys.workers(identity)]
        with self.redis.pipeline(transaction=False) as pipe:
            for identity in identities:
                for key in keys.workers(identity):
                    pipe.hgetall(key)
            hashes = pipe.execute(raise_on_error=False)
        found: dict[tuple[str, str], Work] = {}
        for identity, busy in zip(owners, hashes, strict=True):
            if isinstance(busy, Exception):
                log.warning("busy record of %r is unreadable (%s): skipped", identity, busy)
                continue
            for thread, value in busy.items():
                entry = _work(identity, text(thread), raw(value))
                if entry is not None:
                    found.setdefault((identity, entry.thread), entry)
        return sorted(found.values(), key=lambda w: w.run_at)


def _fields(record: dict[Any, Any]) -> list[Any]:
    """The :data:`FIELDS` of a record read with ``HGETALL``, in order; None for those it
    lacks (all None: the record expired). Names are bytes, or str from a client that
    decodes responses."""
    names: tuple[Any, ...] = FIELDS if any(isinstance(k, str) for k in record) else FIELD_BYTES
    return [record.get(name) for name in names]


def _work(identity: str, thread: str, value: bytes) -> Work | None:
    try:
        entry = json.loads(value)
        job = entry["payload"]
        payload = json.loads(job) if isinstance(job, str) else job
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(entry, dict) or not isinstance(payload, dict):
        return None
    run_at = entry.get("run_at")  # epoch seconds (an integer) in every version
    if isinstance(run_at, bool) or not isinstance(run_at, int | float):
        run_at = 0.0
    return Work(identity, thread, str(entry.get("queue", "")), payload, float(run_at))
