"""The master's side of its liveness key (forkq/daemon/liveness.py), decided with the Redis
steps and the clock passed in: renew, carry on after a lapse nobody used, and after one in
which the leader took jobs, retire the processors of that moment and set the key again only
once every one of them is gone. The real key, scripts and daemons: tests/test_failover.py."""

from __future__ import annotations

import logging

import pytest
import redis

from forkq.config import Config
from forkq.daemon import liveness
from forkq.daemon.liveness import Liveness


class Keeper:
    """The liveness key, in memory."""

    def __init__(self) -> None:
        self.alive = False
        self.recovered = 0  # lists the leader took while the key was absent
        self.claims: list[bool] = []  # each claim_alive's restore flag

    def keep_alive(self, ttl_ms: int) -> bool:
        return self.alive

    def claim_alive(self, ttl_ms: int, *, restore: bool = False) -> int:
        self.claims.append(restore)
        if self.recovered and not restore:
            return self.recovered
        self.alive, self.recovered = True, 0
        return 0


def test_the_numbers_follow_host_failover() -> None:
    config = Config(host_failover=15)
    assert liveness.ttl(config) == 10
    assert liveness.renewal(config) == pytest.approx(10 / 3)
    assert liveness.sweep_interval(config) == 3
    assert liveness.lease_ttl(config) == 10
    assert liveness.renew_interval(config) == 2
    short = Config(host_failover=6, orphan_sweep_interval=0.5)
    assert (liveness.sweep_interval(short), liveness.lease_ttl(short),
            liveness.renew_interval(short)) == (0.5, 4, 2)


def test_a_lapse_nobody_used_is_claimed_back_at_once(caplog: pytest.LogCaptureFixture) -> None:
    keeper, retired = Keeper(), []
    keep = Liveness(Config(host_failover=15))
    keep.start(keeper)
    keep.turn(keeper, 0.0, {1, 2}, lambda: retired.append(1) or 2)
    assert keeper.claims == [True] and not retired
    keeper.alive = False  # lapsed meanwhile (a freeze): nothing was taken
    with caplog.at_level(logging.WARNING):
        keep.turn(keeper, 1.0, {1, 2}, lambda: retired.append(1) or 2)  # not due yet
        assert keeper.claims == [True]
        keep.turn(keeper, 4.0, {1, 2}, lambda: retired.append(1) or 2)
    assert keeper.alive and keeper.claims == [True, False] and not retired
    assert "recovered none of its jobs: carrying on" in caplog.text
    assert keep.waiting_for is None


def test_after_jobs_were_taken_the_key_waits_for_the_processors_of_the_lapse(
        caplog: pytest.LogCaptureFixture) -> None:
    keeper, retired = Keeper(), []
    keep = Liveness(Config(host_failover=15))
    keep.start(keeper)
    keeper.alive, keeper.recovered = False, 2
    with caplog.at_level(logging.INFO):
        keep.turn(keeper, 4.0, {1, 2}, lambda: retired.append(1) or 2)
        assert retired == [1] and not keeper.alive and keep.waiting_for == {1, 2}
        assert "recovered the jobs of 2 lists" in caplog.text
        assert "Retiring 2 processors" in caplog.text
        keep.turn(keeper, 8.0, {2, 3}, lambda: 0)  # 1 gone, 3 is new: 2 still runs
        assert not keeper.alive and keep.waiting_for == {2}
        keep.turn(keeper, 12.0, {3, 4}, lambda: 0)
    assert keeper.alive and keeper.recovered == 0 and keep.waiting_for is None
    assert keeper.claims[-1] is True  # restored: what was taken is forgotten
    assert "liveness restored" in caplog.text


@pytest.mark.redis
def test_the_keys_of_any_type_are_read_as_lapsed_or_taken_and_replaced(r: redis.Redis) -> None:
    """Any client may write anything into ``forkq:alive:<id>`` and ``forkq:recovered:<id>``:
    a renewal works on any type, a claim reads a recovered key of another type as "taken",
    and a restore replaces both."""
    from forkq import keys
    from forkq.daemon.master.effects import RedisStore
    from forkq.registry import Registry

    store = RedisStore(r, "hostile:1:abc", Registry())
    alive, taken = keys.alive(store.identity), keys.recovered(store.identity)
    r.rpush(alive, "x")
    assert store.keep_alive(5000) is True and 0 < r.pttl(alive) <= 5000
    r.delete(alive)
    r.hset(taken, "a", "b")
    assert store.claim_alive(5000) == 1 and not r.exists(alive)
    r.delete(taken)
    r.set(taken, "not a number")
    assert store.claim_alive(5000) == 1
    assert store.claim_alive(5000, restore=True) == 0
    assert r.get(alive) == b"1" and not r.exists(taken)
