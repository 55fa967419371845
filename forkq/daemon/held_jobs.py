"""The job a dead process held: given back to its queue, its death counted, or buried.

One path for both places a holder dies: the master settling a child it reaped
(:mod:`forkq.daemon.master.dead_child`) and the leader (or a restarted daemon) recovering
the in-flight lists of a dead daemon (:mod:`forkq.daemon.children.orphans`). Both call
:func:`give_back`, which runs recover.lua once: in one atomic step the list is deleted and
unregistered and its job is

- requeued unchanged at the front of its queue (``count=False``: a child stopped as told);
  jobs held behind it without being started (a batch) always go back unchanged, in order,
  right behind it, and are never counted;
- or its death is counted (``forkq:kills:<jid>``, kept 7 days; a key holding anything but a
  count restarts at 1) and it is requeued, until the :data:`KILL_LIMIT`-th death buries
  it in the dead set with a :class:`~forkq.errors.JobKilledError` (the poison pill):
  ``its processor died 3 times while running it (last: <how>)``;
- or, when it is no job (:class:`~forkq.errors.MalformedJobError`), buried at once with
  its bytes kept, as a processor buries it;
- or, when its cancellation was asked and stands (``forkq:cancels``: its holder died while
  the job had its ``cancel_grace`` to stop), buried at once with a
  :class:`~forkq.errors.JobCancelledError`, and the request withdrawn in the same step:
  a cancelled job is never run again, whatever ended its holder.

Counting and moving are one script, so a crash between them cannot count a death twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, cast

import redis

from forkq import keys
from forkq import payload as payloads
from forkq.connection import raw, text
from forkq.daemon.children import blocking_wait, failures, fetch
from forkq.daemon.children.fetch import Done, digest
from forkq.errors import JobCancelledError, JobError, JobKilledError
from forkq.scripts import script

log = logging.getLogger(__name__)

NOTHING_DONE = Done()
KILL_LIMIT = 3
"""Deaths of a job's holder at which the job goes to the dead set."""

Outcome = Literal["requeued", "dead", "dropped", "empty"]
Mode = Literal["count", "requeue", "bury"]


class FencedError(Exception):
    """recover.lua changed nothing: ``code`` -1 lease lost, -2 owner alive, -3 list changed."""

    def __init__(self, code: int) -> None:
        super().__init__(f"recover.lua refused ({code})")
        self.code = code


@dataclass(frozen=True)
class Held:
    """What an in-flight list holds: the queue its first pair names and that pair's job, if
    any (the one its holder ran), and the list's length (jobs held behind the first one,
    not started, make it longer: 2 per job)."""

    queue: str
    job: bytes | None
    length: int = 0


@dataclass(frozen=True)
class GivenBack:
    """What became of a held job: ``deaths`` counted so far (0 when not counted)."""

    outcome: Outcome
    job: bytes
    deaths: int


def read(client: redis.Redis, inflight_key: str, done: Done = NOTHING_DONE) -> Held:
    """The queue and job held in ``inflight_key`` (recover.lua's queue rule: else default).

    First ends any connection of the gone holder still waiting to move a job into the list
    (:mod:`~forkq.daemon.children.blocking_wait`: a BLMOVE whose closed socket Redis has not
    seen yet), so no job enters the list after this read. A server that refuses CLIENT LIST
    or KILL (an ACL without them) is reported once and the read goes on. Then, when
    ``done`` (the holder's :class:`~forkq.daemon.children.fetch.Progress`) says it completed the
    first jobs of its batch and the list still begins with them, acknowledges those, so the
    job read is the one it ran."""
    _end_waiters(client, inflight_key)
    held = _elements(client, inflight_key)
    count = done.count if len(held) >= 2 and digest(held[1]) == done.head else 0
    if 0 < 2 * count <= len(held):
        fetch.acknowledge(client, inflight_key, last=held[2 * count - 1], count=count)
        held = _elements(client, inflight_key)
    return _held(held)


def reread(client: redis.Redis, inflight_key: str) -> Held:
    """:func:`read` again, after a step that changed the list (its holder's waiting
    connections are ended already)."""
    return _held(_elements(client, inflight_key))


def _elements(client: redis.Redis, inflight_key: str) -> list[bytes]:
    return [raw(element) for element in client.lrange(inflight_key, 0, -1)]


def _held(held: list[bytes]) -> Held:
    queue = _queue_name(held[0]) if held else "default"
    return Held(queue, held[1] if len(held) >= 2 else None, len(held))


