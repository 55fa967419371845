"""The master's decisions, without forking: a unit tier that drives ``Supervisor.loop_once``.

As gunicorn's tests drive its arbiter with patched fork and waitpid, these give the master
stand-ins for its effects (:mod:`forkq.daemon.master.effects`): processes that are only
pids (fork records, kill and wait follow the test's script), a clock that moves only when
the master waits, a store that answers its Redis steps from memory, and a wakeup that
delivers the signals a test sends. Each test runs the real loop turn by turn.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import signal
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import redis

from forkq.config import Config
from forkq.daemon.master.dead_child import Gone, Settled
from forkq.daemon.master.effects import Effects
from forkq.daemon.master.health import Child, verdict
from forkq.daemon.master.heartbeats import Beat, LastBeat
from forkq.daemon.master.supervisor import Supervisor
from forkq.daemon.signals import STOP_SIGNAL
from forkq.middleware import Chain
from forkq.registry import Registry

EXIT_1 = 1 << 8  # a wait status: exited with status 1
KILLED = int(signal.SIGKILL)  # a wait status: killed by SIGKILL


class FakeClock:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = 1_700_000_000.0

    def monotonic(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


class FakeProcesses:
    """Children that are only pids. A child exits when the test says so, when it is
    SIGKILLed, or (``obey_stop``) when it is told to stop."""

    def __init__(self) -> None:
        self.next_pid = 100
        self.forked: list[tuple[float, int]] = []  # (monotonic time, pid)
        self.live: set[int] = set()
        self.exited: dict[int, int] = {}  # pid -> wait status, not yet collected
        self.sent: list[tuple[int, int]] = []
        self.reporters: dict[int, int] = {}  # pid -> write end of its boot pipe
        self.obey_stop = True
        self.clock: FakeClock | None = None
        self.on_exit: Callable[[], None] = lambda: None  # SIGCHLD

    def fork(self, body: Callable[[], int]) -> int:
        self.next_pid += 1
        pid = self.next_pid
        self.live.add(pid)
        self.forked.append((self.clock.monotonic() if self.clock else 0.0, pid))
        return pid

    def fork_reporting(self, body: Callable[[int], int]) -> tuple[int, int]:
        pid = self.fork(lambda: 0)
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        self.reporters[pid] = write_fd
        return pid, read_fd

    def wait(self, pid: int, *, block: bool = False) -> int | None:
        if block and pid in self.live:
            self.exit(pid, 0)
        return self.exited.pop(pid, None)

    def kill(self, pid: int, signum: int) -> None:
        self.sent.append((pid, signum))
        if signum == signal.SIGKILL or (signum == STOP_SIGNAL and self.obey_stop):
            self.exit(pid, KILLED if signum == signal.SIGKILL else 0)

    def rss_mb(self, pid: int) -> float:
        return 50.0

    # -- the test's side ----------------------------------------------------------------------

    def report(self, pid: int, message: str) -> None:
        """The child ``pid`` writes its boot report and closes the pipe."""
        os.write(self.reporters[pid], message.encode() + b"\n")
        os.close(self.reporters.pop(pid))

    def exit(self, pid: int, status: int) -> None:
        if pid in self.live:
            self.live.discard(pid)
            self.exited[pid] = status
            if pid in self.reporters:
                os.close(self.reporters.pop(pid))
            self.on_exit()

    def signals_to(self, pid: int) -> list[int]:
        return [signum for target, signum in self.sent if target == pid]

    def close(self) -> None:
        for fd in self.reporters.values():
            os.close(fd)


class FakeStore:
    """The master's Redis steps, answered from memory."""

    def __init__(self) -> None:
        self.beats: dict[int, LastBeat] = {}
        self.settled: list[Gone] = []
        self.down = False  # every step raises ConnectionError
        self.records = 0
        self.on_record: Callable[[], None] = lambda: None  # runs inside write_record
        self.cancels: set[str] = set()  # jids whose cancellation is asked
        self.withdrawn: list[str] = []  # requests the master withdrew
        self.lists: dict[str, list[bytes]] = {}  # in-flight key -> its elements
        self.alive = False  # the liveness key exists
        self.recovered = 0  # lists of this daemon the leader took while it lapsed

    def _check(self) -> None:
        if self.down:
            raise redis.ConnectionError("Redis is down (test)")

    def ping(self) -> None:
        self._check()

    def settle(self, gone: Gone, *, max_retries: int, now: float) -> Settled | None:
        self._check()
        self.settled.append(gone)
        return None

    def read_beats(self) -> dict[int, LastBeat]:
        self._check()
        return dict(self.beats)

    def cancel_watch_fds(self) -> list[int]:
        return []

    def cancel_asked(self, ready: list[int]) -> bool:
        return False

    def pending_cancels(self, now: float) -> set[str]:
        self._check()
        return set(self.cancels)

    def read_lists(self, inflight_keys: list[str]) -> dict[str, list[bytes]]:
        self._check()
        return {key: list(self.lists.get(key, [])) for key in inflight_keys}

    def withdraw_cancel(self, jid: str) -> bool:
        self._check()
        stood = jid in self.cancels
        self.cancels.discard(jid)
        self.withdrawn.append(jid)
        return stood

    def forget_children(self, pids: list[int]) -> None:
        self._check()

    def write_record(self, *, info: str, busy: dict[str, str], quiet: bool, rss_kb: int,
                     concurrency: int, failover: float) -> Beat:
        self._check()
        self.records += 1
        self.on_record()
        return Beat(None, [])

    def leads(self) -> bool:
        self._check()
        return False

    def reclaim(self, *, now: float) -> None:
        self._check()

    def clear(self) -> None:
        self._check()

    def keep_alive(self, ttl_ms: int) -> bool:
        self._check()
        return self.alive

    def claim_alive(self, ttl_ms: int, *, restore: bool = False) -> int:
        self._check()
        if self.recovered and not restore:
            return self.recovered
        self.alive, self.recovered = True, 0
        return 0

    def beat(self, *pids: int, job: dict[str, Any] | None = None) -> None:
        """Each of ``pids`` writes a new heartbeat."""
        for pid in pids:
            old = self.beats.get(pid)
            self.beats[pid] = LastBeat((old.seq if old else 0) + 1, 0.0, job)


