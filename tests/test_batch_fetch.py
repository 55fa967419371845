"""Batched reliable fetch: a processor takes up to ``fetch_batch`` jobs from a deep queue.

The jobs it holds without having started them go back unchanged, in order, at the front
of their queue when it is killed (only the running one may run twice, and only its death
counts; those it completed are acknowledged, not run again), and at once when the daemon
is told to quiet or stop, while the running one goes on. TTIN tells them apart.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from forkq import keys
from forkq.client import Client
from forkq.daemon import held_jobs
from forkq.daemon.children import fetch
from forkq.daemon.children.fetch import Done
from forkq.scripts import script

from .conftest import records, until

BATCH = ("concurrency: 1\nfetch_batch: 4\ntimeout: 20\nrequire: jobs\nlog_level: info\n"
         "queues:\n  - warm\n  - default\n")
WARM = 12
"""Short jobs a processor runs from queue warm before default is resumed: its batch size
comes from a moving average of its jobs' run times (BatchSize), so a first job slowed by a
busy host (one took 18 ms and left a batch of 3, not 4) is outweighed by the ones after."""


def _start_batching(r: redis.Redis, daemon: Any,
                    push: Callable[[Client], str]) -> tuple[Any, str]:
    """A daemon (BATCH) that runs WARM short jobs from queue warm while default is paused,
    with the jobs ``push`` pushed to default; then default is resumed, so the processor's
    next fetch takes a batch of 4 that starts with default's oldest job. The daemon and what
    ``push`` returned (the long job's jid)."""
    client = Client(r)
    client.push_bulk({"class": "Record", "queue": "warm", "args": [["w"]] * WARM})
    r.sadd(keys.PAUSED, "default")
    pushed = push(client)
    d = daemon(BATCH)
    until(lambda: len(records(r)) == WARM, 15, lambda: d.log())
    r.srem(keys.PAUSED, "default")
    return d, pushed


def _push_holding(client: Client, seconds: float = 30) -> str:
    """A Hold "h" of ``seconds`` and ten Records (0..9), to queue default; the Hold's jid."""
    hold = client.push({"class": "Hold", "args": ["h", seconds]})
    assert hold is not None
    client.push_bulk({"class": "Record", "args": [[n] for n in range(10)]})
    return hold


def _start_holding(r: redis.Redis, daemon: Any) -> tuple[Any, str, list[bytes]]:
    """A daemon whose one processor runs a long Hold job and holds three more jobs."""
    d, hold = _start_batching(r, daemon, _push_holding)
    until(lambda: len(records(r, "test:started")) == 1, 15, lambda: d.log())
    [inflight] = [k for k in r.keys("forkq:inflight:*:*")]
    held = r.lrange(inflight, 0, -1)
    assert len(held) == 8, held  # the running Hold and three Records, with their queues
    assert [json.loads(job)["args"] for job in held[3::2]] == [[0], [1], [2]]
    return d, hold, held


def _record_order(r: redis.Redis) -> list[Any]:
    """The args[0] of each job run, in order, but the warm-up jobs (queue warm)."""
    return [row["args"][0] for row in records(r) if row.get("queue") != "warm"]


def test_a_killed_processor_s_held_jobs_go_back_in_order_and_run_once(
        r: redis.Redis, daemon: Any) -> None:
    d, hold, _ = _start_holding(r, daemon)
    victim = records(r, "test:started")[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    until(lambda: len(records(r)) == WARM + 11, 20, lambda: d.log())
    # the running job goes back first (and runs again); the held ones follow, once, in order
    assert _record_order(r) == ["h", *range(10)]
    starts = [row["marker"] for row in records(r, "test:started")]
    assert starts == ["h", "h"]
    assert r.get(keys.kills(hold)) == b"1"
    assert len(r.keys("forkq:kills:*")) == 1, "only the running job's death counts"


def test_jobs_a_killed_processor_completed_in_its_batch_do_not_run_again(
        r: redis.Redis, daemon: Any) -> None:
    def push(client: Client) -> str:
        client.push_bulk({"class": "Record", "args": [["x0"], ["x1"]]})
        hold = client.push({"class": "Hold", "args": ["h", 30]})
        client.push_bulk({"class": "Record", "args": [[f"y{n}"] for n in range(10)]})
        return str(hold)

    d, hold = _start_batching(r, daemon, push)
    until(lambda: len(records(r, "test:started")) == 1, 15, lambda: d.log())
    assert _record_order(r) == ["x0", "x1"]
    [inflight] = [k for k in r.keys("forkq:inflight:*:*")]
    assert r.llen(inflight) == 8, "x0 and x1 are acknowledged with the next fetch only"
    os.kill(records(r, "test:started")[0]["pid"], signal.SIGKILL)
    until(lambda: len(records(r)) == WARM + 13, 20, lambda: d.log())
    assert _record_order(r) == ["x0", "x1", "h", *(f"y{n}" for n in range(10))]
    assert r.get(keys.kills(hold)) == b"1" and len(r.keys("forkq:kills:*")) == 1
    until(lambda: r.get("stat:processed") == str(WARM + 13).encode(), 5,
          lambda: str(r.get("stat:processed")))


@pytest.mark.parametrize("signum", [signal.SIGTSTP, signal.SIGTERM], ids=["quiet", "stop"])
def test_quiet_and_stop_give_back_held_jobs_at_once(r: redis.Redis, daemon: Any,
                                                    signum: signal.Signals) -> None:
    d, _, held = _start_holding(r, daemon)
    d.signal(signal.SIGTTIN)
    until(lambda: "holding 3 more, not started" in d.log(), 5, lambda: d.log())
    d.signal(signum)
    # the three held Records are back at the front (right end) of the queue, in order,
    # while the Hold job still runs
    until(lambda: r.lrange("queue:default", -3, -1) == [held[7], held[5], held[3]], 5,
          lambda: f"{r.lrange('queue:default', -3, -1)}\n{d.log()}")
    assert _record_order(r) == [] and d.alive()
    [inflight] = [k for k in r.keys("forkq:inflight:*:*")]
    assert r.lrange(inflight, 0, -1) == held[:2]
    assert "gave back 3 held jobs not started" in d.log()


@pytest.mark.slow
def test_jobs_held_behind_a_long_job_go_back_to_their_queue(r: redis.Redis,
                                                            daemon: Any) -> None:
    d, _ = _start_batching(r, daemon, lambda client: _push_holding(client, 12))
    until(lambda: "gave back 3 held jobs not started (the job running has run for" in d.log(),
          15, lambda: d.log())
    assert _record_order(r) == [], "the long job still runs"
    assert [json.loads(job)["args"] for job in r.lrange("queue:default", -3, -1)] == [
        [2], [1], [0]], "back at the front of their queue, in order"
    until(lambda: len(records(r)) == WARM + 11, 20, lambda: d.log())
    assert _record_order(r) == ["h", *range(10)], "each once, in order"


# --- the scripts, on the session's server ------------------------------------------------

INFLIGHT = "forkq:inflight:test:1"


def _batcher(r: redis.Redis, queues: list[tuple[str, int]], batch: int = 3,
             strict: bool = True) -> fetch.Fetcher:
    return fetch.Fetcher(r, INFLIGHT, queues=queues, strict=strict, rng=random.Random(1),
                         batch=batch)


def _names(found: fetch.Fetch) -> list[tuple[str, bytes]]:
    return [(job.queue, job.raw) for job in found.jobs]


def test_a_deep_queue_gives_a_batch_oldest_first_and_a_shallow_one_a_single_job(
        r: redis.Redis) -> None:
    r.lpush("queue:a", *[f"a{n}".encode() for n in range(6)])  # a0 is the oldest
    fetcher = _batcher(r, [("a", 1)])
    assert _names(fetcher.ack_and_fetch(ack=None)) == [("a", b"a0"), ("a", b"a1"), ("a", b"a2")]
    assert r.lrange(INFLIGHT, 0, -1) == [b"queue:a", b"a0", b"queue:a", b"a1", b"queue:a", b"a2"]
    # a0 and a1 completed: one acknowledgement for both (the last one and their count)
    assert fetcher.ack_and_fetch(ack=b"a1", acked=2, fetch=False) == fetch.NOTHING
    assert fetcher.ack_and_fetch(ack=b"a1", acked=2, fetch=False) == fetch.NOTHING  # again
    assert r.lrange(INFLIGHT, 0, -1) == [b"queue:a", b"a2"]
    assert r.get("stat:processed") == b"2"
    # a2 is acknowledged with the fetch; 3 are left: one job only (the queue is shallow)
    assert _names(fetcher.ack_and_fetch(ack=b"a2")) == [("a", b"a3")]
    assert r.get("stat:processed") == b"3"


def test_a_batch_skips_a_wrong_typed_queue_and_honours_the_order_per_job(
        r: redis.Redis) -> None:
    r.set("queue:bad", "x")
    r.lpush("queue:low", *[f"l{n}".encode() for n in range(5)])
    r.lpush("queue:high", b"h0")
    fetcher = _batcher(r, [("bad", 1), ("high", 1), ("low", 1)])
    found = fetcher.ack_and_fetch(ack=None)
    # strict: high first; then high is empty, so low (deep) gives the rest
    assert _names(found) == [("high", b"h0"), ("low", b"l0"), ("low", b"l1")]
    assert found.skipped == [("queue:bad", "string")]


def test_settling_a_batch_into_a_wrong_typed_queue_refuses_and_changes_nothing(
        r: redis.Redis) -> None:
    held = [b"queue:a", b'{"class":"X","args":[],"jid":"j1"}', b"queue:bad", b"held-2"]
    r.rpush(INFLIGHT, *held)
    r.set("queue:bad", "x")
    seen = held_jobs.read(r, INFLIGHT)
    with pytest.raises(redis.ResponseError, match="queue:bad"):
        held_jobs.give_back(r, INFLIGHT, seen, count=False, how="exited", now=time.time())
    assert r.lrange(INFLIGHT, 0, -1) == held
    r.delete("queue:bad")
    back = held_jobs.give_back(r, INFLIGHT, seen, count=False, how="exited", now=time.time())
    assert back.outcome == "requeued" and not r.exists(INFLIGHT)
    assert r.lrange("queue:a", 0, -1) == [held[1]] and r.lrange("queue:bad", 0, -1) == [b"held-2"]


def test_a_list_changed_since_it_was_read_is_not_settled(r: redis.Redis) -> None:
    r.rpush(INFLIGHT, b"queue:a", b"j1", b"queue:a", b"j2")
    seen = held_jobs.read(r, INFLIGHT)
    r.rpush(INFLIGHT, b"queue:a", b"j3")
    with pytest.raises(held_jobs.FencedError):
        held_jobs.give_back(r, INFLIGHT, seen, count=False, how="exited", now=time.time())
    assert r.llen(INFLIGHT) == 6


def test_a_hostile_batch_list_is_settled_without_stopping(r: redis.Redis) -> None:
    good = b'{"class":"X","args":[],"queue":"a","jid":"j2"}'
    r.rpush(INFLIGHT, b"\xff\xfe", b"not json", b"queue:", good, b"queue:a", b"\x00\x01",
            b"stray")
    seen = held_jobs.read(r, INFLIGHT, Done(b"x" * 16, 5))  # names another head: none done
    assert seen.length == 7  # nothing acknowledged: the head is another job
    back = held_jobs.give_back(r, INFLIGHT, seen, count=True, how="killed", now=time.time())
    assert back.outcome == "dead", "the first is no job: buried with its bytes kept"
    assert json.loads(r.zrange("dead", 0, -1)[0])["raw"] == "not json"
    assert r.lrange("queue:default", 0, -1) == [good], "'queue:' names no queue: default"
    assert r.lrange("queue:a", 0, -1) == [b"\x00\x01"], "held bytes go back unchanged"
    assert not r.exists(INFLIGHT)


def test_one_pop_for_same_orders_takes_what_one_pop_per_job_would(r: redis.Redis) -> None:
    # strict order: the batch's jobs share one order, taken by one RPOP with a count, yet
    # exactly as the per-job rule says: while the queue is deep; an emptied queue hands on
    # to the next one in the order, a shallow one ends the batch
    r.lpush("queue:a", *[f"a{n}".encode() for n in range(7)])
    r.lpush("queue:b", *[f"b{n}".encode() for n in range(9)])
    fetcher = fetch.Fetcher(r, INFLIGHT, queues=[("a", 1), ("b", 1)], strict=True,
                            rng=random.Random(1), batch=6, spread=1)
    found = fetcher.ack_and_fetch(ack=None, take=3)  # deep = 3 x 1: a0, then a1 and a2
    assert _names(found) == [("a", b"a0"), ("a", b"a1"), ("a", b"a2")]
    found = fetcher.ack_and_fetch(ack=b"a2", acked=3, take=6)  # deep 6: 4 left in a, shallow
    assert _names(found) == [("a", b"a3")]
    r.delete("queue:a")
    r.lpush("queue:a", b"c0")
    found = fetcher.ack_and_fetch(ack=b"a3", take=2, acked=1)  # deep 2: c0, a empties, b deep
    assert _names(found) == [("a", b"c0"), ("b", b"b0")]
    found = fetcher.ack_and_fetch(ack=b"b0", take=6, acked=2)  # 8 in b: b1, then 2 while deep
    assert _names(found) == [("b", f"b{n}".encode()) for n in range(1, 4)]
    assert r.lrange("queue:b", 0, -1) == [f"b{n}".encode() for n in range(8, 3, -1)]
    assert r.get("stat:processed") == b"6"  # 3 + 1 + 2 acknowledged


def test_a_batch_never_takes_more_than_asked_or_configured(r: redis.Redis) -> None:
    r.lpush("queue:a", *[f"a{n}".encode() for n in range(40)])
    fetcher = _batcher(r, [("a", 1)], batch=4)
    assert len(fetcher.ack_and_fetch(ack=None, take=9).jobs) == 4  # the configured batch
    r.delete(INFLIGHT)
    assert len(fetcher.ack_and_fetch(ack=None, take=2).jobs) == 2
    r.delete(INFLIGHT)
    assert len(fetcher.ack_and_fetch(ack=None, take=0).jobs) == 1


def test_a_give_back_of_held_jobs_refuses_a_wrong_typed_queue_and_a_changed_list(
        r: redis.Redis) -> None:
    # what a processor's heartbeat runs for the jobs held behind a long one (giveback.lua)
    give_back = script(r, "giveback")
    held = [b"queue:a", b"running", b"queue:bad", b"\xff\xfe held", b"queue:a", b"held-2"]
    r.rpush(INFLIGHT, *held)
    r.set("queue:bad", "x")
    with pytest.raises(redis.ResponseError, match="queue:bad"):
        give_back(keys=[INFLIGHT], args=[b"\xff\xfe held", b"held-2"])
    assert r.lrange(INFLIGHT, 0, -1) == held and r.get("queue:bad") == b"x"
    r.delete("queue:bad")
    assert give_back(keys=[INFLIGHT], args=[b"held-2", b"\xff\xfe held"]) == 0, "not its tail"
    assert r.lrange(INFLIGHT, 0, -1) == held
    assert give_back(keys=[INFLIGHT], args=[b"\xff\xfe held", b"held-2"]) == 2
    assert r.lrange(INFLIGHT, 0, -1) == held[:2], "the running job stays"
    assert r.lrange("queue:bad", 0, -1) == [b"\xff\xfe held"], "bytes unchanged, at the front"
    assert r.lrange("queue:a", 0, -1) == [b"held-2"]
