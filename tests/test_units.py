"""Pure policies and small mechanisms: no Redis, no fork."""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import resource
import signal
import threading
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis.utils

from forkq import keys, scripts, wirejson
from forkq import payload as job
from forkq.daemon import pipes
from forkq.daemon.children import failures, fetch
from forkq.daemon.children.fetch import BatchSize
from forkq.daemon.master.supervisor import STALL_SLACK, overslept
from forkq.daemon.refusal import Recurring, describe, is_refusal
from forkq.daemon.signals import SelfPipe
from forkq.daemon.watch_token import WatchToken
from forkq.errors import MalformedJobError, UnknownJobError
from forkq.middleware import Chain
from forkq.registry import Job, Registry, RetryRules
from forkq.registry import job as job_decorator


@pytest.mark.parametrize(("value", "text"), [
    (1795238956.99455, "1795238956.99455"),
    (1e15, "1.0e+15"),
    (123456789012345.0, "123456789012345.0"),
    (1e-05, "1.0e-05"),
    (0.0001, "0.0001"),
    (1e20, "1.0e+20"),
    (2.0, "2.0"),
    (-0.0, "-0.0"),
    (-1.5, "-1.5"),
])
def test_floats_are_written_as_ruby_does(value: float, text: str) -> None:
    assert wirejson.ruby_float(value) == text


def test_json_is_compact_raw_utf8_with_ruby_escapes() -> None:
    value = {"b": [1, 2.5, None, True], "a": "x\n\"/é\u2028\x01"}
    assert wirejson.dumps(value) == '{"b":[1,2.5,null,true],"a":"x\\n\\"/é\u2028\\u0001"}'


def test_non_json_arguments_are_refused_with_their_path() -> None:
    with pytest.raises(TypeError, match=r"\$\.args\[1\]: set"):
        wirejson.dumps({"args": [1, {2}]})
    with pytest.raises(ValueError):
        wirejson.dumps([float("nan")])
    with pytest.raises(TypeError, match=r"\$\[0\]: string is not valid UTF-8"):
        wirejson.dumps(["\ud800"])


def test_redis_py_parses_replies_with_hiredis() -> None:
    """hiredis is one of forkq's dependencies: redis-py uses its C parser."""
    assert redis.utils.HIREDIS_AVAILABLE


def test_preload_reads_every_script_once_for_the_children_to_inherit() -> None:
    folder = Path(scripts.__file__).parent
    names = sorted(p.stem for p in folder.glob("*.lua") if p.stem not in ("guard", "workflow"))
    scripts.source.cache_clear()
    scripts.preload()
    assert scripts.source.cache_info().currsize == len(names) > 10
    for name in names:
        assert scripts.source(name).endswith((folder / f"{name}.lua").read_text())
    assert scripts.source.cache_info().misses == len(names)  # no file read again


def test_a_script_is_served_with_every_library_helper_it_reaches_and_no_other() -> None:
    """Each served script defines, in the libraries' order, every helper whose name its text
    reads, and none that nothing in it reads (a helper missing would be a nil global, which
    Redis refuses at the call; one too many costs a closure at every call)."""
    folder = Path(scripts.__file__).parent
    texts = [(folder / f"{name}.lua").read_text() for name in ("guard", "workflow")]
    statements = scripts._statements()
    assert "".join(s.text for s in statements) == "".join(  # all but the header comments
        text[re.search(r"^local ", text, re.M).start():] for text in texts)  # type: ignore[union-attr]
    helpers = set().union(*(s.defines for s in statements))
    assert {"wrong_type", "try", "release_unique", "workflow_done", "member_failed"} <= helpers
    served_alone = []
    for path in sorted(folder.glob("*.lua")):
        if path.stem in ("guard", "workflow"):
            continue
        chosen = scripts.reached(path.read_text())
        assert scripts.source(path.stem) == "".join(s.text for s in chosen) + path.read_text()
        assert chosen == [s for s in statements if s in chosen]  # their order kept
        defined = set().union(*(s.defines for s in chosen))
        read = scripts._words(path.read_text()).union(*(s.reads for s in chosen))
        assert read & helpers <= defined, path.stem
        assert all(s.defines & read for s in chosen), path.stem
        if not chosen:
            served_alone.append(path.stem)
    assert "beat" in served_alone and "fetch" not in served_alone


