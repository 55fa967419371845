"""Fair tenants: a queue whose jobs name groups runs them round-robin across the groups.

``@job(group=lambda customer_id, *a, **k: customer_id)``: the push computes the job's group
from its arguments and writes it into the payload (``group``, a non-empty string). The job
goes to ``queue:<name>`` as every job does (so ``LLEN`` and Sidekiq's Web UI see every
job waiting) and, in the same step (``push.lua``; the scheduler's ``move.lua`` for a
scheduled or retried one), onto its group's list ``forkq:group:<len(name)>:<name>:<group>``
(the index: the group's waiting jobs, oldest at the right); a group with jobs waiting has a
place in the queue's rotation ``forkq:groups:<name>`` (a list of group names, ``""`` first).

A processor's fetch (``fetch.lua``) takes a job of a queue whose rotation exists by turns:
each turn moves the rotation's first name to its end; a group's turn takes that group's
oldest job (removed from the queue's list wherever it is), the ``""`` turn takes the queue's
oldest job whatever its group: jobs without a group, and jobs a recovery put back, are
never starved. A tenant that pushed 100,000 jobs therefore delays one that pushed 10 by
at most a few turns. A queue without a rotation is fetched exactly as before.

The queue's list is the truth; the index is a guide. A job taken from the queue another
way (a blocking move of an idle processor, the oldest job's turn) leaves its group's list
in the same step (``unindex_group`` in ``guard.lua``); an entry whose job is no longer in
the queue (deleted by a tool that does not know the index) is dropped when its turn finds
it missing.

``group_limit=N`` is a concurrency limit keyed by the group (:mod:`forkq.concurrency`):
at most N jobs of the job's class and group run at once, across every daemon.

Cost: a group's job is removed from the middle of its queue's list, which costs Redis a
search from the end it is nearer to (the oldest ``PROBE`` jobs are looked at first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from forkq import concurrency
from forkq.connection import text

FIELD = "group"
LIMIT = "group_limit"
MARKER = b'"group"'
"""In a job's bytes when it may name a group (a byte search, no decode)."""

GroupOf = Callable[..., Any]


def check_group_of(value: Any) -> None:
    """TypeError naming ``group`` unless it is a function or a non-empty string."""
    if not (callable(value) or (isinstance(value, str) and value)):
        raise TypeError(f"group must be a function of the job's arguments or a non-empty "
                        f"string, got {value!r}")


def group_of(group: GroupOf | str, args: list[Any]) -> str:
    """The job's group: ``group(*args)`` as text, or the string itself; ValueError when it
    is empty (an empty name is the rotation's turn of the oldest job)."""
    name = group if isinstance(group, str) else str(group(*args))
    if not name:
        raise ValueError("a job's group must be a non-empty string, got ''")
    return name


def apply(fields: dict[str, Any]) -> None:
    """Check a push's ``group`` / ``group_limit`` and turn ``group_limit`` into the
    concurrency limit it is (``concurrency_limit`` / ``concurrency_key`` = the group).
    TypeError/ValueError naming the field when a value is wrong, when ``group_limit`` comes
    without a group or with a ``concurrency_limit`` of its own."""
    group = fields.get(FIELD)
    if FIELD in fields and not (isinstance(group, str) and group):
        raise TypeError(f"group of a push must be a non-empty string, got {group!r}")
    if LIMIT not in fields:
        return
    check_options(fields, group)
    fields[concurrency.LIMIT] = fields.pop(LIMIT)
    fields[concurrency.KEY] = group


def check_options(options: dict[str, Any], group: Any) -> None:
    """A ``group_limit`` in ``options`` (job options or a push's fields) is an integer >= 1,
    comes with a group (``group``: the job's ``group=`` or the push's field) and without a
    ``concurrency_limit``; TypeError/ValueError naming the option otherwise."""
    if LIMIT not in options:
        return
    concurrency.check_limit(options[LIMIT])
    if group is None:
        raise ValueError("group_limit needs group (the jobs' tenant)")
    if concurrency.LIMIT in options:
        raise ValueError("group_limit and concurrency_limit cannot both be set: group_limit "
                         "is a concurrency limit keyed by the group")


ROTATION_PREFIX = "forkq:groups:"


def rotation_key(queue: str) -> str:
    """The rotation of queue ``queue`` (a list of group names, ``""`` first)."""
    return ROTATION_PREFIX + queue


def group_key(queue: str, group: str) -> str:
    """The index of ``group``'s jobs waiting in queue ``queue`` (a list, oldest at the
    right); the queue name's length keeps the name apart from the group's."""
    return f"forkq:group:{len(queue)}:{queue}:{group}"


def waiting(redis_client: Any, queue: str) -> list[tuple[str, int]]:
    """The groups in ``queue``'s rotation with the jobs their index lists, in turn order
    (``[]`` when the queue has none, or its keys hold another type)."""
    rotation = rotation_key(queue)
    if text(redis_client.type(rotation)) != "list":
        return []
    names = [text(name) for name in redis_client.lrange(rotation, 0, -1)]
    names = [name for name in names if name]
    pipe = redis_client.pipeline(transaction=False)
    for name in names:
        pipe.llen(group_key(queue, name))
    counts = pipe.execute(raise_on_error=False)
    return [(name, count if isinstance(count, int) else 0)
            for name, count in zip(names, counts, strict=True)]