class FakeWakeup:
    """Delivers the signals the test sends; a wait without one lets the clock run."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.pending: list[signal.Signals] = []
        self.frozen = 0.0  # the next wait lasts this much longer: the daemon was frozen in it
        self.after_wait: Callable[[], None] = lambda: None  # runs as a wait returns

    def wait(self, timeout: float, *, also: Iterable[int] = ()
             ) -> tuple[list[signal.Signals], list[int]]:
        self.clock.advance(self.frozen)
        self.frozen = 0.0
        fds = list(also)
        ready = select.select(fds, [], [], 0)[0] if fds else []
        self.after_wait()
        if self.pending or ready:
            received, self.pending = self.pending, []
            return received, ready
        self.clock.advance(timeout)
        return [], []

    def close(self) -> None:
        pass


class Master:
    """A Supervisor on stand-ins, and the test's handles on them."""

    def __init__(self, config: Config, reload: Callable[[], Config] | None = None) -> None:
        self.clock = FakeClock()
        self.processes = FakeProcesses()
        self.processes.clock = self.clock
        self.store = FakeStore()
        self.wakeup = FakeWakeup(self.clock)
        self.processes.on_exit = lambda: self.wakeup.pending.append(signal.SIGCHLD)
        self.titles: list[str] = []
        effects = Effects(processes=self.processes, clock=self.clock, store=self.store,
                          wakeup=self.wakeup, title=self.titles.append)
        self.sup = Supervisor(config, registry=Registry(), middleware=Chain(), reload=reload,
                              effects=effects)
        self.sup.start()

    def turn(self, count: int = 1) -> None:
        for _ in range(count):
            self.sup.loop_once(self.clock.monotonic())

    def run_until(self, condition: Callable[[], bool], seconds: float) -> None:
        """Turn the loop until ``condition`` holds; fail after ``seconds`` of the fake clock."""
        deadline = self.clock.monotonic() + seconds
        while not condition():
            assert self.clock.monotonic() < deadline, "the condition never held"
            self.turn()

    def signal(self, signum: signal.Signals) -> None:
        self.wakeup.pending.append(signum)
        self.turn()

    def children(self) -> dict[int, int]:
        """pid -> slot of the pool's children."""
        return {pid: child.slot for pid, child in self.sup.pool.children.items()}

    def boot_all(self) -> list[int]:
        """Every child reports ready; their pids."""
        pids = sorted(self.children())
        for pid in pids:
            if pid in self.processes.reporters:
                self.processes.report(pid, "ready")
        self.turn()
        return pids


