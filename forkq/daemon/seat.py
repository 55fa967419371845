"""Which idle processors of a daemon listen to Redis: one or two hold a *seat*; the others
park, and the most recently idle of them is rung first.

Redis hands a push to the client that has waited longest, and a Python process that has
slept long runs its next job's first steps several times slower than one that ran moments
ago. With every idle processor waiting, each sleeps through as many pushes as there are
processors. So only seat holders listen (a ``BLMOVE`` on their queue, or the key watch of
processors of several queues); the other idle processors *park*, each on its own doorbell.
A lightly loaded daemon then runs its jobs on the same few processors, whatever its
``concurrency``, and the others sleep.

How many seats: Redis gives a push to one ``BLMOVE`` waiter, so processors of one queue use
two (:data:`BLOCKING_SEATS`): while one runs a job the other listens, and they take turns
without waking anyone (with one seat, each job of a lightly loaded daemon would wake a
parked processor to listen in its place: measured, 0.2-0.3 ms more CPU per job). A key
watch wakes every watcher, so processors of several queues use one. A daemon with no more
processors than seats uses none: all its idle processors listen. How many processors share
the seats is the master's word (:meth:`Seat.share`, in shared memory, read at each idle
turn), so a reload that raises or lowers ``concurrency`` across that line changes what the
running processors do too.

A holder marks itself *listening* just before it waits. When it takes a job it clears the
mark and keeps its seat if another holder listens (it listens again after the job, with no
system call: the usual turn of a lightly loaded daemon costs one system call, the fence
below); else, and when it stops, fails a step against Redis (then it backs off) or took a
job it fetched without having listened (it was rung), it gives up its seat, and if no other
holder listens it rings the processor that parked last, which takes a seat, fetches once (a
push made in between is not missed) and listens. Every parked processor also fetches on its
own every ``IDLE_WAIT`` seconds, so a lost ring costs at most that. When a holder runs a
job with its seat past :data:`HOLD_LIMIT`, its heartbeat thread hands the seat on
(:meth:`Seat.hand_on`): it gives it up and rings the processor that parked last, so two listen
again (else the one left would hand its seat on with each job it takes, one ring per job,
until the long job ends). The methods that change which seat a process holds are atomic
between its threads (a lock of the process's own).

No ring is lost. A processor registers as parked (under the registry's lock) *before* it
tries the seats a last time, and a holder gives up its seat *before* it looks at the other
holders' marks, and picks one to ring under that lock: either the last try finds the seat
free, or the giver finds the registration. Of two holders going busy at once, each clears
its own mark, then makes a lock operation on the seats' file (``lockf``: giving up its seat,
or unlocking :data:`_FENCE`, a byte nobody holds), then reads the other's mark. The kernel
serialises lock operations on one file under one lock, so whichever comes second sees the
first's mark cleared (a store before a lock release is seen by a load after the next
acquire): at least one of them gives up its seat and rings. The lock is held for
microseconds; a process that cannot get it within :data:`REGISTRY_PATIENCE` (its holder was
stopped with SIGSTOP) goes on without it rather than wait.

A seat is a POSIX record lock (``lockf``) on one byte of an unlinked file the master opens
before it forks (bytes 0 and 1); byte 8 locks the registry of parked processors, a shared
mapping of one ``monotonic_ns`` stamp per slot (0: not parked). Such locks belong to a
process, are not inherited by a fork, and the kernel drops them when the process dies, so a
dead holder never keeps a seat: when the master reaps a child, it clears the listening mark
of every free seat (holding the seat while it does, so no new holder's mark is lost) and
rings every doorbell. The marks are a shared mapping of one byte per seat. A doorbell is a
non-blocking pipe per slot (two fds per slot in the master and its processors; the
scheduler and processors of lanes close them at once); a ring is one byte, and a parked
processor drains what it finds. A :class:`Seat` serves ``slots`` slots, at least
:data:`MIN_SLOTS`: a reload that raises ``concurrency`` beyond that gives the processors
forked after it a seat of their own (:class:`forkq.daemon.master.pool.Pool`), so until the
older ones are replaced, each group has its own listeners.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Literal

from forkq.daemon import pipes

BLOCKING_SEATS = 2
"""Seats of processors that wait with ``BLMOVE`` (one queue); a key watch uses one."""
_REGISTRY = 8  # the byte whose lock guards the registry of parked processors
_FENCE = 9  # a byte nobody locks: unlocking it is a lock operation on the file, a fence
HOLD_LIMIT = 1.0
"""Seconds a job may run on a processor that kept its seat before the seat is handed on."""
REGISTRY_PATIENCE = 0.01
"""Seconds a process tries for the registry's lock before it goes on without it."""
MIN_SLOTS = 16
"""Slots a seat has at least, so that a reload raising ``concurrency`` up to that keeps one
seat for all processors."""
_STAMP = struct.Struct("=Q")
_COUNT = struct.Struct("=I")

