"""Pushing jobs: the :class:`Client` with ``push`` / ``push_bulk``, client middleware.

Wire protocol (Sidekiq's, docs/sidekiq-wire.md §2), one round trip per call:

- immediate: pipeline ``SADD queues <q>`` + ``LPUSH queue:<q> <json>...``; the
  payload carries ``enqueued_at``;
- scheduled (``at`` in the future): ``ZADD schedule <at> <json>``, without
  ``enqueued_at``; an ``at`` in the past pushes immediately;
- a unique job (its lock), a job of a group pushed now (its index): ``EVALSHA`` of
  ``push.lua``, in the same round trip.

An ``at`` or interval below 1,000,000,000 is relative to now, as Sidekiq. Each payload
is encoded once, just before sending (:func:`forkq.payload.encode_bytes`; a ``push_bulk``
of immediate jobs without client middleware encodes their shared fields once,
:func:`forkq.payload.encode_immediate`), and the commands go out in one write
(:mod:`forkq.connection`), never resent.

A push never hangs: a client that builds its own connection gives every reply
``timeout`` seconds and every connect ``connect_timeout`` seconds (5 and 5 by default;
``FORKQ_CLIENT_TIMEOUT`` / ``FORKQ_CLIENT_CONNECT_TIMEOUT`` for the default client).
Whatever goes wrong in Redis, ``push``, ``push_bulk`` and ``perform_*`` raise one
exception, :class:`~forkq.errors.EnqueueError`, telling the jobs enqueued from those
certainly not enqueued and those whose fate is unknown (the command was sent, the reply
never came: a blind retry may enqueue twice). Bad arguments raise TypeError/ValueError
before any I/O.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import redis

from forkq import concurrency, durability, groups, keys, scripts, unique
from forkq import payload as payloads
from forkq.connection import KeptConnections, KeptRedis, MasterLost, connect, round_trip
from forkq.durability import Durability
from forkq.errors import EnqueueError
from forkq.middleware import CLIENT, ClientChain, current_job

_RELATIVE_LIMIT = 1_000_000_000


class Diversion(Protocol):
    """What takes the place of Redis while a testing mode is on (see :func:`divert`)."""

    def push(self, jobs: list[Job], now: float) -> set[str]:
        """Take the jobs of one push: each a payload (client middleware done, not yet
        encoded) and its ``at`` (None: now); the jids of the unique jobs it dropped."""

    def cancel_requested(self, jid: str) -> bool:
        """The answer of :func:`cancel_requested` for ``jid``."""

    def result(self, jid: str) -> Any:
        """The answer of :func:`result` for ``jid`` (it does not wait)."""

    def enter_limiter(self, name: str) -> bool:
        """Whether an entry of limiter ``name`` (one built without a client) is admitted."""

    def commit_batch(self, batch: Any) -> None:
        """Take a batch built in a ``with forkq.batch()`` block (:mod:`forkq.batches`)."""

    def push_chain(self, run: Any) -> None:
        """Take a chain's push (:mod:`forkq.canvas`)."""

    def batch_status(self, bid: str) -> Any:
        """The answer of :func:`forkq.batch_status` for ``bid``."""

    def chain_status(self, cid: str) -> Any:
        """The answer of :func:`forkq.chain_status` for ``cid``."""

    def progress(self, jid: str, report: dict[str, Any]) -> None:
        """Keep what :func:`forkq.progress` reported of the running job ``jid``."""


_diversion: Diversion | None = None



class BatchTaker(Protocol):
    """An open ``with forkq.batch()`` block (:mod:`forkq.batches`): it takes the jobs pushed
    inside it, to push them with the batch when the block ends."""

    def take(self, client: Client, jobs: list[Job]) -> None:
        """Keep ``jobs`` (payloads not yet encoded, and their ``at``) for the batch."""


OPEN_BATCH: contextvars.ContextVar[BatchTaker | None] = contextvars.ContextVar(
    "forkq_open_batch", default=None)
"""The batch block open in this context (thread, task), set by :mod:`forkq.batches`."""


def divert(diversion: Diversion | None) -> Diversion | None:
    """Send every client's pushes and :func:`cancel_requested` questions to ``diversion``
    instead of Redis (None: to Redis again); returns the one it replaces, to restore. The
    switch of :mod:`forkq.testing`'s modes; nothing else sets it, so a daemon always talks
    to Redis."""
    global _diversion
    previous, _diversion = _diversion, diversion
    return previous


