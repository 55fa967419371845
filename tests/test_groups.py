"""Fair tenants: a queue whose jobs name groups is run round-robin across the groups; the
queue's list keeps every job (a truthful LLEN), the index never outlives its jobs, and a
queue without groups is fetched as before."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest
import redis

from forkq import groups
from forkq.client import Client
from forkq.registry import job

from . import jobs
from .conftest import holding, records, until

ROTATION = groups.rotation_key("tenants")
CONFIG = "concurrency: {c}\nrequire: jobs\nqueues: [tenants]\nlog_level: warning\n"


def _index_keys(r: redis.Redis) -> list[bytes]:
    return sorted(r.keys("forkq:group*"))


def _order(r: redis.Redis) -> list[str]:
    return [item.decode() for item in r.lrange("test:order", 0, -1)]


def test_a_push_names_the_group_keeps_every_job_in_the_queue_and_indexes_it(
        r: redis.Redis, default_client: Client) -> None:
    for n in range(3):
        jobs.tenant.perform_async("acme", n)
    jobs.tenant.perform_async("initech", 0)
    assert r.llen("queue:tenants") == 4  # the truth, as Sidekiq's Web UI reads it
    assert json.loads(r.lindex("queue:tenants", 0))["group"] == "initech"
    assert r.lrange(ROTATION, 0, -1) == [b"", b"acme", b"initech"]
    assert r.llen(groups.group_key("tenants", "acme")) == 3
    assert groups.waiting(r, "tenants") == [("acme", 3), ("initech", 1)]
    Client(r).push({"class": "tenant", "queue": "tenants", "args": ["x", 1], "group": "raw"})
    assert groups.waiting(r, "tenants")[-1] == ("raw", 1)


@pytest.mark.parametrize(("options", "error"), [
    ({"group": ""}, "non-empty string"), ({"group": 7}, "non-empty string"),
    ({"group_limit": 2}, "group_limit needs group"),
    ({"group": "a", "group_limit": 0}, "at least 1"),
    ({"group": "a", "group_limit": 2, "concurrency_limit": 2}, "cannot both be set"),
])
def test_bad_group_options_are_refused_naming_them(options: dict[str, Any], error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=error):
        Client(redis.Redis(port=1)).push({"class": "tenant", "args": [], **options})


def test_bad_group_options_are_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="group_limit needs group"):
        job(name="group_probe", group_limit=2)(lambda: None)
    with pytest.raises(TypeError, match="group must be a function"):
        job(name="group_probe", group="")(lambda: None)
    with pytest.raises(ValueError, match="cannot both be set"):
        job(name="group_probe", group="a", group_limit=1, concurrency_limit=1)(lambda: None)
    with pytest.raises(ValueError, match="non-empty string"):
        job(name="group_probe", group=lambda x: x)(lambda x: None).perform_async("")


def test_a_small_tenant_is_not_held_up_by_a_big_one(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    """20,000 jobs of group A pushed, then 20 of group B: every B job finishes before A's
    200th (the positions are printed)."""
    Client(r).push_bulk({"class": "tenant", "queue": "tenants", "group": "A",
                         "args": [["A", n] for n in range(20_000)]})
    for n in range(20):
        jobs.tenant.perform_async("B", n)
    assert r.llen("queue:tenants") == 20_020
    d = daemon(CONFIG.format(c=4))
    until(lambda: sum(item.startswith("B:") for item in _order(r)) == 20, 60, d.log)
    order = _order(r)
    b_at = [i for i, item in enumerate(order) if item.startswith("B:")]
    a_before_last_b = sum(item.startswith("A:") for item in order[:b_at[-1]])
    print(f"\nB finished at positions {b_at}; A jobs finished before the last B: "
          f"{a_before_last_b}")
    assert a_before_last_b < 200, order[:b_at[-1] + 1]
    until(lambda: r.llen("test:order") == 20_020, 120, d.log)
    assert _index_keys(r) == [] and r.llen("queue:tenants") == 0


def test_one_turn_in_each_round_takes_the_queues_oldest_job_whatever_its_group(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    """Jobs without a group (here pushed before the group's) run in the turns of the queue's
    oldest job, between the group's turns, not after all of them."""
    Client(r).push_bulk({"class": "tenant", "queue": "tenants",
                         "args": [["none", n] for n in range(5)]})
    for n in range(30):
        jobs.tenant.perform_async("A", n)
    d = daemon(CONFIG.format(c=1))
    until(lambda: r.llen("test:order") == 35, 30, d.log)
    order = _order(r)
    last_plain = max(i for i, item in enumerate(order) if item.startswith("none:"))
    assert last_plain < 12, order
    assert [item for item in order if item.startswith("A:")] == [f"A:{n}" for n in range(30)]
    assert _index_keys(r) == []


def test_an_idle_daemon_takes_a_grouped_job_by_its_blocking_wait_and_drops_its_index(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    d = daemon(CONFIG.format(c=2))
    until(lambda: len(r.keys("forkq:inflight:*")) >= 2, 15, d.log)  # armed: waiting
    for n in range(3):
        jobs.tenant.perform_async("solo", n)
    until(lambda: r.llen("test:order") == 3, 15, d.log)
    until(lambda: _index_keys(r) == [], 10, lambda: f"{_index_keys(r)}\n{d.log()}")


def test_a_scheduled_job_of_a_group_joins_the_rotation_when_it_is_due(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    jobs.tenant.perform_in(1, "later", 0)
    assert _index_keys(r) == []  # waiting in schedule: no index yet
    d = daemon(CONFIG.format(c=1))
    until(lambda: _order(r) == ["later:0"], 30, d.log)
    assert _index_keys(r) == []


def test_an_entry_whose_job_was_deleted_from_the_queue_is_dropped_at_its_turn(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    for n in range(3):
        jobs.tenant.perform_async("gone", n)
    jobs.tenant.perform_async("kept", 0)
    for raw in r.lrange("queue:tenants", 0, -1):  # as a tool that knows no index deletes
        if json.loads(raw)["group"] == "gone":
            r.lrem("queue:tenants", 1, raw)
    d = daemon(CONFIG.format(c=1))
    until(lambda: _order(r) == ["kept:0"], 15, d.log)
    until(lambda: _index_keys(r) == [], 10, lambda: f"{_index_keys(r)}\n{d.log()}")


def test_a_group_limit_holds_per_group_and_other_groups_run(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    for n in range(4):
        jobs.tenant_limited.perform_async("acme", f"a{n}", 0.3)
        jobs.tenant_limited.perform_async("initech", f"i{n}", 0.3)
    queued = json.loads(r.lindex("queue:tenants", 0))
    assert (queued["concurrency_limit"], queued["concurrency_key"]) == (1, "initech")
    assert "group_limit" not in queued
    d = daemon(CONFIG.format(c=4))
    until(lambda: len(records(r)) == 8, 30, d.log)
    started = records(r, "test:started")
    assert max(row["running"] for row in started) == 1, started
    until(lambda: _index_keys(r) == [] and not r.keys("forkq:slots:*"), 10, d.log)


def test_a_killed_grouped_job_comes_back_and_nothing_of_the_index_is_left(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    jid = jobs.tenant.perform_async("victim", 0, 30.0)
    jobs.tenant.perform_async("victim", 1)
    d = daemon(CONFIG.format(c=1))
    until(lambda: holding(r), 15, d.log)
    [key] = holding(r)
    os.kill(int(key.rsplit(b":", 1)[1]), signal.SIGKILL)

    def running_again() -> bool:  # the next child runs it (maybe after victim 1, its turn)
        return any(json.loads(r.lindex(k, 1) or "{}").get("jid") == jid
                   for k in holding(r) if k != key)

    until(running_again, 30, d.log)
    until(lambda: _index_keys(r) == [] and r.llen("test:order") == 1, 15, d.log)


def test_index_keys_of_another_type_and_group_fields_of_any_type_stop_nothing(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    """A rotation or a group's list of another type, a group that is no string: the jobs are
    pushed and run all the same (taken in queue order), the other keys are left alone."""
    r.set(groups.group_key("tenants", "broken"), "not a list")
    for n in range(3):
        jobs.tenant.perform_async("broken", n)  # its index is another type: unindexed
        jobs.tenant.perform_async("fine", n)
    r.rpush(groups.rotation_key("tenants"), "broken")  # as if it had been indexed
    for field in (5, {"a": 1}, [], None, ""):
        r.lpush("queue:tenants", json.dumps({"class": "tenant", "args": ["odd", 0],
                                              "queue": "tenants", "jid": "x", "group": field}))
    r.set(groups.rotation_key("other"), "x")
    Client(r).push({"class": "tenant", "queue": "other", "args": ["other", 0], "group": "g"})
    d = daemon(CONFIG.format(c=2).replace("[tenants]", "[tenants, other]"))
    until(lambda: r.llen("test:order") == 12, 30, d.log)
    assert r.get(groups.group_key("tenants", "broken")) == b"not a list"
    assert r.get(groups.rotation_key("other")) == b"x"
    assert _index_keys(r) == [b"forkq:group:7:tenants:broken", b"forkq:groups:other"]


def test_clearing_a_queue_drops_its_groups_index(r: redis.Redis, default_client: Client) -> None:
    from forkq import api

    for n in range(3):
        jobs.tenant.perform_async("acme", n)
    assert _index_keys(r) != []
    assert api.Queue(r, "tenants").clear() == 3
    assert _index_keys(r) == []
