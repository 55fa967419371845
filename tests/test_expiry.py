"""Expiring jobs (``expires_in``, Sidekiq Pro's): a job not started by its ``expires_at``
is dropped unrun, logged and counted (``forkq_jobs_expired_total``), never filed to dead."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from forkq import testing
from forkq.client import Client
from forkq.metrics import layout
from forkq.registry import job

from .conftest import until

RAN: list[str] = []


@job(name="expiring_probe", expires_in=3600)
def expiring_probe(marker: str) -> None:
    """An expiring job for the testing modes."""
    RAN.append(marker)


def _queued(r: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in r.lrange("queue:default", 0, -1)]


def test_a_push_stamps_expires_at_from_when_the_job_is_due(r: redis.Redis) -> None:
    client = Client(r)
    before = time.time()
    client.push({"class": "Record", "args": [], "expires_in": 60})
    [queued] = _queued(r)
    assert before + 60 <= queued["expires_at"] <= time.time() + 60
    at = time.time() + 3600
    client.push({"class": "Record", "args": [], "expires_in": 60, "at": at})
    [(member, score)] = r.zrange("schedule", 0, -1, withscores=True)
    assert json.loads(member)["expires_at"] == pytest.approx(at + 60) and score == at
    client.push_bulk({"class": "Record", "args": [[1], [2]], "expires_in": 5})
    assert all("expires_at" in job for job in _queued(r)[:2])


@pytest.mark.parametrize(("value", "error"), [(0, "positive"), (-1, "positive"),
                                              ("60", "number"), (float("nan"), "positive")])
def test_a_bad_expires_in_is_refused_before_any_io(value: Any, error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=f"expires_in must be a {error}"):
        Client(redis.Redis(port=1)).push({"class": "Record", "args": [], "expires_in": value})
    with pytest.raises((TypeError, ValueError), match="expires_in"):
        job(name="expiring_bad", expires_in=value)(lambda: None)


def test_an_expired_job_is_dropped_unrun_logged_and_counted(r: redis.Redis,
                                                            daemon: Any) -> None:
    client = Client(r)
    stale = client.push({"class": "Record", "args": ["stale"], "expires_in": 0.2})
    fresh = client.push({"class": "Record", "args": ["fresh"], "expires_in": 3600})
    time.sleep(0.3)  # the first one's expires_at passes before any daemon runs
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\n")
    until(lambda: r.llen("test:ran") == 1 and r.get("stat:processed") == b"2", 15, d.log)
    [ran] = [json.loads(row) for row in r.lrange("test:ran", 0, -1)]
    assert ran["jid"] == fresh
    assert f"Record jid={stale} expired" in d.log() and r.zcard("dead") == 0
    field = layout.series_field("default", "Record", "x")
    until(lambda: r.hget(layout.JOBS, field) == b"1", 15, "the expiry is not counted")


def test_fake_mode_drains_no_expired_job() -> None:
    RAN.clear()
    with testing.fake() as queues:
        expiring_probe.perform_async("kept")
        expiring_probe.set(expires_in=0.01).perform_async("late")
        time.sleep(0.05)
        assert queues.drain() == 1 and RAN == ["kept"]
