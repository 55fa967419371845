"""The client's wire format and every Lua script, against the throwaway server."""

from __future__ import annotations

import json
import random
import re
import time
from collections import deque

import pytest
import redis

from forkq import keys, wirejson
from forkq import payload as payloads
from forkq.client import Client
from forkq.daemon import held_jobs
from forkq.daemon.children import failures, fetch
from forkq.middleware import Chain

DECIMAL = re.compile(r'"(created_at|enqueued_at)":\d+\.\d+[,}]')


def test_push_writes_sidekiqs_immediate_format(r: redis.Redis) -> None:
    before = time.time()
    jid = Client(r).push({"class": "HardWorker", "args": ["bob", 1], "tags": ["a"]})
    assert r.smembers("queues") == {b"default"}
    (raw,) = r.lrange("queue:default", 0, -1)
    assert DECIMAL.search(raw.decode())
    job = json.loads(raw)
    assert list(job) == ["retry", "queue", "tags", "args", "class", "jid", "created_at",
                         "enqueued_at"]
    assert (job["jid"], job["class"], job["args"], job["retry"]) == (jid, "HardWorker",
                                                                   ["bob", 1], True)
    assert before <= job["created_at"] <= job["enqueued_at"] <= time.time()


def test_future_jobs_go_to_schedule_without_enqueued_at(r: redis.Redis) -> None:
    client = Client(r)
    client.push({"class": "X", "args": [], "at": 3600})
    client.push({"class": "X", "args": [], "at": time.time() - 5, "queue": "past"})
    ((raw, score),) = r.zrange("schedule", 0, -1, withscores=True)
    assert "enqueued_at" not in json.loads(raw) and "at" not in json.loads(raw)
    assert abs(score - (time.time() + 3600)) < 5
    assert r.llen("queue:past") == 1 and r.smembers("queues") == {b"past"}


def test_push_bulk_is_one_lpush_with_shared_times(r: redis.Redis) -> None:
    jids = Client(r).push_bulk({"class": "X", "args": [[n] for n in range(5)], "queue": "b"})
    raws = r.lrange("queue:b", 0, -1)
    jobs = [json.loads(raw) for raw in reversed(raws)]
    assert [j["args"] for j in jobs] == [[n] for n in range(5)]
    assert [j["jid"] for j in jobs] == jids and len(set(jids)) == 5
    assert len({(j["created_at"], j["enqueued_at"]) for j in jobs}) == 1


def test_push_bulk_writes_with_middleware_or_without_the_same_bytes(r: redis.Redis) -> None:
    """Without client middleware the jobs' shared fields are encoded once
    (payload.encode_immediate); with it each payload is encoded on its own."""
    chain: Chain[payloads.Payload, payloads.Payload] = Chain()
    chain.add(lambda p, nxt: nxt())
    item = {"class": "X", "args": deque([(1, "é"), [{"k": [1.5e-7]}], []]), "queue": "b",
            "retry": 3, "tags": ["a"], "enqueued_at": 5, "retry_for": 60.5}
    shown = []
    for client in (Client(r), Client(r, middleware=chain)):
        jids = client.push_bulk(item)
        for raw in r.lrange("queue:b", 0, -1):
            job = json.loads(raw)
            assert job["jid"] in jids
            shown.append(raw.replace(job["jid"].encode(), b"J").replace(
                wirejson.dumps(job["created_at"]).encode(), b"T"))
        r.delete("queue:b")
    assert shown[:3] == shown[3:] and b'"enqueued_at":T,' in shown[0]
    for client in (Client(r), Client(r, middleware=chain)):
        with pytest.raises(TypeError, match=r"^\$\.args\[0\]: object"):
            client.push_bulk({"class": "X", "args": deque([[1], [object()]])})
    assert r.keys("*") == [b"queues"]  # nothing sent by the refused pushes


def test_client_middleware_can_change_or_stop_a_push(r: redis.Redis) -> None:
    chain: Chain[payloads.Payload, payloads.Payload] = Chain()
    chain.add(lambda p, nxt: None if p["args"] == ["drop"] else (p.update(tag=1), nxt())[1])
    client = Client(r, middleware=chain)
    assert client.push({"class": "X", "args": ["drop"]}) is None
    assert client.push({"class": "X", "args": ["keep"]})
    assert [json.loads(x)["tag"] for x in r.lrange("queue:default", 0, -1)] == [1]


