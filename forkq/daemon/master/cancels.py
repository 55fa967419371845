"""Which of the master's processors run a job whose cancellation was asked (pure).

The request is a jid in ``forkq:cancels`` (:mod:`forkq.ops.cancel`). The master reads the
pending jids when that key changes (its watch) and at least every second, and the in-flight
lists of its children; :func:`to_stop` names the children to kill, each with the jid it
runs. A child is killed only for the job it *runs*: for a one-job processor the first job
of its list that it has not completed (its slot's :class:`~forkq.daemon.progress.Progress`
says how many it completed at the head); in a processor with lanes, each lane's one job.
A job held behind the running one (a batch) is not stopped early: it is stopped when it
starts. The kill's settlement (:mod:`~forkq.daemon.master.dead_child`, cause ``cancel``)
files the job to ``dead`` with ``forkq.JobCancelledError`` and withdraws the request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from forkq import payload as payloads
from forkq.daemon.progress import Done, digest
from forkq.errors import JobError


@dataclass(frozen=True)
class Holder:
    """One child's in-flight lists as read, and what it completed of its batch."""

    lists: Sequence[Sequence[bytes]]  # its own list, then each lane's
    done: Done


def to_stop(pending: set[str], holders: Mapping[int, Holder]) -> dict[int, str]:
    """Child pid → the cancelled jid it runs, for each child running one."""
    stop = {}
    for pid, holder in holders.items():
        for elements in holder.lists:
            jid = _running_jid(elements, holder.done)
            if jid in pending:
                stop[pid] = jid
                break
    return stop


def _running_jid(elements: Sequence[bytes], done: Done) -> str | None:
    """The jid of the job a list's holder runs: the first pair it has not completed."""
    completed = done.count if len(elements) >= 2 and digest(elements[1]) == done.head else 0
    index = 2 * completed + 1
    if index >= len(elements):
        return None
    try:
        return payloads.jid(payloads.decode(elements[index]))
    except JobError:
        return None