def _end_waiters(client: redis.Redis, inflight_key: str) -> None:
    global _waiters_refused
    if _waiters_refused:
        return
    try:
        blocking_wait.end_waiters(client, inflight_key)
    except redis.ResponseError as exc:
        if "NOPERM" not in str(exc) and "unknown" not in str(exc).lower():
            raise
        _waiters_refused = True
        log.warning("the server refuses CLIENT LIST / CLIENT KILL (%s): a processor that died "
                    "while waiting for a job cannot be disconnected before its in-flight "
                    "list is taken back; grant +client|list +client|kill", exc)


_waiters_refused = False


def give_back(client: redis.Redis, inflight_key: str, held: Held, *, count: bool, how: str,
              now: float, token: str | None = None, owner: str = "") -> GivenBack:
    """Give back the job :func:`read` found in ``inflight_key`` (see the module's rules).

    ``how`` ends the poison-pill message (``killed by signal SIGKILL``). With ``token`` (the
    leader's), recover.lua checks the lease and that ``owner``'s records have expired; without,
    the caller guarantees the holder is gone (reaped, or proven gone on this host). Raises
    :class:`FencedError` when the script changed nothing, and ``redis.ResponseError`` when it
    refused (a key of the wrong type; nothing changed)."""
    withdraw = _cancelled(client, held)
    mode, jid, entry = _decide(held, count=count, how=how, now=now, cancelled=bool(withdraw))
    result = script(client, "recover")(
        # without a token KEYS[4] is not read, but an empty key name would fail every ACL
        # key pattern: name a key the script declares anyway
        keys=[keys.LEADER, inflight_key, keys.INFLIGHT_REGISTRY, owner or keys.LEADER,
              keys.beats(owner),
              keys.kills(jid), keys.DEAD, keys.CANCELS, keys.alive(owner),
              keys.recovered(owner)],
        args=[token or "", held.job or b"", mode, KILL_LIMIT, entry, keys.KILLS_TTL, repr(now),
              repr(now - keys.DEAD_TIMEOUT), keys.DEAD_MAX_JOBS, held.length, withdraw,
              keys.RECOVERED_TTL])
    if isinstance(result, int):
        raise FencedError(result)
    outcome, deaths = result
    return GivenBack(cast(Outcome, text(outcome)), held.job or b"", int(deaths))


def _cancelled(client: redis.Redis, held: Held) -> str:
    """The jid of the held job when its cancellation was asked and stands (it goes to the
    dead set as cancelled, and the request is withdrawn), else "". A ``forkq:cancels`` of
    another type reads as no request: the job is given back as any other."""
    try:
        jid = payloads.jid(payloads.decode(held.job)) if held.job is not None else ""
        return jid if jid and client.zscore(keys.CANCELS, jid) is not None else ""
    except (JobError, redis.ResponseError):
        return ""


def _decide(held: Held, *, count: bool, how: str, now: float, cancelled: bool = False,
            ) -> tuple[Mode, str, str]:
    """recover.lua's mode, the job's kill-counter id and the dead-set entry ("" = drop)."""
    if held.job is None:
        return "requeue", "", ""  # nothing to requeue: the list is just deleted
    try:
        payload = payloads.decode(held.job)
    except JobError as exc:
        log.error("queue %s: a dead process held %s; moved to the dead set", held.queue, exc)
        failure = failures.unrunnable(held.job, held.queue, exc, now)
        return "bury", "", failure.payload if failure.mode == "dead" else ""
    if cancelled:  # asked to stop while it ran: its holder's end is the job's
        message = f"the job was cancelled while it ran, and its processor ended ({how})"
        failures.record_error(payload, failures.error_class_name(JobCancelledError()),
                              message, now)
        failure = failures.bury(payload, now)
        return "bury", "", failure.payload if failure.mode == "dead" else ""
    if not count:
        return "requeue", "", ""
    message = f"its processor died {KILL_LIMIT} times while running it (last: {how})"
    failures.record_error(payload, failures.error_class_name(JobKilledError()), message, now)
    failure = failures.bury(payload, now)  # written only at the limit
    return ("count", payloads.kill_key_id(payload, held.job),
            failure.payload if failure.mode == "dead" else "")


def _queue_name(element: bytes | str) -> str:
    name = text(element)
    return name[6:] if name.startswith("queue:") and len(name) > 6 else "default"