def test_bad_args_raise_in_the_caller_before_anything_is_sent(r: redis.Redis) -> None:
    seen: list[payloads.Payload] = []
    chain: Chain[payloads.Payload, payloads.Payload] = Chain()
    chain.add(lambda p, nxt: (seen.append(p), nxt())[1])
    for client in (Client(r), Client(r, middleware=chain)):
        for bad in ({1, 2}, "lone \ud800", float("nan"), b"bytes"):
            with pytest.raises((TypeError, ValueError)):
                client.push({"class": "X", "args": [bad]})
            with pytest.raises((TypeError, ValueError)):
                client.push_bulk({"class": "X", "args": [[1], [bad], [3]]})
    # only the good job ahead of the bad one in each push_bulk: Sidekiq checks first too
    assert [p["args"] for p in seen] == [[1]] * 4
    chain.add(lambda p, nxt: (p.update(tag=object()), nxt())[1])
    with pytest.raises(TypeError, match=r"\$\.tag"):
        Client(r, middleware=chain).push({"class": "X", "args": [1]})
    assert r.keys("*") == []


def test_pushed_bytes_are_the_exact_encoders(r: redis.Redis) -> None:
    args = [1e20, 1.5e-7, 0.1, -0.0, 1e16, 2**70, "é/\u2028\U0001f600\x01", {"k": (1, None)}]
    Client(r).push({"class": "X", "args": args, "queue": "exact"})
    Client(r).push_bulk({"class": "X", "args": [args, [1.0]], "queue": "exact"})
    Client(r).push({"class": "X", "args": args, "at": 3600})
    raws = r.lrange("queue:exact", 0, -1) + r.zrange("schedule", 0, -1)
    assert len(raws) == 4
    for raw in raws:
        assert raw == wirejson.dumps_exact(wirejson.loads(raw)).encode("utf-8")
    assert b'"args":[1.0e+20,1.5e-07,0.1,-0.0,1.0e+16,' in raws[-1]


def _fetcher(r: redis.Redis, queues: list[tuple[str, int]], strict: bool = True
             ) -> fetch.Fetcher:
    return fetch.Fetcher(r, "forkq:inflight:test:1", queues=queues, strict=strict,
                         rng=random.Random(1))


def test_fetch_moves_the_oldest_job_into_the_inflight_list(r: redis.Redis) -> None:
    r.lpush("queue:a", b"first", b"second")
    fetcher = _fetcher(r, [("a", 1)])
    got = fetcher.ack_and_fetch(ack=None)
    assert got == fetch.Fetch([fetch.Fetched("a", b"first")], [])
    assert r.lrange("forkq:inflight:test:1", 0, -1) == [b"queue:a", b"first"]
    assert fetcher.ack_and_fetch(ack=b"first").jobs == [fetch.Fetched("a", b"second")]
    assert r.lrange("forkq:inflight:test:1", 0, -1) == [b"queue:a", b"second"]
    assert fetcher.ack_and_fetch(ack=b"second").jobs == []
    assert r.exists("forkq:inflight:test:1") == 0
    assert int(r.get("stat:processed") or 0) == 2
    daily = keys.daily(keys.STAT_PROCESSED, keys.utc_date())
    assert int(r.get(daily) or 0) == 2 and r.ttl(daily) > 157_000_000


def test_strict_fetch_takes_queues_in_order(r: redis.Redis) -> None:
    r.lpush("queue:low", b"l")
    r.lpush("queue:high", b"h")
    fetcher = _fetcher(r, [("high", 1), ("low", 1)])
    assert fetcher.ack_and_fetch(ack=None).jobs == [fetch.Fetched("high", b"h")]
    assert fetcher.ack_and_fetch(ack=b"h").jobs == [fetch.Fetched("low", b"l")]


