"""The operator's Python API (forkq.api) on the suite's throwaway server.

Data is written the way forkq, Sidekiq 6.4.1 and (from sidekiq-wire.md §10) Sidekiq
7.x / 8.x write it; every action is checked for neither losing nor duplicating the job,
also when it races another action or the leader's mover.
"""

from __future__ import annotations

import json
import time

import pytest
import redis

import forkq
from forkq import api, keys, wirejson
from forkq import payload as payloads
from forkq.daemon.children import due_jobs, failures
from forkq.daemon.children.lease import Lease
from forkq.errors import ForkqError, NotFoundError


def _job(klass: str = "Record", args: list[object] | None = None, **extra: object
         ) -> dict[str, object]:
    job = payloads.build(klass, args if args is not None else [1], queue="default",
                         now=time.time() - 5)
    job.update(extra)
    return job


def _failed(job: dict[str, object], count: int = 0) -> dict[str, object]:
    for _ in range(count + 1):
        failures.record_error(job, "ValueError", "boom", time.time())
    return job


# --- queues ------------------------------------------------------------------------------


def test_queue_size_latency_jobs_find_delete_clear(r: redis.Redis) -> None:
    client = forkq.Client(r)
    jids = [client.push({"class": "Record", "args": [n], "queue": "q1"}) for n in range(120)]
    client.push({"class": "Record", "args": [0], "queue": "q2"})
    assert [q.name for q in api.Queue.all(r)] == ["q1", "q2"]
    queue = api.Queue(r, "q1")
    assert queue.size() == 120 and queue.exists()
    assert 0 < queue.latency() < 60
    assert [job.jid for job in queue.jobs()] == jids[::-1], "newest first, across pages"
    assert [job.args for job in queue.next_jobs(3)] == [[0], [1], [2]], "next to run first"

    found = queue.find_job(str(jids[70]))
    assert found is not None and found.args == [70] and found.klass == "Record"
    assert queue.delete(found) and not queue.delete(found), "the second delete finds nothing"
    assert queue.size() == 119 and queue.find_job(str(jids[70])) is None

    assert queue.clear() == 119
    assert queue.size() == 0 and not queue.exists()
    assert [q.name for q in api.Queue.all(r)] == ["q2"]


def test_latency_reads_sidekiq_8_milliseconds(r: redis.Redis) -> None:
    ten_seconds_ago_ms = int((time.time() - 10) * 1000)
    job = _job(enqueued_at=ten_seconds_ago_ms, created_at=ten_seconds_ago_ms)
    r.lpush("queue:eight", wirejson.dumps(job))
    r.sadd("queues", "eight")
    assert 9 < api.Queue(r, "eight").latency() < 30
    (record,) = api.Queue(r, "eight").jobs()
    assert record.enqueued_at == pytest.approx(ten_seconds_ago_ms / 1000)
    assert api.Stats.read(r).queues == {"eight": 1}


def test_iterating_a_queue_while_it_is_consumed_or_deleted_from_skips_nothing(
        r: redis.Redis) -> None:
    client = forkq.Client(r)
    jids = [client.push({"class": "Record", "args": [n], "queue": "q"}) for n in range(200)]
    queue = api.Queue(r, "q")
    seen: list[str] = []
    for job in queue.jobs():
        seen.append(job.jid)
        if len(seen) == 50:
            for _ in range(30):  # processors take the oldest 30 meanwhile
                r.rpop("queue:q")
    assert set(jids[30:]) <= set(seen), "every job still queued was seen"
    deleted = sum(1 for job in queue.jobs() if queue.delete(job))
    assert deleted == 170 and queue.size() == 0


# --- sorted sets -----------------------------------------------------------------------------