def config(**changes: Any) -> Config:
    base = Config(concurrency=2, timeout=5.0, liveness_timeout=10.0, scheduler=False,
                  redis_url="redis://127.0.0.1:1/0")
    return dataclasses.replace(base, **changes)


@pytest.fixture
def master() -> Iterator[Callable[..., Master]]:
    made: list[Master] = []

    def make(cfg: Config | None = None, reload: Callable[[], Config] | None = None) -> Master:
        m = Master(cfg or config(), reload)
        made.append(m)
        return m

    yield make
    for m in made:
        m.sup.close()
        m.processes.close()
        for child in m.sup.pool.children.values():
            if child.report_fd is not None:
                os.close(child.report_fd)


# -- respawn and its backoff -------------------------------------------------------------------


def test_a_child_that_dies_is_replaced_at_once_after_a_healthy_life(
        master: Callable[..., Master]) -> None:
    m = master()
    m.turn()
    first, second = m.boot_all()
    m.clock.advance(60)  # a long healthy life (beating all along)
    m.store.beat(first, second)
    m.turn()
    m.processes.exit(first, EXIT_1)
    m.turn()
    assert first not in m.children() and len(m.children()) == 2  # replaced in the same turn
    assert m.store.settled[-1] == Gone(_key(m, first), "crash", "exited with status 1")


def test_a_dead_child_with_lanes_has_every_lane_s_list_settled(
        master: Callable[..., Master]) -> None:
    m = master(config(concurrency=1, async_concurrency=3))
    m.turn()
    [pid] = m.boot_all()
    m.processes.exit(pid, EXIT_1)
    m.turn()
    assert [gone.inflight_key for gone in m.store.settled[-4:]] == [
        _key(m, pid), *(f"{_key(m, pid)}-{lane}" for lane in range(3))]
    assert {gone.cause for gone in m.store.settled[-4:]} == {"crash"}


def test_a_child_running_a_cancelled_job_is_killed_and_its_job_settled_as_cancelled(
        master: Callable[..., Master]) -> None:
    m = master(config(cancel_grace=0.0))  # no grace: killed as soon as it is seen
    m.turn()
    first, second = m.boot_all()
    job = b'{"class":"X","args":[],"jid":"j1"}'
    m.store.lists[_key(m, first)] = [b"queue:default", job, b"queue:default", b"{}"]
    m.store.cancels = {"j1"}
    m.clock.advance(1.5)
    m.turn(2)
    assert first not in m.children() and second in m.children()
    gone = [g for g in m.store.settled if g.inflight_key == _key(m, first)][-1]
    assert (gone.cause, gone.timeout_jid) == ("cancel", "j1")
    assert len(m.children()) == 2, "replaced at once, without a backoff"


