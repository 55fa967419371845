"""The processor child's decisions, without forking: a unit tier that drives its lanes.

As ``tests/test_master.py`` does for the master, these give a
:class:`~forkq.daemon.children.processor.Processor` stand-in effects
(:class:`~forkq.daemon.children.effects.Effects`): queues that are Python lists, a clock
that moves only when a job runs or the test moves it, jobs that complete or fail as the
test says, and a record of every step taken. Each test runs the real turn, step by step.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

import pytest
import redis

from forkq.config import Config
from forkq.daemon.children import processor as processors
from forkq.daemon.children.failures import Failure
from forkq.daemon.children.fetch import Fetch, Fetched
from forkq.daemon.children.processor import HELD_WAIT_LIMIT, REFUSED_WAIT, Processor
from forkq.middleware import Chain
from forkq.registry import Registry

FAILED = Failure("retry", "{}", 0.0)


@dataclasses.dataclass
class FakeEffects:
    """Effects answered from memory; ``steps`` records what the processor did."""

    queue: deque[bytes] = dataclasses.field(default_factory=deque)
    clock: float = 100.0
    run_time: float = 0.001
    failing: set[bytes] = dataclasses.field(default_factory=set)
    errors: list[redis.RedisError] = dataclasses.field(default_factory=list)  # next fetches
    moved_in: list[bytes] = dataclasses.field(default_factory=list)  # a blocking move brings
    stop_after_idle: bool = False
    told: bool = False
    steps: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)

    def monotonic(self) -> float:
        return self.clock

    def register(self) -> None:
        self.steps.append(("register",))

    def fetch(self, lane: int, *, ack: bytes | None, acked: int, fetch: bool,
              take: int, value: str = "") -> Fetch:
        if self.errors:
            raise self.errors.pop(0)
        jobs = [Fetched("default", self.queue.popleft())
                for _ in range(take if fetch else 0) if self.queue]
        self.steps.append(("fetch", lane, ack, acked if ack else 0, fetch,
                           [job.raw for job in jobs]))
        return Fetch(jobs, [])

    def run(self, lane: int, fetched: Fetched) -> Failure | None:
        self.steps.append(("run", lane, fetched.raw))
        self.clock += self.run_time
        return FAILED if fetched.raw in self.failing else None

    def file(self, lane: int, failure: Failure, job: bytes) -> bool:
        self.steps.append(("file", lane, job))
        return True

    def give_back(self, lane: int, jobs: list[bytes]) -> int:
        self.steps.append(("give_back", lane, jobs))
        self.queue.extendleft(reversed(jobs))
        return len(jobs)

    def admit(self, lane: int, fetched: Fetched) -> bool:
        return True

    def busy(self, lane: int) -> None:
        self.steps.append(("busy", lane))

    def idle(self, lane: int) -> Fetched | None:
        self.steps.append(("idle", lane))
        if self.stop_after_idle:
            self.told = True
        if self.moved_in:
            return Fetched("default", self.moved_in.pop(0))
        return None

    def rest(self, seconds: float) -> None:
        self.steps.append(("rest", seconds))

    def stop_requested(self, timeout: float = 0.0) -> bool:
        return self.told

    def stop_pending(self) -> bool:
        return self.told

    def wake_lanes(self) -> None:
        self.steps.append(("wake_lanes",))

    def close(self) -> None:
        pass

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [step for step in self.steps if step[0] == kind]


def started(effects: FakeEffects, **settings: Any) -> Processor:
    """A processor of one lane (unless ``async_concurrency`` is given) on ``effects``."""
    config = Config(**{"fetch_batch": 1, **settings})
    processor = Processor(config, identity="host:1:abc", slot=0, registry=Registry(),
                          middleware=Chain())
    processor.start(effects)
    return processor


def test_a_job_is_acknowledged_with_the_next_fetch() -> None:
    effects = FakeEffects(queue=deque([b"a", b"b"]))
    processor = started(effects)
    [lane] = processor.lanes
    processor.turn(lane)
    processor.turn(lane)
    processor.turn(lane)
    assert effects.of("fetch") == [
        ("fetch", 0, None, 0, True, [b"a"]),
        ("fetch", 0, b"a", 1, True, [b"b"]),  # a's acknowledgement rides on b's fetch
        ("fetch", 0, b"b", 1, True, []),
    ]
    assert effects.of("run") == [("run", 0, b"a"), ("run", 0, b"b")]
    assert effects.steps[-1] == ("idle", 0)  # nothing found: it waits


def test_a_batch_runs_its_held_jobs_before_fetching_again_and_acknowledges_them_together(
        ) -> None:
    effects = FakeEffects(queue=deque([b"a", b"b", b"c"]))
    processor = started(effects, fetch_batch=3)
    [lane] = processor.lanes
    processor.turn(lane)  # the first fetch takes one: no run time is known yet
    processor.turn(lane)  # short jobs: the next fetch takes the rest of the batch
    processor.turn(lane)  # c was held: no fetch
    processor.turn(lane)
    assert [step[5] for step in effects.of("fetch")] == [[b"a"], [b"b", b"c"], []]
    assert effects.of("fetch")[-1][2:4] == (b"c", 2)  # b and c acknowledged in one


def test_progress_counts_the_completed_jobs_of_a_batch_for_the_master() -> None:
    effects = FakeEffects(queue=deque([b"a", b"b", b"c"]))
    processor = started(effects, fetch_batch=3)
    [lane] = processor.lanes
    processor.turn(lane)
    processor.turn(lane)  # fetched b, c; ran b
    assert lane.progress.read().count == 1 and lane.held


def test_a_failure_is_filed_after_the_jobs_completed_before_it_are_acknowledged() -> None:
    effects = FakeEffects(queue=deque([b"first", b"ok", b"bad", b"next"]), failing={b"bad"})
    processor = started(effects, fetch_batch=3)
    [lane] = processor.lanes
    for _ in range(4):  # first; then ok (bad and next held); bad; then its filing
        processor.turn(lane)
    kinds = [step[0] for step in effects.steps]
    filed = kinds.index("file")
    assert effects.steps[filed] == ("file", 0, b"bad")
    assert effects.steps[filed - 1][:5] == ("fetch", 0, b"ok", 1, False)  # ack first, alone
    assert effects.of("run")[-1] == ("run", 0, b"next")


def test_held_jobs_go_back_when_the_running_job_runs_past_the_limit() -> None:
    effects = FakeEffects(queue=deque([b"a", b"b", b"c", b"d"]))
    processor = started(effects, fetch_batch=4)
    [lane] = processor.lanes
    processor.turn(lane)
    processor.turn(lane)  # b runs, c and d held
    lane.held.extend([Fetched("default", b"x")])  # one more held
    lane.started = effects.clock
    processor._on_beat_turn()
    assert not effects.of("give_back"), "not yet past the limit"
    effects.clock += HELD_WAIT_LIMIT
    processor._on_beat_turn()
    assert effects.of("give_back") == [("give_back", 0, [b"c", b"d", b"x"])]
    assert not lane.held


def test_a_stop_gives_back_held_jobs_fetches_nothing_more_and_settles_the_last_job() -> None:
    effects = FakeEffects(queue=deque([b"a", b"b", b"c"]))
    processor = started(effects, fetch_batch=3)
    [lane] = processor.lanes
    processor.turn(lane)
    processor.turn(lane)  # ran b; c held
    effects.told = True
    processor.lane_loop(lane)
    assert effects.of("give_back") == [("give_back", 0, [b"c"])]
    assert effects.of("fetch")[-1] == ("fetch", 0, b"b", 1, False, [])
    assert not lane.owes and processor.stopping


def test_a_stop_seen_in_the_idle_wait_ends_the_loop() -> None:
    effects = FakeEffects(stop_after_idle=True)
    processor = started(effects)
    processor.lane_loop(processor.lanes[0])
    assert [step[0] for step in effects.steps] == ["fetch", "idle", "wake_lanes"]


def test_a_job_a_blocking_move_brought_runs_without_a_fetch() -> None:
    effects = FakeEffects(moved_in=[b"pushed"])
    processor = started(effects)
    [lane] = processor.lanes
    processor.turn(lane)
    assert [step[0] for step in effects.steps] == ["fetch", "idle", "busy", "run"]
    assert lane.ack == b"pushed"


@pytest.mark.parametrize(("error", "waits"), [
    (redis.ConnectionError("down"), [0.1, 0.1]),
    (redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'"),
     [REFUSED_WAIT, REFUSED_WAIT]),
])
def test_a_redis_error_backs_off_and_keeps_what_the_lane_owes(
        error: redis.RedisError, waits: list[float]) -> None:
    effects = FakeEffects(queue=deque([b"a"]))
    processor = started(effects)
    [lane] = processor.lanes
    processor.turn(lane)
    effects.errors = [error, error]
    processor._guarded(processor.turn, lane)
    processor._guarded(processor.turn, lane)
    assert [step[1] for step in effects.of("rest")] == waits
    assert lane.ack == b"a", "the acknowledgement is kept for the next try"
    processor._guarded(processor.turn, lane)
    assert effects.of("fetch")[-1][2] == b"a"


def test_backoff_doubles_with_the_outage_up_to_two_seconds() -> None:
    down = redis.ConnectionError("down")
    assert [processors.backoff(down, lasted) for lasted in (0, 1, 2, 3, 4, 5, 60)] == [
        0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_max_jobs_stops_the_processor_after_its_job() -> None:
    effects = FakeEffects(queue=deque([b"a", b"b", b"c"]))
    processor = started(effects, max_jobs=2)
    processor.lane_loop(processor.lanes[0])
    assert effects.of("run") == [("run", 0, b"a"), ("run", 0, b"b")]
    assert effects.of("fetch")[-1] == ("fetch", 0, b"b", 1, False, [])


def test_lanes_of_an_async_processor_fetch_one_job_each() -> None:
    effects = FakeEffects(queue=deque([b"a", b"b", b"c"]))
    processor = started(effects, fetch_batch=10, async_concurrency=3)
    assert len(processor.lanes) == 3
    for lane in processor.lanes:
        processor.turn(lane)
    assert effects.of("run") == [("run", 0, b"a"), ("run", 1, b"b"), ("run", 2, b"c")]
    assert all(len(step[5]) == 1 for step in effects.of("fetch"))
