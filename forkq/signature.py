"""Signatures: a job and its arguments captured without enqueuing (Celery's ``.s()``).

    sig = send_report.s(42, fmt="pdf")          # nothing is pushed
    sig = sig.set(queue="reports", retry=3)     # other options, a new signature
    sig.perform_async()                         # push it as perform_async would

A signature is what batches take as callbacks (:mod:`forkq.batches`) and what chains,
groups and chords are made of (:mod:`forkq.canvas`). Its arguments must be JSON-native,
as a push's: the check happens when it is pushed or turned into a :func:`template`.
Keyword arguments travel in the payload's ``kwargs`` field (an object) and reach the
job as keyword arguments; a job pushed by Sidekiq's client has none.

A **template** is a signature encoded for a script to push later with a value put in
front of its arguments (a batch's status, a chain's previous result, a chord's results):
``<queue>\\0<head>\\0<tail>``, the job's JSON cut where its first argument goes. Its jid
and ``created_at`` are fixed when the template is made; the script adds ``enqueued_at``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from forkq import client as clients
from forkq import payload as payloads

KWARGS = "kwargs"
"""The payload field of a signature's keyword arguments."""

_HOLE = "forkq:first-argument:7c1f"  # where a template's first argument goes


@dataclass(frozen=True)
class Signature:
    """A job (``enqueue``: what ``@job`` returned, or ``Job.set()``) with its arguments."""

    enqueue: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The job's wire name."""
        return str(self.enqueue._name)

    def set(self, **overrides: Any) -> Signature:
        """A copy with other options (``queue=``, ``retry=``, any job option)."""
        return Signature(self.enqueue.set(**overrides), self.args, self.kwargs)

    def item(self, *, before: tuple[Any, ...] = ()) -> dict[str, Any]:
        """The push item of this signature (``Client.push``'s argument), with ``before``
        put in front of its arguments (the options computed from the arguments, such as a
        ``group`` or a ``concurrency_key``, see the signature's own arguments only)."""
        item: dict[str, Any] = self.enqueue._item(self.args)
        item["args"] = [*before, *item["args"]]
        if self.kwargs:
            item[KWARGS] = dict(self.kwargs)
        return item

    def perform_async(self) -> str | None:
        """Push it now; the jid (None when a client middleware stopped it)."""
        return clients.default().push(self.item())

    def __repr__(self) -> str:
        shown = [repr(arg) for arg in self.args]
        shown += [f"{key}={value!r}" for key, value in self.kwargs.items()]
        return f"{self.name}.s({', '.join(shown)})"


def signature(enqueue: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Signature:
    """The signature of ``enqueue`` called with ``args`` and ``kwargs``; TypeError for a
    keyword that is no string."""
    for key in kwargs:
        if not isinstance(key, str):
            raise TypeError(f"a signature's keyword must be a string, got {key!r}")
    return Signature(enqueue, tuple(args), dict(kwargs))


def check(value: Any, what: str) -> Signature:
    """``value`` when it is a :class:`Signature`, else TypeError naming ``what``."""
    if not isinstance(value, Signature):
        raise TypeError(f"{what} must be a signature (job.s(...)), got {value!r}")
    return value


def payload_of(client: clients.Client, sig: Signature, now: float, *,
               extra: dict[str, Any] | None = None,
               before: tuple[Any, ...] = ()) -> payloads.Payload | None:
    """The payload ``client`` would push for ``sig`` (client middleware run; None when it
    stopped it), with ``extra`` fields; not encoded, not pushed."""
    item = {**sig.item(before=before), **(extra or {})}
    return client.prepare(item, now)


def template(client: clients.Client, sig: Signature, now: float, *,
             extra: dict[str, Any] | None = None) -> tuple[str, bytes] | None:
    """The jid and the template (see the module's doc) of ``sig``, or None when a client
    middleware stopped it. TypeError/ValueError for arguments JSON cannot carry."""
    payload = payload_of(client, sig, now, extra=extra, before=(_HOLE,))
    if payload is None:
        return None
    encoded = payloads.encode_bytes(payload)
    hole = json.dumps(_HOLE).encode()
    head, found, tail = encoded.partition(hole)
    if not found or hole in tail:
        raise ValueError(f"{sig!r}: its arguments hold forkq's own marker {_HOLE!r}")
    return str(payload["jid"]), b"\0".join([str(payload["queue"]).encode(), head, tail])
