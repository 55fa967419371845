"""Unique jobs (``unique_for``): a push of the same job while an earlier one holds its lock
is dropped; the lock goes with the job (success, dead, drop, burial, start), never with a
process, so a SIGKILLed child's job keeps it and nothing leaks."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from typing import Any

import pytest
import redis

from forkq import keys, testing, unique
from forkq.client import Client
from forkq.daemon.child_process import QUICK_DEATH
from forkq.ops.cancel import cancel
from forkq.ops.queues import Queue
from forkq.ops.sorted_sets import ScheduledSet
from forkq.registry import job

from .conftest import holding, records, until
from .test_job_lookup import Forkq

APP = "concurrency: 2\nrequire: jobs\n"


def _locks(r: redis.Redis) -> dict[str, str]:
    """Every unique lock in the server: key → the jid it holds."""
    return {key.decode(): (r.get(key) or b"").decode()
            for key in r.scan_iter(match=keys.UNIQUE_PREFIX + "*")}


def _item(klass: str, *args: Any, **options: Any) -> dict[str, Any]:
    return {"class": klass, "args": list(args), "unique_for": 600, **options}


def _started(r: redis.Redis, marker: str) -> list[dict[str, Any]]:
    return [json.loads(row) for row in r.lrange("test:started", 0, -1)
            if json.loads(row)["marker"] == marker]


def test_a_second_push_of_the_same_job_is_dropped_while_the_first_holds_the_lock(
        r: redis.Redis) -> None:
    client = Client(r)
    first = client.push(_item("Record", 1))
    assert first is not None
    assert client.push(_item("Record", 1)) is None, "the same class, queue and args"
    assert client.push(_item("Record", 2)) is not None, "other args"
    assert client.push(_item("Record", 1, queue="other")) is not None, "another queue"
    assert client.push({"class": "Record", "args": [1]}) is not None, "a push without the lock"
    assert r.llen("queue:default") == 3 and r.llen("queue:other") == 1
    key = unique.lock_key(unique.digest("Record", "default", [1]))
    assert _locks(r)[key] == first
    assert 590 < r.ttl(key) <= 600
    [queued] = [json.loads(raw) for raw in r.lrange("queue:default", 0, -1)
                if json.loads(raw)["jid"] == first]
    assert queued["unique_for"] == 600 and queued["unique_digest"] == key.rsplit(":", 1)[1]


def test_a_scheduled_unique_job_holds_its_lock_through_its_wait(r: redis.Redis) -> None:
    client = Client(r)
    jid = client.push({**_item("Record", "later"), "at": time.time() + 3600})
    assert jid is not None and r.zcard("schedule") == 1
    assert client.push(_item("Record", "later")) is None, "a push now, while one waits"
    key = unique.lock_key(unique.digest("Record", "default", ["later"]))
    assert 3600 + 590 < r.ttl(key) <= 3600 + 600


def test_push_bulk_leaves_out_the_jobs_a_lock_drops(r: redis.Redis) -> None:
    client = Client(r)
    assert client.push(_item("Record", "b")) is not None
    pushed = client.push_bulk({"class": "Record", "args": [["a"], ["b"], ["c"], ["a"]],
                               "unique_for": 60})
    assert len(pushed) == 2 and r.llen("queue:default") == 3  # b held already, a once
    assert set(_locks(r).values()) >= set(pushed)


def test_a_lock_of_the_wrong_type_refuses_the_push_naming_the_key(r: redis.Redis) -> None:
    key = unique.lock_key(unique.digest("Record", "default", [1]))
    r.rpush(key, "junk")
    with pytest.raises(Exception, match="forkq:unique:"):
        Client(r).push(_item("Record", 1))
    assert r.llen("queue:default") == 0


@pytest.mark.parametrize(("options", "error"), [
    ({"unique_for": 0}, "positive"), ({"unique_for": "600"}, "number"),
    ({"unique_for": float("inf")}, "positive"), ({"unique_for": True}, "number"),
    ({"unique_for": 60, "unique_until": "end"}, "'success' or 'start'"),
    ({"unique_until": "start"}, "needs unique_for"),
])
def test_bad_unique_options_are_refused_before_any_io(options: dict[str, Any],
                                                      error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=error):
        Client(redis.Redis(port=1)).push({"class": "Record", "args": [], **options})
    with pytest.raises((TypeError, ValueError), match=error):
        job(name="unique_probe", **options)(lambda: None)


def test_a_job_that_succeeds_releases_its_lock_and_the_same_push_is_taken_again(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon(APP)
    client = Client(r)
    jid = client.push(_item("Record", "once"))
    until(lambda: r.llen("test:ran") == 1, 15, d.log)
    until(lambda: not _locks(r), 5, lambda: f"lock left: {_locks(r)}")
    again = client.push(_item("Record", "once"))
    assert again is not None and again != jid
    until(lambda: r.llen("test:ran") == 2 and not _locks(r), 15, d.log)


@pytest.mark.parametrize("retry", [0, False], ids=["dead", "dropped"])
def test_a_job_that_will_not_run_again_releases_its_lock(r: redis.Redis, daemon: Any,
                                                         retry: Any) -> None:
    d = daemon(APP)
    client = Client(r)
    client.push(_item("Boom", "no", retry=retry))
    until(lambda: r.get("stat:failed") == b"1", 15, d.log)
    until(lambda: not _locks(r), 5, lambda: f"lock left: {_locks(r)}")
    assert r.zcard("dead") == (0 if retry is False else 1)
    assert client.push(_item("Boom", "no", retry=retry)) is not None


def test_a_job_to_retry_keeps_its_lock(r: redis.Redis, daemon: Any) -> None:
    d = daemon(APP)
    client = Client(r)
    jid = client.push(_item("Boom", "again"))  # Boom retries twice, the first after ~15 s
    until(lambda: r.zcard("retry") == 1, 15, d.log)
    assert list(_locks(r).values()) == [jid]
    assert client.push(_item("Boom", "again")) is None


def test_a_lock_held_until_start_goes_when_the_job_starts(r: redis.Redis,
                                                          daemon: Any) -> None:
    d = daemon(APP)
    client = Client(r)
    client.push(_item("Gate", "start", unique_until="start"))
    until(lambda: _started(r, "start"), 15, d.log)
    until(lambda: not _locks(r), 5, lambda: f"lock left: {_locks(r)}")
    assert client.push(_item("Gate", "start", unique_until="start")) is not None, (
        "taken again while the first still runs")
    r.rpush("test:gate:start", 1, 1)
    until(lambda: r.llen("test:ran") == 2, 15, d.log)


def test_a_sigkilled_childs_job_runs_again_with_its_lock_then_releases_it(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon(APP)
    client = Client(r)
    jid = client.push(_item("Gate", "killed"))
    until(lambda: len(_started(r, "killed")) == 1, 15, d.log)
    os.kill(_started(r, "killed")[0]["pid"], signal.SIGKILL)
    until(lambda: len(_started(r, "killed")) == 2, 30, d.log)  # requeued, run again
    assert list(_locks(r).values()) == [jid], "the requeued job keeps its lock"
    assert client.push(_item("Gate", "killed")) is None
    r.rpush("test:gate:killed", 1)
    until(lambda: r.llen("test:ran") == 1, 15, d.log)
    until(lambda: not _locks(r), 5, lambda: f"lock left: {_locks(r)}")
    assert client.push(_item("Gate", "killed")) is not None


def test_a_poison_pill_buried_after_its_deaths_releases_its_lock(r: redis.Redis,
                                                                 daemon: Any) -> None:
    d = daemon(APP)
    client = Client(r)
    client.push(_item("Suicide"))
    until(lambda: r.zcard("dead") == 1, 60, d.log)
    until(lambda: not _locks(r), 5, lambda: f"lock left: {_locks(r)}")
    assert client.push(_item("Suicide")) is not None


def _key_of(*args: Any) -> str:
    return unique.lock_key(unique.digest("Record", "default", list(args)))


def test_an_operator_removing_a_waiting_unique_job_releases_its_lock(r: redis.Redis) -> None:
    client = Client(r)
    for n in range(6):
        client.push(_item("Record", n))
    client.push({**_item("Record", "s1"), "at": time.time() + 3600})
    client.push({**_item("Record", "s2"), "at": time.time() + 3600})
    client.push({**_item("Record", "s3"), "at": time.time() + 3600})
    queue = Queue(r, "default")
    [zero] = [job for job in queue.jobs() if job.item["args"] == [0]]
    assert queue.delete(zero) and _key_of(0) not in _locks(r)
    [one] = [job for job in queue.jobs() if job.item["args"] == [1]]
    assert cancel(r, one.jid).outcome == "dequeued" and _key_of(1) not in _locks(r)
    scheduled = ScheduledSet(r)
    first, second, _ = sorted(scheduled.entries(10), key=lambda e: e.item["args"])
    assert cancel(r, first.jid).outcome == "unscheduled" and _key_of("s1") not in _locks(r)
    assert scheduled.kill(second) and _key_of("s2") not in _locks(r), "killed: to dead"
    assert scheduled.clear() == 1 and _key_of("s3") not in _locks(r)
    assert queue.clear() == 4 and not _locks(r)
    assert client.push(_item("Record", 2)) is not None


def test_a_unique_job_retried_by_an_operator_keeps_its_lock(r: redis.Redis) -> None:
    client = Client(r)
    jid = client.push({**_item("Record", "due"), "at": time.time() + 3600})
    [entry] = ScheduledSet(r).entries(10)
    assert ScheduledSet(r).add_to_queue(entry) and r.llen("queue:default") == 1
    assert list(_locks(r).values()) == [jid]


@job(name="unique_record", unique_for=60)
def unique_record(n: int) -> None:
    """A unique job for the testing modes."""
    RAN.append(n)


RAN: list[int] = []


def test_fake_mode_drops_a_unique_push_while_the_same_job_waits() -> None:
    RAN.clear()
    with testing.fake() as queues:
        assert unique_record.perform_async(1) is not None
        assert unique_record.perform_async(1) is None
        assert unique_record.perform_in(3600, 1) is None, "a scheduled push: the same job"
        assert unique_record.perform_async(2) is not None
        [first, _] = queues.jobs(unique_record)
        assert first["unique_digest"] == unique.digest("unique_record", "default", [1])
        assert queues.drain() == 2 and RAN == [1, 2]
        assert unique_record.perform_async(1) is not None, "drained: taken again"


def test_inline_mode_runs_every_unique_push() -> None:
    RAN.clear()
    with testing.inline():
        assert unique_record.perform_async(3) is not None
        assert unique_record.perform_async(3) is not None
    assert RAN == [3, 3]


@pytest.mark.slow
def test_a_kill_storm_over_a_thousand_unique_jobs_leaves_no_lock(r: redis.Redis,
                                                                 daemon: Any) -> None:
    """50 SIGKILLs of children busy with unique jobs: each victim has lived past the
    quick-death window (5 s), so the storm meets no respawn backoff and lasts ~50 s."""
    total = 1000
    pushed = Client(r).push_bulk({"class": "Sleep", "unique_for": 3600,
                                  "args": [[random.uniform(0.3, 0.5), str(n)]
                                           for n in range(total)]})
    assert len(pushed) == total and len(_locks(r)) == total
    d = daemon("concurrency: 8\nrequire: jobs\nlog_level: warning\n")
    d.wait_children(8)
    killed: set[int] = set()
    rng = random.Random(5)
    while len(killed) < 50 and r.llen("queue:default"):
        time.sleep(0.2)
        now = time.time()
        ripe = [c.pid for c in d.children()
                if c.pid not in killed and now - c.create_time() > QUICK_DEATH + 0.5]
        if ripe:
            victim = rng.choice(ripe)
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
    assert len(killed) == 50, f"the queue ran dry after {len(killed)} kills"
    ran = lambda: {row["marker"] for row in records(r)}  # noqa: E731
    until(lambda: len(ran()) + r.zcard("dead") == total, 120,
          lambda: f"{len(ran())} ran, {r.zcard('dead')} dead; log:\n{d.log()}")
    until(lambda: r.llen("queue:default") == 0 and not holding(r), 30, d.log)
    until(lambda: not _locks(r), 10, lambda: f"{len(_locks(r))} locks left")
    print(f"{len(killed)} children killed over {total} unique jobs: {len(ran())} ran, "
          f"{r.zcard('dead')} buried; 0 locks left")


@pytest.mark.process
def test_forkq_job_shows_the_unique_lock_a_job_holds(r: redis.Redis, server: Any) -> None:
    client = Client(r)
    jid = client.push(_item("Record", "shown"))
    plain = client.push({"class": "Record", "args": ["plain"]})
    cli = Forkq(server)
    out, _ = cli.text("job", str(jid))
    key = _key_of("shown")
    assert re.search(rf"lock +{key}: held by this job, (9|10)m \d\ds left", out), out
    data = cli.json("job", str(jid))
    assert data["lock"]["key"] == key and data["lock"]["holder"] == jid
    assert 590 < data["lock"]["ttl"] <= 600
    assert cli.json("job", str(plain))["lock"] is None
    r.delete(key)
    assert f"lock       {key}: free" in cli.text("job", str(jid))[0]
