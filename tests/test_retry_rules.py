"""Retry rules by exception, end to end: a real daemon files ``picky``'s failures by its
``retry_on`` / ``discard_on`` (the policy itself is unit-tested in test_units.py)."""

from __future__ import annotations

from typing import Any

import redis

from forkq.client import Client
from forkq.metrics import layout, prometheus

from .conftest import until


def test_a_daemon_files_failures_by_the_jobs_retry_rules(r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: info\n")
    client = Client(r)
    client.push({"class": "picky", "args": ["timeout"]})
    client.push({"class": "picky", "args": ["key"]})
    client.push({"class": "picky", "args": ["value"]})
    until(lambda: r.get("stat:failed") == b"3", 15, d.log)
    assert r.zcard("retry") == 1 and b'"timeout"' in r.zrange("retry", 0, -1)[0]
    assert r.zcard("dead") == 1 and b'"value"' in r.zrange("dead", 0, -1)[0]
    log = d.log()
    assert "KeyError: 'key' -> drop" in log and "ValueError: value -> dead" in log, log
    discarded = layout.series_field("default", "picky", "d")  # forkq_jobs_discarded_total
    until(lambda: r.hget(layout.JOBS, discarded) == b"1", 15, "the discard is not counted")
    assert b"forkq_jobs_discarded_total{" in prometheus.exposition(r)