def diverted() -> Diversion | None:
    """The diversion on (a testing mode), or None: pushes go to Redis."""
    return _diversion


def at_epoch(value: float) -> float:
    """An interval or an epoch → an epoch: values below 1e9 are seconds from now."""
    return time.time() + value if value < _RELATIVE_LIMIT else float(value)


Job = tuple[payloads.Payload, float | None]
"""A job of a push: its payload (client middleware done, not yet encoded) and its ``at``
(None: now)."""


def load_push() -> list[tuple[Any, ...]]:
    """The command that loads push.lua on a server that refused its EVALSHA with NOSCRIPT."""
    return [("SCRIPT", "LOAD", scripts.source("push"))]


class PushSteps:
    """The I/O-free steps of a push, shared by :class:`Client` and :class:`forkq.aio.Client`
    so that both send the same bytes and raise the same errors: each client only sends the
    commands these steps plan (:meth:`commands`) and hands the replies back
    (:func:`dropped_by`, :func:`check_results`, :func:`failed_push`)."""

    middleware: ClientChain

    def _prepare(self, fields: _Fields, args: Any, now: float,
                 jid: str | None = None) -> payloads.Payload | None:
        """The payload to push, or None when a middleware stopped it.

        Middleware only ever sees JSON-native payloads (as in Sidekiq, which checks
        before its middleware); with no middleware the check is left to the one encode
        in :meth:`commands`, which still comes before any I/O."""
        payload = _build(fields, args, now, jid)
        if not self.middleware:
            return payload
        payloads.check(payload)
        return self.middleware.run(payload, lambda: payload)

    def prepare(self, item: Mapping[str, Any], now: float) -> payloads.Payload | None:
        """The payload :meth:`Client.push` would push for ``item`` (client middleware run), or
        None when a middleware stopped it: encoded later (a batch's job, a template)."""
        return self._prepare(_fields(item), item.get("args"), now)

    def _job(self, item: Mapping[str, Any], now: float) -> Job | None:
        """The job of a ``push`` of ``item``, or None when a middleware stopped it
        (:meth:`Client.push` inlines this, its hot path)."""
        payload = self._prepare(_fields(item), item.get("args"), now)
        return None if payload is None else (payload, _at(item.get("at")))

    def _bulk(self, item: Mapping[str, Any], now: float) -> tuple[list[Job], Encoded | None]:
        """The jobs of a ``push_bulk`` of ``item`` (those no middleware stopped); or, in the
        common case (fresh jids, no ``at``, no middleware, batch block, testing mode, unique,
        expiry or group), no jobs but the commands that push them all, their shared fields
        encoded once. TypeError/ValueError for bad arguments."""
        arg_lists = item.get("args")
        if not isinstance(arg_lists, Sequence) or isinstance(arg_lists, (str, bytes)):
            raise TypeError("push_bulk: 'args' must be a list of argument lists")
        ats = item.get("at")
        if isinstance(ats, Sequence) and len(ats) != len(arg_lists):
            raise ValueError("push_bulk: 'at' must have one entry per job")
        fields = _fields(item)
        jids = payloads.new_jids(len(arg_lists)) if fields.jid is None else None
        if (jids is not None and ats is None and not self.middleware and _diversion is None
                and OPEN_BATCH.get() is None and unique.FOR not in fields.extra
                and "expires_in" not in fields.extra and groups.FIELD not in fields.extra):
            return [], _encoded_now(fields, arg_lists, jids, now)
        jobs: list[Job] = []
        for index, args in enumerate(arg_lists):
            payload = self._prepare(fields, args, now, None if jids is None else jids[index])
            if payload is not None:
                jobs.append((payload, _at(ats[index] if isinstance(ats, Sequence) else ats)))
        return jobs, None

    def _elsewhere(self, jobs: list[Job], now: float) -> set[str] | None:
        """Stamp the jobs' expiry; then, when they go anywhere but Redis (none at all, a
        ``with forkq.batch()`` block, a testing mode: :func:`divert`), take them there and
        return the jids of the unique jobs dropped; None: they are to be sent."""
        if not jobs:
            return set()
        for payload, at in jobs:
            payloads.stamp_expiry(payload, at, now)
        taker = OPEN_BATCH.get()
        if taker is not None:
            assert isinstance(self, Client)  # the asyncio client refuses a batch block first
            taker.take(self, jobs)
            return set()
        if _diversion is not None:
            return _diversion.push(jobs, now)
        return None

    def commands(self, jobs: list[Job], now: float, *,
                 bid: str = "") -> tuple[list[tuple[Any, ...]], list[list[str]]]:
        """The commands that push ``jobs`` (see :meth:`Client._send`) and the jids each
        carries ([] for the ``queues`` index). With ``bid``, a job pushed by push.lua joins
        that batch as it is pushed; the caller registers the others (:mod:`forkq.batches`).
        Each payload is encoded here (TypeError/ValueError for a value JSON cannot carry)."""
        commands: list[tuple[Any, ...]] = []
        carried: list[list[str]] = []
        immediate: dict[str, list[payloads.Payload]] = {}
        for payload, at in jobs:
            if unique.FOR in payload or groups.FIELD in payload:
                commands.append(_script_push(payload, at, now, bid))
                carried.append([payload["jid"]])
            elif at is not None and at > now:
                commands.append(("ZADD", keys.SCHEDULE, at, payloads.encode_bytes(payload)))
                carried.append([payload["jid"]])
            else:
                payload["enqueued_at"] = now
                immediate.setdefault(payload["queue"], []).append(payload)
        for queue, batch in immediate.items():
            commands += [("SADD", keys.QUEUES, queue),
                         ("LPUSH", keys.QUEUE_PREFIX + queue, *map(payloads.encode_bytes, batch))]
            carried += [[], [str(payload["jid"]) for payload in batch]]
        return commands, carried


