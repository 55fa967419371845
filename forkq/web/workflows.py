"""What the dashboard reads of workflows: batches (:mod:`forkq.batches`), chains
(:mod:`forkq.canvas`) and progress (:mod:`forkq.progress`), for the Batches pages
(:mod:`forkq.web.views.batches`) and the job pages (:mod:`forkq.web.views.job`).

Keys read (never written here; :func:`forkq.batches.recent` drops the index entries of
batches that expired): ``forkq:batches``, ``forkq:batch:<bid>`` with its ``:pending`` and
``:failed`` sets, ``forkq:chain:<cid>`` and ``forkq:progress:<jid>``. A key of another type
is named in the page's notice (:mod:`forkq.web.damage`) and read as empty: a batch whose
record is not a hash cannot be shown, one whose sets are damaged shows its record and
says its counts are not to be trusted. Bounded work: a page reads at most
:data:`BATCHES_SHOWN` batches or :data:`MEMBERS_SHOWN` members of each kind, each in
pipelines of a few commands per item.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from forkq import batches, canvas, keys
from forkq.client import Client
from forkq.connection import is_wrong_type, text
from forkq.progress import read as read_progress
from forkq.web import damage
from forkq.web.routes import Request

BATCHES_SHOWN = 100
MEMBERS_SHOWN = 100
EVENTS = batches.EVENTS


def state_of(status: batches.BatchStatus) -> str:
    """``succeeded`` (its success fired), ``complete`` (every member ran; some failed) or
    ``open``."""
    if status.success:
        return "succeeded"
    return "complete" if status.complete else "open"


def percent(done: float, total: float) -> int:
    """``done`` of ``total`` as a whole percentage, rounded down (100 only when all is done:
    a batch at 99.9 % is not shown finished); 0 for numbers that make no share."""
    if not (math.isfinite(done) and math.isfinite(total)) or total <= 0:
        return 0
    return max(0, min(100, math.floor(100 * done / total)))


@dataclass(frozen=True)
class BatchRow:
    """One batch as the pages show it; ``damaged``: its pending or failed set is of another
    type, so its counts are not to be trusted (none of its members counts as succeeded)."""

    status: batches.BatchStatus
    damaged: bool = False

    @property
    def state(self) -> str:
        return state_of(self.status)

    @property
    def percent(self) -> int:
        if self.status.total == 0:
            return 100
        return percent(self.status.succeeded, self.status.total)


def _record_keys(bid: str) -> dict[str, str]:
    meta = keys.batch(bid)
    return {meta: "hash", f"{meta}:pending": "set", f"{meta}:failed": "set"}


def _damaged_bids(request: Request, bids: list[str]) -> tuple[set[str], set[str]]:
    """The bids whose record, and those whose pending or failed set, are of another type
    (each key named in the notice); one pipelined ``TYPE`` per key."""
    wanted = {name: kind for bid in bids for name, kind in _record_keys(bid).items()}
    damaged = set(damage.check(request, wanted))
    broken_record = {bid for bid in bids if keys.batch(bid) in damaged}
    broken_sets = {bid for bid in bids if bid not in broken_record
                   and {f"{keys.batch(bid)}:pending", f"{keys.batch(bid)}:failed"} & damaged}
    return broken_record, broken_sets


def recent(request: Request, limit: int = BATCHES_SHOWN) -> list[BatchRow]:
    """The newest ``limit`` batches, newest first (:func:`forkq.batches.recent`). Their keys
    are type-checked first, so a batch of another type is named (``recent`` skips it)."""
    if damage.check(request, {keys.BATCHES: "zset"}):
        return []

    def newest() -> list[str]:
        # ZRANGE of the last ones, not ZREVRANGE: the documented ACL grants +zrange only
        found: list[bytes] = request.redis.zrange(keys.BATCHES, -limit, -1)  # type: ignore[assignment]
        return [text(bid) for bid in found]

    bids: list[str] = damage.guarded(request, newest, [], f"key {keys.BATCHES!r}")
    _, broken_sets = _damaged_bids(request, bids)
    client = Client(request.redis)
    none: list[batches.BatchStatus] = []
    found = damage.guarded(request, lambda: batches.recent(client, limit), none,
                           f"key {keys.BATCHES!r}")
    return [BatchRow(status, status.bid in broken_sets) for status in found]


@dataclass(frozen=True)
class Callback:
    """A batch's ``event`` as the batch page shows it: its callback's jid ("" when the batch
    has none for it) and when the event fired (None: not yet)."""

    event: str
    jid: str
    fired_at: float | None


def callbacks(status: batches.BatchStatus) -> list[Callback]:
    return [Callback(event, status.callbacks.get(event, ""), status.fired.get(event))
            for event in EVENTS]


@dataclass(frozen=True)
class Member:
    """A member of a batch: a job (by jid), a child batch (by bid) or a chain (by its id,
    with the step it is at: ``step`` of ``steps``, its ``state``, that step's class and
    jid)."""

    name: str
    kind: str  # job, batch, chain
    failed: bool = False
    steps: int = 0
    step: int = 0
    state: str = ""
    step_class: str = ""
    step_jid: str = ""


@dataclass(frozen=True)
class BatchPage:
    """What ``/batch/<bid>`` shows. ``problem``: why the batch's record cannot be read (of
    another type); ``row`` None and no problem: there
    is no such batch."""

    bid: str
    row: BatchRow | None
    problem: str = ""
    failed: list[Member] = field(default_factory=list)
    pending: list[Member] = field(default_factory=list)
    more: bool = False

    @property
    def callbacks(self) -> list[Callback]:
        return callbacks(self.row.status) if self.row else []


def batch_page(request: Request, bid: str, limit: int = MEMBERS_SHOWN) -> BatchPage:
    """Batch ``bid``: its status and up to ``limit`` failed and pending members, each with
    its kind (:func:`forkq.batches.members`, then two pipelined reads per member)."""
    broken_record, broken_sets = _damaged_bids(request, [bid])
    if broken_record:
        return BatchPage(bid, None, f"the record {keys.batch(bid)!r} is not a hash: the "
                                    "batch cannot be read")
    client = Client(request.redis)
    status = batches.status(bid, client=client)
    if status is None:
        return BatchPage(bid, None, "")
    empty = batches.Members([], [], False)
    found = damage.guarded(request, lambda: batches.members(client, bid, limit), empty,
                           f"the members of batch {bid!r}")
    failed = set(found.failed)
    kinds = member_kinds(request, sorted(failed | set(found.pending)))
    return BatchPage(bid, BatchRow(status, bid in broken_sets), "",
                     [replace(kinds[name], failed=True) for name in found.failed],
                     [replace(kinds[name], failed=name in failed) for name in found.pending],
                     found.more)


def member_kinds(request: Request, names: list[str]) -> dict[str, Member]:
    """Each member as a :class:`Member`: a child batch when a batch record of that name
    exists, a chain when a chain record does, else a job. A chain record of another type
    is named and the member shown as a job."""
    with request.redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.exists(keys.batch(name))
            pipe.hmget(keys.chain(name), "n", "step", "state")
        found = pipe.execute(raise_on_error=False)
    members: dict[str, Member] = {}
    chains: dict[str, tuple[int, int, str]] = {}
    for index, name in enumerate(names):
        exists, chain = found[2 * index:2 * index + 2]
        if exists == 1:
            members[name] = Member(name, "batch")
        elif isinstance(chain, list) and chain[0] is not None:
            chains[name] = (canvas.whole(chain[0]), canvas.whole(chain[1]),
                            text(chain[2] or b"running"))
        else:
            _note_refusal(request, chain, keys.chain(name), "hash")
            members[name] = Member(name, "job")
    members.update(_chain_members(request, chains))
    return members


def _chain_members(request: Request, chains: dict[str, tuple[int, int, str]]
                   ) -> dict[str, Member]:
    """The chains among a batch's members, each with its current step's class and jid."""
    with request.redis.pipeline(transaction=False) as pipe:
        for name, (_, step, _) in chains.items():
            pipe.hmget(keys.chain(name), f"class:{step}", f"jid:{step}")
        found = pipe.execute(raise_on_error=False)
    members = {}
    for (name, (steps, step, state)), reply in zip(chains.items(), found, strict=True):
        klass, jid = reply if isinstance(reply, list) else (None, None)
        members[name] = Member(name, "chain", False, steps, step, state,
                               text(klass) if klass else "", text(jid) if jid else "")
    return members


def _note_refusal(request: Request, reply: Any, key: str, kind: str) -> None:
    """Name ``key`` in the notice when ``reply`` is Redis refusing it for its type; any
    other error goes on up."""
    if isinstance(reply, redis.ResponseError) and is_wrong_type(reply):
        damage.note(request, f"key {key!r} is not a {kind}: read as empty")
    elif isinstance(reply, Exception):
        raise reply


# --- a job's workflow: its batch, its chain, its progress ------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a chain as the job page shows it: ``state`` done, running (the step the
    chain is at: queued, running or retrying), failed, waiting (not pushed yet) or ``not
    run`` (after the step where the chain failed)."""

    index: int
    klass: str
    jid: str
    state: str