def test_a_cancelled_job_has_cancel_grace_seconds_to_stop_before_its_child_is_killed(
        master: Callable[..., Master], caplog: pytest.LogCaptureFixture) -> None:
    m = master(config(cancel_grace=5.0))
    m.turn()
    first, second = m.boot_all()
    m.store.lists[_key(m, first)] = [b"queue:default", b'{"class":"X","args":[],"jid":"j1"}']
    m.store.cancels = {"j1"}
    with caplog.at_level(logging.INFO):
        m.turn()
        asked = m.clock.monotonic()
        assert "job j1 was cancelled: processor-" in caplog.text
        m.run_until(lambda: first not in m.children(), 10)
    assert m.clock.monotonic() - asked >= 5.0, "killed before its grace was over"
    assert second in m.children()
    gone = [g for g in m.store.settled if g.inflight_key == _key(m, first)][-1]
    assert (gone.cause, gone.timeout_jid) == ("cancel", "j1")
    assert m.store.withdrawn == [], "the kill's settlement withdraws it, with the filing"


def test_a_cancelled_job_that_completes_within_its_grace_keeps_its_child_and_the_request_goes(
        master: Callable[..., Master]) -> None:
    m = master(config(cancel_grace=5.0))
    m.turn()
    first, _ = m.boot_all()
    key = _key(m, first)
    m.store.lists[key] = [b"queue:default", b'{"class":"X","args":[],"jid":"j1"}']
    m.store.cancels = {"j1"}
    m.clock.advance(1.5)
    m.turn(2)
    m.store.lists[key] = [b"queue:default"]  # it completed and was acknowledged
    m.clock.advance(1.5)
    m.turn(2)
    assert m.store.withdrawn == ["j1"] and m.store.cancels == set()
    m.clock.advance(10)
    m.turn(2)
    assert first in m.children(), "a job that ended is not killed for"


def test_a_held_job_that_is_cancelled_does_not_kill_its_processor_before_it_starts(
        master: Callable[..., Master]) -> None:
    m = master()
    m.turn()
    first, _ = m.boot_all()
    held = b'{"class":"X","args":[],"jid":"j2"}'
    m.store.lists[_key(m, first)] = [b"queue:default", b'{"class":"X","args":[],"jid":"j1"}',
                                     b"queue:default", held]
    m.store.cancels = {"j2"}
    m.clock.advance(1.5)
    m.turn(2)
    assert first in m.children()


def test_quick_deaths_back_off_0_5_1_2_4_seconds(master: Callable[..., Master]) -> None:
    m = master(config(concurrency=1))
    m.turn()
    delays = []
    for _ in range(5):
        [pid] = m.children()
        m.processes.report(pid, "ready")  # booted: these are crashes, not boot failures
        m.turn()
        m.processes.exit(pid, EXIT_1)
        died = m.clock.monotonic()
        m.run_until(lambda pid=pid: bool(m.children()) and pid not in m.children(), 60)
        delays.append(round(m.processes.forked[-1][0] - died, 1))
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0], delays


# -- culling ------------------------------------------------------------------------------------


def test_a_silent_child_is_killed_after_liveness_timeout_and_its_job_settled(
        master: Callable[..., Master]) -> None:
    m = master()
    m.turn()
    quiet, beating = m.boot_all()
    start = m.clock.monotonic()
    while signal.SIGKILL not in m.processes.signals_to(quiet):
        assert m.clock.monotonic() - start < 15, "never culled"
        m.store.beat(beating)
        m.turn()
    waited = m.clock.monotonic() - start
    assert 10 < waited <= 12, waited  # liveness_timeout 10 s, judged once a second
    assert signal.SIGKILL not in m.processes.signals_to(beating)
    m.turn()
    gone = [g for g in m.store.settled if g.inflight_key == _key(m, quiet)]
    assert gone and gone[0].cause == "crash" and "no heartbeat for" in gone[0].how


