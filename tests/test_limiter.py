"""Rate and concurrency limiters (forkq.limiter): shared by every process on the Redis, on
the server's clock; a concurrent slot of a SIGKILLed processor is freed at its reap; an
OverLimit that escapes a job reschedules it."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from typing import Any

import pytest
import redis

import forkq
from forkq import limiter
from forkq.client import Client
from forkq.metrics import layout

from .conftest import until
from .test_job_lookup import Forkq


@pytest.fixture
def client(r: redis.Redis) -> Client:
    return Client(r)


def _admitted(limit: limiter.Limiter, tries: int) -> int:
    admitted = 0
    for _ in range(tries):
        try:
            with limit:
                admitted += 1
        except forkq.OverLimit:
            pass
    return admitted


def test_a_window_admits_count_per_sliding_window(client: Client) -> None:
    window = limiter.window("w", 5, 0.5, wait_timeout=0, client=client)
    assert _admitted(window, 8) == 5
    with pytest.raises(forkq.OverLimit, match=r"limiter 'w' .* no room within 0 s"):
        window.acquire()
    time.sleep(0.6)
    assert _admitted(window, 8) == 5


def test_a_waiting_window_admits_when_room_comes(client: Client) -> None:
    window = limiter.window("slow", 2, 0.3, wait_timeout=5, client=client)
    started = time.monotonic()
    assert _admitted(window, 6) == 6  # 2 per 0.3 s: the last two wait ~0.6 s
    assert time.monotonic() - started >= 0.5


def test_a_bucket_counts_per_calendar_period(client: Client, r: redis.Redis) -> None:
    bucket = limiter.bucket("b", 3, "day", wait_timeout=0, client=client)
    assert _admitted(bucket, 5) == 3
    [key] = r.keys("forkq:limiter:bucket:b:*")
    assert int(key.rsplit(b":", 1)[1]) == int(r.time()[0] // 86400)
    with pytest.raises(ValueError, match="per must be one of second, minute, hour, day"):
        limiter.bucket("b", 3, "week")


def test_a_leaky_bucket_takes_a_burst_then_its_rate(client: Client) -> None:
    leaky = limiter.leaky("l", 4, 0.4, wait_timeout=0, client=client)  # 10 per second
    assert _admitted(leaky, 6) == 4
    time.sleep(0.25)  # ~2.5 drops leaked
    assert _admitted(leaky, 4) == 2


def test_a_concurrent_limiter_holds_count_slots_per_thread(client: Client,
                                                           r: redis.Redis) -> None:
    slots = limiter.concurrent("c", 2, wait_timeout=0, client=client)
    inside = threading.Barrier(3)
    leave = threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            with slots:
                inside.wait(5)
                leave.wait(5)
        except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait(5)
    with pytest.raises(forkq.OverLimit):
        slots.acquire()
    leave.set()
    for thread in threads:
        thread.join(5)
    assert not errors and r.zcard("forkq:limiter:concurrent:c") == 0
    with slots:
        assert r.zcard("forkq:limiter:concurrent:c") == 1


@pytest.mark.parametrize(("build", "error"), [
    (lambda: limiter.window("", 5, 1), "name"),
    (lambda: limiter.window("x", 0, 1), "count must be a positive"),
    (lambda: limiter.leaky("x", 5, -1), "seconds must be a positive"),
    (lambda: limiter.concurrent("x", 1, wait_timeout=-1), "wait_timeout must be a non-neg"),
])
def test_bad_limiter_arguments_are_refused(build: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        build()


def test_a_limiter_key_of_another_type_is_refused_naming_it(client: Client,
                                                            r: redis.Redis) -> None:
    r.set("forkq:limiter:window:bad", "x")
    with pytest.raises(redis.ResponseError, match="forkq:limiter:window:bad"):
        limiter.window("bad", 1, 1, client=client).acquire()


def test_a_slot_held_by_a_sigkilled_processor_is_freed_at_its_reap(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\n")
    Client(r).push({"class": "holding", "args": ["kept"]})
    until(lambda: r.llen("test:started") == 1, 15, d.log)
    assert r.zcard("forkq:limiter:concurrent:held") == 1  # lock_timeout: 600 s
    os.kill(json.loads(r.lindex("test:started", 0))["pid"], signal.SIGKILL)
    until(lambda: r.llen("test:started") == 2, 30, d.log)  # requeued: run again, slot free
    assert r.zcard("forkq:limiter:concurrent:held") == 1
    assert "freed 1 limiter slot that" in d.log()
    r.rpush("test:gate:kept", 1)
    until(lambda: r.zcard("forkq:limiter:concurrent:held") == 0, 15, d.log)


def test_an_over_limit_job_is_rescheduled_not_failed(r: redis.Redis, daemon: Any) -> None:
    r.zadd("forkq:limiter:concurrent:full", {"someone": time.time() * 1000 + 600_000})
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\n")
    jid = Client(r).push({"class": "over", "args": []})
    until(lambda: r.zcard("schedule") == 1, 15, d.log)
    [(member, due)] = r.zrange("schedule", 0, -1, withscores=True)
    job = json.loads(member)
    assert job["jid"] == jid and job["overrated"] == 1 and "retry_count" not in job
    assert 300 < due - time.time() <= 601
    assert r.get("stat:failed") is None and r.zcard("retry") == 0
    assert f"over jid={jid} over limit" in d.log()
    field = layout.series_field("default", "over", "o")
    until(lambda: r.hget(layout.JOBS, field) == b"1", 15, "the reschedule is not counted")


def test_an_over_limit_job_past_its_reschedules_fails(r: redis.Redis, daemon: Any) -> None:
    r.zadd("forkq:limiter:concurrent:full", {"someone": time.time() * 1000 + 600_000})
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\n")
    Client(r).push({"class": "over", "args": [], "overrated": limiter.MAX_OVERRATED})
    until(lambda: r.zcard("retry") == 1, 15, d.log)
    assert b"forkq.OverLimit" in r.zrange("retry", 0, -1)[0]


@pytest.mark.slow
def test_a_window_holds_across_three_daemons(r: redis.Redis, daemon: Any) -> None:
    """1,000 jobs through window("api", 50, 1.0) on three daemons of 4 processors: no
    sliding second admits more than 50 (by the server's clock), every job completes."""
    total, limit = 1000, 50
    Client(r).push_bulk({"class": "rated", "args": [[n, limit] for n in range(total)]})
    daemons = [daemon("concurrency: 4\nrequire: jobs\nlog_level: warning\n") for _ in range(3)]
    until(lambda: r.llen("test:admitted") == total, 120,
          lambda: f"{r.llen('test:admitted')} admitted; log:\n{daemons[0].log()}")
    until(lambda: r.get("stat:processed") == str(total).encode(), 30, daemons[0].log)
    times = sorted(float(t) for t in r.lrange("test:admitted", 0, -1))
    most, start = 0, 0
    for end, moment in enumerate(times):  # every window of one second that ends at an entry
        while times[start] <= moment - 1.0:
            start += 1
        most = max(most, end - start + 1)
    per_second: dict[int, int] = {}
    for moment in times:
        per_second[int(moment - times[0])] = per_second.get(int(moment - times[0]), 0) + 1
    print(f"{total} jobs on 3 daemons over {times[-1] - times[0]:.1f} s; most in any "
          f"sliding second: {most}; per second: {list(per_second.values())}")
    assert most <= limit and r.get("stat:failed") is None


@pytest.mark.process
def test_forkq_limits_and_uniques_show_what_flow_control_holds(r: redis.Redis,
                                                               server: Any) -> None:
    client = Client(r)
    r.sadd("forkq:slots:limited:acct-1", "j1", "j2")
    r.rpush("forkq:slots:limited:acct-1:blocked", "{}")
    with limiter.window("api", 5, 60, client=client):
        pass
    jid = client.push({"class": "Record", "args": [1], "unique_for": 600})
    r.set("forkq:limiter:window:broken", "x")
    for n in range(3):
        client.push({"class": "tenant", "queue": "tenants", "args": ["acme", n], "group": "acme"})
    cli = Forkq(server)
    out, err = cli.text("limits", code=1)
    assert re.search(r"limited:acct-1 +2 +1", out) and re.search(r"window +api +1", out), out
    assert re.search(r"tenants +acme +3", out), out
    assert "forkq:limiter:window:broken" in err
    data = cli.json("limits", code=1)
    assert data["slots"] == [{"name": "limited:acct-1", "running": 2, "waiting": 1}]
    assert {"kind": "window", "name": "api", "used": 1.0} in data["limiters"]
    assert data["groups"] == [{"queue": "tenants", "group": "acme", "waiting": 3}]
    out, _ = cli.text("uniques")
    assert "Unique locks: 1" in out and str(jid) in out
    [lock] = cli.json("uniques")["locks"]
    assert lock["jid"] == jid and 590 < lock["ttl"] <= 600
