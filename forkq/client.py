"""Pushing jobs: the :class:`Client` with ``push`` / ``push_bulk``, client middleware.

Wire protocol (Sidekiq's, sidekiq-wire.md §2), one round trip per call:

- immediate: pipeline ``SADD queues <q>`` + ``LPUSH queue:<q> <json>...``; the
  payload carries ``enqueued_at``;
- scheduled (``at`` in the future): ``ZADD schedule <at> <json>``, without
  ``enqueued_at``; an ``at`` in the past pushes immediately.

An ``at`` or interval below 1,000,000,000 is relative to now, as Sidekiq.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from forkq import keys
from forkq import payload as payloads
from forkq.connection import connect
from forkq.middleware import Chain

ClientChain = Chain[payloads.Payload, payloads.Payload]

_RELATIVE_LIMIT = 1_000_000_000

MIDDLEWARE: ClientChain = Chain()
"""The client middleware chain every :class:`Client` uses unless given its own."""


def at_epoch(value: float) -> float:
    """An interval or an epoch → an epoch: values below 1e9 are seconds from now."""
    return time.time() + value if value < _RELATIVE_LIMIT else float(value)


class Client:
    """Pushes jobs to one Redis. Safe to share between threads; not across a fork."""

    def __init__(
        self,
        redis_client: redis.Redis | None = None,
        *,
        url: str | None = None,
        embedded_dir: str | None = None,
        middleware: ClientChain | None = None,
    ) -> None:
        if redis_client is None:
            redis_client = connect(url or _env_url(), embedded_dir=embedded_dir or _env_dir())
        self.redis = redis_client
        self.middleware: ClientChain = middleware if middleware is not None else MIDDLEWARE

    def push(self, item: Mapping[str, Any]) -> str | None:
        """Push one job. ``item`` has ``class`` and ``args``, optionally ``queue``, ``retry``,
        ``at``, ``jid`` and any other key (kept in the payload). Returns the jid, or None
        when a client middleware stopped the push."""
        now = time.time()
        payload = self._prepare(item, now)
        if payload is None:
            return None
        self._send([(payload, _at(item.get("at")))], now)
        return str(payload["jid"])

    def push_bulk(self, item: Mapping[str, Any]) -> list[str]:
        """Push many jobs of one class in one round trip: ``item["args"]`` is a list of arg
        lists; ``at`` may be one number or one per job. All share ``created_at`` and
        ``enqueued_at``, as in Sidekiq. Returns the jids pushed."""
        arg_lists = item.get("args")
        if not isinstance(arg_lists, Sequence) or isinstance(arg_lists, (str, bytes)):
            raise TypeError("push_bulk: 'args' must be a list of argument lists")
        ats = item.get("at")
        if isinstance(ats, Sequence) and len(ats) != len(arg_lists):
            raise ValueError("push_bulk: 'at' must have one entry per job")
        now = time.time()
        jobs: list[tuple[payloads.Payload, float | None]] = []
        for index, args in enumerate(arg_lists):
            payload = self._prepare({**item, "args": args}, now)
            if payload is not None:
                jobs.append((payload, _at(ats[index] if isinstance(ats, Sequence) else ats)))
        self._send(jobs, now)
        return [str(payload["jid"]) for payload, _ in jobs]

    def _prepare(self, item: Mapping[str, Any], now: float) -> payloads.Payload | None:
        payload = _normalize(item, now)
        return self.middleware.run(payload, lambda: payload)

    def _send(self, jobs: list[tuple[payloads.Payload, float | None]], now: float) -> None:
        """One pipeline: ZADD the future jobs; SADD + one LPUSH per queue for the rest."""
        if not jobs:
            return
        pipe = self.redis.pipeline(transaction=False)
        immediate: dict[str, list[str]] = {}
        for payload, at in jobs:
            if at is not None and at > now:
                pipe.zadd(keys.SCHEDULE, {payloads.encode(payload): at})
            else:
                payload["enqueued_at"] = now
                immediate.setdefault(payload["queue"], []).append(payloads.encode(payload))
        for queue, encoded in immediate.items():
            pipe.sadd(keys.QUEUES, queue)
            pipe.lpush(keys.queue(queue), *encoded)
        pipe.execute()


def _normalize(item: Mapping[str, Any], now: float) -> payloads.Payload:
    name = _class_name(item.get("class"))
    args = item.get("args")
    if not isinstance(args, (list, tuple)):
        raise TypeError(f"job args must be a list, got {type(args).__name__}")
    queue = item.get("queue", "default")
    if not isinstance(queue, str) or not queue:
        raise ValueError(f"job queue must be a non-empty string, got {queue!r}")
    extra = {k: v for k, v in item.items() if k not in _BUILT_FIELDS}
    payload = payloads.build(
        name, args, queue=queue, retry=item.get("retry", True), options=extra, now=now
    )
    if isinstance(item.get("jid"), str):
        payload["jid"] = item["jid"]
    payloads.encode(payload)  # fail here, in the caller, on non-JSON-native args
    return payload


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


def _env_url() -> str:
    return os.environ.get("FORKQ_REDIS_URL") or os.environ.get("REDIS_URL") or (
        "redis://127.0.0.1:6379/0"
    )


def _env_dir() -> str:
    return os.environ.get("FORKQ_EMBEDDED_DIR", ".forkq")


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