def test_a_beating_child_is_never_culled(master: Callable[..., Master]) -> None:
    m = master()
    m.turn()
    pids = m.boot_all()
    for _ in range(60):  # a minute of turns, each child beating every second
        m.store.beat(*pids)
        m.turn()
    assert not [s for _, s in m.processes.sent if s == signal.SIGKILL]


def test_a_job_past_its_timeout_gets_its_child_killed_for_a_timeout(
        master: Callable[..., Master]) -> None:
    m = master(config(job_timeout=3.0))
    m.turn()
    pid, _ = m.boot_all()
    job = {"class": "Slow", "jid": "j1", "started": m.clock.time(), "queue": "default"}
    m.store.beat(pid, job=job)
    m.run_until(lambda: signal.SIGKILL in m.processes.signals_to(pid), 8)
    m.turn()
    [gone] = [g for g in m.store.settled if g.inflight_key == _key(m, pid)]
    assert (gone.cause, gone.timeout_jid, gone.timeout) == ("timeout", "j1", 3.0)


def test_a_redis_outage_pauses_culling_and_then_gives_a_fresh_window(
        master: Callable[..., Master]) -> None:
    m = master()
    m.turn()
    pids = m.boot_all()
    m.store.down = True
    for _ in range(30):  # 30 s without being able to read a beat: nobody is culled
        m.turn()
    m.store.down = False
    m.turn()
    assert not [s for _, s in m.processes.sent if s == signal.SIGKILL]
    back = m.clock.monotonic()
    m.run_until(lambda: any(signal.SIGKILL in m.processes.signals_to(p) for p in pids), 15)
    assert m.clock.monotonic() - back > 10  # a full liveness_timeout after Redis came back


@pytest.mark.parametrize("seconds", [40, 75])
def test_a_daemon_frozen_in_its_wait_kills_no_child_when_it_resumes(
        master: Callable[..., Master], seconds: int, caplog: pytest.LogCaptureFixture) -> None:
    """A SIGSTOP of the whole group lands while the master waits (where it spends its
    time): the turn that resumes judges the children after noticing the stall."""
    m = master()
    m.turn()
    pids = m.boot_all()
    for _ in range(3):
        m.store.beat(*pids)
        m.turn()
    m.wakeup.frozen = seconds
    with caplog.at_level(logging.WARNING, logger="forkq.daemon.master.supervisor"):
        m.turn(3)
    assert not [s for _, s in m.processes.sent if s == signal.SIGKILL]
    assert caplog.text.count("the master was stalled for") == 1, caplog.text
    m.run_until(lambda: any(signal.SIGKILL in m.processes.signals_to(p) for p in pids), 15)


def test_a_stall_does_not_count_toward_a_running_job_s_timeout(
        master: Callable[..., Master]) -> None:
    """A job with 30 s of ``job_timeout`` ran 5 s, then the daemon was frozen 75 s: it is
    not killed when the daemon resumes, and is once it has run 30 s of its own."""
    m = master(config(job_timeout=30.0, liveness_timeout=100.0))
    m.turn()
    pid, _ = m.boot_all()
    job = {"class": "Slow", "jid": "j1", "started": m.clock.time(), "queue": "default",
           "payload": "{}", "run_at": int(m.clock.time())}
    m.store.beat(pid, job=job)
    m.turn()
    for _ in range(5):
        m.store.beat(pid, job=job)
        m.turn()
    m.wakeup.frozen = 75
    m.turn(3)
    assert signal.SIGKILL not in m.processes.signals_to(pid)
    resumed = m.clock.monotonic()
    m.run_until(lambda: signal.SIGKILL in m.processes.signals_to(pid), 40)
    assert 20 < m.clock.monotonic() - resumed <= 27  # the 25 s its job had left, +1 s turns