def test_retry_pushes_once_with_the_count_lowered(r: redis.Redis) -> None:
    job = _failed(_job("Boom", ["x"], tags=["t"], custom={"k": 1}), count=2)
    member = wirejson.dumps(job)
    r.zadd("retry", {member: time.time() + 3600})
    retry_set = api.RetrySet(r)
    entry = retry_set.find_job(str(job["jid"]))
    assert entry is not None and entry.retry_count == 2 and entry.error_class == "ValueError"

    assert retry_set.retry(entry)
    assert not retry_set.retry(entry), "a second retry of the same entry pushes nothing"
    assert r.zcard("retry") == 0 and r.llen("queue:default") == 1
    pushed = json.loads(r.lindex("queue:default", 0) or b"")
    assert pushed["jid"] == job["jid"] and pushed["retry_count"] == 1
    assert pushed["tags"] == ["t"] and pushed["custom"] == {"k": 1}
    assert pushed["enqueued_at"] > time.time() - 5
    assert r.sismember("queues", "default")


def test_add_to_queue_kill_delete_and_clear(r: redis.Redis) -> None:
    scheduled = api.ScheduledSet(r)
    jobs = [_job(args=[n]) for n in range(4)]
    for n, job in enumerate(jobs):
        r.zadd("schedule", {wirejson.dumps(job): time.time() + 100 + n})
    entries = list(scheduled)
    assert [e.args for e in entries] == [[0], [1], [2], [3]]
    assert [e.args for e in scheduled.entries(2, reverse=True)] == [[3], [2]]

    assert scheduled.add_to_queue(entries[0])
    (queued,) = r.lrange("queue:default", 0, -1)
    assert json.loads(queued)["jid"] == jobs[0]["jid"] and "retry_count" not in json.loads(queued)

    assert scheduled.kill(entries[1]) and not scheduled.kill(entries[1])
    dead = api.DeadSet(r)
    (buried,) = list(dead)
    assert buried.jid == jobs[1]["jid"] and buried.score == pytest.approx(time.time(), abs=5)
    with pytest.raises(ForkqError, match="already dead"):
        dead.kill(buried)

    assert scheduled.delete(entries[2]) and not scheduled.delete(entries[2])
    assert scheduled.size() == 1 and scheduled.clear() == 1 and scheduled.size() == 0
    assert r.llen("queue:default") == 1 and dead.size() == 1


def test_reschedule_moves_the_member_also_when_another_client_wrote_its_json(
        r: redis.Redis) -> None:
    job = _failed(_job("Boom", ["é/x", 1e-05]))
    foreign = json.dumps(job)  # Python's default JSON: spaces and \\u escapes, not Ruby's bytes
    r.zadd("retry", {foreign: time.time() + 60})
    retry_set = api.RetrySet(r)
    entry = retry_set.find_job(str(job["jid"]))
    assert entry is not None
    target = time.time() + 7200
    assert retry_set.reschedule(entry, target)
    ((member, score),) = r.zrange("retry", 0, -1, withscores=True)
    assert member.decode() == foreign and score == pytest.approx(target)
    retry_set.delete(entry)
    assert not retry_set.reschedule(entry, target), "gone: nothing added"
    assert r.zcard("retry") == 0


def test_an_action_racing_the_leaders_mover_acts_once(r: redis.Redis) -> None:
    job = _failed(_job("Boom"))
    r.zadd("retry", {wirejson.dumps(job): time.time() - 1})  # already due
    entry = api.RetrySet(r).find_job(str(job["jid"]))
    assert entry is not None
    lease = Lease(r, identity="test:1:abcdefabcdef", pid=1, ttl=10.0)
    assert lease.acquire()
    assert due_jobs.move_due(r, lease.token, time.time()) == 1
    assert not api.RetrySet(r).retry(entry), "the mover took it first"
    assert r.llen("queue:default") == 1 and r.zcard("retry") == 0


