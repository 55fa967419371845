"""How far a processor got through the jobs it holds, in memory its master can read.

A processor that holds a batch (:mod:`forkq.daemon.children.fetch`) does not tell Redis
each time it completes one of them: it writes the count to a small shared mapping that
the master created for its slot before the fork, and Redis hears of the completed jobs
with the next fetch (one acknowledgement for all of them). When the processor dies, the
master reads the mapping (:meth:`Progress.read`): the first ``done`` pairs of the in-flight
list are jobs that completed, *if* the list still begins with the job the mapping names
(``head``, a digest of its bytes), else none are (the acknowledgement reached Redis
already). So only the job that was running runs again (:mod:`forkq.daemon.held_jobs`).

Layout: 16 bytes of BLAKE2b digest of the first held job, then ``done`` as an unsigned
32-bit integer. The writer is the one child of the slot, the reader the master after
that child was reaped: no lock. Each write is ordered so that a child killed between two
writes leaves a state that claims nothing wrongly (``done`` is cleared before ``head``
changes).
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass

_LAYOUT = struct.Struct("=16sI")
_COUNT = struct.Struct("=I")


def digest(job: bytes) -> bytes:
    """The 16-byte digest naming a job's bytes."""
    return hashlib.blake2b(job, digest_size=16).digest()


@dataclass(frozen=True)
class Done:
    """What a gone processor had completed: the first ``count`` pairs of its list, if the
    list begins with the job whose digest is ``head``."""

    head: bytes = b""
    count: int = 0


class Progress:
    """The shared mapping of one processor slot (create before fork)."""

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, _LAYOUT.size)

    def start(self, head: bytes) -> None:
        """A new batch begins with the job ``head`` (its bytes); nothing completed yet."""
        self.completed(0)
        self._map[:16] = digest(head)

    def completed(self, count: int) -> None:
        """``count`` jobs of the batch, from its start, completed."""
        _COUNT.pack_into(self._map, 16, count)

    def read(self) -> Done:
        """What the mapping says now (``Done()`` when nothing completed)."""
        head, count = _LAYOUT.unpack(self._map[:_LAYOUT.size])
        return Done(head, count) if count else Done()
