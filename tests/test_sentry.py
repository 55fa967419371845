"""forkq.sentry with the real sentry-sdk, in a real daemon: one event per failure, grouped,
with the job's fields; arguments only with ``send_default_pii``; nothing for a job that
succeeds or is cancelled; no event twice through the logging integration; no breadcrumb of
one job in the next one's event; events sent from the children (their own sending thread)
and flushed before a recycled child exits.

The application is tests/sentry_app.py (its transport writes each event to a file).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from forkq import api
from forkq.client import Client
from tests.conftest import Daemon, push, until


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _of(path: Path, jid: str) -> list[dict[str, Any]]:
    return [row for row in _events(path) if row["event"].get("tags", {}).get("forkq.jid") == jid]


def _start(daemon: Callable[..., Daemon], path: Path, *, pii: bool, extra: str = "") -> Daemon:
    return daemon(f"""
        concurrency: 1
        require: sentry_app
        {extra}
        """, FORKQ_SENTRY_EVENTS=str(path), FORKQ_SENTRY_PII="1" if pii else "0",
        FORKQ_SENTRY_DELAY="0.3")


def _requeue_when_failed(r: redis.Redis, d: Daemon, jid: str) -> None:
    """Wait for the job's entry in ``retry``, then put it back in its queue now (as the
    scheduler does when it is due, without the wait)."""
    retries = api.RetrySet(r)
    until(lambda: retries.find_job(jid), 30, lambda: f"not in retry; log:\n{d.log()}")
    entry = retries.find_job(jid)
    assert entry is not None and retries.add_to_queue(entry)


def _frames(row: dict[str, Any]) -> list[str]:
    value = row["event"]["exception"]["values"][-1]
    return [frame["function"] for frame in value["stacktrace"]["frames"]]


def test_each_failure_is_one_event_grouped_by_jid(daemon: Callable[..., Daemon],
                                                  r: redis.Redis, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    d = _start(daemon, path, pii=False)
    crumb = push(r, "SentryCrumb", "before")
    flaky = push(r, "SentryFlaky", "f1", 2, "s3cr3t")
    _requeue_when_failed(r, d, flaky)
    _requeue_when_failed(r, d, flaky)
    until(lambda: flaky.encode() in r.lrange("test:sentry:done", 0, -1), 30,
          lambda: f"the job never completed; log:\n{d.log()}")
    until(lambda: len(_of(path, flaky)) >= 2, 30, lambda: f"events: {_events(path)}")
    d.stop()  # graceful: the child flushes whatever is pending

    rows = _events(path)
    assert len(_of(path, flaky)) == 2, rows  # one per failure, none for the success
    assert len(rows) == 2, rows  # nothing for SentryCrumb, nothing from the logging integration
    assert _of(path, crumb) == []
    first, second = (row["event"] for row in rows)
    for number, event in enumerate((first, second)):
        assert event["transaction"] == "SentryFlaky"
        assert event["tags"]["forkq.job"] == "SentryFlaky"
        assert event["tags"]["forkq.queue"] == "default"
        assert event["level"] == "error"
        value = event["exception"]["values"][-1]
        assert value["type"] == "ValueError" and value["value"] == "flaky f1"
        assert value["mechanism"] == {"type": "forkq", "handled": False}
        job = event["extra"]["forkq-job"]
        assert job["class"] == "SentryFlaky" and job["jid"] == flaky
        assert job["queue"] == "default"
        assert job["attempt"] == number + 1
        assert job["args"] == job["kwargs"] == "[Filtered]"
        assert "s3cr3t" not in json.dumps(event["extra"]) + json.dumps(event["tags"])
        crumbs = [c.get("message") for c in event.get("breadcrumbs", {}).get("values", [])]
        assert "flaky-f1" in crumbs and "crumb-before" not in crumbs, crumbs
        assert not any("SentryCrumb" in str(c) for c in crumbs), crumbs
    assert first["extra"]["forkq-job"]["retry_count"] is None
    assert second["extra"]["forkq-job"]["retry_count"] == 0
    # grouped: the same jid tag, and the same exception and stack for Sentry's grouping
    assert first["tags"]["forkq.jid"] == second["tags"]["forkq.jid"] == flaky
    assert _frames(rows[0]) == _frames(rows[1]) and "perform" in _frames(rows[0])
    # sent from the processor child, by the transport's own thread there
    assert {row["pid"] for row in rows} != {d.pid}
    assert {row["thread"] for row in rows} == {"sentry-sdk.BackgroundWorker"}
    assert all(row["made_in"] == row["pid"] for row in rows), rows  # not the master's


def test_a_dead_job_is_one_event_with_its_arguments_and_flushed_before_recycling(
        daemon: Callable[..., Daemon], r: redis.Redis, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    d = _start(daemon, path, pii=True, extra="max_jobs: 1")
    cancelled = push(r, "SentryCancelled", "c1")
    dead_set = api.DeadSet(r)
    until(lambda: dead_set.find_job(cancelled), 30, lambda: f"log:\n{d.log()}")
    dead = Client(r).push({"class": "SentryDead", "args": ["d1", "s3cr3t"], "retry": 0})
    assert dead is not None
    until(lambda: dead_set.find_job(dead), 30, lambda: f"log:\n{d.log()}")
    # the child exits after its one job, its event still in the sending thread's queue
    # (0.3 s behind): the exit hook's flush is what delivers it
    until(lambda: _of(path, dead), 30, lambda: f"no event; log:\n{d.log()}")
    d.stop()

    rows = _events(path)
    assert [row["event"]["tags"]["forkq.jid"] for row in rows] == [dead], rows
    event = rows[0]["event"]
    assert rows[0]["pid"] != d.pid
    assert event["transaction"] == "SentryDead"
    assert event["exception"]["values"][-1]["type"] == "KeyError"
    job = event["extra"]["forkq-job"]
    assert job["args"] == ["d1", "s3cr3t"] and job["kwargs"] == {}
    assert job["retry_count"] is None and job["attempt"] == 1
    assert "fail:" in d.log() and "-> dead" in d.log()  # logged, and not sent a second time