def test_a_helper_read_before_its_definition_is_served_with_it() -> None:
    """settle reads member_succeeded, declared above it and defined below it: both go."""
    chosen = scripts.reached("settle(bid)")
    texts = [s.text for s in chosen]
    assert any(t.startswith("member_succeeded = function") for t in texts)
    assert any(t.startswith("local member_succeeded") for t in texts)
    assert scripts.reached("-- settle(bid) in a comment\nreturn 'try'") == [
        s for s in scripts._statements() if "try" in s.defines]


def test_epoch_timestamps_stay_decimal() -> None:
    for _ in range(1000):
        stamp = random.uniform(1e9, 4e9)
        assert "e" not in wirejson.ruby_float(stamp)


def test_payload_fields_and_order_match_sidekiq() -> None:
    payload = job.build("HardWorker", ["bob", 1], queue="default", now=1795238956.99455)
    assert list(payload) == ["retry", "queue", "args", "class", "jid", "created_at"]
    assert len(payload["jid"]) == 24 and int(payload["jid"], 16) >= 0
    assert job.encode(payload).startswith('{"retry":true,"queue":"default","args":["bob",1],')


@pytest.mark.parametrize(("raw", "problem"), [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object, got a JSON array"),
    (b'{"class": "X"}', "has no 'args'"),
    (b'{"class": "X", "args": "a"}', "'args' must be a JSON array, got a JSON string"),
    (b'{"args": []}', "no string 'class'"),
])
def test_malformed_payloads_are_named(raw: bytes, problem: str) -> None:
    with pytest.raises(MalformedJobError, match=problem):
        job.decode(raw)


def test_integer_timestamps_are_milliseconds() -> None:
    assert job.epoch_seconds(1795238956994) == pytest.approx(1795238956.994)
    assert job.epoch_seconds(1795238956.5) == 1795238956.5
    assert job.epoch_seconds("x") is None


def _orders(queues: list[tuple[str, int]], take: int, *, strict: bool = False) -> list[str]:
    """The queue orders a processor's fetch draws for ``take`` jobs (no connection is made)."""
    unconnected = redis.Redis(unix_socket_path="/nonexistent/forkq-unit.sock")
    return fetch.Fetcher(unconnected, "forkq:inflight:h:1", queues=queues, strict=strict,
                         rng=random.Random(7)).orders(take)


def test_weighted_order_matches_the_weights() -> None:
    orders = _orders([("critical", 3), ("default", 2), ("low", 1)], 60_000)
    firsts = Counter(order.split(",")[0] for order in orders)
    assert firsts["1"] / 60_000 == pytest.approx(3 / 6, abs=0.01)
    assert firsts["2"] / 60_000 == pytest.approx(2 / 6, abs=0.01)
    assert firsts["3"] / 60_000 == pytest.approx(1 / 6, abs=0.01)
    assert all(sorted(order.split(",")) == ["1", "2", "3"] for order in orders)


def test_strict_order_and_a_single_queue_are_the_configured_order() -> None:
    assert _orders([("a", 1), ("b", 5)], 2, strict=True) == ["1,2", "1,2"]
    assert _orders([("only", 4)], 3) == ["1", "1", "1"]
    assert _orders([("a", 1), ("b", 1), ("a", 1)], 1, strict=True) == ["1,2"]


def test_backoff_is_sidekiqs_formula() -> None:
    for count in (0, 1, 5, 24):
        delays = {failures.backoff(count, random.Random(seed)) for seed in range(200)}
        assert min(delays) == count**4 + 15
        assert max(delays) == count**4 + 15 + 9 * (count + 1)
    assert failures.backoff(2, random.Random(1), base=100) - 100 in range(0, 28, 3)
    assert failures.backoff(2, random.Random(1), base=0.5) - 0.5 in range(0, 28, 3)
    for no_base in (0, -5):  # Sidekiq: a custom delay of 0 or less means the default
        assert failures.backoff(2, random.Random(1), base=no_base) - 2**4 - 15 in range(0, 28, 3)


def test_allowed_retries() -> None:
    assert failures.allowed_retries(True, 25) == 25
    assert failures.allowed_retries(3, 25) == 3
    assert failures.allowed_retries(0, 25) == 0
    assert failures.allowed_retries(False, 25) is None


@pytest.mark.parametrize(("field", "registered", "mode"), [
    (None, 2, "retry"), (None, False, "drop"), (None, 0, "dead"), ("5", 2, "retry"),
    (1.5, False, "drop"), (False, 2, "drop"), (0, True, "dead"), (True, False, "retry")])
