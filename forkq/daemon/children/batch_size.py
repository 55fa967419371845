"""How many jobs a processor takes in one fetch from a deep queue: the batch size policy.

A processor holds the jobs of a batch behind the one it runs (:mod:`forkq.daemon.children.fetch`).
For short jobs a big batch saves round trips and server work per job; for long ones every
held job waits, and at the end of a drain one processor may still hold a queue's last
jobs while the others are idle. So the size adapts to the jobs this processor runs:

- at most ``limit`` (the ``fetch_batch`` setting);
- no more than :data:`HOLD_BUDGET` seconds of expected work held behind the running job,
  by a moving average of the run times of the jobs it ran (:data:`WEIGHT` for the newest):
  ``1 + floor(HOLD_BUDGET / average)``: jobs of 10 ms take up to 6, of 50 ms or more 1;
- one before it has run any job (the first job it runs tells how long they take).

Pure: the run times are given to it (:meth:`BatchSize.ran`); no clock, no I/O.
"""

from __future__ import annotations

HOLD_BUDGET = 0.05
"""Seconds of expected work a processor may hold, not started, behind its running job."""

WEIGHT = 0.2
"""The weight of the newest run time in the moving average."""


class BatchSize:
    """One processor's batch size: :meth:`size` for the next fetch, :meth:`ran` after each job."""

    def __init__(self, limit: int, budget: float = HOLD_BUDGET) -> None:
        self.limit = max(1, limit)
        self._budget = budget
        self._average: float | None = None
        self._size = 1

    def ran(self, seconds: float) -> None:
        """A job ran for ``seconds`` (wall time, from start to outcome)."""
        seconds = max(0.0, seconds)
        average = self._average
        average = seconds if average is None else average + WEIGHT * (seconds - average)
        self._average = average
        if average * (self.limit - 1) <= self._budget:
            self._size = self.limit
        else:
            self._size = 1 + int(self._budget / average)

    def size(self) -> int:
        """How many jobs the next fetch may take (1 .. ``limit``)."""
        return self._size