def steps_of(chain: canvas.ChainStatus) -> list[Step]:
    found = []
    for index, (klass, jid) in enumerate(chain.steps, start=1):
        if chain.state == "succeeded":
            state = "done"
        elif chain.state == "failed" and chain.failed_step is not None:
            state = ("done" if index < chain.failed_step else
                     "failed" if index == chain.failed_step else "not run")
        else:
            state = "done" if index < chain.step else "running" if index == chain.step \
                else "waiting"
        found.append(Step(index, klass, jid, state))
    return found


@dataclass(frozen=True)
class Progress:
    """What the job last said of its progress (:func:`forkq.progress`)."""

    done: float | None
    total: float | None
    note: str
    at: float | None

    @property
    def percent(self) -> int | None:
        if self.done is None or self.total is None:
            return None
        return percent(self.done, self.total)


@dataclass(frozen=True)
class JobFlow:
    """A job's workflow: its batch (``bid``; ``batch`` None when it is gone, or
    ``batch_damaged``: its record is of another type), its chain (``chain_id``; ``chain``
    None when gone, or ``chain_damaged``) and its progress (None: it reported none)."""

    bid: str = ""
    batch: BatchRow | None = None
    chain_id: str = ""
    chain: canvas.ChainStatus | None = None
    steps: list[Step] = field(default_factory=list)
    progress: Progress | None = None
    batch_damaged: bool = False
    chain_damaged: bool = False