def test_a_daemon_frozen_between_two_turns_kills_no_child_when_it_resumes(
        master: Callable[..., Master], caplog: pytest.LogCaptureFixture) -> None:
    """Frozen in the turn's last steps (writing the process record): the next turn's
    judgement comes after the stall is noticed too."""
    m = master()
    m.turn()
    pids = m.boot_all()
    m.store.beat(*pids)
    m.turn()

    def freeze() -> None:
        m.store.on_record = lambda: None
        m.clock.advance(40)

    m.store.on_record = freeze
    with caplog.at_level(logging.WARNING, logger="forkq.daemon.master.supervisor"):
        m.run_until(lambda: m.store.on_record is not freeze, 10)
        m.turn(3)
    assert not [s for _, s in m.processes.sent if s == signal.SIGKILL]
    assert caplog.text.count("the master was stalled for") == 1, caplog.text


# -- settling a dead child's job ----------------------------------------------------------------


def test_a_slot_waits_until_its_dead_childs_job_is_settled(master: Callable[..., Master]) -> None:
    m = master()
    m.turn()
    pid, _ = m.boot_all()
    slot = m.children()[pid]
    m.store.down = True
    m.processes.exit(pid, KILLED)
    for _ in range(5):
        m.turn()
    assert slot not in m.children().values(), "respawned before the job was settled"
    m.store.down = False
    m.turn()
    assert m.store.settled[-1] == Gone(_key(m, pid), "crash", "killed by signal SIGKILL")
    assert slot in m.children().values()


# -- reload -------------------------------------------------------------------------------------


def test_reload_applies_master_settings_at_once_and_replaces_children_for_others(
        master: Callable[..., Master]) -> None:
    new: list[Config] = []
    m = master(reload=lambda: new[-1])
    m.turn()
    pids = m.boot_all()
    new.append(config(liveness_timeout=20.0, redis_url="redis://elsewhere:6379/0"))
    m.signal(signal.SIGHUP)
    assert m.sup.config.liveness_timeout == 20.0  # master-only: no child replaced
    assert m.sup.config.redis_url == "redis://127.0.0.1:1/0"  # restart-only: kept
    assert not [s for _, s in m.processes.sent]
    new.append(config(liveness_timeout=20.0, queues=(("critical", 3), ("default", 1))))
    m.signal(signal.SIGHUP)
    assert all(STOP_SIGNAL in m.processes.signals_to(pid) for pid in pids)
    m.turn()
    assert len(m.children()) == 2 and not set(m.children()) & set(pids)  # replacements


def test_a_smaller_concurrency_retires_the_highest_slots(master: Callable[..., Master]) -> None:
    new = [config(concurrency=1)]
    m = master(config(concurrency=3), reload=lambda: new[-1])
    m.turn()
    pids = m.boot_all()
    m.signal(signal.SIGHUP)
    m.turn()
    assert list(m.children().values()) == [0]
    assert [p for p in pids if STOP_SIGNAL in m.processes.signals_to(p)] == pids[1:]


# -- halt on boot failures ----------------------------------------------------------------------


def test_five_boot_failures_in_a_row_halt_the_master_with_79(
        master: Callable[..., Master]) -> None:
    m = master(config(concurrency=1))
    m.turn()
    for _ in range(5):
        [pid] = m.children() or [None]
        assert pid is not None
        m.processes.report(pid, "error ImportError: no module named app")
        m.processes.exit(pid, 3 << 8)
        m.run_until(lambda pid=pid: pid not in m.children() and (
            bool(m.children()) or m.sup.stop_deadline is not None), 60)
    m.run_until(lambda: m.sup.done, 10)
    assert m.sup.pool.halt_reason is not None
    assert "failed to boot 5 times in a row: ImportError" in m.sup.pool.halt_reason
    assert m.sup.exit_code() == 79