class Encoded(NamedTuple):
    """The commands of a ``push_bulk`` encoded at once (none for no jobs), the jids each
    carries, and the jids pushed."""

    commands: list[tuple[Any, ...]]
    carried: list[list[str]]
    jids: list[str]


class Client(PushSteps):
    """Pushes jobs to one Redis. Safe to share between threads; not across a fork.

    A client built from a URL, or with :meth:`keeping`, keeps the connections its pushes
    used, one per thread pushing at once (:class:`~forkq.connection.KeptConnections`); one
    given a ``redis_client`` checks a connection out of that client's pool for each push,
    since the application's pool may have a limit."""

    def __init__(
        self,
        redis_client: redis.Redis | None = None,
        *,
        url: str | None = None,
        embedded_dir: str | None = None,
        middleware: ClientChain | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        self._kept: KeptConnections | None = None
        if redis_client is None:
            redis_client = connect(
                url or env_url(), embedded_dir=embedded_dir or env_dir(),
                socket_timeout=timeout or env_seconds("FORKQ_CLIENT_TIMEOUT"),
                connect_timeout=connect_timeout or env_seconds("FORKQ_CLIENT_CONNECT_TIMEOUT"))
            self._kept = KeptConnections(redis_client)  # its pool is forkq's: no limit
        self.redis = redis_client
        self.middleware: ClientChain = middleware if middleware is not None else CLIENT

    @classmethod
    def keeping(cls, redis_client: redis.Redis) -> Client:
        """A client on ``redis_client`` whose pool forkq built (no limit), keeping the
        connections its pushes used as a client built from a URL does: a processor's
        client, for the jobs its jobs push (a checkout per push costs ~20 µs more)."""
        client = cls(redis_client)
        client._kept = (redis_client.kept if isinstance(redis_client, KeptRedis)
                        else KeptConnections(redis_client))
        return client

    def push(self, item: Mapping[str, Any], *, durable: bool | Durability = False
             ) -> str | None:
        """Push one job. ``item`` has ``class`` and ``args``, optionally ``queue``, ``retry``,
        ``at``, ``jid`` and any other key (kept in the payload). Returns the jid, or None
        when a client middleware stopped the push or the job is unique (``unique_for``)
        and an earlier push of it holds its lock (:mod:`forkq.unique`). With ``durable``,
        returns only once replicas or disks confirm it (:mod:`forkq.durability`)."""
        now = time.time()
        payload = self._prepare(_fields(item), item.get("args"), now)
        if payload is None:
            return None
        level = durability.resolve(durable) if durable else None  # a plain push: no call
        dropped = self._send([(payload, _at(item.get("at")))], now, level)
        return None if dropped else str(payload["jid"])

    def push_bulk(self, item: Mapping[str, Any], *, durable: bool | Durability = False
                  ) -> list[str]:
        """Push many jobs of one class in one round trip: ``item["args"]`` is a list of arg
        lists; ``at`` may be one number or one per job. All share ``created_at`` and
        ``enqueued_at``, as in Sidekiq. Returns the jids pushed (without those a middleware
        stopped or a unique job's lock dropped). ``durable`` as for :meth:`push`."""
        now = time.time()
        level = durability.resolve(durable) if durable else None
        jobs, encoded = self._bulk(item, now)
        if encoded is not None:  # the common case, encoded at once
            if encoded.commands:
                self._round_trip(encoded.commands, encoded.carried, level)
            return encoded.jids
        return pushed(jobs, self._send(jobs, now, level))

    def _send(self, jobs: list[Job], now: float, level: Durability | None = None) -> set[str]:
        """One round trip: ZADD the future jobs; SADD + one LPUSH per queue for the rest;
        a unique job with its lock, a job of a group with its index (push.lua) (inside a
        ``with forkq.batch()`` block, nothing yet: the batch takes them,
        :mod:`forkq.batches`; while a testing mode is on, no Redis at all: see
        :func:`divert`).
        The jids of the unique jobs dropped.

        Each payload is encoded once, here, before anything is sent (TypeError/ValueError
        for a value JSON cannot carry). Raises :class:`EnqueueError` unless every job's
        command succeeded (the ``queues`` index is best effort: a job whose LPUSH
        succeeded is enqueued). ``level``: see :meth:`_round_trip`."""
        held = self._elsewhere(jobs, now)
        if held is not None:
            return held
        commands, carried = self.commands(jobs, now)
        return dropped_by(commands, carried, self._round_trip(commands, carried, level))

    def _round_trip(self, commands: list[tuple[Any, ...]], carried: list[list[str]],
                    level: Durability | None = None) -> list[Any]:
        """Send ``commands`` in one write; ``carried`` names the jids each one carries, for
        the :class:`EnqueueError` raised unless every command that carries jobs succeeded.
        A script the server did not know (push.lua) is loaded and its commands sent
        again: refused with NOSCRIPT, they ran nothing. With ``level``, its WAIT follows
        the pushes (again after a resend) and must confirm them (:mod:`forkq.durability`).
        The replies of ``commands``."""
        wait = [level.command()] if level else []
        try:
            results = self._exchange(commands + wait)
            confirmed = results.pop() if wait else None
            unknown = unknown_scripts(results)
            if unknown:
                self._exchange(load_push())
                again = self._exchange([commands[i] for i in unknown] + wait)
                confirmed = again.pop() if wait else None
                retried(results, unknown, again)
        except redis.RedisError as exc:
            raise failed_push(exc, carried) from exc
        check_results(carried, results)
        confirm(level, confirmed, carried)
        return results

    def _exchange(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        return (round_trip(self.redis, commands) if self._kept is None
                else self._kept.round_trip(commands))


def _script_push(payload: payloads.Payload, at: float | None, now: float,
                 bid: str = "") -> tuple[Any, ...]:
    """The EVALSHA of push.lua that pushes ``payload`` (due at ``at``): a unique job with
    its lock (the payload gains the lock's digest, :mod:`forkq.unique`), a job of a group
    with its index (:mod:`forkq.groups`); with ``bid``, a member of that batch once pushed."""
    scheduled = at is not None and at > now
    target = keys.SCHEDULE if scheduled else keys.queue(payload["queue"])
    lock, ttl = target, ""  # no lock (push.lua)
    if unique.FOR in payload:
        unique.check(payload)
        digest = unique.digest(payload["class"], payload["queue"], payload["args"])
        payload[unique.DIGEST] = digest
        lock, ttl = unique.lock_key(digest), str(unique.ttl(payload, at, now))
    if not scheduled:
        payload["enqueued_at"] = now
    return ("EVALSHA", push_sha(), 3, lock, target, keys.QUEUES, payload["jid"], ttl,
            payloads.encode_bytes(payload), at if scheduled else "", payload["queue"], bid)


@functools.cache
def push_sha() -> str:
    """The SHA-1 of push.lua as served (read at the first push that needs it)."""
    return hashlib.sha1(scripts.source("push").encode()).hexdigest()


def _encoded_now(fields: _Fields, arg_lists: Sequence[Any], jids: list[str],
                 now: float) -> Encoded:
    """The commands that push jobs of fresh ``jids`` at once, untouched by middleware: what
    :meth:`PushSteps.commands` would give for their payloads, the shared fields encoded once."""
    arg_lists = list(arg_lists)  # any Sequence: a deque cannot be sliced
    for args in arg_lists:
        _check_args(args)
    encoded = payloads.encode_immediate(fields.name, arg_lists, jids, queue=fields.queue,
                                        retry=fields.retry, options=fields.extra, now=now)
    if not encoded:
        return Encoded([], [], jids)
    return Encoded([("SADD", keys.QUEUES, fields.queue),
                    ("LPUSH", keys.QUEUE_PREFIX + fields.queue, *encoded)], [[], jids], jids)


def pushed(jobs: list[Job], dropped: set[str]) -> list[str]:
    """The jids of ``jobs`` pushed: all but the unique jobs ``dropped``."""
    return [str(payload["jid"]) for payload, _ in jobs if payload["jid"] not in dropped]


def dropped_by(commands: list[tuple[Any, ...]], carried: list[list[str]],
               results: list[Any]) -> set[str]:
    """The jids of the unique jobs whose push.lua found their lock taken (replied 0)."""
    return {group[0] for command, group, result in zip(commands, carried, results, strict=True)
            if command[0] == "EVALSHA" and result == 0}


def unknown_scripts(results: list[Any]) -> list[int]:
    """The indexes of the commands refused with NOSCRIPT: they ran nothing; send them again
    after :func:`load_push`."""
    return [i for i, result in enumerate(results)
            if isinstance(result, redis.exceptions.NoScriptError)]


def retried(results: list[Any], unknown: list[int], again: list[Any]) -> None:
    """Put the replies ``again`` of the commands ``unknown`` sent again into ``results``."""
    for i, result in zip(unknown, again, strict=True):
        results[i] = result


def failed_push(exc: redis.RedisError, carried: list[list[str]]) -> EnqueueError:
    """What a push whose round trip raised ``exc`` tells its caller: every job not enqueued
    when nothing was sent, else every job's fate unknown."""
    jids = [jid for group in carried for jid in group]
    sent = not _before_sending(exc)
    return EnqueueError(f"not enqueued{' (or unknown)' if sent else ''}: {exc}",
                        enqueued=[], not_enqueued=[] if sent else jids,
                        unknown=jids if sent else [])


def confirm(level: Durability | None, reply: Any, carried: list[list[str]]) -> None:
    """EnqueueError unless ``reply`` (the WAIT of ``level``) confirms the jobs ``carried``."""
    if level is not None:
        level.check(reply, [jid for group in carried for jid in group])


def check_results(carried: list[list[str]], results: list[Any]) -> None:
    """Raise EnqueueError when Redis refused a command that carries jobs (a command that
    carries none, ``[]``, is best effort: the ``queues`` index)."""
    refused = [(group, result) for group, result in zip(carried, results, strict=True)
               if group and isinstance(result, Exception)]
    if not refused:
        return
    failed = [jid for group, _ in refused for jid in group]
    done = [jid for group, result in zip(carried, results, strict=True)
            if not isinstance(result, Exception) for jid in group]
    error = refused[0][1]
    raise EnqueueError(f"Redis refused {len(failed)} job(s): {error}", enqueued=done,
                       not_enqueued=failed, unknown=[]) from error


def _before_sending(exc: redis.RedisError) -> bool:
    """Whether the error came before anything was sent (no connection could be made, or the
    server was found not to be the master before the push was sent)."""
    if isinstance(exc, MasterLost):
        return not exc.sent
    return isinstance(exc, redis.AuthenticationError) or "connecting to" in str(exc)


class _Fields(NamedTuple):
    """What the jobs of one push or push_bulk share, checked once."""

    name: str
    queue: str
    retry: Any
    extra: dict[str, Any]
    jid: str | None


def _fields(item: Mapping[str, Any]) -> _Fields:
    """The shared fields of ``item``; TypeError/ValueError for a bad class or queue."""
    name = _class_name(item.get("class"))
    queue = item.get("queue", "default")
    if not isinstance(queue, str) or not queue:
        raise ValueError(f"job queue must be a non-empty string, got {queue!r}")
    extra = {k: v for k, v in item.items() if k not in _BUILT_FIELDS}
    if unique.FOR in extra or unique.UNTIL in extra:  # constants: no call on a plain push
        unique.check(extra)
    if "expires_in" in extra:
        payloads.check_expires_in(extra["expires_in"])
    if groups.FIELD in extra or groups.LIMIT in extra:
        groups.apply(extra)  # group_limit becomes the concurrency limit it is
    if concurrency.LIMIT in extra:
        concurrency.check_limit(extra[concurrency.LIMIT])
        extra.setdefault(concurrency.KEY, "")  # none given: one key for the whole class
        if not isinstance(extra[concurrency.KEY], str):
            raise TypeError(f"concurrency_key of a push must be a string, got "
                            f"{extra[concurrency.KEY]!r}")
    jid = item.get("jid")
    return _Fields(name, queue, item.get("retry", True), extra,
                   jid if isinstance(jid, str) else None)


def _build(fields: _Fields, args: Any, now: float, jid: str | None = None) -> payloads.Payload:
    """A fresh payload (its own dict and args list) for one job; its jid is ``jid``, else the
    shared one of ``fields``, else a fresh one."""
    _check_args(args)
    return payloads.build(fields.name, args, queue=fields.queue, retry=fields.retry,
                          options=fields.extra, now=now, jid=jid or fields.jid)


def _check_args(args: Any) -> None:
    """TypeError unless ``args`` is a list or a tuple (a job's arguments)."""
    if not isinstance(args, (list, tuple)):
        raise TypeError(f"job args must be a list, got {type(args).__name__}")


_BUILT_FIELDS = frozenset({"class", "args", "queue", "retry", "at", "jid", "created_at"})


def _class_name(value: Any) -> str:
    if isinstance(value, str) and value:
        return value
    for attribute in ("job_name", "name"):
        name = getattr(value, attribute, None)
        if isinstance(name, str) and name:
            return name
    raise TypeError(f"job class must be a registered job or a non-empty name, got {value!r}")


def _at(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"'at' must be a number of seconds or an epoch, got {value!r}")
    return at_epoch(float(value))


def env_url() -> str:
    """The Redis URL of a client built without one: ``FORKQ_REDIS_URL``, else ``REDIS_URL``,
    else the local server."""
    return os.environ.get("FORKQ_REDIS_URL") or os.environ.get("REDIS_URL") or (
        "redis://127.0.0.1:6379/0"
    )


def env_dir() -> str:
    """The embedded server's directory for a client built without one (``FORKQ_EMBEDDED_DIR``)."""
    return os.environ.get("FORKQ_EMBEDDED_DIR", ".forkq")


DEFAULT_TIMEOUT = 5.0


def env_seconds(name: str) -> float:
    """A positive number of seconds from the environment variable ``name`` (default 5)."""
    text = os.environ.get(name, "")
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{name}={text!r}: expected a positive number of seconds")
    return value


def cancel_requested(jid: str | None = None, *, client: Client | None = None) -> bool:
    """Whether cancelling job ``jid`` (default: the job running in this thread or task) was
    asked (``forkq cancel``, :func:`forkq.api.cancel`) and still stands: a long job may check
    it between steps and stop early, cleaning up first. Once it has answered True inside the
    job, the job is filed as cancelled (to ``dead`` with
    :class:`~forkq.errors.JobCancelledError`, never retried) whether it then returns or
    raises; a job that does not stop within the daemon's ``cancel_grace`` is killed. One
    round trip. ValueError outside a job when no ``jid`` is given."""
    context = current_job()
    if jid is None:
        if context is None:
            raise ValueError("cancel_requested() outside a job needs the jid")
        jid = context.jid
    if _diversion is not None:
        return _diversion.cancel_requested(jid)
    asked = (client or default()).redis.zscore(keys.CANCELS, jid) is not None
    if asked and context is not None and context.jid == jid:
        context.cancel_seen = True  # the daemon files the job as cancelled however it ends
    return asked


def result(jid: str, *, timeout: float | None = None, client: Client | None = None) -> Any:
    """What job ``jid`` returned, once it completed: a job with the ``result_ttl`` option
    (see :mod:`forkq.results`). Blocks on the server (no polling) up to ``timeout`` seconds
    (None: for ever); raises :class:`~forkq.errors.JobFailedError` when the job failed for
    good, :class:`~forkq.errors.ResultTimeoutError` when nothing came in time."""
    if _diversion is not None:
        return _diversion.result(jid)
    from forkq import results  # the client side loads it only when results are used

    return results.wait((client or default()).redis, jid, timeout)


_default: Client | None = None


def default() -> Client:
    """The client used by ``perform_async`` and friends.

    Built on first use from ``FORKQ_REDIS_URL`` / ``REDIS_URL`` (``embedded`` works
    with ``FORKQ_EMBEDDED_DIR``); inside the daemon it is the processor's own client.
    """
    global _default
    if _default is None:
        _default = Client()
    return _default


def configure(client: Client | None) -> None:
    """Replace the default client (None: rebuild from the environment on next use)."""
    global _default
    _default = client