def test_a_null_or_wrong_typed_retry_takes_the_job_s_registered_option(
        field: Any, registered: bool | int, mode: str) -> None:
    """As Sidekiq's job_retry.rb does for a nil ``retry``: the job class's option."""
    payload = {"class": "Boom", "args": [], "jid": "a" * 24, "queue": "q", "retry": field}
    failure = failures.plan(payload, ValueError("bad"), max_retries=25, rng=random.Random(0),
                            now=1.0, rules=RetryRules(retry=registered))
    assert failure.mode == mode


def test_failure_fields_follow_job_retry() -> None:
    payload = job.build("Boom", [], queue="q", retry=1, options={"backtrace": 2}, now=1.0)
    try:
        raise ValueError("bad")
    except ValueError as exc:
        first = failures.plan(payload, exc, max_retries=25, rng=random.Random(0), now=100.0)
        assert first.mode == "retry" and 115 <= first.score <= 124
        filed = json.loads(first.payload)
        assert (filed["error_class"], filed["error_message"], filed["retry_count"]) == (
            "ValueError", "bad", 0)
        assert filed["failed_at"] == 100.0 and "retried_at" not in filed
        lines = json.loads(zlib.decompress(base64.b64decode(filed["error_backtrace"])))
        assert len(lines) == 1 and "in `test_failure_fields_follow_job_retry'" in lines[0]
        second = failures.plan(filed, exc, max_retries=25, rng=random.Random(0), now=200.0)
    assert second.mode == "dead" and second.score == 200.0
    dead = json.loads(second.payload)
    assert (dead["retry_count"], dead["retried_at"], dead["failed_at"]) == (1, 200.0, 100.0)


def test_retry_false_drops_and_dead_false_never_buries() -> None:
    exc = RuntimeError("x")
    dropped = job.build("X", [], queue="q", retry=False, now=1.0)
    assert failures.plan(dropped, exc, max_retries=25, rng=random.Random(), now=2.0).mode == "drop"
    kept = job.build("X", [], queue="q", retry=0, options={"dead": False}, now=1.0)
    assert failures.plan(kept, exc, max_retries=25, rng=random.Random(), now=2.0).mode == "drop"


def test_retry_for_closes_the_retry_window_in_seconds_or_sidekiq_8_milliseconds() -> None:
    exc = RuntimeError("x")
    for failed_at in (1000.0, 1_000_000):  # float seconds; integer milliseconds (8.x)
        payload = job.build("X", [], queue="q", options={"retry_for": 60}, now=1.0)
        payload["failed_at"], payload["retry_count"] = failed_at, 0
        inside = failures.plan(dict(payload), exc, max_retries=25, rng=random.Random(), now=1059.0)
        after = failures.plan(dict(payload), exc, max_retries=25, rng=random.Random(), now=1061.0)
        assert (inside.mode, after.mode) == ("retry", "dead"), failed_at


