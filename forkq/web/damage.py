"""Keys of the wrong type on a page: what a view reads that another program (or a typo at
``redis-cli``) made a string where a set belongs, say. The page renders what it can, the
damaged key reads as empty, and the layout names it in a notice (``id="damaged-keys"``).

A view calls :func:`check` once with the fixed keys it reads and their types (one pipelined
``TYPE`` per key, a round trip; a missing key is fine), and wraps a read that would raise
``WRONGTYPE`` in :func:`guarded`, which answers the fallback instead. Per-item keys (a
queue's list, a process's hash, a minute's metrics) are reported by the code reading them.
An action (or an unguarded read) that meets WRONGTYPE answers 409 with every fixed key of
the wrong type named (:mod:`forkq.web.app`), never 500.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import redis

from forkq import keys
from forkq.connection import is_wrong_type, text
from forkq.metrics import layout
from forkq.web.routes import Request

T = TypeVar("T")

#: The fixed keys the pages read, and the type each must have.
TYPES: Mapping[str, str] = {**keys.TYPES, layout.JOBS: "hash"}


def note(request: Request, message: str) -> None:
    """Add ``message`` to the page's notice (once)."""
    if message not in request.damaged:
        request.damaged.append(message)


def check(request: Request, wanted: Mapping[str, str]) -> list[str]:
    """Note every key of ``wanted`` (name → type) that exists with another type; their names."""
    names = list(wanted)
    if not names:
        return []
    with request.redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.type(name)
        found = pipe.execute(raise_on_error=False)
    damaged = []
    for name, reply in zip(names, found, strict=True):
        if not isinstance(reply, bytes | str):  # TYPE refused (an ACL): nothing to say
            continue
        kind = text(reply)
        if kind not in ("none", wanted[name]):
            damaged.append(name)
            note(request, f"key {name!r} is not a {wanted[name]} (it is a {kind}): "
                          "read as empty")
    return damaged


def fixed(request: Request, *names: str) -> list[str]:
    """:func:`check` of fixed keys named in :data:`TYPES`."""
    return check(request, {name: TYPES[name] for name in names})


def guarded(request: Request, read: Callable[[], T], fallback: T, what: str) -> T:
    """``read()``, or ``fallback`` (noting ``what`` could not be read) when Redis answers
    WRONGTYPE; any other error goes on up."""
    try:
        return read()
    except redis.ResponseError as exc:
        if not is_wrong_type(exc):
            raise
        note(request, f"{what} could not be read: Redis refused: {exc}")
        return fallback


def members(request: Request, name: str) -> set[str]:
    """The members of the set ``name`` as text; none when it is of another type (noted)."""
    empty: set[bytes | str] = set()
    found = guarded(request, lambda: set(request.redis.smembers(name)), empty, f"key {name!r}")
    return {text(member) for member in found}
