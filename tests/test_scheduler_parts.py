"""The scheduler's parts, without a daemon: periodic ticks (pure), config checks, and every
script the leader runs against the session's throwaway Redis — lease, fencing, due-job
mover, orphan recovery, periodic firing."""

from __future__ import annotations

import datetime as dt
import json
import random
import re
import time
from zoneinfo import ZoneInfo

import pytest
import redis

from forkq import config, cron, keys, wirejson
from forkq.cron import Periodic
from forkq.daemon.children import due_jobs, lease, orphans, periodic
from forkq.daemon.children.lease import Lease, LeaseLostError
from forkq.errors import ConfigError
from forkq.registry import REGISTRY

from . import jobs  # noqa: F401 - registers the test jobs

UTC = dt.timezone.utc


def epoch(*fields: int, tz: dt.tzinfo = UTC) -> float:
    return dt.datetime(*fields, tzinfo=tz).timestamp()  # type: ignore[misc]


# -- periodic ticks (pure) ----------------------------------------------------------------------

EVERY_MINUTE = Periodic(name="m", cron="* * * * *", job="Record")
NOON = epoch(2026, 11, 21, 12, 0, 0)


def test_a_new_entry_fires_nothing_and_starts_counting_now() -> None:
    assert cron.due_ticks(EVERY_MINUTE, None, NOON + 30, grace=60) == ([], NOON + 30)


def test_a_tick_fires_once_when_due() -> None:
    assert cron.due_ticks(EVERY_MINUTE, NOON - 30, NOON + 0.2, grace=60) == ([NOON], NOON)
    assert cron.due_ticks(EVERY_MINUTE, NOON, NOON + 0.5, grace=60) == ([], NOON)
    assert cron.due_ticks(EVERY_MINUTE, NOON, NOON + 59.9, grace=60) == ([], NOON)


def test_ticks_within_the_grace_all_fire_in_order() -> None:
    ticks, mark = cron.due_ticks(EVERY_MINUTE, NOON - 120, NOON + 50, grace=200)
    assert ticks == [NOON - 60, NOON]
    assert mark == NOON


@pytest.mark.parametrize(("missed", "fired"), [("latest", [NOON + 3600]), ("skip", [])])
def test_ticks_missed_beyond_the_grace_follow_the_policy(missed: str, fired: list[float]) -> None:
    entry = Periodic(name="m", cron="* * * * *", job="Record", missed=missed)
    ticks, mark = cron.due_ticks(entry, NOON, NOON + 3600 + 30, grace=20)
    assert ticks == fired
    assert mark == NOON + 3600  # every tick up to the latest is handled


def test_a_tick_due_right_now_is_never_dropped_nor_taken_early() -> None:
    for missed in ("latest", "skip"):
        entry = Periodic(name="m", cron="* * * * *", job="Record", missed=missed)
        assert cron.due_ticks(entry, NOON - 60, NOON + 0.003, grace=1) == ([NOON], NOON)
        assert cron.due_ticks(entry, NOON - 60, NOON + 10, grace=10) == ([NOON], NOON)
        assert cron.due_ticks(entry, NOON - 60, NOON - 0.0005, grace=30) == (
            [], NOON - 60)  # half a millisecond early: not yet
        assert cron.latest_tick(entry, NOON - 0.0005) == NOON - 60
        assert cron.latest_tick(entry, NOON) == NOON


def test_a_daily_tick_in_the_hour_dst_repeats_runs_once() -> None:
    berlin = Periodic(name="b", cron="30 2 * * *", job="Record", timezone="Europe/Berlin")
    first = epoch(2024, 10, 27, 0, 30, 0)  # 02:30 CEST; 02:30 CET would follow an hour later
    assert cron.next_tick(berlin, first - 60) == first
    assert cron.next_tick(berlin, first) == epoch(2024, 10, 28, 1, 30, 0)  # 02:30 CET
    assert cron.latest_tick(berlin, first + 3600 + 60) == first
    assert cron.due_ticks(berlin, first, first + 3600 + 60, grace=60) == ([], first)