def test_a_message_that_is_not_utf8_or_cannot_be_read_is_still_filed() -> None:
    class UnprintableError(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    name = b"report-\xff.csv".decode("utf-8", "surrogateescape")  # os.fsdecode of a bad name
    for exc, message in [(RuntimeError(f"cannot open {name}"), "cannot open report-\ufffd.csv"),
                         (UnprintableError(), "(the message could not be read: RuntimeError)")]:
        payload = job.build("X", [], queue="q", now=1.0)
        planned = failures.plan(payload, exc, max_retries=25, rng=random.Random(), now=2.0)
        assert planned.mode == "retry" and json.loads(planned.payload)["error_message"] == message


def test_retry_in_sets_the_base_delay_and_a_faulty_one_falls_back_to_the_default() -> None:
    def boom(count: int, exc: BaseException) -> float:
        raise KeyError("app bug")

    exc = RuntimeError("x")
    for retry_in, low, high in [(lambda c, e: 1000, 1000, 1009), (boom, 15, 24),
                                (lambda c, e: 0, 15, 24),
                                (lambda c, e: "soon", 15, 24), (None, 15, 24)]:
        payload = job.build("X", [], queue="q", now=1.0)
        planned = failures.plan(payload, exc, max_retries=25, rng=random.Random(0), now=0.0,
                                rules=RetryRules(retry_in=retry_in))
        assert planned.mode == "retry" and low <= planned.score <= high, (retry_in, planned)


@pytest.mark.parametrize(("rules", "error", "mode"), [
    (RetryRules(discard_on=(ValueError,)), ValueError("x"), "drop"),
    (RetryRules(discard_on=(ValueError,)), KeyError("x"), "retry"),
    (RetryRules(retry_on=(TimeoutError,)), TimeoutError("x"), "retry"),
    (RetryRules(retry_on=(TimeoutError,)), ValueError("x"), "dead"),
    (RetryRules(retry_on=(OSError,), discard_on=(TimeoutError,)), TimeoutError("x"), "drop"),
    (RetryRules(retry_in=lambda count, exc: "kill"), ValueError("x"), "dead"),
    (RetryRules(retry_in=lambda count, exc: "discard"), ValueError("x"), "drop"),
    (RetryRules(retry_in=lambda count, exc: "later"), ValueError("x"), "retry"),
    (RetryRules(retry=0, discard_on=(ValueError,)), ValueError("x"), "drop"),
])
def test_retry_rules_by_exception_come_before_the_retry_count(
        rules: RetryRules, error: Exception, mode: str) -> None:
    payload = job.build("X", [], queue="q", now=1.0)
    assert failures.plan(payload, error, max_retries=25, rng=random.Random(0), now=2.0,
                         rules=rules).mode == mode


def test_retry_on_and_discard_on_take_a_class_or_a_tuple_of_them() -> None:
    registry = Registry()
    single = job_decorator(name="r1", registry=registry, retry_on=TimeoutError)(lambda: None)
    assert single.options.retry_on == (TimeoutError,)
    both = job_decorator(name="r2", registry=registry, discard_on=(KeyError, ValueError))(
        lambda: None)
    assert both.options.rules().discard_on == (KeyError, ValueError)
    assert single.set(retry_on=OSError).perform_async is not None
    with pytest.raises(TypeError, match="retry_on must be an exception class"):
        job_decorator(name="r3", registry=registry, retry_on="TimeoutError")(lambda: None)
    with pytest.raises(TypeError, match="discard_on must be an exception class"):
        job_decorator(name="r4", registry=registry, discard_on=(ValueError, 3))(lambda: None)


def test_backtrace_is_rubys_mime_base64() -> None:
    text = failures.compress_backtrace([f"line {n}" for n in range(50)])
    assert all(len(line) <= 60 for line in text.split("\n")) and text.endswith("\n")
    assert json.loads(zlib.decompress(base64.b64decode(text)))[49] == "line 49"


def test_chain_wraps_in_order_and_can_stop() -> None:
    calls: list[str] = []
    chain: Chain[dict[str, int], str] = Chain()
    chain.add(lambda ctx, nxt: (calls.append("outer"), nxt())[1])
    chain.add(lambda ctx, nxt: (calls.append("inner"), nxt())[1])
    assert chain.run({}, lambda: "done") == "done"
    assert calls == ["outer", "inner"]
    chain.add(lambda ctx, nxt: None)
    assert chain.run({}, lambda: "never") is None


def test_registry_runs_only_registered_names() -> None:
    registry = Registry()

    @job_decorator(name="Named", queue="q", registry=registry)
    def named(x: int) -> int:
        return x * 2

    class Worker(Job, name="Worker", registry=registry, queue="w", retry=3):
        def perform(self, x: int) -> str:
            return f"{self.jid}:{x}"

    assert named(4) == 8
    assert registry.lookup("Named").call({"args": [5]}) == 10
    assert registry.lookup("Worker").call({"args": [1], "jid": "j"}) == "j:1"
    assert registry.lookup("Worker").options.retry == 3
    for name in ("os.system", "builtins.eval", "subprocess.call"):
        with pytest.raises(UnknownJobError, match="unknown job"):
            registry.lookup(name)
    with pytest.raises(ValueError, match="already registered"):
        job_decorator(name="Named", registry=registry)(lambda: None)


def test_self_pipe_records_signals_in_order() -> None:
    pipe = SelfPipe([signal.SIGUSR1, signal.SIGUSR2])
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGUSR1)
        received, _ = pipe.wait(1.0)
        assert received == [signal.SIGUSR2, signal.SIGUSR1]
        assert pipe.wait(0.0) == ([], [])
    finally:
        pipe.close()


def test_a_wait_on_fds_past_1024_works_where_select_refuses() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= 2048, f"this test needs an open-files hard limit of 2048 or more, not {hard}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    read_fd, write_fd = pipes.pipe()
    high = os.dup2(read_fd, 1500)  # what a process holding a thousand files gets next
    try:
        assert pipes.readable([high], 0.0) == []
        os.write(write_fd, b"!")
        assert sorted(pipes.readable([high, read_fd], 1.0)) == sorted([high, read_fd])
        pipe = SelfPipe([signal.SIGUSR1])
        try:
            assert pipe.wait(0.0, also=[high]) == ([], [high])
        finally:
            pipe.close()
    finally:
        for fd in (high, read_fd, write_fd):
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    with pytest.raises(OSError, match="not open"):  # as select raised EBADF
        pipes.readable([high], 0.0)