def test_iterating_a_set_while_entries_leave_skips_none(r: redis.Redis) -> None:
    now = time.time()
    members = {wirejson.dumps(_job(args=[n])): now + 100 + n // 3 for n in range(200)}  # ties
    r.zadd("schedule", members)
    scheduled = api.ScheduledSet(r)
    assert sum(1 for entry in scheduled if scheduled.delete(entry)) == 200
    r.zadd("schedule", members)
    seen = []
    for entry in scheduled.entries(reverse=True):
        seen.append(entry.raw)
        if len(seen) == 10:
            r.zremrangebyrank("schedule", 0, 19)  # the mover takes the 20 soonest meanwhile
    assert len(seen) == 180 and len(set(seen)) == 180
    assert [e.args for e in scheduled.entries(2)] == [[20], [21]]


def test_retry_all_and_kill_all_leave_nothing_behind(r: redis.Redis) -> None:
    for n in range(130):
        r.zadd("retry", {wirejson.dumps(_failed(_job(args=[n]))): time.time() + 60 + n})
    assert api.RetrySet(r).kill_all() == 130
    assert r.zcard("retry") == 0 and r.zcard("dead") == 130
    assert api.DeadSet(r).retry_all() == 130
    assert r.zcard("dead") == 0 and r.llen("queue:default") == 130
    counts = {json.loads(m)["retry_count"] for m in r.lrange("queue:default", 0, -1)}
    assert counts == {-1}, "Sidekiq's retry lowers retry_count; the next failure makes it 0"


def test_an_entry_that_is_not_a_job_can_be_listed_and_deleted_not_retried(
        r: redis.Redis) -> None:
    r.zadd("dead", {b"\xffnot json": time.time()})
    dead = api.DeadSet(r)
    (entry,) = list(dead)
    assert entry.item == {} and entry.jid == ""
    with pytest.raises(ForkqError, match="not a job"):
        dead.retry(entry)
    assert dead.delete(entry) and dead.size() == 0


def test_error_fields_and_backtrace_read_both_base64_forms(r: redis.Redis) -> None:
    job = _failed(_job("Boom"), count=1)
    lines = ["a.py:1:in `x'", "b.py:2:in `y'"]
    job["error_backtrace"] = failures.compress_backtrace(lines)  # 6.x: MIME lines
    strict = _failed(_job("Boom"))
    strict["error_backtrace"] = failures.compress_backtrace(lines).replace("\n", "")  # 7.2.1+
    strict["failed_at"] = int(time.time() * 1000)  # 8.x: milliseconds
    r.zadd("retry", {wirejson.dumps(job): 1, wirejson.dumps(strict): 2})
    first, second = list(api.RetrySet(r))
    assert first.error_backtrace == second.error_backtrace == lines
    assert first.retry_count == 1 and first.time("retried_at") is not None
    assert second.time("failed_at") == pytest.approx(time.time(), abs=5)
    assert first.summary()["error_message"] == "boom" and first.summary()["set"] == "retry"


# --- processes ---------------------------------------------------------------------------------


def _process(r: redis.Redis, identity: str, info: dict[str, object], *, busy: int = 0,
             concurrency: int | None = None, work_keys: tuple[str, ...] = (),
             work: dict[str, str] | None = None) -> None:
    r.sadd("processes", identity)
    fields: dict[str, object] = {"info": json.dumps(info), "busy": busy, "beat": time.time(),
                                 "quiet": "false", "rss": 1000, "rtt_us": 50}
    if concurrency is not None:
        fields["concurrency"] = concurrency
    r.hset(identity, mapping=fields)  # type: ignore[arg-type]
    r.expire(identity, 60)
    for key in work_keys:
        r.hset(f"{identity}:{key}", mapping=work or {})


def test_process_set_reads_sidekiq_6_7_and_8_records(r: redis.Redis) -> None:
    job = wirejson.dumps(_job("HardWorker", ["bob", 1]))
    now = int(time.time())
    _process(r, "six:1:aaaaaaaaaaaa", {"hostname": "six", "pid": 1, "tag": "app",
             "concurrency": 10, "queues": ["default"], "labels": [], "started_at": now,
             "identity": "six:1:aaaaaaaaaaaa"}, busy=1, work_keys=("workers",),
             work={"tid-1": json.dumps({"queue": "default", "payload": job, "run_at": now})})
    _process(r, "eight:2:bbbbbbbbbbbb", {"hostname": "eight", "pid": 2, "concurrency": 5,
             "capsules": {"default": {"concurrency": 5, "mode": "weighted",
                                      "weights": {"critical": 2, "low": 1}}},
             "version": "8.1.2", "started_at": now, "identity": "eight:2:bbbbbbbbbbbb"},
             busy=1, concurrency=7, work_keys=("work",),
             work={"tid-2": json.dumps({"queue": "critical", "payload": json.loads(job),
                                        "run_at": now - 3})})
    r.sadd("processes", "gone:3:cccccccccccc")  # its hash expired: listing unlists it

    processes = api.ProcessSet(r)
    eight, six = processes.live()  # sorted by identity
    assert (six.identity, six.tag, six.pid, six.concurrency, six.busy, six.queues) == (
        "six:1:aaaaaaaaaaaa", "app", 1, 10, 1, ["default"])
    assert (eight.concurrency, eight.queues, eight.version) == (7, ["critical", "low"], "8.1.2")
    assert not r.sismember("processes", "gone:3:cccccccccccc")
    assert processes.total_concurrency() == 17
    work = processes.work()
    assert [(w.identity, w.thread, w.queue, w.payload["class"]) for w in work] == [
        ("eight:2:bbbbbbbbbbbb", "tid-2", "critical", "HardWorker"),
        ("six:1:aaaaaaaaaaaa", "tid-1", "default", "HardWorker")]
    assert api.Stats.read(r).workers_size == 2 and api.Stats.read(r).processes_size == 2


def test_find_quiet_stop_and_refusals(r: redis.Redis) -> None:
    info = {"hostname": "h", "pid": 10, "concurrency": 1, "queues": ["default"],
            "started_at": int(time.time())}  # an integer: seconds, in every Sidekiq version
    _process(r, "h:10:aaaaaaaaaaaa", {**info, "identity": "h:10:aaaaaaaaaaaa"})
    _process(r, "h:101:bbbbbbbbbbbb", {**info, "pid": 101, "identity": "h:101:bbbbbbbbbbbb"})
    _process(r, "h:12:cccccccccccc", {**info, "pid": 12, "embedded": True,
                                      "identity": "h:12:cccccccccccc"})
    processes = api.ProcessSet(r)
    assert processes.find("h:10").identity == "h:10:aaaaaaaaaaaa", "whole parts, not h:101"
    with pytest.raises(NotFoundError, match="matches 3 processes"):
        processes.find("h")
    for absent in ("x:1", "h:1"):
        with pytest.raises(NotFoundError, match=f"no live process '{absent}'"):
            processes.find(absent)

    processes.signal(processes.find("h:10"), "quiet")
    processes.signal(processes.find("h:10"), "stop")
    assert r.lrange("h:10:aaaaaaaaaaaa-signals", 0, -1) == [b"TERM", b"TSTP"]
    assert 0 < r.ttl("h:10:aaaaaaaaaaaa-signals") <= 60
    with pytest.raises(ForkqError, match="embedded"):
        processes.signal(processes.find("h:12"), "stop")
    with pytest.raises(ForkqError, match="not a forkq process: it cannot reload"):
        processes.signal(processes.find("h:10"), "reload")  # Sidekiq would die of a HUP
    assert r.llen("h:10:aaaaaaaaaaaa-signals") == 2 and not r.exists("h:12:cccccccccccc-signals")
    assert processes.find("h:10").started_at == pytest.approx(time.time(), abs=5)


def test_stats_and_history(r: redis.Redis) -> None:
    client = forkq.Client(r)
    client.push({"class": "Record", "args": [1]})
    client.push({"class": "Record", "args": [2], "queue": "other"})
    client.push({"class": "Record", "args": [3], "at": time.time() + 60})
    r.zadd("retry", {"a": 1})
    r.zadd("dead", {"b": 1, "c": 2})
    today = keys.utc_date()
    r.set("stat:processed", 12)
    r.set("stat:failed", 3)
    r.set(keys.daily("stat:processed", today), 5)
    stats = api.Stats.read(r)
    assert (stats.processed, stats.failed, stats.enqueued, stats.scheduled_size,
            stats.retry_size, stats.dead_size) == (12, 3, 2, 1, 1, 2)
    assert stats.queues == {"default": 1, "other": 1} and stats.default_queue_latency < 60
    assert stats.latencies.keys() == {"default", "other"} and 0 < stats.latencies["other"] < 60
    days = api.history(r, 3)
    assert days[0]["date"] == today and days[0]["processed"] == 5
    assert len(days) == 3 and days[1]["processed"] == 0