Woken = Literal["woken", "rung", "timed out"]
"""What ended a parked wait: the wake fd (a signal), the doorbell, or the timeout."""


class Seat:
    """The seats, the parked registry and the doorbells of ``slots`` processor slots, shared
    by ``sharing`` processors (create in the master, before the children that use it are
    forked; :meth:`share` changes it). A process uses the same ``seats`` (1 or
    :data:`BLOCKING_SEATS`) in every call."""

    def __init__(self, slots: int, *, sharing: int = 0) -> None:
        self.slots = slots
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as its children
        self._fd = self._file.fileno()
        self._parked = mmap.mmap(-1, _STAMP.size * slots)
        self._listening = mmap.mmap(-1, BLOCKING_SEATS)  # per seat: 1 while its holder listens
        self._sharing = mmap.mmap(-1, _COUNT.size)  # how many processors share the seats
        _COUNT.pack_into(self._sharing, 0, sharing)
        self._bells: list[tuple[int, int]] = []
        self._seat: int | None = None  # the seat this process holds
        # between a processor's threads (its heartbeat thread hands the seat on); a record
        # lock is the process's, so the registry's needs it too
        self._guard = threading.RLock()
        try:
            for _ in range(slots):
                self._bells.append(pipes.pipe(nonblocking=True))
        except OSError:  # out of fds: nothing is left open
            self.close()
            raise

    @property
    def sharing(self) -> int:
        """How many processors share these seats, as the master last said."""
        return int(_COUNT.unpack_from(self._sharing)[0])

    def share(self, processors: int) -> None:
        """In the master: ``processors`` share these seats from now on (the processors read
        it at each idle turn: a daemon whose reload raised ``concurrency`` past the number of
        seats has its running processors take seats as its new ones do). Each slot is rung,
        so a parked processor looks again at once."""
        _COUNT.pack_into(self._sharing, 0, processors)
        self._ring_all()

    @property
    def held(self) -> bool:
        """Whether this process holds a seat."""
        return self._seat is not None

    def take(self, seats: int) -> bool:
        """Try to hold one of the first ``seats`` seats (no waiting); True when this process
        holds one (at once, with no system call, when it kept its seat through a job)."""
        with self._guard:
            if self._seat is None:
                self._seat = next((seat for seat in range(seats) if _try_lock(self._fd, seat)),
                                  None)
                if self._seat is not None:  # not listening yet (a dead holder's mark may be left)
                    self._listening[self._seat] = 0
            return self._seat is not None

    def listen(self) -> None:
        """The holder is about to wait for work (a no-op without a seat): the others see it
        listening until :meth:`busy` or :meth:`release`."""
        with self._guard:
            if self._seat is not None:
                self._listening[self._seat] = 1

    def busy(self, seats: int) -> None:
        """The holder (if this process holds a seat) is about to run a job. A holder that
        was listening keeps its seat while another holder of the ``seats`` listens, so it
        listens again after the job with no system call; any other gives the seat up, and
        rings, as :meth:`release` does."""
        with self._guard:
            mine = self._seat
            if mine is None:
                return
            if self._listening[mine] and seats > 1:
                self._listening[mine] = 0
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _FENCE)  # a fence: see the module's doc
                if self._others_listen(mine, seats):
                    return
            self.release(seats)

    def release(self, seats: int) -> None:
        """Give up the seat (if held); when no other holder of the ``seats`` listens, ring
        the processor that parked last."""
        with self._guard:
            mine = self._give_up()
            if mine is not None and not self._others_listen(mine, seats):
                self._ring_latest()  # else it listens, or will look when it stops listening

    def hand_on(self) -> None:
        """Give up the seat (if held) and ring the processor that parked last, though another
        holder may listen: a holder whose job runs long lets a parked processor listen in its
        place (from its heartbeat thread, while the job runs)."""
        with self._guard:
            if self._give_up() is not None:
                self._ring_latest()

    def _give_up(self) -> int | None:
        """Unmark and unlock the seat held (the unlock is also the fence before a look at
        the others' marks); which it was, None when none was held."""
        mine, self._seat = self._seat, None
        if mine is not None:
            self._listening[mine] = 0
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, mine)
        return mine

    def _ring_latest(self) -> None:
        with self._registry():
            latest = self._latest()
        self._ring(latest)

    def _others_listen(self, mine: int, seats: int) -> bool:
        """Whether a holder of another of the ``seats`` listens (read after a fence)."""
        listening = self._listening
        return any(listening[seat] for seat in range(seats) if seat != mine)

    def park(self, slot: int) -> None:
        """Register ``slot`` as parked (before the last try of the seat); a ring from before
        is dropped."""
        self._drain(slot)
        with self._registry():
            _STAMP.pack_into(self._parked, _STAMP.size * slot, time.monotonic_ns())

    def leave(self, slot: int) -> None:
        """``slot`` is no longer parked (it woke, or its process is gone)."""
        with self._registry():
            _STAMP.pack_into(self._parked, _STAMP.size * slot, 0)

    def wait(self, slot: int, timeout: float, wake_fd: int) -> Woken:
        """Wait, parked, up to ``timeout`` seconds for ``slot``'s doorbell or for ``wake_fd``;
        what ended the wait (``wake_fd`` first when both are readable). The ring is
        consumed."""
        bell = self._bells[slot][0]
        readable = pipes.readable([bell, wake_fd], timeout)
        self._drain(slot)
        return "woken" if wake_fd in readable else "rung" if bell in readable else "timed out"

    def child_gone(self, slot: int) -> None:
        """The master reaped ``slot``'s child: forget its registration, clear the listening
        mark of a seat it held (the kernel freed the seat), and ring every slot, so that, if
        it held a seat, a parked processor takes it at once. Never waits on a lock (a stopped
        child may hold the registry's); an unlocked clear of the gone slot's stamp races
        with nothing that matters: its successor is forked after this."""
        _STAMP.pack_into(self._parked, _STAMP.size * slot, 0)
        for seat in range(BLOCKING_SEATS):
            if _try_lock(self._fd, seat):  # free: no holder can mark it while the master holds it
                self._listening[seat] = 0
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, seat)
        self._ring_all()

    def _ring_all(self) -> None:
        for _, write_fd in self._bells:
            with contextlib.suppress(OSError):  # a full pipe already rings
                os.write(write_fd, b"!")

    def close(self) -> None:
        """Close this process's ends (the master, once no child of this seat is left); again
        does nothing."""
        for read_fd, write_fd in self._bells:
            os.close(read_fd)
            os.close(write_fd)
        self._bells = []
        self._parked.close()
        self._listening.close()
        self._sharing.close()
        self._file.close()

    def _latest(self) -> int | None:
        """Under the registry's lock: the slot that parked last, now unregistered; None when
        none is parked."""
        stamps = struct.unpack_from(f"={self.slots}Q", self._parked)
        latest = max(range(self.slots), key=stamps.__getitem__)
        if not stamps[latest]:
            return None
        _STAMP.pack_into(self._parked, _STAMP.size * latest, 0)
        return latest

    def _ring(self, slot: int | None) -> None:
        if slot is not None:
            with contextlib.suppress(OSError):  # a full pipe already rings
                os.write(self._bells[slot][1], b"!")

    @contextlib.contextmanager
    def _registry(self) -> Iterator[None]:
        """The registry's lock, held for a few microseconds by whoever has it: tried for at
        most :data:`REGISTRY_PATIENCE` seconds, then the step goes on without it (a holder
        stopped with SIGSTOP must not stop the others; unlocked, two givers may ring the
        same processor, or a ring may be lost: the 2 s fetch covers that)."""
        fd = self._fd
        with self._guard:
            locked = _try_lock(fd, _REGISTRY)
            if not locked:
                deadline = time.monotonic() + REGISTRY_PATIENCE
                while not locked and time.monotonic() < deadline:
                    os.sched_yield()
                    locked = _try_lock(fd, _REGISTRY)
            try:
                yield
            finally:
                if locked:
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, _REGISTRY)

    def _drain(self, slot: int) -> None:
        with contextlib.suppress(OSError):  # empty: BlockingIOError
            while os.read(self._bells[slot][0], 4096):
                pass


def _try_lock(fd: int, byte: int) -> bool:
    """Lock ``byte`` of the file for this process without waiting; whether it did."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte)
    except OSError:
        return False
    return True
