"""Optional results: a job with ``result_ttl`` keeps what it returned (or its failure for
good) under ``forkq:result:<jid>``; ``forkq.result`` waits for it on the server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

import forkq
from forkq import keys
from forkq.client import Client

from . import jobs
from .conftest import until

APP = "concurrency: 1\nrequire: jobs\n"


def test_a_job_s_return_value_is_waited_for_on_the_server(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    jid = str(jobs.answer.perform_async(21))
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(forkq.result(jid, timeout=30)))
    waiter.start()
    until(lambda: int(r.info("clients")["blocked_clients"]) >= 1, 5,
          "the waiter does not block on the server")
    d = daemon(APP)
    waiter.join(timeout=30)
    assert got == [{"double": 42}], d.log()
    assert 0 < r.ttl(keys.result(jid)) <= 60
    assert forkq.result(jid, timeout=1) == {"double": 42}, "the result stays for other waiters"


def test_a_coroutine_job_s_result_and_a_failure_for_good(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    ok = str(jobs.answer_async.perform_async(7))
    failed = str(jobs.answer_fails.perform_async("no luck"))
    unstorable = str(jobs.answer_set.perform_async())
    d = daemon(APP)
    assert forkq.result(ok, timeout=30) == [7, 7], d.log()
    with pytest.raises(forkq.JobFailedError) as caught:
        forkq.result(failed, timeout=30)
    assert (caught.value.error_class, caught.value.error_message) == ("ValueError", "no luck")
    with pytest.raises(forkq.JobFailedError, match="cannot be stored as JSON"):
        forkq.result(unstorable, timeout=30)
    # all three were processed, and only answer_fails failed: the unstorable one completed
    until(lambda: r.get("stat:processed") == b"3", 5, lambda: d.log())
    assert r.get("stat:failed") == b"1" and r.zcard("retry") == r.zcard("dead") == 0


def test_no_result_in_time_raises_and_a_job_without_result_ttl_stores_none(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    started = time.monotonic()
    with pytest.raises(forkq.ResultTimeoutError):
        forkq.result("never-pushed", timeout=0.3)
    # at least its timeout; the upper bound only tells a timeout from a hang (or a unit mix-up)
    assert 0.3 <= time.monotonic() - started < 30
    jid = default_client.push({"class": "Record", "args": [1]})
    d = daemon(APP)
    until(lambda: r.get("stat:processed") == b"1", 15, lambda: d.log())
    assert not r.exists(keys.result(str(jid)))


def test_result_ttl_must_be_a_positive_number() -> None:
    for bad in (0, -1, True, "60", float("inf")):
        with pytest.raises(ValueError, match="result_ttl"):
            forkq.job(name=f"bad_ttl_{bad!r}", result_ttl=bad)(lambda: None)
    with pytest.raises(ValueError, match="result_ttl"):
        jobs.answer.set(result_ttl=-5)


def test_a_hostile_result_ttl_counts_as_absent_or_is_capped(
        r: redis.Redis, daemon: Any) -> None:
    client = Client(r)
    hostile = ["x", [1], -1, 0, True, None]
    jids = [client.push({"class": "answer", "args": [1], "result_ttl": ttl}) for ttl in hostile]
    r.lpush("queue:default", b'{"class":"answer","args":[2],"jid":"huge","result_ttl":1e300}')
    d = daemon(APP)
    until(lambda: r.get("stat:processed") == b"7", 15, lambda: d.log())
    assert not any(r.exists(keys.result(str(jid))) for jid in jids)
    assert forkq.result("huge", timeout=5, client=client) == {"double": 4}
    assert 0 < r.ttl(keys.result("huge")) <= 10 * 365 * 24 * 3600