def test_a_cron_that_never_matches_is_rejected() -> None:
    for expression in ("0 0 30 2 *", "0 0 31 4 *"):
        with pytest.raises(ValueError, match="never matches"):
            cron.check_schedule(expression, "UTC")
    with pytest.raises(ValueError, match="5 fields"):
        cron.check_schedule("* * * * * * 2030", "UTC")


def test_the_timezone_decides_when_a_daily_tick_is() -> None:
    berlin = Periodic(name="b", cron="0 3 * * *", job="Record", timezone="Europe/Berlin")
    after = epoch(2026, 11, 21, 0, 0, 0)
    assert cron.next_tick(berlin, after) == epoch(2026, 11, 21, 3, 0, 0,
                                                      tz=ZoneInfo("Europe/Berlin"))
    assert cron.next_tick(berlin, after) == epoch(2026, 11, 21, 2, 0, 0)


# -- configuration ------------------------------------------------------------------------------


def load(tmp_path: object, text: str) -> config.Config:
    path = f"{tmp_path}/c.yml"
    with open(path, "w") as f:
        f.write(text)
    return config.load_file(path, {})


def test_periodic_entries_are_read_with_defaults(tmp_path: object) -> None:
    conf = load(tmp_path, "periodic:\n  - cron: '*/5 * * * *'\n    class: Record\n"
                          "  - name: n\n    cron: '0 3 * * *'\n    class: Record\n"
                          "    args: [1, x]\n    queue: q\n    timezone: Europe/Berlin\n"
                          "    missed: skip\n")
    assert conf.periodic == (
        Periodic(name="Record */5 * * * *", cron="*/5 * * * *", job="Record"),
        Periodic(name="n", cron="0 3 * * *", job="Record", args=(1, "x"), queue="q",
                 timezone="Europe/Berlin", missed="skip"),
    )
    assert conf.scheduler is True and conf.leader_lease_ttl == 10.0


@pytest.mark.parametrize(("entry", "problem"), [
    ("- cron: '61 * * * *'\n    class: Record", "entry 1: cron: expected a cron expression"),
    ("- cron: '* * * * *'", "entry 1: class: expected the name of a registered job"),
    ("- cron: '* * * * *'\n    class: Record\n    timezone: Mars/Olympus",
     "entry 1: timezone: unknown time zone 'Mars/Olympus'"),
    ("- cron: '* * * * *'\n    class: Record\n    missed: twice",
     "entry 1: missed: expected latest or skip, got 'twice'"),
    ("- cron: '* * * * *'\n    class: Record\n    args: [2026-01-01]", "entry 1: args: not JSON"),
    ("- cron: '* * * * *'\n    class: Record\n    every: 5", "entry 1: unknown key 'every'"),
    ("- cron: '* * * * *'\n    class: Record\n  - cron: '* * * * *'\n    class: Record",
     "two periodic jobs are named 'Record * * * * *'"),
    ("- every minute", "entry 1: expected a mapping with cron and class"),
])
def test_bad_periodic_entries_are_named_with_their_position(
        tmp_path: object, entry: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"concurrency: 1\nperiodic:\n  {entry}\n")
    assert re.search(r"c\.yml:[35]:\d+: periodic: ", str(caught.value)), caught.value
    assert problem in str(caught.value), caught.value


def test_the_renew_interval_must_be_under_half_the_lease(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match=r"c.yml:2:\d+: leader_renew_interval: "
                       r"leader_renew_interval \(3s\) must be at most half of "
                       r"leader_lease_ttl \(5s\)"):
        load(tmp_path, "leader_lease_ttl: 5\nleader_renew_interval: 3\n")
    with pytest.raises(ConfigError, match="must be at least 2"):
        load(tmp_path, "leader_lease_ttl: 1\n")
    with pytest.raises(ConfigError, match=r"c.yml:1:\d+: periodic_grace: periodic_grace \(5s\) "
                       r"must be at least leader_lease_ttl \(10s\)"):
        load(tmp_path, "periodic_grace: 5\n")