def test_lane_keys_name_their_owner_and_child() -> None:
    [lane0, lane1] = keys.inflight_lanes("host:12:abc", 345, 2)
    assert lane1 == "forkq:inflight:host:12:abc:345-1"
    assert keys.inflight_owner(lane0) == keys.inflight_owner(lane1) == "host:12:abc"
    assert keys.inflight_pid("345-1") == keys.inflight_pid("345") == 345
    for bad in ("345-", "x-1", "345-a", ""):
        assert keys.inflight_pid(bad) is None
    assert keys.inflight_owner("forkq:inflight:host:12:abc:345-x") is None


def test_the_watch_token_is_one_lane_s_at_a_time_and_its_release_rings() -> None:
    token = WatchToken()
    read_fd, write_fd = os.pipe()
    try:
        assert token.take() and token.held() and token.take()  # taking again keeps it
        other: list[bool] = []
        thread = threading.Thread(target=lambda: other.append(token.take()))
        thread.start()
        thread.join(timeout=5)
        assert other == [False], "another lane of the process may not take it"
        waiter: list[bool] = []
        thread = threading.Thread(target=lambda: waiter.append(token.wait(5, read_fd)))
        thread.start()
        token.release()  # rings: the waiter wakes (not by its wake fd)
        thread.join(timeout=5)
        assert waiter == [False] and not token.held()
        thread = threading.Thread(target=lambda: other.append(token.take() and token.held()))
        thread.start()
        thread.join(timeout=5)
        assert other == [False, True], "a released token is free for another lane"
    finally:
        token.close()
        os.close(read_fd)
        os.close(write_fd)


def test_jids_made_in_bulk_look_like_sidekiqs_and_differ() -> None:
    from forkq import payload

    jids = payload.new_jids(1000)
    assert len(jids) == 1000 == len(set(jids))
    assert all(len(jid) == 24 and int(jid, 16) >= 0 and jid == jid.lower() for jid in jids)
    assert payload.new_jids(0) == []


def test_a_payload_float_outside_the_fixed_band_takes_the_exact_encoder() -> None:
    """The float leaf check inlined in the plain walk: created_at in the band goes the fast
    way; a float Ruby writes in exponent form is still written as Ruby writes it."""
    fast = {"args": [1], "created_at": 1795614815.4656}
    assert wirejson.dumps(fast) == wirejson.dumps_exact(fast)
    odd = {"args": [1], "created_at": 1e-5, "x": 1e20}
    assert wirejson.dumps(odd) == wirejson.dumps_exact(odd) == \
        '{"args":[1],"created_at":1.0e-05,"x":1.0e+20}'


def test_a_batch_holds_at_most_its_budget_of_expected_work() -> None:
    sizes = BatchSize(16, budget=0.05)
    assert sizes.size() == 1, "no job run yet: one (they may be long)"
    sizes.ran(0.0001)
    assert sizes.size() == 16, "short jobs: the whole batch"
    for _ in range(40):
        sizes.ran(0.010)
    assert sizes.size() == 6, "10 ms jobs: the running one and five held (50 ms)"
    for _ in range(40):
        sizes.ran(2.0)
    assert sizes.size() == 1, "long jobs: one at a time"
    sizes.ran(-1.0)  # a clock step back counts as 0 s
    assert 1 <= sizes.size() <= 16
    assert BatchSize(0).size() == 1 and BatchSize(1).size() == 1


def test_one_long_job_shrinks_the_batch_at_once_and_short_ones_restore_it() -> None:
    sizes = BatchSize(16, budget=0.05)
    sizes.ran(0.0002)
    sizes.ran(30.0)  # a 30 s job among short ones: average ~6 s
    assert sizes.size() == 1
    runs = 0
    while sizes.size() < 16:
        sizes.ran(0.0002)
        runs += 1
    assert runs < 60, "short jobs bring the batch back within a few dozen runs"


# --- refusals, the stall verdict, fields of the wrong type ----------------------------------


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
    assert (job.int_field(payload, "retry_count"), job.text_field(payload, "queue"),
            job.backtrace_limit(payload), job.jid(payload),
            job.number_field(payload, "timeout")) == expected
