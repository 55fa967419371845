"""Pure parts of the trust rules: the stall verdict, the once-a-minute reporter, refusals."""

from __future__ import annotations

import logging

import pytest
import redis

from forkq import payload as payloads
from forkq.refusal import Recurring, describe, is_refusal
from forkq.supervisor import STALL_SLACK, overslept


def test_a_turn_more_than_the_slack_late_is_a_stall() -> None:
    assert overslept(None, 100.0) == 0.0  # no turn before
    assert overslept(100.0, 100.0 + STALL_SLACK) == 0.0  # late, but within the slack
    assert overslept(100.0, 141.0) == 41.0
    assert overslept(100.0, 99.0) == 0.0


def test_a_recurring_problem_is_logged_once_a_minute_per_subject(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    reporter = Recurring(logging.getLogger("t"), clock=lambda: now[0])
    with caplog.at_level(logging.INFO):
        assert reporter.report("queue:a", "bad %s", "a")
        assert not reporter.report("queue:a", "bad %s", "a")
        assert reporter.report("queue:b", "bad %s", "b")
        now[0] = 60.0
        assert reporter.report("queue:a", "bad %s", "a")
        assert reporter.clear("queue:a", "fine %s", "a") and not reporter.clear("queue:a")
    assert caplog.messages == ["bad a", "bad b", "bad a", "fine a"]
    assert reporter.subjects == ["queue:b"]


def test_a_refusal_is_told_from_an_outage_and_says_what_it_means() -> None:
    assert is_refusal(redis.ResponseError("WRONGTYPE x")) and not is_refusal(
        redis.ConnectionError("Error 111 connecting"))
    assert describe(redis.ResponseError("WRONGTYPE Operation against a key"), "processes") == (
        "WRONGTYPE: key 'processes' holds the wrong kind of value")
    assert "maxmemory with the noeviction policy" in describe(
        redis.exceptions.OutOfMemoryError("command not allowed"))
    assert "read-only replica" in describe(redis.exceptions.ReadOnlyError("You can't write"))


@pytest.mark.parametrize(("fields", "expected"), [
    ({}, (None, None, None, "", None)),
    ({"retry_count": 3, "queue": "q", "backtrace": True, "jid": "j", "timeout": 5},
     (3, "q", -1, "j", 5.0)),
    ({"retry_count": True, "queue": 5, "backtrace": "x", "jid": 7, "timeout": "5"},
     (None, None, None, "", None)),
    ({"retry_count": -1, "queue": "", "backtrace": -2, "jid": ["j"], "timeout": 10**400},
     (-1, None, 0, "", None)),
])
def test_an_optional_field_of_the_wrong_type_counts_as_absent(
        fields: dict[str, object], expected: tuple[object, ...]) -> None:
    payload = {"class": "X", "args": [], **fields}
    assert (payloads.int_field(payload, "retry_count"), payloads.text_field(payload, "queue"),
            payloads.backtrace_limit(payload), payloads.jid(payload),
            payloads.number_field(payload, "timeout")) == expected