def test_a_boot_report_written_after_the_wait_still_names_the_reason(
        master: Callable[..., Master], caplog: pytest.LogCaptureFixture) -> None:
    """The child writes its report and exits between the loop's wait and its reap: the
    master reads the report as it reaps the child."""
    m = master(config(concurrency=1))
    m.turn()
    [pid] = m.children()

    def fail() -> None:
        m.wakeup.after_wait = lambda: None
        m.processes.report(pid, "error RuntimeError: database refused the connection")
        m.processes.exit(pid, 79 << 8)

    m.wakeup.after_wait = fail
    m.run_until(lambda: pid not in m.children(), 5)
    assert (f"processor-0 (pid {pid}) failed to boot (1 of 5): RuntimeError: database "
            "refused the connection") in caplog.text


# -- the stop deadline --------------------------------------------------------------------------


def test_term_waits_for_children_until_timeout_then_kills_and_requeues(
        master: Callable[..., Master]) -> None:
    m = master(config(timeout=5.0))
    m.turn()
    m.processes.obey_stop = False  # busy children: they do not exit when told
    pids = m.boot_all()
    start = m.clock.monotonic()
    m.signal(signal.SIGTERM)
    assert all(STOP_SIGNAL in m.processes.signals_to(p) for p in pids)
    m.run_until(lambda: m.sup.done, 10)
    assert 5.0 <= m.clock.monotonic() - start < 6.0
    assert all(signal.SIGKILL in m.processes.signals_to(p) for p in pids)
    causes = {g.inflight_key: g.cause for g in m.store.settled}
    assert causes == {_key(m, p): "exit" for p in pids}  # pushed back, not a death
    assert m.sup.exit_code() == 0


def test_an_idle_daemon_stops_at_once(master: Callable[..., Master]) -> None:
    m = master()
    m.turn()
    m.boot_all()
    start = m.clock.monotonic()
    m.signal(signal.SIGTERM)
    m.run_until(lambda: m.sup.done, 2)
    assert m.clock.monotonic() - start < 1.0


def _key(m: Master, pid: int) -> str:
    return f"forkq:inflight:{m.sup.identity}:{pid}"


# -- the health verdict (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(("seen_ago", "job_age", "rss", "expected"), [
    (5, None, 50, None),
    (11, None, 50, ("crash", "no heartbeat for 11s (liveness_timeout 10s)")),
    (1, 4, 50, ("timeout", "Slow jid=j ran past its timeout of 3s")),
    (1, 2, 50, None),
    (1, None, 151, ("crash", "RSS above 150 MB (1.5 x max_memory_mb)")),
    (1, None, 149, None),
])
def test_the_verdict_on_a_child(seen_ago: float, job_age: float | None, rss: float,
                                expected: tuple[str, str] | None) -> None:
    now, wall = 500.0, 1_700_000_000.0
    job = None if job_age is None else {"class": "Slow", "jid": "j", "started": wall - job_age}
    child = Child(pid=1, slot=0, started=0.0, report_fd=None, seen=now - seen_ago, job=job)
    kill = verdict(child, now, config(job_timeout=3.0, max_memory_mb=100), wall=wall,
                   rss_mb=rss)
    assert (None if kill is None else (kill.cause, kill.reason)) == expected


def test_the_first_turn_forks_at_once(master: Callable[..., Master]) -> None:
    m = master()
    start = m.clock.monotonic()
    m.turn()
    assert len(m.children()) == 2 and m.clock.monotonic() == start  # no wait before forking


def test_the_process_record_is_written_before_the_first_fork(
        master: Callable[..., Master]) -> None:
    """Its ``info.proof`` is how the next daemon on the host proves this one gone: a child may
    take a job, and the whole daemon be SIGKILLed, before the first turn's beat (a loaded
    host: the next daemon found no proof and left the job to the sweep, a minute later)."""
    m = master()
    written_at_fork: list[int] = []
    fork = m.processes.fork

    def recording_fork(body: Callable[[], int]) -> int:
        written_at_fork.append(m.store.records)
        return fork(body)

    m.processes.fork = recording_fork  # type: ignore[method-assign]
    m.turn()
    assert len(written_at_fork) == 2 and min(written_at_fork) >= 1, written_at_fork