def test_a_periodic_job_must_be_registered(tmp_path: object) -> None:
    conf = load(tmp_path, "periodic:\n  - cron: '* * * * *'\n    class: Nope\n")
    with pytest.raises(ConfigError, match=r"periodic: entry 1 \(Nope \* \* \* \* \*\): "
                       "no registered job 'Nope'"):
        cron.check_jobs(conf, REGISTRY)


# -- the lease ----------------------------------------------------------------------------------


def test_one_lease_one_holder_renew_and_release_only_by_the_owner(r: redis.Redis) -> None:
    a = Lease(r, identity="host:1:aaaaaaaaaaaa", pid=11, ttl=5)
    b = Lease(r, identity="host:2:bbbbbbbbbbbb", pid=22, ttl=5)
    assert a.acquire() and not b.acquire()
    assert a.token is not None and a.holds(time.monotonic())
    assert lease.holder(r) == a.token and lease.leads(a.token, "host:1:aaaaaaaaaaaa")
    assert r.get("dear-leader") == b"host:1:aaaaaaaaaaaa"
    assert 4000 < int(r.pttl(keys.LEADER)) <= 5000
    b.token = a.token + "x"  # a forged token renews and releases nothing
    assert not b.renew() and b.token is None
    assert a.renew()
    a.release()
    assert r.get(keys.LEADER) is None and r.get("dear-leader") is None
    assert b.acquire() and b.token != a.token


def test_the_mirror_leaves_a_sidekiq_enterprise_leader_alone(r: redis.Redis) -> None:
    r.set("dear-leader", "ruby-host:9:cccccccccccc")
    a = Lease(r, identity="host:1:aaaaaaaaaaaa", pid=11, ttl=5)
    assert a.acquire()
    a.release()
    assert r.get("dear-leader") == b"ruby-host:9:cccccccccccc"


def test_every_new_term_has_a_new_token(r: redis.Redis) -> None:
    a = Lease(r, identity="host:1:aaaaaaaaaaaa", pid=11, ttl=5)
    assert a.acquire()
    first = a.token
    a.release()
    assert a.acquire() and a.token != first


# -- fencing: an ex-leader whose lease expired changes nothing ---------------------------------


def expired_leader(r: redis.Redis) -> tuple[Lease, Lease]:
    """``old`` took the lease, it expired (as while SIGSTOPped), ``new`` took over."""
    old = Lease(r, identity="host:1:aaaaaaaaaaaa", pid=11, ttl=5)
    new = Lease(r, identity="host:2:bbbbbbbbbbbb", pid=22, ttl=5)
    assert old.acquire()
    r.delete(keys.LEADER)  # as if its TTL ran out
    assert new.acquire()
    return old, new


def test_a_paused_ex_leader_moves_no_due_job(r: redis.Redis) -> None:
    old, new = expired_leader(r)
    r.zadd(keys.SCHEDULE, {scheduled_job("x"): time.time() - 1})
    assert old.token is not None and new.token is not None
    with pytest.raises(LeaseLostError):
        due_jobs.move_due(r, old.token, time.time())
    assert r.zcard(keys.SCHEDULE) == 1 and r.llen("queue:default") == 0
    assert due_jobs.move_due(r, new.token, time.time()) == 1


def test_a_paused_ex_leader_recovers_and_fires_nothing(r: redis.Redis) -> None:
    old, _ = expired_leader(r)
    assert old.token is not None
    dead_owner_holding(r, "gone:1:dddddddddddd", 5, b'{"class":"Record","args":[],"jid":"j1"}')
    with pytest.raises(LeaseLostError):
        orphans.sweep(r, old.token, now=time.time())
    assert r.llen(keys.inflight("gone:1:dddddddddddd", 5)) == 2
    with pytest.raises(LeaseLostError):
        periodic.fire(r, old.token, name="m", tick=NOON, payload=None)
    assert r.hget(keys.PERIODIC, "m") is None


# -- the due-job mover --------------------------------------------------------------------------


