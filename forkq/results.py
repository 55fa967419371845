"""Optional job results: ``@job(result_ttl=600)`` keeps what the job returned, and
:func:`forkq.result` waits for it. Off by default (Sidekiq jobs have no results).

A job whose payload has ``result_ttl`` (seconds > 0; the job option travels in the payload,
so ``job.set(result_ttl=60)`` works too) gets its outcome stored by the processor under
``forkq:result:<jid>`` (:func:`forkq.keys.result`) for that long: a list holding one JSON
document, ``{"value": <what the job returned>}`` when it completed, or ``{"error_class",
"error_message"}`` when it failed for good (went dead or was dropped; a failure that will be
retried stores nothing, so a waiter waits through the retries). A return value JSON cannot
carry is stored as a ``TypeError`` failure (the job itself completed and is not retried).

:func:`wait` blocks on the server (``BLMOVE key key``: it returns the moment the result is
stored and leaves it in place for other waiters), on a connection of its own, without
polling. A Redis error while storing is logged by the processor and the job counts as
completed: the waiter then times out.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from forkq import keys
from forkq.errors import JobFailedError, ResultTimeoutError


def store_value(client: Any, jid: str, value: Any, ttl: int) -> str | None:
    """Store ``value`` as the result of ``jid``; when JSON cannot carry it, store a
    ``TypeError`` failure instead and return its message."""
    try:
        document = json.dumps({"value": value}, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        message = f"the job's return value cannot be stored as JSON: {exc}"
        store_failure(client, jid, "TypeError", message, ttl)
        return message
    _store(client, jid, document, ttl)
    return None


def store_failure(client: Any, jid: str, error_class: str, error_message: str,
                  ttl: int) -> None:
    """Store that ``jid`` failed for good."""
    _store(client, jid, json.dumps({"error_class": error_class,
                                    "error_message": error_message}), ttl)


def _store(client: Any, jid: str, document: str, ttl: int) -> None:
    key = keys.result(jid)
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(key)  # a job run twice (at least once) keeps its last outcome
        pipe.rpush(key, document)
        pipe.expire(key, ttl)
        pipe.execute()


def wait(client: redis.Redis, jid: str, timeout: float | None) -> Any:
    """The value job ``jid`` returned, waiting up to ``timeout`` seconds (None: for ever) for
    it; raises :class:`JobFailedError` if it failed for good, :class:`ResultTimeoutError` if
    nothing was stored in time."""
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be positive seconds or None, got {timeout!r}")
    pool = client.connection_pool
    socket_timeout = None if timeout is None else timeout + 5
    waiter = redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class,
        **{**pool.connection_kwargs, "socket_timeout": socket_timeout}))
    key = keys.result(jid)
    try:
        found = waiter.blmove(key, key, timeout or 0, "RIGHT", "RIGHT")  # type: ignore[arg-type]
    finally:
        waiter.close()
        waiter.connection_pool.disconnect()
    if found is None:
        raise ResultTimeoutError(f"no result for job {jid} within {timeout:g}s")
    return _outcome(jid, found)


def _outcome(jid: str, found: bytes | str) -> Any:
    try:
        document = json.loads(found)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise JobFailedError(jid, "forkq.MalformedResult", f"{keys.result(jid)} holds no result")
    if "value" in document:
        return document["value"]
    raise JobFailedError(jid, str(document.get("error_class", "")),
                         str(document.get("error_message", "")))
