"""Batches, chains and chords on real daemons, with children and daemons SIGKILLed in the
middle: each callback fires exactly once, after what it waits for (forkq/batches.py,
forkq/canvas.py, forkq/scripts/workflow.lua)."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

import psutil
import pytest
import redis

import forkq
from forkq import Client, api, keys
from forkq.daemon.child_process import QUICK_DEATH
from forkq.daemon.held_jobs import KILL_LIMIT

from . import flows
from .conftest import holding, records, until, until_retried

CONFIG = "concurrency: 4\nrequire: flows\nlog_level: warning\n"


def _callbacks(r: redis.Redis, tag: str | None = None) -> list[dict[str, Any]]:
    return [row for row in records(r, "test:wf:callbacks") if tag is None or row["tag"] == tag]


def _ran(r: redis.Redis) -> list[dict[str, Any]]:
    return records(r, "test:wf:ran")


def _whereabouts(r: redis.Redis, bid: str) -> dict[str, list[str]]:
    """Where each pending member of batch ``bid`` is (``forkq job``'s lookup: kind and key of
    each place), for a failure's message."""
    jids = [jid.decode() for jid in r.smembers(f"{keys.batch(bid)}:pending")]
    return {jid: [f"{place.kind} {place.key}" for place in api.find_job(r, jid).places]
            for jid in jids}


def _twice_killed_job(r: redis.Redis, pid: int) -> bool:
    """Whether process ``pid`` holds a job whose processor died KILL_LIMIT - 1 times."""
    for key in r.keys(f"{keys.INFLIGHT_PREFIX}*:{pid}"):
        held = r.lrange(key, 1, 1)
        if held and int(r.get(keys.kills(json.loads(held[0])["jid"])) or 0) >= KILL_LIMIT - 1:
            return True
    return False


def _kill_children(r: redis.Redis, daemons: list[Any], kills: int, rng: random.Random,
                   busy: Any) -> int:
    """SIGKILL random children (older than the quick-death window) while ``busy()``, up
    to ``kills`` of them; how many were killed. A child running a job whose holders died
    twice already is spared: a requeued job runs again at once, and a third death would
    bury it as a poison pill (held_jobs.KILL_LIMIT), which is not what these tests test."""
    killed: set[int] = set()
    while len(killed) < kills and busy():
        time.sleep(0.1)
        now = time.time()
        ripe = [c.pid for d in daemons if d.alive() for c in d.children()
                if c.pid not in killed and now - c.create_time() > QUICK_DEATH + 0.5
                and not _twice_killed_job(r, c.pid)]
        if ripe:
            victim = rng.choice(ripe)
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
    return len(killed)