def scheduled_job(arg: str, queue: str = "default", **extra: object) -> str:
    return wirejson.dumps({"retry": True, "queue": queue, "args": [arg], "class": "Record",
                           "jid": "a" * 24, "created_at": 1795238956.99622, **extra})


def test_due_jobs_move_with_a_fresh_enqueued_at_and_everything_else_kept(r: redis.Redis) -> None:
    now = time.time()
    early = scheduled_job("early", "critical", tags=["a"], custom={"k": 1})
    retry = scheduled_job("retry", "low", error_message="boom", retry_count=0)
    later = scheduled_job("later")
    r.zadd(keys.SCHEDULE, {early: now - 10, later: now + 60})
    r.zadd(keys.RETRY, {retry: now - 1})
    assert due_jobs.move_due(r, grab(r), now) == 2
    moved = json.loads(r.lindex("queue:critical", 0))
    assert list(moved) == [*json.loads(early), "enqueued_at"]
    assert moved["enqueued_at"] == now and moved["tags"] == ["a"] and moved["custom"] == {"k": 1}
    assert r.lindex("queue:critical", 0).decode() == early[:-1] + f',"enqueued_at":{now!r}}}'
    assert json.loads(r.lindex("queue:low", 0))["error_message"] == "boom"
    assert r.smembers(keys.QUEUES) == {b"critical", b"low"}
    assert r.zrange(keys.SCHEDULE, 0, -1) == [later.encode()]
    assert r.zcard(keys.RETRY) == 0
    assert due_jobs.next_due(r) == pytest.approx(now + 60)


def test_an_existing_enqueued_at_is_replaced_in_place(r: redis.Redis) -> None:
    now = time.time()
    job = scheduled_job("x", enqueued_at=1.5, z=2)
    r.zadd(keys.RETRY, {job: now - 1})
    due_jobs.move_due(r, grab(r), now)
    assert list(json.loads(r.lindex("queue:default", 0))) == list(json.loads(job))
    assert json.loads(r.lindex("queue:default", 0))["enqueued_at"] == now


def test_a_malformed_due_entry_goes_unchanged_to_the_default_queue(r: redis.Redis) -> None:
    r.zadd(keys.SCHEDULE, {b"not json \xff": 1.0, b'{"queue": 5}': 2.0})
    assert due_jobs.move_due(r, grab(r), time.time()) == 2
    assert set(r.lrange("queue:default", 0, -1)) == {b'{"queue": 5}', b"not json \xff"}


def test_thousands_of_due_jobs_move_in_batches_each_once(r: redis.Redis) -> None:
    now = time.time()
    r.zadd(keys.SCHEDULE, {scheduled_job(str(i)): now - i / 1000 for i in range(2500)})
    assert due_jobs.move_due(r, grab(r), now) == 2500
    assert r.llen("queue:default") == 2500 and r.zcard(keys.SCHEDULE) == 0


def grab(r: redis.Redis) -> str:
    holder = Lease(r, identity="host:1:aaaaaaaaaaaa", pid=11, ttl=30)
    assert holder.acquire() and holder.token is not None
    return holder.token


# -- orphan recovery ----------------------------------------------------------------------------


def dead_owner_holding(r: redis.Redis, identity: str, pid: int, job: bytes,
                       queue: str = "queue:default") -> str:
    key = keys.inflight(identity, pid)
    r.rpush(key, queue, job)
    r.sadd(keys.INFLIGHT_REGISTRY, key)
    r.sadd(keys.PROCESSES, identity)
    return key


