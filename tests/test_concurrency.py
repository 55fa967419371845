"""Concurrency limits per key: at most N jobs of a key run at once across every daemon; a
job over its limit waits in its key's line, unpolled, and the step that frees a slot (the
end of a run, a kill, a recovery) brings the next one back, so no key stays blocked."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

import pytest
import redis

from forkq import concurrency
from forkq.client import Client
from forkq.daemon.child_process import QUICK_DEATH
from forkq.metrics import prometheus
from forkq.ops.cancel import cancel
from forkq.registry import job

from . import jobs
from .conftest import holding, records, until
from .test_job_lookup import Forkq

SLOTS = concurrency.slots_key("limited", "a")
LINE = concurrency.blocked_key("limited", "a")


def _started(r: redis.Redis) -> list[dict[str, Any]]:
    return records(r, "test:started")


def test_a_push_writes_the_key_and_the_limit(r: redis.Redis, default_client: Client) -> None:
    jobs.limited.perform_async("acct-7", "m")
    [queued] = [json.loads(raw) for raw in r.lrange("queue:default", 0, -1)]
    assert queued["concurrency_limit"] == 2 and queued["concurrency_key"] == "acct-7"
    Client(r).push({"class": "limited", "args": ["x", "n"], "concurrency_limit": 3})
    assert json.loads(r.lindex("queue:default", 0))["concurrency_key"] == ""


@pytest.mark.parametrize(("options", "error"), [
    ({"concurrency_limit": 0}, "at least 1"), ({"concurrency_limit": 1.5}, "integer"),
    ({"concurrency_limit": True}, "integer"),
])
def test_bad_concurrency_options_are_refused(options: dict[str, Any], error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=error):
        Client(redis.Redis(port=1)).push({"class": "limited", "args": [], **options})
    with pytest.raises((TypeError, ValueError), match=error):
        job(name="limit_probe", **options)(lambda: None)
    with pytest.raises(TypeError, match="concurrency_key must be a function"):
        job(name="limit_probe", concurrency_limit=1, concurrency_key=3)(lambda: None)


def test_at_most_the_limit_run_and_the_rest_wait_unpolled_in_order(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    for n in range(5):
        jobs.limited.perform_async("a", f"g{n}", 0.0, True)
    jobs.limited.perform_async("b", "other", 0.0, False)  # another key is not held up
    d = daemon("concurrency: 4\nrequire: jobs\nlog_level: info\n")
    until(lambda: len(_started(r)) == 3 and r.llen(LINE) == 3, 15,
          lambda: f"{_started(r)} {r.llen(LINE)}; log:\n{d.log()}")
    assert sorted(row["marker"] for row in _started(r)) == ["g0", "g1", "other"]
    assert r.scard(SLOTS) == 2 and r.llen("queue:default") == 0
    assert b'forkq_jobs_blocked{job_class="limited"} 3' in prometheus.exposition(r)
    time.sleep(0.5)
    assert len(_started(r)) == 3, "a blocked job ran with no slot freed"
    for n in range(5):  # each end frees a slot: the next of the line runs
        r.rpush(f"test:gate:g{n}", 1)
        until(lambda n=n: len(records(r)) >= n + 2, 15, d.log)
    until(lambda: len(records(r)) == 6, 15, d.log)
    order = [row["marker"] for row in _started(r) if row["limit_key"] == "a"]
    assert order == ["g0", "g1", "g2", "g3", "g4"] or sorted(order[:2]) == ["g0", "g1"]
    assert max(row["running"] for row in _started(r)) <= 2
    until(lambda: r.scard(SLOTS) == 0 and r.llen(LINE) == 0, 10, d.log)
    assert not r.exists(concurrency.LINES)  # the emptied line is unlisted
    assert b"forkq_jobs_blocked{" not in prometheus.exposition(r)


def test_a_killed_holder_frees_its_slot_to_the_next_in_line(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    for n in range(3):
        jobs.limited.perform_async("a", f"k{n}", 0.0, True)
    d = daemon("concurrency: 3\nrequire: jobs\nlog_level: info\n")
    until(lambda: len(_started(r)) == 2 and r.llen(LINE) == 1, 15, d.log)
    victim = _started(r)[0]
    os.kill(victim["pid"], signal.SIGKILL)
    # its job goes back to the front of its queue (the line's first job right behind it,
    # brought back by the freed slot): it runs again at once, and the third finds the
    # limit reached again and waits in the line; no ghost of the killed run holds a slot
    until(lambda: len(_started(r)) == 3 and r.llen(LINE) == 1, 30, d.log)
    assert _started(r)[2]["marker"] == victim["marker"] and r.scard(SLOTS) == 2
    for n in range(3):
        r.rpush(f"test:gate:k{n}", 1, 1)
    until(lambda: len(records(r)) == 3 and r.scard(SLOTS) == 0 and r.llen(LINE) == 0, 30,
          d.log)


@pytest.mark.slow
def test_limits_hold_on_three_daemons_through_a_kill_storm(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    """2,000 jobs over 20 keys, limit 2, on three daemons of 4 processors, while 30 children
    past the quick-death window are SIGKILLed: no key ever runs more than 2, no job is lost,
    every job ends and no key stays blocked."""
    total, keys = 2000, [f"k{n}" for n in range(20)]
    Client(r).push_bulk({"class": "limited", "concurrency_limit": 2, "args": [
        [keys[n % 20], str(n), random.uniform(0.1, 0.2)] for n in range(total)]})
    for raw in r.lrange("queue:default", 0, 4):  # raw pushes: the key is given per job
        assert json.loads(raw)["concurrency_key"] == ""
    r.delete("queue:default")
    for n in range(total):  # through the job's own key function, as an application pushes
        jobs.limited.perform_async(keys[n % 20], str(n), random.uniform(0.1, 0.2))
    daemons = [daemon("concurrency: 4\nrequire: jobs\nlog_level: warning\n") for _ in range(3)]
    killed: set[int] = set()
    rng = random.Random(7)
    storm_end = time.monotonic()
    while len(killed) < 30 and (r.llen("queue:default") or holding(r)):
        time.sleep(0.2)
        now = time.time()
        ripe = [c.pid for d in daemons for c in d.children()
                if c.pid not in killed and now - c.create_time() > QUICK_DEATH + 0.5]
        if ripe:
            victim = rng.choice(ripe)
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
            storm_end = time.monotonic()
    ran = lambda: {row["marker"] for row in records(r)}  # noqa: E731
    until(lambda: len(ran()) + r.zcard("dead") == total, 180,
          lambda: f"{len(ran())} ran, {r.zcard('dead')} dead; log:\n{daemons[0].log()}")
    took = time.monotonic() - storm_end
    lines = {k: r.llen(concurrency.blocked_key("limited", k)) for k in keys}
    until(lambda: all(r.scard(concurrency.slots_key("limited", k)) == 0 for k in keys), 30,
          "slots still held")
    most = max(row["running"] for row in records(r, "test:started"))
    print(f"{len(killed)} kills: {len(ran())} jobs ran, {r.zcard('dead')} buried; most "
          f"running per key {most}; last job {took:.1f} s after the last kill")
    assert most <= 2 and not any(lines.values()), lines


@pytest.mark.process
def test_a_blocked_job_is_found_by_forkq_job_and_cancelled_from_its_line(
        r: redis.Redis, server: Any, default_client: Client) -> None:
    r.sadd(SLOTS, "x", "y")  # both slots of key "a" taken
    jid = jobs.limited.perform_async("a", "waiting")
    raw = r.rpop("queue:default")
    r.rpush(LINE, b"{}", raw)  # as a fetch leaves it: the second in its line
    cli = Forkq(server)
    out, _ = cli.text("job", str(jid))
    assert "waiting for a concurrency slot of limited (key 'a'), 1 job ahead of it" in out
    assert cli.json("job", str(jid))["places"][0]["place"] == "blocked"
    assert cancel(r, str(jid)).outcome == "unblocked" and r.llen(LINE) == 1


def test_a_whole_daemon_killed_leaves_no_slot_and_no_lock_behind(
        r: redis.Redis, daemon: Any) -> None:
    """A daemon SIGKILLed with its children while a unique, limited job runs: the next
    daemon on the host recovers the job (restart recovery, recover.lua), which keeps its
    unique lock, frees its slot and takes it again; once it succeeds nothing is left."""
    Client(r).push({"class": "limited", "args": ["a", "whole", 0.0, True], "unique_for": 600,
                    "concurrency_limit": 2, "concurrency_key": "a"})
    first = daemon("concurrency: 2\nrequire: jobs\nlog_level: info\n")
    until(lambda: len(_started(r)) == 1, 15, first.log)
    first.sigkill(everything=True)
    second = daemon("concurrency: 2\nrequire: jobs\nlog_level: info\n")
    until(lambda: len(_started(r)) == 2, 30, second.log)  # recovered and run again
    [lock] = r.keys("forkq:unique:*")
    assert r.get(lock) is not None and r.scard(SLOTS) == 1, "one slot: its second run"
    r.rpush("test:gate:whole", 1, 1)
    until(lambda: len(records(r)) == 1 and r.scard(SLOTS) == 0 and not r.keys("forkq:unique:*"),
          15, second.log)


def test_flow_control_fields_of_any_type_run_the_job_unlimited(r: redis.Redis,
                                                               daemon: Any) -> None:
    """Any client may write anything: fields of the wrong type or shape name no lock and no
    slot; each job runs (or is buried as it would be), and the fetch goes on."""
    bodies = [
        {"concurrency_limit": "2", "concurrency_key": "a"},
        {"concurrency_limit": 2, "concurrency_key": None},
        {"concurrency_limit": 1.5, "concurrency_key": "a"},
        {"concurrency_limit": -1, "concurrency_key": "a"},
        {"unique_digest": 5},
        {"unique_digest": "z" * 40},
        {"unique_until": "start", "unique_digest": ["x"]},
        {"expires_at": "soon"},
        {"expires_at": None},
        {"group": 7}, {"group": ""}, {"group": {"a": 1}},
    ]
    for n, extra in enumerate(bodies):
        job = {"class": "Record", "args": [n, '"concurrency_limit": 1 "unique_digest" "group"'],
               "jid": f"{n:024x}", "queue": "default", **extra}
        r.lpush("queue:default", json.dumps(job))
    r.lpush("queue:default", '{"class":"Record","args":[],"concurrency_limit":1,'
                             '"concurrency_key":"a","jid":"' + "f" * 24 + '"')  # not JSON
    d = daemon("concurrency: 2\nrequire: jobs\nlog_level: warning\n")
    until(lambda: len(records(r)) == len(bodies) and r.zcard("dead") == 1, 15, d.log)
    assert not r.keys("forkq:slots:*") and not r.keys("forkq:unique:*")
    assert not r.keys("forkq:group*")
    assert "Traceback" not in d.log(), d.log()