@pytest.mark.slow
def test_a_batch_of_5000_fires_each_callback_once_through_40_child_kills_and_a_daemon_kill(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    total = 5000
    with forkq.batch(on_success=flows.callback.s("success"),
                     on_complete=flows.callback.s("complete"), description="storm") as b:
        for n in range(total):
            flows.item.perform_async(n, 0.08)
    assert forkq.batch_status(b.bid).total == total  # type: ignore[union-attr]
    daemons = [daemon(CONFIG), daemon(CONFIG)]
    rng = random.Random(11)
    pending = lambda: forkq.batch_status(b.bid).pending  # type: ignore[union-attr]  # noqa: E731
    killed = _kill_children(r, daemons, 20, rng, lambda: pending() > total // 3)
    daemons[1].sigkill(everything=True)  # a whole daemon, then its restart recovers its jobs
    daemons.append(daemon(CONFIG))
    killed += _kill_children(r, [daemons[0], daemons[2]], 20, rng, lambda: pending() > 0)
    until(lambda: len(_callbacks(r)) >= 2, 240,
          lambda: f"pending {pending()}: {_whereabouts(r, b.bid)}; logs:\n"
                  + "\n".join(d.log()[-3000:] for d in daemons))
    time.sleep(1)  # a second firing would be pushed in the same step: give it time to run
    success, complete = _callbacks(r, "success"), _callbacks(r, "complete")
    ran = _ran(r)
    print(f"{killed} child kills and 1 daemon kill: {len({row['n'] for row in ran})} of "
          f"{total} jobs ran ({len(ran)} runs); on_success ran {len(success)} time(s), "
          f"on_complete {len(complete)}; on_success "
          f"{success[0]['at'] - max(row['at'] for row in ran):.3f} s after the last job's end")
    assert killed == 40
    assert {row["n"] for row in ran} == set(range(total))  # 0 lost
    assert len(success) == 1 and len(complete) == 1
    assert success[0]["at"] > max(row["at"] for row in ran)
    assert success[0]["status"]["pending"] == 0 and success[0]["status"]["total"] == total
    status = forkq.batch_status(b.bid)
    assert status is not None and status.success and status.complete and status.pending == 0


def test_on_success_waits_for_jobs_that_fail_twice_then_succeed(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    with forkq.batch(on_success=flows.callback.s("success"),
                     on_complete=flows.callback.s("complete")) as b:
        for n in range(10):
            flows.flaky.perform_async(n)
        for n in range(20):
            flows.item.perform_async(100 + n)
    daemon(CONFIG)
    until_retried(r, lambda: len(_callbacks(r, "success")) == 1, 60)
    time.sleep(0.5)
    flaky_ends = [row["at"] for row in _ran(r) if row["n"] < 10]
    success, complete = _callbacks(r, "success"), _callbacks(r, "complete")
    assert len(flaky_ends) == 10 and len(success) == 1 and len(complete) == 1
    assert success[0]["at"] > max(flaky_ends)
    status = forkq.batch_status(b.bid)
    assert status is not None and status.succeeded == 30 and status.failures == 0


def test_a_job_that_dies_fires_on_death_and_on_complete_once_and_on_success_never(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    with forkq.batch(on_success=flows.callback.s("success"),
                     on_complete=flows.callback.s("complete"),
                     on_death=flows.callback.s("death")) as b:
        flows.doomed.perform_async(1)
        for n in range(5):
            flows.item.perform_async(n)
    daemon(CONFIG)
    until(lambda: {row["tag"] for row in _callbacks(r)} == {"death", "complete"}, 30)
    until(lambda: r.llen("queue:default") == 0 and not holding(r), 15)
    time.sleep(0.5)
    assert sorted(row["tag"] for row in _callbacks(r)) == ["complete", "death"]
    status = forkq.batch_status(b.bid)
    assert status is not None and status.complete and not status.success
    assert (status.pending, status.failures, status.succeeded) == (1, 1, 5)
    assert _callbacks(r, "complete")[0]["status"]["failures"] == 1


@pytest.mark.slow
def test_a_five_step_chain_passes_its_values_through_a_child_kill(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    cid = forkq.chain(flows.slow_step.s(0, "a", 0.1), flows.slow_step.s("b", 8.0),
                      flows.slow_step.s("c", 0.1), flows.slow_step.s("d", 0.1),
                      flows.slow_step.s("e", 0.1)).perform_async()
    d = daemon(CONFIG)
    until(lambda: any(row["label"] == "b" for row in records(r, "test:wf:started")), 30)
    [started] = [row for row in records(r, "test:wf:started") if row["label"] == "b"]
    child = psutil.Process(started["pid"])
    until(lambda: time.time() - child.create_time() > QUICK_DEATH + 0.5, 15)
    child.kill()  # b runs again in a fresh child
    until(lambda: _chain_state(cid) == "succeeded", 60, d.log)
    ends = {row["label"]: row["value"] for row in records(r, "test:wf:steps")}
    assert ends["e"] == [0, "a", "b", "c", "d"]
    assert [row["label"] for row in records(r, "test:wf:started")].count("b") == 2


def _chain_state(cid: str) -> str:
    status = forkq.chain_status(cid)
    return status.state if status is not None else "none"


def test_a_failing_step_stops_the_chain_after_its_retries(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    cid = forkq.chain(flows.step.s(1, "a"), flows.broken_step.s(),
                      flows.step.s("c")).perform_async()
    daemon(CONFIG)
    until_retried(r, lambda: _chain_state(cid) == "failed", 60)
    status = forkq.chain_status(cid)
    assert status is not None and status.failed_step == 2 and status.step == 2
    labels = [row["label"] for row in records(r, "test:wf:steps")]
    assert labels == ["a", "broken", "broken"]  # one retry; c never ran
    assert r.zcard("dead") == 1


def test_a_chord_of_1000_gives_its_callback_every_result_in_order_through_a_child_kill(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    bid = forkq.chord([flows.item.s(n, 0.02) for n in range(1000)],
                      flows.callback.s("chord")).perform_async()
    d = daemon(CONFIG)
    until(lambda: len(_ran(r)) > 300, 60, d.log)
    ripe = lambda: [c for c in d.children()  # noqa: E731
                    if time.time() - c.create_time() > QUICK_DEATH + 0.5]
    until(ripe, 15, "no child past the quick-death window")
    ripe()[0].kill()
    assert len(_ran(r)) < 1000, "the kill came after the last job"
    until(lambda: len(_callbacks(r, "chord")) == 1, 120, d.log)
    time.sleep(0.5)
    [called] = _callbacks(r, "chord")
    assert called["status"] == [2 * n for n in range(1000)]
    assert len(_callbacks(r)) == 1
    assert not r.exists(f"forkq:batch:{bid}:pending")


def test_a_job_adds_100_jobs_to_its_own_running_batch(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    with forkq.batch(on_success=flows.callback.s("success")):
        flows.grow.perform_async(100)
        for n in range(3):
            flows.item.perform_async(n)
    daemon(CONFIG)
    until(lambda: len(_callbacks(r, "success")) == 1, 60)
    time.sleep(0.5)
    [success] = _callbacks(r)
    added = [row for row in _ran(r) if row["n"] >= 1000]
    assert len(added) == 100 and success["at"] > max(row["at"] for row in added)
    assert success["status"]["total"] == 104 and success["status"]["pending"] == 0


def test_a_batch_of_batches_fires_the_parents_callback_once_after_every_child_succeeded(
        r: redis.Redis, daemon: Any, default_client: Client) -> None:
    children = []
    with forkq.batch(on_success=flows.callback.s("parent")) as parent:
        for k in range(3):
            with forkq.batch(on_success=flows.callback.s(f"child{k}")) as child:
                for n in range(20):
                    flows.item.perform_async(100 * k + n, 0.01)
                flows.flaky.perform_async(1000 + k)
            children.append(child.bid)
        flows.item.perform_async(999)
    status = forkq.batch_status(parent.bid)
    assert status is not None and status.total == 4  # 3 child batches and a job
    daemon(CONFIG)
    until_retried(r, lambda: len(_callbacks(r, "parent")) == 1, 60)
    time.sleep(0.5)
    tags = sorted(row["tag"] for row in _callbacks(r))
    assert tags == ["child0", "child1", "child2", "parent"]
    child_success = [forkq.batch_status(bid).fired["success"]  # type: ignore[union-attr]
                     for bid in children]
    assert forkq.batch_status(parent.bid).fired["success"] >= max(child_success)  # type: ignore[union-attr]
    assert _callbacks(r, "parent")[0]["at"] > max(row["at"] for row in _ran(r))


def test_an_exception_in_the_block_pushes_nothing(r: redis.Redis,
                                                   default_client: Client) -> None:
    with pytest.raises(RuntimeError), forkq.batch(on_success=flows.callback.s("x")):
        flows.item.perform_async(1)
        raise RuntimeError("no")
    assert r.dbsize() == 0


def test_jobs_carry_the_bid_as_sidekiq_pro_writes_it(r: redis.Redis,
                                                      default_client: Client) -> None:
    with forkq.batch() as b:
        jid = flows.item.perform_async(1)
        Client(r).push_bulk({"class": "wf_item", "args": [[2], [3]]})
    jobs = [json.loads(raw) for raw in r.lrange("queue:default", 0, -1)]
    assert {job["bid"] for job in jobs} == {b.bid} and jid in {job["jid"] for job in jobs}
    assert r.scard(f"forkq:batch:{b.bid}:pending") == 3


def test_workflow_fields_and_keys_of_any_type_never_stop_a_job(
        r: redis.Redis, daemon: Any) -> None:
    r.set("forkq:batch:str", "x")
    r.hset("forkq:batch:badset", "committed", "1")
    r.rpush("forkq:batch:badset:pending", "j5")
    r.rpush("forkq:chain:lst", "x")
    fields: list[dict[str, Any]] = [
        {"bid": 5}, {"bid": "nosuch"}, {"bid": "str"}, {"bid": "badset", "jid": "j5"},
        {"chain": 7, "chain_step": "x"}, {"chain": "lst", "chain_step": 1},
        {"chain": {"a": 1}, "chord": "yes"}, {"bid": None, "chain": None},
    ]
    for n, extra in enumerate(fields):
        body = {"class": "wf_item", "args": [n], "queue": "default", "retry": False,
                "jid": f"j{n}", **extra}
        r.lpush("queue:default", json.dumps(body))
    r.lpush("queue:default", json.dumps({"class": "wf_item", "args": [99], "retry": 0,
                                         "jid": "kw", "kwargs": [1]}))
    d = daemon(CONFIG)
    until(lambda: len(_ran(r)) == len(fields) and r.zcard("dead") == 1, 30, d.log)
    until(lambda: not holding(r) and r.llen("queue:default") == 0, 15, d.log)
    [dead] = [json.loads(raw) for raw in r.zrange("dead", 0, -1)]
    assert dead["jid"] == "kw" and "kwargs must be an object" in dead["error_message"]
    assert d.alive() and r.type("forkq:batch:str") == b"string"


def test_a_cancelled_waiting_job_dies_for_its_batch(r: redis.Redis,
                                                     default_client: Client) -> None:
    from forkq import api

    with forkq.batch(on_death=flows.callback.s("death"),
                     on_complete=flows.callback.s("complete")) as b:
        jid = flows.item.set(queue="parked").perform_async(1)
    assert api.cancel(r, str(jid)).outcome == "dequeued"
    tags = sorted(json.loads(raw)["args"][1] for raw in r.lrange("queue:default", 0, -1))
    assert tags == ["complete", "death"]
    status = forkq.batch_status(b.bid)
    assert status is not None and status.failures == 1 and not status.success
