"""Bounded reads of ``schedule``, ``retry`` and ``dead`` for a page of the dashboard:
:func:`page` (one page by position), :func:`entry_key` / :func:`resolve` (a member named in a
link or a checkbox, found again by its score).

Every read costs O(log N + page size) in Redis, whatever the set's size: a page is one
``ZCARD`` and one ``ZRANGE`` by index (pages by position, as Sidekiq's Web: an entry
removed meanwhile shifts the next page by one; newest first is the same slice counted from
the end with negative indices, reversed here, since the least-privilege ACL (docs/redis.md) grants
no ``ZREVRANGE``); a member is found again with
``ZRANGEBYSCORE score score`` in windows of :data:`SAME_SCORE_WINDOW`, reading at most
:data:`SAME_SCORE_LIMIT` members that share its score.

An entry's **key** is ``<score>-<digest>``: its score as Python's ``repr`` (the shortest text
that reads back as the same double, so Redis finds exactly that score) and the first 16 hex
digits of the SHA-1 of its raw bytes. It names one exact member, also one that is not JSON
or has no jid, and never a second member holding the same job written differently.

A key of the wrong type raises :class:`ForkqError` naming it; members that are not jobs are
returned like any other (``item`` empty) for the caller to show as such.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import redis

from forkq.connection import raw
from forkq.errors import ForkqError
from forkq.ops.records import SortedEntry
from forkq.ops.sorted_sets import JobSet

PAGE_SIZE = 25
MAX_PAGE_SIZE = 500
SAME_SCORE_WINDOW = 500
SAME_SCORE_LIMIT = 5_000


@dataclass(frozen=True)
class Page:
    """Entries ``number`` (1-based) of a set, ``size`` per page, out of ``total``."""

    entries: list[SortedEntry]
    number: int
    size: int
    total: int
    newest_first: bool

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.size))

    @property
    def first_index(self) -> int:
        """The 0-based position of the page's first entry in display order."""
        return (self.number - 1) * self.size


@contextmanager
def sorted_set_read(name: str) -> Iterator[None]:
    """Turn Redis' refusal to read a key of another type into a :class:`ForkqError` naming it."""
    try:
        yield
    except redis.ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        raise ForkqError(f"key {name!r} is not a sorted set: {exc}") from None


def page(jobset: JobSet, number: int = 1, *, size: int = PAGE_SIZE,
         newest_first: bool = False) -> Page:
    """Page ``number`` of ``jobset`` by score: highest first with ``newest_first`` (the dead
    set's latest deaths), else lowest first (the next due). ``number`` and ``size`` are
    clamped to sane values; a page past the end is empty."""
    size = min(max(1, size), MAX_PAGE_SIZE)
    number = max(1, number)
    start = (number - 1) * size
    with sorted_set_read(jobset.name), jobset.redis.pipeline(transaction=False) as pipe:
        pipe.zcard(jobset.name)
        if newest_first:  # the same slice counted from the end, in ascending order
            pipe.zrange(jobset.name, -(start + size), -(start + 1), withscores=True)
        else:
            pipe.zrange(jobset.name, start, start + size - 1, withscores=True)
        total, found = pipe.execute()
    pairs = cast(list[Any], found)
    entries = [SortedEntry(raw(member), score=float(score), set_name=jobset.name)
               for member, score in (reversed(pairs) if newest_first else pairs)]
    return Page(entries, number, size, int(total), newest_first)


def entry_key(entry: SortedEntry) -> str:
    """The key naming exactly this member (see the module docstring)."""
    return f"{entry.score!r}-{digest(entry.raw)}"


def digest(member: bytes) -> str:
    return hashlib.sha1(member, usedforsecurity=False).hexdigest()[:16]


def parse_key(key: str) -> tuple[float, str] | None:
    """``(score, digest)`` from a key; None for text no :func:`entry_key` makes."""
    score_text, _, wanted = key.rpartition("-")
    if len(wanted) != 16 or any(c not in "0123456789abcdef" for c in wanted):
        return None
    try:
        score = float(score_text)
    except ValueError:
        return None
    return (score, wanted) if not math.isnan(score) else None


def resolve(jobset: JobSet, key: str) -> SortedEntry | None:
    """The member ``key`` names, if the set still holds it at that score; None otherwise
    (gone, rescheduled, a malformed key, or past :data:`SAME_SCORE_LIMIT` members of the
    same score)."""
    parsed = parse_key(key)
    if parsed is None:
        return None
    score, wanted = parsed
    bound = repr(score)
    with sorted_set_read(jobset.name):
        for offset in range(0, SAME_SCORE_LIMIT, SAME_SCORE_WINDOW):
            found = jobset.redis.zrangebyscore(jobset.name, bound, bound, start=offset,
                                               num=SAME_SCORE_WINDOW)
            for member in cast(list[Any], found):
                if digest(raw(member)) == wanted:
                    return SortedEntry(raw(member), score=score, set_name=jobset.name)
            if len(found) < SAME_SCORE_WINDOW:
                return None
    return None
