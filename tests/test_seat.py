"""The seats of idle processors (:mod:`forkq.daemon.seat`), with real forked processes: a
seat is a record lock, held per process, dropped by the kernel when its holder dies; a
holder that goes busy keeps its seat while another listens; the processor that parked last
is rung first, and only when no holder listens any more."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from forkq.daemon.seat import BLOCKING_SEATS, Seat


class Holder:
    """A forked process that takes a seat, tells whether it got one, then does what it is
    told (listen, go busy, give the seat up) until it is told to exit (or is killed)."""

    def __init__(self, seat: Seat, seats: int) -> None:
        order_read, self._order = os.pipe()
        self._answer, answer_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child
            try:
                os.close(self._order)
                os.write(answer_write, b"1" if seat.take(seats) else b"0")
                while (order := os.read(order_read, 1)) not in (b"", b"x"):
                    {b"l": seat.listen, b"b": lambda: seat.busy(seats),
                     b"r": lambda: seat.release(seats)}[order]()
                    os.write(answer_write, b"1" if seat.held else b"0")
            finally:
                os._exit(0)
        os.close(order_read)
        os.close(answer_write)
        self.took = os.read(self._answer, 1) == b"1"

    def tell(self, order: bytes) -> bool:
        """Listen (``l``), go busy (``b``) or give the seat up (``r``), and wait until it has
        (and has rung, if it rings); whether it holds a seat then."""
        os.write(self._order, order)
        return os.read(self._answer, 1) == b"1"

    def release(self) -> None:
        """Give up the seat, then exit."""
        assert not self.tell(b"r")
        os.write(self._order, b"x")
        os.waitpid(self.pid, 0)
        self.pid = 0

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self.pid = 0

    def close(self) -> None:
        if self.pid:
            self.kill()
        os.close(self._order)
        os.close(self._answer)


@pytest.fixture
def seat() -> Iterator[Seat]:
    made = Seat(4)
    yield made
    made.close()


@pytest.fixture
def never() -> Iterator[int]:
    """A wake fd that never becomes readable."""
    read_fd, write_fd = os.pipe()
    yield read_fd
    os.close(read_fd)
    os.close(write_fd)


@pytest.fixture
def beside(seat: Seat) -> Iterator[Holder]:
    """Another holder that listens, while this process holds the other seat and has parked
    slot 3 (standing for a third processor)."""
    other = Holder(seat, BLOCKING_SEATS)
    try:
        assert other.took and seat.take(BLOCKING_SEATS)
        other.tell(b"l")
        seat.park(3)
        yield other
    finally:
        other.close()


def test_a_seat_is_held_by_one_process_and_freed_by_its_death(seat: Seat) -> None:
    holder = Holder(seat, 1)
    try:
        assert holder.took
        assert not seat.take(1) and not seat.held
        holder.kill()  # no release: the kernel drops the lock of a dead process
        assert seat.take(1) and seat.held
    finally:
        holder.close()


def test_processors_of_one_queue_hold_two_seats(seat: Seat) -> None:
    first, second = Holder(seat, BLOCKING_SEATS), Holder(seat, BLOCKING_SEATS)
    try:
        assert first.took and second.took
        assert not seat.take(BLOCKING_SEATS)  # a third idle processor parks
        first.release()
        assert seat.take(BLOCKING_SEATS)
    finally:
        first.close()
        second.close()


def test_the_processor_that_parked_last_is_rung_first(seat: Seat, never: int) -> None:
    for slot in (0, 2, 1):
        seat.park(slot)
    rung = []
    for _ in range(4):
        assert seat.take(1)
        seat.release(1)  # no seat held any more: rings the latest parked, if any
        rung.append([slot for slot in range(4) if seat.wait(slot, 0, never) == "rung"])
    assert rung == [[1], [2], [0], []]


def test_a_holder_rings_only_when_no_other_holder_listens(seat: Seat, beside: Holder,
                                                          never: int) -> None:
    seat.release(BLOCKING_SEATS)  # the other still listens: nobody is woken
    assert seat.wait(3, 0, never) == "timed out"
    assert not beside.tell(b"b")  # the last listener went busy: it gives up its seat
    assert seat.wait(3, 0, never) == "rung"  # and the parked processor is rung


def test_a_busy_holder_keeps_its_seat_while_the_other_listens(seat: Seat, beside: Holder,
                                                              never: int) -> None:
    seat.listen()
    seat.busy(BLOCKING_SEATS)  # the other listens: this one keeps its seat, rings nobody
    assert seat.held and seat.wait(3, 0, never) == "timed out"
    assert not beside.tell(b"b")  # no one listens now: the other gives its seat up
    assert seat.wait(3, 0, never) == "rung"
    assert seat.take(BLOCKING_SEATS)  # back from the job: still seated, listens again
    seat.listen()
    rung = Holder(seat, BLOCKING_SEATS)  # the rung processor takes the other seat
    assert rung.took
    rung.close()


def test_a_holder_busy_with_a_long_job_hands_its_seat_on(seat: Seat, beside: Holder,
                                                         never: int) -> None:
    seat.listen()
    seat.busy(BLOCKING_SEATS)  # kept: the other listens
    handing = threading.Thread(target=seat.hand_on)  # the heartbeat thread, job running
    handing.start()
    handing.join()
    # the seat is free and the parked processor is rung, though the other listens
    assert not seat.held and seat.wait(3, 0, never) == "rung"
    rung = Holder(seat, BLOCKING_SEATS)
    assert rung.took  # it listens in this one's place
    rung.close()
    seat.hand_on()  # again, with no seat: nothing to give up, nobody rung
    assert seat.wait(3, 0, never) == "timed out"


def test_of_two_holders_going_busy_at_once_one_gives_up_its_seat(seat: Seat) -> None:
    for _ in range(20):
        first, second = Holder(seat, BLOCKING_SEATS), Holder(seat, BLOCKING_SEATS)
        try:
            assert first.took and second.took
            first.tell(b"l")
            second.tell(b"l")
            os.write(first._order, b"b")  # both at once
            os.write(second._order, b"b")
            kept = [os.read(holder._answer, 1) == b"1" for holder in (first, second)]
            assert kept.count(True) <= 1, "two busy holders kept both seats: no one listens"
        finally:
            first.close()
            second.close()


def test_a_holder_that_did_not_listen_gives_up_its_seat_when_busy(seat: Seat,
                                                                  never: int) -> None:
    other = Holder(seat, BLOCKING_SEATS)
    try:
        assert other.took and seat.take(BLOCKING_SEATS)  # rung: seated, fetched, found a job
        other.tell(b"l")
        seat.busy(BLOCKING_SEATS)
        assert not seat.held  # a job fetched without listening never keeps a seat
    finally:
        other.close()


def test_the_master_forgets_a_dead_listener(seat: Seat, never: int) -> None:
    other = Holder(seat, BLOCKING_SEATS)
    try:
        assert other.took and seat.take(BLOCKING_SEATS)
        other.tell(b"l")
        other.kill()  # it died listening
        seat.child_gone(0)
        for slot in range(4):
            seat.wait(slot, 0, never)  # the master's rings, read
        seat.park(3)
        seat.listen()
        seat.busy(BLOCKING_SEATS)  # the dead one's mark is gone: this one rings
        assert not seat.held and seat.wait(3, 0, never) == "rung"
    finally:
        other.close()


def test_a_parked_processor_that_left_is_not_rung(seat: Seat, never: int) -> None:
    seat.park(0)
    seat.park(1)
    seat.leave(1)  # it woke on its own (a timeout, a signal)
    assert seat.take(1)
    seat.release(1)
    assert [seat.wait(slot, 0, never) for slot in (0, 1)] == ["rung", "timed out"]


def test_a_ring_before_parking_is_dropped_and_a_signal_comes_first(seat: Seat) -> None:
    seat.park(2)
    assert seat.take(1)
    seat.release(1)  # rings slot 2; it wakes on its own before reading the bell
    seat.leave(2)
    seat.park(2)  # a new parking: the old ring must not end it at once
    wake_read, wake_write = os.pipe()
    try:
        assert seat.wait(2, 0, wake_read) == "timed out"
        os.write(wake_write, b"s")
        seat.child_gone(0)  # rings every slot
        assert seat.wait(2, 0, wake_read) == "woken"
    finally:
        os.close(wake_read)
        os.close(wake_write)


def test_the_master_rings_every_slot_and_forgets_the_gone_one(seat: Seat, never: int) -> None:
    seat.park(0)
    seat.park(1)
    seat.child_gone(1)  # its child died parked (or holding a seat)
    assert [seat.wait(slot, 0, never) for slot in range(4)] == ["rung"] * 4
    assert seat.take(1)
    seat.release(1)
    assert [seat.wait(slot, 0, never) for slot in (0, 1)] == ["rung", "timed out"]


def test_how_many_processors_share_the_seats_is_seen_by_forked_ones_and_rings_all(
        seat: Seat, never: int) -> None:
    assert seat.sharing == 0  # as made
    made = Seat(2, sharing=3)
    try:
        assert made.sharing == 3
    finally:
        made.close()
    answer_read, answer_write = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: reports what it sees after the change
        try:
            os.read(go_read, 1)
            os.write(answer_write, str(seat.sharing).encode())
        finally:
            os._exit(0)
    try:
        seat.share(4)  # a reload raised concurrency past the seats
        os.write(go_write, b"!")
        assert os.read(answer_read, 8) == b"4"
    finally:
        os.waitpid(pid, 0)
        for fd in (answer_read, answer_write, go_read, go_write):
            os.close(fd)
    assert [seat.wait(slot, 0, never) for slot in range(4)] == ["rung"] * 4  # all look again


def test_a_process_stopped_holding_the_registry_stops_no_other(seat: Seat,
                                                               never: int) -> None:
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            with seat._registry():
                os.write(ready_write, b"!")
                os.kill(os.getpid(), signal.SIGSTOP)  # as an operator or a debugger may
        finally:
            os._exit(0)
    try:
        assert os.read(ready_read, 1) == b"!"
        seat.park(1)  # each of these would wait for ever on a blocking lock
        assert seat.take(1)
        seat.release(1)  # without the lock: still rings
        assert seat.wait(1, 0, never) == "rung"
        seat.leave(1)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(ready_read)
        os.close(ready_write)
