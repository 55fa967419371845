"""Concurrency limits per key: at most N jobs of a key run at once, across every daemon.

``@job(concurrency_limit=2, concurrency_key=lambda account_id, *a, **k: account_id)``: the
push computes the job's key from its arguments (``concurrency_key``; none: one key for the
whole class) and writes it into the payload with the limit (``concurrency_key``,
``concurrency_limit``). A processor's fetch (``fetch.lua``; after a blocking move,
``admit.lua``) takes a slot of ``forkq:slots:<class>:<key>`` (a set of the jids running)
for the job, or, when all ``limit`` are taken, moves it to the key's waiting line
``forkq:slots:<class>:<key>:blocked``: it does not run, spends no retry and is not polled.
Every step that ends a job's run frees its slot and moves the first job of the line to the
front of its queue, in the same atomic step (``release_slot`` in ``guard.lua``): its
acknowledgement, a failure filed (retry, dead, drop, reschedule), held jobs given back, a
dead child's or daemon's jobs recovered. A job without a limit costs the fetch one plain
substring search.

A push that does not carry the fields (a Ruby client's, or a raw push without them) runs
unlimited.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LIMIT = "concurrency_limit"
KEY = "concurrency_key"
SLOTS_PREFIX = "forkq:slots:"

KeyOf = Callable[..., Any]


def check_limit(value: Any) -> None:
    """TypeError/ValueError naming ``concurrency_limit`` unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"concurrency_limit must be an integer, got {value!r}")
    if value < 1:
        raise ValueError(f"concurrency_limit must be at least 1, got {value!r}")


def check_key(value: Any) -> None:
    """TypeError naming ``concurrency_key`` unless it is a function or a string."""
    if not (callable(value) or isinstance(value, str)):
        raise TypeError(f"concurrency_key must be a function of the job's arguments or a "
                        f"string, got {value!r}")


def key_of(key: KeyOf | str | None, args: list[Any]) -> str:
    """The job's key: ``key(*args)`` as text, the string itself, or "" (the whole class)."""
    if key is None:
        return ""
    if isinstance(key, str):
        return key
    return str(key(*args))


def slots_key(klass: str, key: str) -> str:
    """The running jobs of ``klass`` under ``key`` (a set of jids)."""
    return f"{SLOTS_PREFIX}{klass}:{key}"


def blocked_key(klass: str, key: str) -> str:
    """The waiting line of ``klass`` under ``key`` (a list of jobs)."""
    return slots_key(klass, key) + ":blocked"


LINES = "forkq:lines"
"""The waiting lines that held a job (a set; a line emptied by a cancel may stay listed)."""

MARKER = b'"concurrency_limit"'
"""In a job's bytes when it names a concurrency limit (a byte search, no decode)."""