def test_a_call_repeated_after_a_lost_reply_loses_no_job(r: redis.Redis) -> None:
    """The script ran but its reply never arrived; the processor calls again, as it does."""
    r.lpush("queue:a", b"A", b"B", b"C")
    fetcher = _fetcher(r, [("a", 1)])
    assert fetcher.ack_and_fetch(ack=None).jobs == [fetch.Fetched("a", b"A")]
    fetcher.ack_and_fetch(ack=b"A")  # acks A, moves B in: this reply is "lost"
    assert fetcher.ack_and_fetch(ack=b"A").jobs == [fetch.Fetched("a", b"B")]  # B, not deleted
    assert fetcher.ack_and_fetch(ack=None).jobs == [fetch.Fetched("a", b"B")]  # nor stranded
    assert fetcher.ack_and_fetch(ack=b"B").jobs == [fetch.Fetched("a", b"C")]
    assert r.lrange("forkq:inflight:test:1", 0, -1) == [b"queue:a", b"C"]
    assert int(r.get("stat:processed") or 0) == 2


def test_requeue_puts_the_job_back_at_the_front_unchanged(r: redis.Redis) -> None:
    held, following = b'{"class":"A","args":[1]}', b'{"class":"A","args":[2]}'
    r.lpush("queue:a", held, following)
    r.sadd(keys.INFLIGHT_REGISTRY, "forkq:inflight:test:1")
    _fetcher(r, [("a", 1)]).ack_and_fetch(ack=None)
    key = "forkq:inflight:test:1"
    back = held_jobs.give_back(r, key, held_jobs.read(r, key), count=False, how="", now=1.0)
    assert (back.outcome, back.job) == ("requeued", held)
    assert r.lrange("queue:a", 0, -1) == [following, held]  # right end = fetched next
    assert r.exists(key) == 0
    assert r.smembers(keys.INFLIGHT_REGISTRY) == set()
    back = held_jobs.give_back(r, key, held_jobs.read(r, key), count=False, how="", now=1.0)
    assert back.outcome == "empty"


def _hold(r: redis.Redis, job: bytes) -> bytes:
    """Put ``job`` in the in-flight list forkq:inflight:test:1, as a fetch does."""
    r.lpush("queue:a", job)
    _fetcher(r, [("a", 1)]).ack_and_fetch(ack=None)
    return job


def test_fail_files_retry_then_dead_and_counts(r: redis.Redis) -> None:
    key = "forkq:inflight:test:1"
    failure = failures.Failure("retry", '{"jid":"1"}', 1e10)
    assert failures.file(r, key, failure, held=_hold(r, b"x"))
    assert r.zrange("retry", 0, -1, withscores=True) == [(b'{"jid":"1"}', 1e10)]
    assert r.exists(key) == 0
    now = time.time()
    r.zadd("dead", {"ancient": now - keys.DEAD_TIMEOUT - 10})
    failures.file(r, key, failures.Failure("dead", '{"jid":"2"}', now), held=_hold(r, b"y"))
    assert r.zrange("dead", 0, -1) == [b'{"jid":"2"}']
    failures.file(r, key, failures.Failure("drop", '{"jid":"3"}', now), held=_hold(r, b"z"))
    assert r.zcard("retry") == 1 and r.zcard("dead") == 1
    assert (int(r.get("stat:processed") or 0), int(r.get("stat:failed") or 0)) == (3, 3)


def test_fail_files_nothing_for_a_job_the_list_no_longer_holds(r: redis.Redis) -> None:
    key = "forkq:inflight:test:1"
    _hold(r, b"recovered")
    r.delete(key)  # the leader's orphan sweep gave it back while this process was cut off
    assert not failures.file(r, key, failures.Failure("retry", '{"jid":"1"}', 1e10),
                          held=b"recovered")
    assert r.zcard("retry") == 0 and r.get("stat:failed") is None


def test_dead_set_is_trimmed_to_its_size(r: redis.Redis) -> None:
    now = time.time()
    r.zadd("dead", {f"old{n}": now - 20_000 + n for n in range(keys.DEAD_MAX_JOBS)})
    failures.file(r, "forkq:inflight:test:1", failures.Failure("dead", "newest", now),
               held=_hold(r, b"x"))
    assert r.zcard("dead") == keys.DEAD_MAX_JOBS
    assert r.zrange("dead", -1, -1) == [b"newest"] and r.zscore("dead", "old0") is None