def job_flow(request: Request, jid: str, item: dict[str, Any]) -> JobFlow:
    """The workflow of job ``jid`` whose payload is ``item``: its chain (``chain``), its
    batch (``bid``; a chain's step has none, its chain's batch is shown) and its progress.
    The keys are type-checked before they are read (one pipelined ``TYPE`` each)."""
    bid, cid = (_name(item.get(name)) for name in (batches.FIELD, canvas.FIELD))
    wanted = {keys.progress(jid): "hash"} if jid else {}
    if cid:
        wanted[keys.chain(cid)] = "hash"
    damaged = set(damage.check(request, wanted))
    client = Client(request.redis)
    chain = None
    chain_damaged = bool(cid) and (keys.chain(cid) in damaged or not _steps_exist(request, cid))
    if cid and not chain_damaged:
        chain = damage.guarded(request, lambda: canvas.chain_status(cid, client=client), None,
                               f"chain {cid!r}")
    found = progress_of(request, jid) if jid and keys.progress(jid) not in damaged else None
    bid = bid or (_name(chain.bid) if chain else "")
    row, batch_damaged = batch_row(request, bid) if bid else (None, False)
    return JobFlow(bid, row, cid, chain, steps_of(chain) if chain else [], found,
                   batch_damaged, chain_damaged)


def _steps_exist(request: Request, cid: str) -> bool:
    """Whether chain ``cid``'s record holds the last step it says it has (``n``): a record
    whose ``n`` another program made huge would have :func:`forkq.canvas.chain_status`
    build that many steps. Named in the notice when not."""
    key = keys.chain(cid)
    count = canvas.whole(damage.guarded(request, lambda: request.redis.hget(key, "n"), None,
                                f"key {key!r}"))
    if count <= 0:
        return True  # gone, or no steps: chain_status says so
    last = damage.guarded(request, lambda: request.redis.hget(key, f"class:{count}"), None,
                          f"key {key!r}")
    if last is None:
        damage.note(request, f"key {key!r} names {count:,} steps but has no step {count:,}: "
                             "its steps are not shown")
    return last is not None


def batch_row(request: Request, bid: str) -> tuple[BatchRow | None, bool]:
    """Batch ``bid`` as a job page links it (None when there is none), and whether its
    record is of another type (then None too; the key is named)."""
    broken_record, broken_sets = _damaged_bids(request, [bid])
    if broken_record:
        return None, True
    status = batches.status(bid, client=Client(request.redis))
    return (BatchRow(status, bid in broken_sets) if status else None), False


def _name(value: Any) -> str:
    """A payload's or record's id field: a non-empty string, else ""."""
    return value if isinstance(value, str) and value else ""


def progress_of(request: Request, jid: str) -> Progress | None:
    """The progress job ``jid`` reported last (:func:`forkq.progress.read`), or None."""
    found = read_progress(request.redis, jid) if jid else None
    if not found:
        return None
    done, total, at = (found.get(name) for name in ("done", "total", "at"))
    return Progress(done, total, str(found.get("note", "")), at)