def test_a_dead_process_s_job_goes_to_the_front_of_its_queue(r: redis.Redis) -> None:
    job = b'{"class":"Record","args":[1],"jid":"bbbbbbbbbbbbbbbbbbbbbbbb","queue":"default"}'
    key = dead_owner_holding(r, "gone:1:dddddddddddd", 5, job)
    r.sadd(keys.INFLIGHT_REGISTRY, keys.inflight("gone:1:dddddddddddd", 6))  # an idle one
    r.hset("gone:1:dddddddddddd:workers", "5", "{}")
    r.lpush("queue:default", b"other")
    found = orphans.sweep(r, grab(r), now=time.time())
    assert sorted((f.outcome, f.job) for f in found) == [("empty", b""), ("requeued", job)]
    assert r.lrange("queue:default", 0, -1) == [b"other", job]  # the right end: next fetched
    assert not r.exists(key) and r.scard(keys.INFLIGHT_REGISTRY) == 0
    assert r.get(keys.kills("bbbbbbbbbbbbbbbbbbbbbbbb")) == b"1"
    assert r.scard(keys.PROCESSES) == 0 and not r.exists("gone:1:dddddddddddd:workers")


@pytest.mark.parametrize("alive", ["process hash", "child beats"])
def test_a_live_owner_is_never_recovered(r: redis.Redis, alive: str) -> None:
    identity = "live:1:eeeeeeeeeeee"
    key = dead_owner_holding(r, identity, 5, b'{"class":"Record","args":[],"jid":"c"}')
    r.hset(identity if alive == "process hash" else keys.beats(identity), "x", "1")
    assert orphans.sweep(r, grab(r), now=time.time()) == []
    assert r.llen(key) == 2 and r.sismember(keys.INFLIGHT_REGISTRY, key)
    assert r.sismember(keys.PROCESSES, identity)


def test_the_third_recovery_of_a_job_sends_it_to_the_dead_set(r: redis.Redis) -> None:
    jid = "f" * 24
    job = wirejson.dumps({"retry": True, "queue": "default", "args": [], "class": "Record",
                          "jid": jid}).encode()
    r.set(keys.kills(jid), 2)
    dead_owner_holding(r, "gone:1:dddddddddddd", 5, job)
    [found] = orphans.sweep(r, grab(r), now=time.time())
    assert found.outcome == "dead" and r.llen("queue:default") == 0
    [entry] = r.zrange(keys.DEAD, 0, -1)
    buried = json.loads(entry)
    assert buried["error_class"] == "forkq.JobKilledError"
    assert buried["error_message"].startswith("its processor died 3 times while running it")


# -- periodic firing ----------------------------------------------------------------------------


def test_a_tick_is_enqueued_once_whoever_fires_it(r: redis.Redis) -> None:
    entry = Periodic(name="m", cron="* * * * *", job="Record", args=(1,), queue="ticks")
    token = grab(r)
    payload = cron.payload_for(entry, REGISTRY, NOON, time.time())
    assert payload["periodic"] == "m" and payload["periodic_at"] == NOON
    assert periodic.fire(r, token, name="m", tick=NOON, payload=payload)
    assert not periodic.fire(r, token, name="m", tick=NOON, payload=payload)
    assert not periodic.fire(r, token, name="m", tick=NOON - 60, payload=payload)
    assert r.llen("queue:ticks") == 1 and r.sismember(keys.QUEUES, "ticks")
    assert periodic.last_handled(r) == {"m": NOON}


def test_a_member_rescheduled_after_it_was_read_is_not_moved(r: redis.Redis) -> None:
    from forkq.scripts import source

    job = scheduled_job("x")
    now = time.time()
    r.zadd(keys.SCHEDULE, {job: now + 3600})  # read as due, then rescheduled (ZINCRBY)
    move = r.register_script(source("move"))
    assert move(keys=[keys.LEADER, keys.SCHEDULE, keys.QUEUES],
                args=[grab(r), repr(now), job, job, "default"]) == [0]
    assert r.zscore(keys.SCHEDULE, job) == now + 3600 and r.llen("queue:default") == 0


def test_a_fetch_puts_its_in_flight_list_back_in_the_registry(r: redis.Redis) -> None:
    from forkq.daemon.children.fetch import Fetcher

    key = keys.inflight("cut:1:ffffffffffff", 7)
    r.lpush("queue:default", b"job")
    fetcher = Fetcher(r, key, queues=[("default", 1)], strict=True, rng=random.Random())
    assert fetcher.ack_and_fetch(ack=None).jobs
    assert r.sismember(keys.INFLIGHT_REGISTRY, key)
