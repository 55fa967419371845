"""Which of the master's processors run a job whose cancellation was asked, and when to
kill them (pure).

The request is a jid in ``forkq:cancels`` (:mod:`forkq.ops.cancel`). The master reads the
pending jids when that key changes (its watch), and every second while some stand or while
the watch cannot be opened, and the in-flight
lists of its children; :func:`to_stop` names the children running a cancelled job, each with
the jid it runs. A child is stopped only for the job it *runs*: for a one-job processor the
first job of its list that it has not completed (its slot's
:class:`~forkq.daemon.children.fetch.Progress` says how many it completed at the head); in a
processor with lanes, each lane's one job. A job held behind the running one (a batch) is not
stopped early: it is stopped when it starts.

Cooperative first, then by force (:func:`decide`): the request itself is what the job sees
(:func:`forkq.cancel_requested` turns True at once), so the master only notes when it first
saw the child run the cancelled job, and kills the child once ``cancel_grace`` seconds have
passed since (0: at once). A job that stops on seeing the request is filed to ``dead`` by its
processor (:mod:`forkq.daemon.children.job_run`); one killed is filed by the kill's
settlement (:mod:`~forkq.daemon.master.dead_child`, cause ``cancel``); either way with
``forkq.JobCancelledError``, never retried, and the request is withdrawn in the same step.
A job that ends within the grace without having looked (it completed) leaves the request
standing: the master withdraws it (:attr:`Decision.ended`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from forkq import payload as payloads
from forkq.daemon.children.fetch import Done, digest
from forkq.errors import JobError


@dataclass(frozen=True)
class Holder:
    """One child's in-flight lists as read, and what it completed of its batch."""

    lists: Sequence[Sequence[bytes]]  # its own list, then each lane's
    done: Done


@dataclass(frozen=True)
class Asked:
    """A cancelled job a child was found running, and since when (monotonic seconds)."""

    jid: str
    since: float


@dataclass(frozen=True)
class Decision:
    """What the master does this turn, each by child pid: note that its job is asked to
    stop (log it), kill it (its grace is over), or forget the request it was found running
    (its job ended within the grace)."""

    asked: dict[int, str]
    kill: dict[int, str]
    ended: dict[int, str]


def decide(running: Mapping[int, str], asked: Mapping[int, Asked], *, now: float,
           grace: float) -> Decision:
    """``running``: child pid → the cancelled jid it runs (:func:`to_stop`); ``asked``: the
    children already found running one, and since when. A child running a cancelled job it
    was not found running before is asked (and killed at once when ``grace`` is 0); one
    still running it ``grace`` seconds later is killed; one that no longer runs the job it
    was asked for has ended it."""
    new: dict[int, str] = {}
    kill: dict[int, str] = {}
    for pid, jid in running.items():
        before = asked.get(pid)
        if before is None or before.jid != jid:
            new[pid] = jid
            since = now
        else:
            since = before.since
        if now - since >= grace:
            kill[pid] = jid
    ended = {pid: before.jid for pid, before in asked.items() if running.get(pid) != before.jid}
    return Decision(new, kill, ended)


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
