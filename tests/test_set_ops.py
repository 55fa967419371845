"""The dashboard's data layer for ``schedule``, ``retry`` and ``dead`` (issue #15 item 1):
paging by position, keys naming exact members, bounded searches continued by cursor, bulk
actions on a selection and on everything matching; hostile members and wrong-typed keys."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from forkq import keys
from forkq.errors import ForkqError
from forkq.ops import set_bulk, set_pages, set_search
from forkq.ops.records import SortedEntry
from forkq.ops.sorted_sets import DeadSet, RetrySet, ScheduledSet

HOSTILE = b"\xff\xfe not json {"


def job(n: int, **fields: Any) -> str:
    return json.dumps({"class": "Mailer", "args": [n], "queue": "default",
                       "jid": f"{n:024x}", "retry": True, "created_at": 1.0, **fields})


def fill(r: redis.Redis, name: str, count: int, **fields: Any) -> None:
    r.zadd(name, {job(n, **fields): float(n) for n in range(1, count + 1)})


def test_pages_by_position_newest_first_or_due_order(r: redis.Redis) -> None:
    fill(r, keys.DEAD, 60)
    first = set_pages.page(DeadSet(r), 1, size=25, newest_first=True)
    assert [e.score for e in first.entries] == [float(n) for n in range(60, 35, -1)]
    assert (first.total, first.pages, first.number) == (60, 3, 1)
    last = set_pages.page(DeadSet(r), 3, size=25, newest_first=True)
    assert [e.score for e in last.entries] == [float(n) for n in range(10, 0, -1)]
    assert (last.number, last.pages, last.first_index) == (3, 3, 50)
    assert set_pages.page(DeadSet(r), 4, size=25).entries == []
    fill(r, keys.SCHEDULE, 30)
    due = set_pages.page(ScheduledSet(r), 2, size=25)
    assert [e.score for e in due.entries] == [26.0, 27.0, 28.0, 29.0, 30.0]
    clamped = set_pages.page(ScheduledSet(r), -3, size=10_000)
    assert (clamped.number, clamped.size, len(clamped.entries)) == (1, 500, 30)


def test_a_key_names_one_exact_member_hostile_ones_too(r: redis.Redis) -> None:
    r.zadd(keys.RETRY, {job(1): 5.5, HOSTILE: 5.5, job(2): 1e9 + 0.123456789, job(3): 1e20,
                        job(4): -2.25, job(5): float("inf"), job(6): float("-inf")})
    entries = set_pages.page(RetrySet(r), 1).entries
    assert len(entries) == 7
    for entry in entries:
        found = set_pages.resolve(RetrySet(r), set_pages.entry_key(entry))
        assert found is not None and found.raw == entry.raw and found.score == entry.score
    hostile = next(e for e in entries if e.raw == HOSTILE)
    assert hostile.item == {} and hostile.jid == ""
    r.zrem(keys.RETRY, HOSTILE)
    assert set_pages.resolve(RetrySet(r), set_pages.entry_key(hostile)) is None
    for bad in ("", "x", "5.5-zz", "nan-0123456789abcdef", "5.5-0123456789abcde"):
        assert set_pages.resolve(RetrySet(r), bad) is None


def test_a_key_is_found_among_many_members_of_the_same_score(r: redis.Redis) -> None:
    r.zadd(keys.SCHEDULE, {job(n): 7.0 for n in range(1200)})
    last = set_pages.page(ScheduledSet(r), 1, size=500, newest_first=True).entries[0]
    found = set_pages.resolve(ScheduledSet(r), set_pages.entry_key(last))
    assert found is not None and found.raw == last.raw


def test_a_wrong_typed_set_is_reported_by_name(r: redis.Redis) -> None:
    r.set(keys.DEAD, "not a sorted set")
    with pytest.raises(ForkqError, match="'dead' is not a sorted set"):
        set_pages.page(DeadSet(r))
    with pytest.raises(ForkqError, match="'dead' is not a sorted set"):
        set_search.search(DeadSet(r), "x")
    with pytest.raises(ForkqError, match="'dead' is not a sorted set"):
        set_bulk.act_on_matching(DeadSet(r), "delete", "")


def _jids(found: set_search.Found) -> set[str]:
    return {e.jid for e in found.entries}


def test_search_by_class_jid_args_and_error_text(r: redis.Redis) -> None:
    r.zadd(keys.DEAD, {
        job(1, error_class="Net::ReadTimeout", error_message="took too long"): 1,
        json.dumps({"class": "Billing::Charge", "args": ['he said "hi"', {"x": 1}],
                    "queue": "q", "jid": "c" * 24}): 2,
        job(3, error_class="KeyError", error_message="missing 'invoice'"): 3,
        HOSTILE: 4,
    })
    dead = DeadSet(r)
    assert _jids(set_search.search(dead, "billing::CHARGE")) == {"c" * 24}
    assert _jids(set_search.search(dead, f"{3:024x}")) == {f"{3:024x}"}
    assert _jids(set_search.search(dead, 'said "hi"')) == {"c" * 24}
    assert _jids(set_search.search(dead, "readtimeout")) == {f"{1:024x}"}
    assert _jids(set_search.search(dead, "missing 'invoice'")) == {f"{3:024x}"}
    every = set_search.search(dead, "")
    assert len(every.entries) == 4 and not every.more
    assert [e.score for e in set_search.search(dead, "", newest_first=True).entries] == [
        4.0, 3.0, 2.0, 1.0]
    hostile = set_search.search(dead, "NOT JSON")
    assert [e.raw for e in hostile.entries] == [HOSTILE]


def test_search_narrowed_to_a_field(r: redis.Redis) -> None:
    r.zadd(keys.RETRY, {
        job(1, error_message="Mailer exploded"): 1,
        json.dumps({"class": "Other", "args": ["Mailer"], "queue": "q", "jid": "d" * 24}): 2,
        HOSTILE: 3,
    })
    retry = RetrySet(r)
    assert len(set_search.search(retry, "mailer").entries) == 2
    assert _jids(set_search.search(retry, "mailer", field="class")) == {f"{1:024x}"}
    assert _jids(set_search.search(retry, "mailer", field="args")) == {"d" * 24}
    assert _jids(set_search.search(retry, "exploded", field="error")) == {f"{1:024x}"}
    assert _jids(set_search.search(retry, "d" * 10, field="jid")) == {"d" * 24}
    assert set_search.search(retry, "json", field="class").entries == []
    with pytest.raises(ValueError):
        set_search.search(retry, "x", field="payload")


def test_glob_characters_are_literal(r: redis.Redis) -> None:
    r.zadd(keys.DEAD, {job(1, error_message="a*b[c]?d\\e^-f"): 1, job(2): 2})
    assert _jids(set_search.search(DeadSet(r), "*b[c]?d\\e^-")) == {f"{1:024x}"}
    assert set_search.search(DeadSet(r), "a?b").entries == []


def test_search_work_is_bounded_and_continues_by_cursor(r: redis.Redis) -> None:
    r.zadd(keys.DEAD, {job(n, error_message="needle" if n % 1000 == 0 else "hay"): n
                       for n in range(20_000)})
    first = set_search.search(DeadSet(r), "needle", budget=1000)
    assert first.more and first.examined <= 1000
    seen: set[str] = set()
    cursor, calls = 0, 0
    while True:
        found = set_search.search(DeadSet(r), "needle", cursor=cursor, budget=1000)
        assert found.examined <= 1000
        seen |= _jids(found)
        cursor, calls = found.cursor, calls + 1
        if not found.more:
            break
        assert calls < 200
    assert seen == {f"{n:024x}" for n in range(0, 20_000, 1000)}
    assert calls > 5  # the set was never read in one call


def _keys_of(r: redis.Redis, name: str, *scores: float) -> list[str]:
    found = r.zrangebyscore(name, "-inf", "+inf", withscores=True)
    return [set_pages.entry_key(SortedEntry(m, score=s)) for m, s in found if s in scores]


def test_bulk_on_a_selection(r: redis.Redis) -> None:
    fill(r, keys.DEAD, 5, retry_count=3)
    r.zadd(keys.DEAD, {HOSTILE: 6})
    dead = DeadSet(r)
    chosen = [*_keys_of(r, keys.DEAD, 1, 2, 6), "1.0-0000000000000000"]
    outcome = set_bulk.act_on_keys(dead, "retry", chosen)
    assert (outcome.acted, outcome.gone, outcome.refused) == (2, 1, 1)
    assert "not a job" in outcome.reasons[0]
    queued = [json.loads(m) for m in r.lrange("queue:default", 0, -1)]
    assert sorted(j["args"][0] for j in queued) == [1, 2]
    assert all(j["retry_count"] == 2 and "enqueued_at" in j for j in queued)
    assert r.sismember(keys.QUEUES, "default")
    outcome = set_bulk.act_on_keys(dead, "delete", _keys_of(r, keys.DEAD, 3, 6))
    assert (outcome.acted, outcome.gone, outcome.refused) == (2, 0, 0)
    assert r.zrange(keys.DEAD, 0, -1, withscores=True) == [
        (job(4, retry_count=3).encode(), 4.0), (job(5, retry_count=3).encode(), 5.0)]
    with pytest.raises(ValueError):
        set_bulk.act_on_keys(dead, "kill", [])


def test_bulk_kill_and_add_to_queue(r: redis.Redis) -> None:
    fill(r, keys.RETRY, 3)
    fill(r, keys.SCHEDULE, 2)
    outcome = set_bulk.act_on_keys(RetrySet(r), "kill", _keys_of(r, keys.RETRY, 1, 2))
    assert outcome.acted == 2 and r.zcard(keys.DEAD) == 2 and r.zcard(keys.RETRY) == 1
    outcome = set_bulk.act_on_keys(ScheduledSet(r), "retry", _keys_of(r, keys.SCHEDULE, 1))
    assert outcome.acted == 1 and r.llen("queue:default") == 1
    assert "retry_count" not in json.loads(r.lindex("queue:default", 0) or b"{}")


def test_a_job_whose_queue_is_no_name_is_refused(r: redis.Redis) -> None:
    odd = [json.dumps({"class": "X", "args": [], "jid": f"{n:024x}", "queue": queue})
           for n, queue in enumerate(([1], 7, "", None, {"a": 1}))]
    r.zadd(keys.DEAD, {member: n for n, member in enumerate(odd)})
    outcome = set_bulk.act_on_matching(DeadSet(r), "retry", "")
    assert (outcome.acted, outcome.refused) == (0, 5) and r.zcard(keys.DEAD) == 5
    assert all("not a job" in reason for reason in outcome.reasons)
    assert set_bulk.act_on_matching(DeadSet(r), "delete", "X", field="class").acted == 5


def test_a_wrong_typed_target_refuses_that_member_only(r: redis.Redis) -> None:
    r.set("queue:broken", "x")
    r.zadd(keys.DEAD, {job(1, queue="broken"): 1, job(2): 2})
    outcome = set_bulk.act_on_matching(DeadSet(r), "retry", "")
    assert (outcome.acted, outcome.refused) == (1, 1)
    assert "queue:broken" in outcome.reasons[0]
    assert r.zrange(keys.DEAD, 0, -1) == [job(1, queue="broken").encode()]


def test_bulk_on_everything_matching_is_capped(r: redis.Redis) -> None:
    r.zadd(keys.RETRY, {job(n, error_class="Boom" if n % 3 == 0 else "Fine"): n
                        for n in range(1, 301)})
    retry = RetrySet(r)
    first = set_bulk.act_on_matching(retry, "kill", "boom", field="error", cap=40)
    assert (first.acted, first.more) == (40, True)
    rest = set_bulk.act_on_matching(retry, "kill", "boom", field="error")
    assert (rest.acted, rest.more) == (60, False)
    assert r.zcard(keys.DEAD) == 100 and r.zcard(keys.RETRY) == 200
    assert all(json.loads(m)["error_class"] == "Boom" for m in r.zrange(keys.DEAD, 0, -1))
    cleared = set_bulk.act_on_matching(retry, "delete", "")
    assert cleared.acted == 200 and r.zcard(keys.RETRY) == 0


def test_bulk_on_matching_runs_over_a_large_set_in_batches(r: redis.Redis) -> None:
    r.zadd(keys.DEAD, {job(n): n for n in range(3000)})
    r.zadd(keys.DEAD, {HOSTILE: 5000})
    outcome = set_bulk.act_on_matching(DeadSet(r), "retry", "mailer")
    assert (outcome.acted, outcome.refused, outcome.more) == (3000, 0, False)
    assert r.llen("queue:default") == 3000 and r.zcard(keys.DEAD) == 1
    assert set_bulk.actions(DeadSet(r)) == ("retry", "delete")
    assert set_bulk.actions(RetrySet(r)) == ("retry", "delete", "kill")
