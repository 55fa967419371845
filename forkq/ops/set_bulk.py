"""Bulk actions on ``schedule``, ``retry`` or ``dead``: on a selection of members
(:func:`act_on_keys`) or on every member matching a search (:func:`act_on_matching`).

Each member is acted on by its exact bytes through entry.lua (see
:mod:`forkq.ops.sorted_sets`), one script call per member, pipelined a batch per round trip:
a member raced away (the leader's mover, Sidekiq, another operator) counts as ``gone``, a
member that cannot take the action (not a job, a target key of the wrong type) as
``refused`` with the reason, and neither stops the others.

**Bounded per request.** "Everything matching" runs in the caller (a web request), as a loop
of bounded batches: the search's ``ZSCAN`` (:mod:`forkq.ops.set_search`) hands out the
matches, each batch acted on in one round trip, until the set has been scanned, or
:data:`BULK_CAP` members were acted on, or :data:`BULK_SECONDS` passed; :attr:`Outcome.more`
then says that more may match, and the same request again carries on (the members acted on
have left the set, so a new scan does not meet them again; refused ones are met again and
refused again). The one exception is *delete* with no filter, which empties the set in one
step (``UNLINK``, as Sidekiq's "Delete All"). Measured on 100,000 dead jobs of ~900 bytes:
retrying 10,000 takes ~0.4 s, a search for the 500 jobs of one class over the whole set and
retrying them ~0.35 s; one batch holds the server ~20 ms.

The action names are the page's buttons: ``retry`` (``add_to_queue`` on ``schedule``: its
jobs have not failed), ``delete``, ``kill`` (not on ``dead``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from forkq import keys
from forkq.ops.records import SortedEntry
from forkq.ops.set_pages import MAX_PAGE_SIZE, resolve, sorted_set_read
from forkq.ops.set_search import search
from forkq.ops.sorted_sets import JobSet

BULK_CAP = 50_000
BULK_SECONDS = 10.0
BATCH = 500
KEPT_REASONS = 5

_ACTIONS = {
    keys.SCHEDULE: {"retry": "add_to_queue", "delete": "delete", "kill": "kill"},
    keys.RETRY: {"retry": "retry", "delete": "delete", "kill": "kill"},
    keys.DEAD: {"retry": "retry", "delete": "delete"},
}


@dataclass
class Outcome:
    """What a bulk action did: members ``acted`` on, ``gone`` before it reached them,
    ``refused`` (the first :data:`KEPT_REASONS` reasons in ``reasons``), and whether ``more``
    may match (stopped at the cap or the time limit)."""

    acted: int = 0
    gone: int = 0
    refused: int = 0
    reasons: list[str] = field(default_factory=list)
    more: bool = False

    def add(self, results: list[bool | Exception]) -> None:
        for result in results:
            if isinstance(result, Exception):
                self.refused += 1
                if len(self.reasons) < KEPT_REASONS:
                    self.reasons.append(str(result))
            elif result:
                self.acted += 1
            else:
                self.gone += 1


def actions(jobset: JobSet) -> tuple[str, ...]:
    """The bulk actions this set offers, in button order."""
    return tuple(_ACTIONS.get(jobset.name, {}))


def _method(jobset: JobSet, action: str) -> str:
    try:
        return _ACTIONS[jobset.name][action]
    except KeyError:
        raise ValueError(f"no action {action!r} on {jobset.name!r}") from None


def act_on_keys(jobset: JobSet, action: str, entry_keys: list[str]) -> Outcome:
    """``action`` on the members named by ``entry_keys`` (:func:`forkq.ops.set_pages.entry_key`;
    at most :data:`MAX_PAGE_SIZE` of them, duplicates once); a key whose member is no longer
    there counts as gone."""
    method = _method(jobset, action)
    outcome = Outcome()
    entries: list[SortedEntry] = []
    for key in dict.fromkeys(entry_keys[:MAX_PAGE_SIZE]):
        entry = resolve(jobset, key)
        if entry is None:
            outcome.gone += 1
        else:
            entries.append(entry)
    if entries:
        outcome.add(jobset.act_many(entries, method))
    return outcome


def act_on_matching(jobset: JobSet, action: str, query: str, *, field: str = "any",
                    cap: int = BULK_CAP, seconds: float = BULK_SECONDS) -> Outcome:
    """``action`` on every member matching the search (``query``, ``field``), in bounded
    batches, up to ``cap`` members or ``seconds`` (see the module docstring)."""
    method = _method(jobset, action)
    outcome = Outcome()
    if method == "delete" and not query:
        with sorted_set_read(jobset.name):
            outcome.acted = jobset.clear()
        return outcome
    deadline = time.monotonic() + seconds
    cursor = 0
    while True:
        found = search(jobset, query, field=field, cursor=cursor, want=BATCH)
        room = cap - outcome.acted
        outcome.add(jobset.act_many(found.entries[:room], method))
        cursor = found.cursor
        if len(found.entries) > room or (found.more and (
                outcome.acted >= cap or time.monotonic() >= deadline)):
            outcome.more = True
            return outcome
        if not found.more:
            return outcome
