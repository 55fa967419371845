"""Keys of the wrong type and refusing servers: no job lost, the log names the key.

Issue #11, findings 2-5 and 8, on the real Redis (and the real daemon where it is
behaviour): every script that moves a job checks the keys it writes before its first
write and refuses naming the key (Redis keeps a failed script's earlier writes); a bad
queue key is skipped while the others flow; culling pauses only while the children's
beats cannot be read; a daemon starts working at maxmemory; a frozen daemon does not
kill its own healthy children.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import redis

import forkq
from forkq import keys
from forkq.daemon import held_jobs
from forkq.daemon.children import due_jobs, failures, fetch, orphans, periodic, unfiled
from forkq.daemon.children.lease import Lease
from forkq.embedded import EmbeddedServer
from forkq.ops.queues import Queue
from forkq.ops.sorted_sets import RetrySet

from .conftest import NEXT_BEAT, push, records, throwaway_server, until
from .test_hostile_payloads import CONFIG as PAYLOAD_CONFIG
from .test_supervision import started

TOKEN = "tester:1:aaaaaaaaaaaa:1:00000000"
INFLIGHT = "forkq:inflight:gone-host:1:aaaaaaaaaaaa:7"


def _job(jid: str = "a" * 24, queue: str = "default", **fields: Any) -> str:
    return json.dumps({"class": "Record", "args": [], "queue": queue, "jid": jid,
                       "retry": True, "created_at": 1.0, **fields})


def _wrong(r: redis.Redis, key: str, kind: str = "string") -> None:
    """Make ``key`` hold a value of ``kind`` (string or hash)."""
    r.delete(key)
    if kind == "hash":
        r.hset(key, "x", "y")
    else:
        r.set(key, "not what forkq expects")


def _refusal(exc: pytest.ExceptionInfo[redis.ResponseError], key: str, kind: str) -> None:
    assert f"WRONGTYPE forkq: key '{key}' holds a {kind}" in str(exc.value), exc.value


# --- the scripts, one by one: each target of the wrong type in turn ---------------------------


@pytest.mark.parametrize("target", ["retry", "dead"])
def test_a_failure_whose_set_is_wrong_typed_waits_in_unfiled_and_is_filed_once_mended(
        r: redis.Redis, target: str, caplog: pytest.LogCaptureFixture) -> None:
    """The processor is released (it works on); the leader files the failure at the score
    it was due once the set accepts it, and not before."""
    inflight = "forkq:inflight:h:1:bbbbbbbbbbbb:2"
    job = _job().encode()
    r.rpush(inflight, "queue:default", job)
    _wrong(r, target)
    failure = failures.Failure(target, _job(error_class="E"), 1234.5)
    with caplog.at_level(logging.WARNING):
        assert failures.file(r, inflight, failure, held=job)
    assert f"{target!r} holds another type: the failure waits in 'forkq:unfiled'" in caplog.text
    assert not r.exists(inflight) and r.get("stat:failed") == b"1"
    assert r.zrange(keys.UNFILED, 0, -1, withscores=True) == [
        (f"{target}|{failure.payload}".encode(), 1234.5)]
    with caplog.at_level(logging.ERROR):
        assert unfiled.refile(r, now=2000.0) == 0
    assert f"WRONGTYPE forkq: key '{target}' holds a string" in caplog.text
    assert r.zcard(keys.UNFILED) == 1
    r.delete(target)
    assert unfiled.refile(r, now=2000.0) == 1
    assert r.zrange(target, 0, -1, withscores=True) == [(failure.payload.encode(), 1234.5)]
    assert not r.exists(keys.UNFILED)


@pytest.mark.parametrize("target", ["retry", "dead"])
def test_filing_into_a_wrong_typed_set_and_unfiled_keeps_the_job_held(r: redis.Redis,
                                                                      target: str) -> None:
    job = _job().encode()
    r.rpush("forkq:inflight:h:1:bbbbbbbbbbbb:2", "queue:default", job)
    _wrong(r, target)
    _wrong(r, keys.UNFILED, "hash")
    failure = failures.Failure(target, _job(error_class="E"), 1.0)
    with pytest.raises(redis.ResponseError) as refused:
        failures.file(r, "forkq:inflight:h:1:bbbbbbbbbbbb:2", failure, held=job)
    _refusal(refused, target, "string")
    assert r.lrange("forkq:inflight:h:1:bbbbbbbbbbbb:2", 0, -1) == [b"queue:default", job]
    assert r.get(target) == b"not what forkq expects" and not r.exists("stat:failed")
    assert unfiled.refile(r, now=1.0) == 0  # a wrong-typed forkq:unfiled: reported, no move


def test_an_unfiled_entry_of_no_known_set_is_buried_as_it_is(r: redis.Redis) -> None:
    r.zadd(keys.UNFILED, {b"\xff not ours": 5.0, b"retry|{}": 6.0})
    assert unfiled.refile(r, now=10.0) == 2
    assert r.zrange("dead", 0, -1) == [b"\xff not ours"] and r.zrange("retry", 0, -1) == [b"{}"]


def test_filing_goes_on_past_counters_of_the_wrong_type(r: redis.Redis) -> None:
    job = _job().encode()
    r.rpush("forkq:inflight:h:1:bbbbbbbbbbbb:2", "queue:default", job)
    _wrong(r, "stat:failed", "hash")
    assert failures.file(r, "forkq:inflight:h:1:bbbbbbbbbbbb:2",
                      failures.Failure("retry", _job(error_class="E"), 1.0), held=job)
    assert r.zcard("retry") == 1 and not r.exists("forkq:inflight:h:1:bbbbbbbbbbbb:2")


def test_moving_due_jobs_leaves_those_for_a_bad_queue_and_moves_the_rest(
        r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    r.set(keys.LEADER, TOKEN)
    stuck = [_job(f"{n:024x}") for n in range(5)]
    r.zadd("schedule", {job: 1.0 for job in stuck})
    r.zadd("schedule", {_job("f" * 24, queue="other"): 2.0})
    _wrong(r, "queue:default")
    with caplog.at_level(logging.ERROR):
        assert due_jobs.move_due(r, TOKEN, time.time()) == 1
    assert sorted(m.decode() for m in r.zrange("schedule", 0, -1)) == sorted(stuck)
    assert r.llen("queue:other") == 1 and r.get("queue:default") == b"not what forkq expects"
    assert "'queue:default'" in caplog.text and "holds a string" in caplog.text
    r.delete("queue:default")
    assert due_jobs.move_due(r, TOKEN, time.time()) == 5 and r.zcard("schedule") == 0


def test_a_wrong_typed_schedule_set_is_reported_and_retry_still_moves(
        r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    r.set(keys.LEADER, TOKEN)
    _wrong(r, "schedule", "hash")
    r.zadd("retry", {_job(): 1.0})
    with caplog.at_level(logging.ERROR):
        assert due_jobs.next_due(r) == 1.0
        assert due_jobs.move_due(r, TOKEN, time.time()) == 1
    assert "'schedule'" in caplog.text and r.llen("queue:default") == 1


@pytest.mark.parametrize("action", ["retry", "kill"])
def test_an_operator_action_into_a_wrong_typed_key_changes_nothing(r: redis.Redis,
                                                                  action: str) -> None:
    member = _job(error_class="E", retry_count=0)
    r.zadd("retry", {member: 1.0})
    target = "queue:default" if action == "retry" else "dead"
    _wrong(r, target)
    entries = RetrySet(r)
    entry = next(iter(entries.entries(10)))
    with pytest.raises(redis.ResponseError) as refused:
        getattr(entries, action)(entry)
    _refusal(refused, target, "string")
    assert r.zrange("retry", 0, -1) == [member.encode()]


@pytest.mark.parametrize(("name", "shown"), [("b", "b"),
                                             ("a\x00b\x1b\ncafé", "a\\x00b\\x1b\\ncafé")])
def test_clearing_a_queue_whose_key_holds_another_type_changes_nothing(
        r: redis.Redis, name: str, shown: str) -> None:
    """It holds no jobs, and whatever it is stays for whoever wrote it (it was deleted while
    the clear reported Redis's refusal). The refusal names the key whatever its bytes (a NUL
    ended Redis's error message there)."""
    r.sadd("queues", name)
    _wrong(r, f"queue:{name}")
    with pytest.raises(redis.ResponseError) as refused:
        Queue(r, name).clear()
    _refusal(refused, f"queue:{shown}", "string")
    assert str(refused.value).endswith(f"; queue '{shown}' not cleared")
    assert r.get(f"queue:{name}") == b"not what forkq expects" and r.sismember("queues", name)


@pytest.mark.parametrize("target", ["queue:default", "dead"])
def test_recovering_an_orphan_into_a_wrong_typed_key_leaves_the_list(
        r: redis.Redis, target: str, caplog: pytest.LogCaptureFixture) -> None:
    r.set(keys.LEADER, TOKEN)
    job = _job().encode()
    r.rpush(INFLIGHT, "queue:default", job)
    r.sadd(keys.INFLIGHT_REGISTRY, INFLIGHT)
    if target == "dead":
        r.set("forkq:kills:" + "a" * 24, 2)  # the third death buries it
    _wrong(r, target, "hash")
    with caplog.at_level(logging.ERROR):
        assert orphans.sweep(r, TOKEN, now=time.time()) == []
    assert f"WRONGTYPE forkq: key '{target}' holds a hash" in caplog.text
    assert r.lrange(INFLIGHT, 0, -1) == [b"queue:default", job]
    assert r.sismember(keys.INFLIGHT_REGISTRY, INFLIGHT)
    r.delete(target)
    assert [x.outcome for x in orphans.sweep(r, TOKEN, now=time.time())] == [
        "requeued" if target != "dead" else "dead"]


@pytest.mark.parametrize("count", [True, False])
def test_a_requeue_goes_through_past_a_wrong_typed_dead_set(r: redis.Redis, count: bool) -> None:
    """A step refuses only for a key it is about to write: a requeue (a death below the
    limit, or none counted) writes nothing to ``dead``. A death that reaches the limit
    still refuses, leaving the list as it was."""
    jid = "a" * 24
    _wrong(r, keys.DEAD)
    r.rpush(INFLIGHT, "queue:default", _job(jid), "queue:other", _job("b" * 24))
    back = held_jobs.give_back(r, INFLIGHT, held_jobs.read(r, INFLIGHT), count=count,
                               how="killed by signal SIGKILL", now=time.time())
    assert (back.outcome, back.deaths) == ("requeued", 1 if count else 0)
    assert r.lrange("queue:default", 0, -1) == [_job(jid).encode()]
    assert r.lrange("queue:other", 0, -1) == [_job("b" * 24).encode()]
    assert not r.exists(INFLIGHT)
    r.set(keys.kills(jid), 2)
    r.rpush(INFLIGHT, "queue:default", _job(jid))
    with pytest.raises(redis.ResponseError) as refused:
        held_jobs.give_back(r, INFLIGHT, held_jobs.read(r, INFLIGHT), count=True,
                            how="killed by signal SIGKILL", now=time.time())
    _refusal(refused, keys.DEAD, "string")
    assert r.lrange(INFLIGHT, 0, -1) == [b"queue:default", _job(jid).encode()]
    assert r.get(keys.kills(jid)) == b"2", "a refused step counts no death"


@pytest.mark.parametrize(("held", "deaths"), [
    ("hash", 1), (b"not a count", 1), (b"nan", 1), (b"-4", 1), (b"1e400", 1), (b"1", 2),
])
def test_a_death_count_holding_anything_else_restarts(r: redis.Redis, held: str | bytes,
                                                      deaths: int) -> None:
    """forkq's own kill counter: whatever it holds, counting goes on (settle and sweep)."""
    jid = "a" * 24
    if held == "hash":
        _wrong(r, keys.kills(jid), "hash")
    else:
        r.set(keys.kills(jid), held)
    r.rpush(INFLIGHT, "queue:default", _job(jid))
    back = held_jobs.give_back(r, INFLIGHT, held_jobs.read(r, INFLIGHT), count=True,
                               how="killed by signal SIGKILL", now=time.time())
    assert (back.outcome, back.deaths) == ("requeued", deaths)
    assert 0 < r.ttl(keys.kills(jid)) <= keys.KILLS_TTL
    r.delete("queue:default")
    r.set(keys.LEADER, TOKEN)
    r.rpush(INFLIGHT, "queue:default", _job())
    r.sadd(keys.INFLIGHT_REGISTRY, INFLIGHT)
    _wrong(r, keys.kills(jid), "hash")
    assert [x.outcome for x in orphans.sweep(r, TOKEN, now=time.time())] == ["requeued"]
    assert r.get(keys.kills(jid)) == b"1" and r.llen("queue:default") == 1


def test_recovery_goes_on_past_a_wrong_typed_process_set(r: redis.Redis) -> None:
    r.set(keys.LEADER, TOKEN)
    r.rpush(INFLIGHT, "queue:default", _job())
    r.sadd(keys.INFLIGHT_REGISTRY, INFLIGHT)
    _wrong(r, keys.PROCESSES, "hash")
    assert [x.outcome for x in orphans.sweep(r, TOKEN, now=time.time())] == ["requeued"]
    assert r.llen("queue:default") == 1


def test_an_in_flight_list_naming_no_queue_gives_its_job_back_to_default(r: redis.Redis) -> None:
    key = "forkq:inflight:h:1:bbbbbbbbbbbb:3"
    r.rpush(key, "stat:processed", _job())
    back = held_jobs.give_back(r, key, held_jobs.read(r, key), count=False, how="", now=1.0)
    assert back.outcome == "requeued"
    assert r.lrange("queue:default", 0, -1) == [_job().encode()]
    assert not r.exists("stat:processed")


def test_requeueing_into_a_wrong_typed_queue_leaves_the_list(r: redis.Redis) -> None:
    key = "forkq:inflight:h:1:bbbbbbbbbbbb:3"
    r.rpush(key, "queue:default", _job())
    _wrong(r, "queue:default", "hash")
    with pytest.raises(redis.ResponseError) as refused:
        held_jobs.give_back(r, key, held_jobs.read(r, key), count=False, how="", now=1.0)
    _refusal(refused, "queue:default", "hash")
    assert r.lrange(key, 0, -1) == [b"queue:default", _job().encode()]


@pytest.mark.parametrize("target", ["queue:default", keys.PERIODIC])
def test_a_periodic_tick_into_a_wrong_typed_key_is_not_marked(r: redis.Redis,
                                                              target: str) -> None:
    r.set(keys.LEADER, TOKEN)
    _wrong(r, target)
    with pytest.raises(redis.ResponseError) as refused:
        periodic.fire(r, TOKEN, name="nightly", tick=60.0, payload=json.loads(_job()))
    _refusal(refused, target, "string")
    assert r.type(keys.PERIODIC) in (b"none", b"string") and r.type("queue:default") in (
        b"none", b"string")
    assert not r.exists(keys.PERIODIC) or target == keys.PERIODIC


def test_a_lease_key_of_another_type_is_taken_over(r: redis.Redis,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    _wrong(r, keys.LEADER, "hash")
    _wrong(r, keys.DEAR_LEADER, "hash")  # not ours to touch
    lease = Lease(r, identity="h:1:cccccccccccc", pid=5, ttl=10)
    with caplog.at_level(logging.WARNING):
        assert lease.acquire()
    assert r.get(keys.LEADER) == lease.token.encode()  # type: ignore[union-attr]
    assert "'forkq:leader'" in caplog.text and r.type(keys.DEAR_LEADER) == b"hash"
    assert lease.renew()


def test_a_fetch_skips_a_wrong_typed_queue_and_takes_the_next(r: redis.Redis) -> None:
    _wrong(r, "queue:default")
    r.lpush("queue:other", b"job")
    fetcher = fetch.Fetcher(r, "forkq:inflight:h:1:dddddddddddd:4",
                            queues=[("default", 1), ("other", 1)], strict=True, rng=None)  # type: ignore[arg-type]
    found = fetcher.ack_and_fetch(ack=None)
    assert found == fetch.Fetch([fetch.Fetched("other", b"job")], [("queue:default", "string")])
    assert fetcher.ack_and_fetch(ack=b"job") == fetch.Fetch([], [("queue:default", "string")])


def test_a_fetch_into_a_wrong_typed_in_flight_list_moves_nothing(r: redis.Redis) -> None:
    r.lpush("queue:default", b"job")
    _wrong(r, "forkq:inflight:h:1:dddddddddddd:4", "hash")
    fetcher = fetch.Fetcher(r, "forkq:inflight:h:1:dddddddddddd:4",
                            queues=[("default", 1)], strict=True, rng=None)  # type: ignore[arg-type]
    with pytest.raises(redis.ResponseError) as refused:
        fetcher.ack_and_fetch(ack=None)
    _refusal(refused, "forkq:inflight:h:1:dddddddddddd:4", "hash")
    assert r.lrange("queue:default", 0, -1) == [b"job"]


def test_a_fetch_goes_on_past_a_wrong_typed_registry_and_says_so(r: redis.Redis) -> None:
    """The registry is bookkeeping for recovery: a fetch takes its job (or arms its list)
    unregistered, and names the registry's type for the log."""
    _wrong(r, keys.INFLIGHT_REGISTRY)
    r.lpush("queue:default", b"job")
    key = "forkq:inflight:h:1:dddddddddddd:4"
    fetcher = fetch.Fetcher(r, key, queues=[("default", 1)], strict=True, rng=None)  # type: ignore[arg-type]
    found = fetcher.ack_and_fetch(ack=None)
    assert found == fetch.Fetch([fetch.Fetched("default", b"job")], [], unregistered="string")
    armed = fetcher.ack_and_fetch(ack=b"job", arm=True)
    assert armed.unregistered == "string" and armed.armed
    assert r.lrange(key, 0, -1) == [b"queue:default"]
    assert r.type(keys.INFLIGHT_REGISTRY) == b"string"


def test_a_wrong_typed_registry_is_rebuilt_from_the_in_flight_lists(r: redis.Redis) -> None:
    _wrong(r, keys.INFLIGHT_REGISTRY, "hash")
    lists = ["forkq:inflight:h:1:aaaaaaaaaaaa:4", "forkq:inflight:h:2:bbbbbbbbbbbb:5-0"]
    for key in lists:
        r.rpush(key, "queue:default", b"job")
    _wrong(r, "forkq:inflight:h:3:cccccccccccc:6")  # no list: not registered
    assert orphans.inflight_by_owner(r) == {"h:1:aaaaaaaaaaaa": [lists[0]],
                                            "h:2:bbbbbbbbbbbb": [lists[1]]}
    assert {m.decode() for m in r.smembers(keys.INFLIGHT_REGISTRY)} == set(lists)


# --- the daemon: each key of the wrong type in turn -------------------------------------------

CONFIG = PAYLOAD_CONFIG + "queues: [default, other]\n"
SWEEPING = CONFIG.replace("orphan_sweep_interval: 1\n", "orphan_sweep_interval: 0.5\n")
"""CONFIG with a sweep every 0.5 s: the unfiled are filed with every tenth sweep (5 s)."""
assert SWEEPING != CONFIG, "test_hostile_payloads.CONFIG no longer sets the sweep to 1 s"

NAMED = {  # what the log says when the key holds the wrong type
    "retry": "key 'retry' holds a string",
    "dead": "key 'dead' holds a string",
    "schedule": "'schedule'",
    "queue:default": "'queue:default' holds a string",
    "processes": "'processes'",
    keys.LEADER: "'forkq:leader' held another type",
}


@pytest.mark.parametrize("key", list(NAMED))
def test_a_wrong_typed_key_loses_no_job_and_the_log_names_it(r: redis.Redis, daemon: Any,
                                                            key: str) -> None:
    _wrong(r, key, "hash" if key == keys.LEADER else "string")
    d = daemon(SWEEPING)
    d.wait_children(2)
    client = forkq.Client(r)
    ran = [push(r, "Record", n, queue="other") for n in range(3)]
    if key != "queue:default":
        ran += [push(r, "Record", n) for n in range(3)]
    if key != "schedule":
        ran += [client.push({"class": "Record", "args": ["later"], "at": time.time() + 1})
                or "" for _ in range(2)]
    retried = [client.push({"class": "Boom", "args": ["b"], "queue": "other", "retry": 2})
               or "" for _ in range(2)]
    buried = [client.push({"class": "Boom", "args": ["b"], "queue": "other", "retry": 0})
              or "" for _ in range(2)]
    until(lambda: NAMED[key] in d.log(), 20, d.log())
    if key != keys.LEADER:
        r.delete(key)  # the operator mends it; forkq replaced its own lease key itself
    until(lambda: {row["jid"] for row in records(r)} >= set(ran), 30, d.log())
    until(lambda: _jids(r, "retry") >= set(retried) and _jids(r, "dead") >= set(buried), 30,
          d.log())
    runs = [row["jid"] for row in records(r)]
    assert sorted(runs) == sorted(ran), "every job ran exactly once"
    assert d.alive()


def _jids(r: redis.Redis, zset: str) -> set[str]:
    return {json.loads(member)["jid"] for member in r.zrange(zset, 0, -1)}



def test_a_wrong_typed_registry_stops_no_fetch_and_the_leader_rebuilds_it(
        r: redis.Redis, daemon: Any) -> None:
    """``forkq:inflight`` is shared by every daemon: a string there must stop no job. The
    leader rebuilds it, and a dead process's list it no longer listed is recovered."""
    _wrong(r, keys.INFLIGHT_REGISTRY)
    orphan = json.dumps({"class": "Record", "args": ["orphan"], "queue": "default",
                         "jid": "0badc0de0badc0de0badc0de", "retry": True})
    r.rpush("forkq:inflight:gone-host:1:aaaaaaaaaaaa:11", "queue:default", orphan)
    d = daemon(CONFIG)
    d.wait_children(2)
    jids = [push(r, "Record", n) for n in range(5)]
    until(lambda: {row["jid"] for row in records(r)} >= {*jids, "0badc0de0badc0de0badc0de"},
          30, d.log())
    until(lambda: "'forkq:inflight' held a string, not a set: rebuilt" in d.log(), 15, d.log())
    until(lambda: r.type(keys.INFLIGHT_REGISTRY) == b"set"
          and r.scard(keys.INFLIGHT_REGISTRY) == 2, 15, d.log())  # the two processors'
    assert sorted(row["jid"] for row in records(r)) == sorted(
        [*jids, "0badc0de0badc0de0badc0de"]), "every job ran exactly once"
    assert "refused" not in d.log() and d.alive()


@pytest.mark.parametrize("target", ["retry", "dead"])
def test_processors_whose_failures_cannot_be_filed_keep_working(
        r: redis.Redis, daemon: Any, target: str) -> None:
    """``concurrency: 3`` and three failures while their set holds a string: every later
    job runs at once (before, each processor held its failure and fetched nothing until
    the set was mended); the failures wait in ``forkq:unfiled`` and reach their set, each
    once, when it is mended."""
    _wrong(r, target)
    d = daemon("concurrency: 3\nrequire: jobs\norphan_sweep_interval: 0.5\n")  # refiled: 5 s
    d.wait_children(3)
    client = forkq.Client(r)
    failed = [client.push({"class": "Boom", "args": ["b"], "retry": 2 if target == "retry"
                           else 0}) or "" for _ in range(3)]
    until(lambda: r.zcard(keys.UNFILED) == 3, 15, d.log())
    good = [push(r, "Record", n) for n in range(12)]
    until(lambda: {row["jid"] for row in records(r)} >= set(good), 15, d.log())
    assert r.get(target) == b"not what forkq expects", "still broken while the jobs ran"
    r.delete(target)
    until(lambda: _jids(r, target) == set(failed) and not r.exists(keys.UNFILED), 15, d.log())
    assert sorted(row["jid"] for row in records(r)) == sorted(good)
    assert d.alive()


def test_a_bad_queue_key_stops_no_other_queue(r: redis.Redis, daemon: Any) -> None:
    _wrong(r, "queue:default")
    d = daemon(CONFIG + "strict: true\n")
    d.wait_children(2)
    jids = [push(r, "Record", n, queue="other") for n in range(5)]
    until(lambda: {row["jid"] for row in records(r)} >= set(jids), 15, d.log())
    until(lambda: "queue key 'queue:default' holds a string, not a list; skipped" in d.log(), 5)
    assert d.log().count("queue key 'queue:default' holds a string") <= 2  # one per child
    assert "Redis unavailable" not in d.log()


# --- culling while one periodic step keeps failing --------------------------------------------


def test_a_stopped_child_is_culled_while_the_process_record_is_refused(r: redis.Redis,
                                                                       daemon: Any) -> None:
    _wrong(r, keys.PROCESSES, "hash")
    d = daemon("concurrency: 2\nrequire: jobs\nliveness_timeout: 10\nscheduler: false\n")
    victim, *_ = d.wait_children(2)
    until(lambda: "cannot write the process record to 'processes'" in d.log(), 15, d.log())
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        until(lambda: not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE, 25,
              f"the stopped child was not culled:\n{d.log()}")
    finally:
        if victim.is_running():
            os.kill(victim.pid, signal.SIGCONT)
    assert "no heartbeat for" in d.log() and "Redis unavailable" not in d.log()
    jids = [push(r, "Record", n) for n in range(3)]
    until(lambda: {row["jid"] for row in records(r)} >= set(jids), 15, d.log())
    assert r.hgetall(f"{d.logged_identity()}")  # the rest of the process record is still written


def test_a_crashed_childs_job_is_settled_past_a_wrong_typed_death_count(
        r: redis.Redis, daemon: Any) -> None:
    """The master counts the death of a SIGKILLed child's job in ``forkq:kills:<jid>``; that
    key holding a hash used to make the settlement fail every turn, the slot never respawned
    and the job stayed held."""
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\n")
    [child] = d.wait_children(1)
    jid = push(r, "Sleep", 30, "crash")
    _wrong(r, keys.kills(jid), "hash")
    until(lambda: len(started(r)) == 1, 15, d.log())
    child.kill()
    until(lambda: len(started(r)) == 2, 15, "the job must go back and run again\n" + d.log())
    assert r.get(keys.kills(jid)) == b"1"
    assert "cannot settle" not in d.log() and d.alive()


# --- a daemon started while Redis is at maxmemory ---------------------------------------------


@pytest.fixture
def full_server() -> Iterator[EmbeddedServer]:
    """A throwaway server of its own, to be filled past its maxmemory."""
    with throwaway_server("fq-oom-") as srv:
        try:
            yield srv
        finally:
            with redis.Redis(unix_socket_path=srv.socket) as client:
                client.config_set("maxmemory", 0)


def test_a_daemon_started_at_maxmemory_works_and_says_why_writes_wait(
        r: redis.Redis, daemon: Any, full_server: EmbeddedServer) -> None:
    full = redis.Redis(unix_socket_path=full_server.socket)
    jids = [forkq.Client(full).push({"class": "Silent", "args": [n]}) for n in range(20)]
    orphaned = "forkq:inflight:gone-host:1:aaaaaaaaaaaa:11"  # a dead daemon's job
    full.rpush(orphaned, "queue:default", json.dumps(
        {"class": "Silent", "args": ["orphan"], "queue": "default", "retry": True,
         "jid": "0badc0de0badc0de0badc0de", "created_at": 1.0}))
    full.sadd("forkq:inflight", orphaned)
    with full.pipeline(transaction=False) as pipe:  # small values: no big query buffer
        for n in range(2000):
            pipe.set(f"filler:{n}", b"x" * 1000)
        pipe.execute()
    used = int(full.info("memory")["used_memory"])
    full.config_set("maxmemory-policy", "noeviction")
    full.config_set("maxmemory", used - 500_000)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        full.sadd("probe", "x")
    d = daemon("concurrency: 2\nrequire: jobs\n", redis_url=full_server.url)
    until(lambda: full.llen("queue:default") == 0, 20, d.log())
    until(lambda: int(full.get("stat:processed") or 0) == len(jids) + 1, 15,
          "the leader must take office and sweep the orphan at maxmemory too\n" + d.log())
    assert not full.exists(orphaned) and full.get("forkq:leader")
    assert all(full.llen(k) <= 1 for k in full.keys("forkq:inflight:*:*")), "no job held"
    assert full.zcard("retry") == full.zcard("dead") == 0
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        full.sadd("probe", "x")  # still full: all of it ran at maxmemory
    assert "maxmemory with the noeviction policy" in d.log()
    assert "Redis unavailable" not in d.log()
    identity = d.logged_identity()
    beats = f"forkq:beats:{identity}"
    seqs = _seqs(full, beats)
    until(lambda: all(_seqs(full, beats).get(pid, 0) > seq for pid, seq in seqs.items()),
          NEXT_BEAT,
          "the children's beats must go on at maxmemory, or the master culls them")
    assert len(seqs) == 3 and d.alive()  # two processors and the scheduler
    assert full.sismember("processes", identity), "the process record must be written too"
    beat = float(full.hget(identity, "beat") or 0)
    until(lambda: float(full.hget(identity, "beat") or 0) > beat, 10,
          "the process record must go on being written at maxmemory")
    assert 0 < full.ttl(identity) <= 60


def _seqs(client: redis.Redis, key: str) -> dict[bytes, int]:
    return {pid: json.loads(beat)["seq"] for pid, beat in client.hgetall(key).items()}


# --- a frozen daemon ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_daemon_frozen_longer_than_liveness_timeout_keeps_its_children(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 2\nrequire: jobs\nliveness_timeout: 10\n", new_session=True)
    children = {child.pid for child in d.wait_children(2)}
    jids = [push(r, "Sleep", 16, f"frozen-{n}") for n in range(2)]
    until(lambda: {row["jid"] for row in records(r, "test:started")} >= set(jids), 15, d.log())
    os.killpg(d.pid, signal.SIGSTOP)
    try:
        frozen_until = time.monotonic() + 13  # longer than liveness_timeout: the scenario
        until(lambda: time.monotonic() >= frozen_until, 20)
        os.kill(d.pid, signal.SIGCONT)  # a thaw reaches processes in any order: the master
        # first here, so its first look at the beats comes before the children's next beat
        until(lambda: "stalled for" in d.log() or "killed:" in d.log(), 10, d.log())
    finally:
        os.killpg(d.pid, signal.SIGCONT)
    until(lambda: {row["jid"] for row in records(r)} >= set(jids), 30, d.log())
    assert "killed:" not in d.log(), d.log()  # neither a processor nor the scheduler
    assert sorted(row["jid"] for row in records(r, "test:started")) == sorted(jids)
    assert not r.keys("forkq:kills:*"), "no death was charged"
    assert {child.pid for child in d.children()} == children
    assert "the master was stalled for" in d.log()


def test_the_process_listing_goes_on_past_wrong_typed_records(
        r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """One damaged process record, busy hash or leader key is logged and skipped; the
    readable processes are listed; a wrong-typed ``processes`` key lists none, raising
    nothing (the dashboard and ``forkq status`` read through here)."""
    from forkq.ops.processes import ProcessSet

    r.sadd(keys.PROCESSES, "ok:1", "damaged:2")
    r.hset("ok:1", mapping={"info": json.dumps({"hostname": "ok", "pid": 1}), "busy": "1"})
    r.set("damaged:2", "not a hash")
    _wrong(r, "ok:1:work")
    r.hset("ok:1:workers", "t1", json.dumps({"queue": "q", "run_at": 5,
                                             "payload": {"class": "C", "jid": "j"}}))
    _wrong(r, keys.DEAR_LEADER, "hash")
    processes = ProcessSet(r)
    with caplog.at_level(logging.WARNING, logger="forkq.ops.processes"):
        live = processes.live()
        work = processes.work(live)
    assert [p.identity for p in live] == ["ok:1"]
    assert [(w.identity, w.thread) for w in work] == [("ok:1", "t1")]
    assert processes.leader() == ""
    assert r.sismember(keys.PROCESSES, "damaged:2")  # damaged, not expired: left in place
    logged = caplog.text
    assert "'damaged:2' is unreadable" in logged and "busy record of 'ok:1'" in logged
    _wrong(r, keys.PROCESSES)
    with caplog.at_level(logging.WARNING, logger="forkq.ops.processes"):
        assert processes.live() == []
    assert f"{keys.PROCESSES} is unreadable" in caplog.text
