"""forkq.testing: fake and inline modes for users' test suites, and the pytest fixtures.

Every test here runs with the default client pointed at a closed port, so a push that
escaped the mode would fail with EnqueueError instead of passing unnoticed. The last
tests run a user-style pytest file in a subprocess with REDIS_URL / FORKQ_REDIS_URL at a
closed port (no Redis at all), and check that a push after a mode reaches Redis again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import forkq
from forkq import client as clients
from forkq import testing
from forkq.errors import UnknownJobError
from forkq.middleware import Chain, JobContext, ServerChain
from forkq.registry import Job, Registry, job

REG = Registry()
done: list[tuple[str, Any]] = []


@job(registry=REG, queue="mail")
def send_receipt(order_id: int) -> None:
    done.append(("send_receipt", order_id))


@job(registry=REG)
def follow_up(order_id: int) -> None:
    done.append(("follow_up", order_id))


@job(registry=REG)
def place_order(order_id: int, items: list[Any]) -> None:
    done.append(("place_order", items))
    send_receipt.perform_async(order_id)
    follow_up.perform_in(3600, order_id)


@job(registry=REG)
def explode(message: str) -> None:
    raise RuntimeError(message)


@job(registry=REG)
def again(count: int) -> None:
    again.perform_async(count + 1)


@job(registry=REG)
async def fetch_price(sku: str) -> str:
    await asyncio.sleep(0)
    done.append(("fetch_price", sku))
    return sku


class Report(Job, registry=REG, queue="low"):
    def perform(self, month: str) -> None:
        done.append(("Report", (month, self.jid)))


def closed_url() -> str:
    """A redis:// URL at a port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


@pytest.fixture(autouse=True)
def nowhere() -> Iterator[str]:
    """The default client at a closed port; ``done`` emptied; no mode left on after the test."""
    url = closed_url()
    clients.configure(clients.Client(url=url, timeout=1, connect_timeout=1))
    done.clear()
    yield url
    clients.configure(None)
    assert testing.active() is None


def fake(middleware: ServerChain | None = None) -> testing.Fake:
    return testing.fake(registry=REG, middleware=middleware or Chain())


def inline(middleware: ServerChain | None = None) -> testing.Inline:
    return testing.inline(registry=REG, middleware=middleware or Chain())


def args_of(jobs: list[dict[str, Any]]) -> list[Any]:
    return [payload["args"] for payload in jobs]


# --- the JSON round trip ---------------------------------------------------------------

NOT_JSON = [dt.datetime(2024, 1, 1), {1, 2}, float("nan"), b"bytes", {1: "int key"}]


def client_error(nowhere: str, value: Any) -> BaseException:
    """What the real client raises for ``value`` (before any I/O: the port is closed)."""
    with pytest.raises((TypeError, ValueError)) as raised:
        clients.Client(url=nowhere).push({"class": "Anything", "args": [value]})
    return raised.value


@pytest.mark.parametrize("value", NOT_JSON, ids=["datetime", "set", "nan", "bytes", "intkey"])
@pytest.mark.parametrize("mode", [fake, inline])
def test_args_json_cannot_carry_raise_the_clients_own_error(
        nowhere: str, value: Any, mode: Callable[[], testing.Mode]) -> None:
    expected = client_error(nowhere, value)
    with mode() as on:
        with pytest.raises(type(expected)) as raised:
            send_receipt.perform_async(value)
        with pytest.raises(type(expected)):
            send_receipt.perform_in(60, value)
        if isinstance(on, testing.Fake):
            assert on.jobs() == [] and on.scheduled() == []
    assert str(raised.value) == str(expected)
    assert done == []


@pytest.mark.parametrize("mode", [fake, inline])
def test_a_bulk_push_with_one_bad_job_keeps_and_runs_none(
        mode: Callable[[], testing.Mode]) -> None:
    with mode() as on:
        with pytest.raises(TypeError, match=r"args\[0\]: set"):
            forkq.Client(url="redis://127.0.0.1:1/0").push_bulk(
                {"class": send_receipt.name, "args": [[1], [{2}], [3]]})
        if isinstance(on, testing.Fake):
            assert on.jobs() == []
    assert done == []


def test_the_job_gets_what_the_daemon_would_decode() -> None:
    with fake() as queues:
        place_order.perform_async(1, ("a", "b"))
        assert args_of(queues.jobs(place_order)) == [[1, ["a", "b"]]]
        queues.drain(place_order)
    assert done == [("place_order", ["a", "b"])]  # a list, as after JSON


# --- fake mode -------------------------------------------------------------------------

def test_fake_keeps_every_kind_of_push_per_queue_and_per_job() -> None:
    with fake() as queues:
        jid = send_receipt.perform_async(1)
        follow_up.set(queue="mail").perform_async(2)
        Report.perform_async("2024-05")
        forkq.Client().push_bulk({"class": follow_up.name, "args": [[3], [4]]})
        past = send_receipt.perform_at(dt.datetime.now() - dt.timedelta(hours=1), 5)
        assert args_of(queues.jobs()) == [[1], [2], ["2024-05"], [3], [4], [5]]
        assert args_of(queues.jobs(queue="mail")) == [[1], [2], [5]]
        assert args_of(queues.jobs(follow_up)) == [[2], [3], [4]]
        assert args_of(queues.jobs(Report, queue="low")) == [["2024-05"]]
        assert args_of(queues.jobs(follow_up.name, queue="default")) == [[3], [4]]
        first = queues.jobs()[0]
        assert first["jid"] == jid and first["queue"] == "mail" and "enqueued_at" in first
        assert queues.jobs()[-1]["jid"] == past  # an `at` in the past pushes now
        assert queues.scheduled() == [] and done == []


def test_clear_drops_what_matches() -> None:
    with fake() as queues:
        send_receipt.perform_async(1)
        send_receipt.perform_in(60, 2)
        follow_up.perform_async(3)
        Report.perform_async("x")
        assert queues.clear(send_receipt) == 2
        assert args_of(queues.jobs()) == [[3], ["x"]] and queues.scheduled() == []
        assert queues.clear(queue="low") == 1
        assert queues.clear() == 1
        assert queues.jobs() == [] and queues.clear() == 0


def test_drain_runs_the_jobs_that_jobs_push_and_leaves_scheduled_ones() -> None:
    with fake() as queues:
        place_order.perform_async(7, ["book"])
        assert queues.drain() == 2
        assert done == [("place_order", ["book"]), ("send_receipt", 7)]
        assert queues.jobs() == []
        scheduled = queues.scheduled(follow_up)
        assert args_of(scheduled) == [[7]] and scheduled[0]["at"] > time.time() + 3000
        assert queues.drain() == 0 and done[-1] == ("send_receipt", 7)


def test_scheduled_jobs_run_only_when_asked_soonest_first() -> None:
    with fake() as queues:
        follow_up.perform_in(300, 3)
        follow_up.perform_in(dt.timedelta(seconds=100), 1)
        follow_up.perform_at(time.time() + 200, 2)
        send_receipt.perform_async(0)
        assert args_of(queues.scheduled()) == [[1], [2], [3]]
        assert queues.drain(include_scheduled=True) == 4
        assert done == [("send_receipt", 0), ("follow_up", 1), ("follow_up", 2),
                       ("follow_up", 3)]
        assert queues.scheduled() == []


def test_a_drain_with_scheduled_jobs_runs_what_they_schedule_too() -> None:
    with fake() as queues:
        place_order.perform_in(60, 1, [])
        assert queues.drain(include_scheduled=True) == 3
        assert done == [("place_order", []), ("send_receipt", 1), ("follow_up", 1)]


def test_drain_by_job_or_queue_runs_only_those() -> None:
    with fake() as queues:
        place_order.perform_async(1, [])
        Report.perform_async("m")
        assert queues.drain(place_order) == 1  # the receipt it pushed waits
        assert args_of(queues.jobs()) == [["m"], [1]]
        assert queues.drain(queue="mail") == 1
        assert args_of(queues.jobs()) == [["m"]]
        assert queues.drain() == 1
        assert done[-1][0] == "Report" and done[-1][1][1]  # self.jid is set


def test_a_failing_job_raises_out_of_drain_and_the_rest_stay() -> None:
    with fake() as queues:
        send_receipt.perform_async(1)
        explode.perform_async("boom")
        send_receipt.perform_async(2)
        with pytest.raises(RuntimeError, match="boom"):
            queues.drain()
        assert done == [("send_receipt", 1)]
        assert args_of(queues.jobs()) == [[2]]  # the failed job is gone, the next waits
        assert queues.drain() == 1


def test_an_unregistered_class_raises_unknown_job() -> None:
    with fake() as queues:
        forkq.Client().push({"class": "os.system", "args": ["true"]})
        with pytest.raises(UnknownJobError, match=r"'os\.system'"):
            queues.drain()


def test_a_job_that_pushes_itself_forever_hits_the_drain_limit() -> None:
    with fake() as queues:
        again.perform_async(0)
        with pytest.raises(testing.DrainLimitError, match="push itself"):
            queues.drain(limit=50)
        assert args_of(queues.jobs()) == [[50]]  # 50 ran; the next is still queued


def test_client_middleware_runs_and_can_stop_a_push() -> None:
    def stop_mail(payload: dict[str, Any], call_next: Callable[[], Any]) -> Any:
        return None if payload["queue"] == "mail" else call_next()

    forkq.client_middleware.add(stop_mail)
    try:
        with fake() as queues:
            assert send_receipt.perform_async(1) is None
            assert follow_up.perform_async(2) is not None
            assert args_of(queues.jobs()) == [[2]]
    finally:
        forkq.client_middleware.remove(stop_mail)


# --- server middleware, both modes ---------------------------------------------------

def recorder(seen: list[Any]) -> Callable[[JobContext, Callable[[], Any]], Any]:
    """A server middleware noting each job before it runs and its result after."""
    def around(context: JobContext, call_next: Callable[[], Any]) -> Any:
        seen.append(("before", context.name, context.queue, context.args, context.jid))
        result = call_next()
        seen.append(("after", result))
        return result

    return around


def recording_chain(seen: list[Any]) -> ServerChain:
    return Chain([recorder(seen)])


@pytest.mark.parametrize("mode", [fake, inline])
def test_server_middleware_wraps_each_job(mode: Callable[..., testing.Mode]) -> None:
    seen: list[Any] = []
    with mode(recording_chain(seen)) as on:
        jid = send_receipt.perform_async(5)
        async_jid = fetch_price.perform_async("sku-1")
        if isinstance(on, testing.Fake):
            on.drain()
    assert seen == [("before", send_receipt.name, "mail", [5], jid), ("after", None),
                    ("before", fetch_price.name, "default", ["sku-1"], async_jid),
                    ("after", "sku-1")]  # the coroutine completed inside the chain


def test_the_global_server_middleware_is_the_default() -> None:
    seen: list[Any] = []
    entry = recorder(seen)
    forkq.server_middleware.add(entry)
    try:
        with testing.fake(registry=REG) as queues:
            send_receipt.perform_async(1)
            queues.drain()
        with testing.inline(registry=REG):
            send_receipt.perform_async(2)
    finally:
        forkq.server_middleware.remove(entry)
    assert [step[3] for step in seen if step[0] == "before"] == [[1], [2]]


# --- inline mode ---------------------------------------------------------------------

def test_inline_runs_at_once_with_the_jobs_it_pushes_scheduled_ones_included() -> None:
    with inline():
        jid = place_order.perform_async(9, ["pen"])
        assert isinstance(jid, str) and len(jid) == 24
        assert done == [("place_order", ["pen"]), ("send_receipt", 9), ("follow_up", 9)]
        forkq.Client().push_bulk({"class": send_receipt.name, "args": [[1], [2]]})
        assert done[-2:] == [("send_receipt", 1), ("send_receipt", 2)]


def test_inline_raises_the_jobs_exception_from_the_push() -> None:
    with inline(), pytest.raises(RuntimeError, match="inline boom"):
        explode.perform_async("inline boom")


# --- what a job can ask while it runs ------------------------------------------------

@job(registry=REG)
def careful(step_count: int) -> None:
    context = forkq.current_job()
    assert context is not None
    for step in range(step_count):
        if forkq.cancel_requested():
            raise forkq.JobCancelledError(f"stopped at step {step}")
        done.append(("careful", (context.jid, step)))


@pytest.mark.parametrize("mode", [fake, inline])
def test_current_job_and_cancel_requested_answer_without_redis(
        mode: Callable[[], testing.Mode]) -> None:
    with mode() as on:
        jid = careful.perform_async(2)
        if isinstance(on, testing.Fake):
            on.drain()
        assert done == [("careful", (jid, 0)), ("careful", (jid, 1))]
        assert forkq.current_job() is None  # outside the job again


def test_a_jid_in_cancelled_is_seen_as_cancelled() -> None:
    with fake() as queues:
        jid = careful.perform_async(2)
        queues.cancelled.add(jid)
        assert forkq.cancel_requested(jid) and not forkq.cancel_requested("other")
        with pytest.raises(forkq.JobCancelledError, match="step 0"):
            queues.drain()
    assert done == []


# --- async jobs ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", [fake, inline])
def test_coroutine_jobs_run_to_completion(mode: Callable[[], testing.Mode]) -> None:
    with mode() as on:
        fetch_price.perform_async("a")
        if isinstance(on, testing.Fake):
            assert done == []
            assert on.drain() == 1
    assert done == [("fetch_price", "a")]


def test_coroutine_jobs_run_from_inside_a_running_loop() -> None:
    async def an_async_test() -> None:
        with inline():
            fetch_price.perform_async("in-loop")
        with fake() as queues:
            fetch_price.perform_async("drained-in-loop")
            queues.drain()

    asyncio.run(an_async_test())
    assert done == [("fetch_price", "in-loop"), ("fetch_price", "drained-in-loop")]


def test_a_coroutine_jobs_exception_reaches_the_test_from_inside_a_loop() -> None:
    @job(registry=REG, name="tests.async_explode")
    async def async_explode() -> None:
        raise ValueError("async boom")

    async def an_async_test() -> None:
        with inline():
            async_explode.perform_async()

    with pytest.raises(ValueError, match="async boom"):
        asyncio.run(an_async_test())
    with inline(), pytest.raises(ValueError, match="async boom"):
        async_explode.perform_async()


# --- switching -----------------------------------------------------------------------

def test_modes_nest_and_restore_in_order(nowhere: str) -> None:
    outer = fake().start()
    try:
        assert testing.active() is outer
        with inline() as inner:
            assert testing.active() is inner
            send_receipt.perform_async(1)
            with pytest.raises(RuntimeError, match="reverse order"):
                outer.stop()
        assert testing.active() is outer
        send_receipt.perform_async(2)
        assert args_of(outer.jobs()) == [[2]] and done == [("send_receipt", 1)]
        with pytest.raises(RuntimeError, match="already on"):
            outer.start()
    finally:
        outer.stop()
    assert testing.active() is None
    with pytest.raises(forkq.EnqueueError):  # Redis again: the closed port
        send_receipt.perform_async(3)


def test_a_mode_is_left_when_the_block_raises() -> None:
    with pytest.raises(KeyError), fake():
        raise KeyError("test failure")
    assert testing.active() is None


def test_pushes_reach_redis_again_after_a_mode(r: redis.Redis) -> None:
    client = forkq.Client(r)
    with fake() as queues:
        client.push({"class": send_receipt.name, "args": [1], "queue": "mail"})
        assert len(queues.jobs()) == 1
    assert r.llen("queue:mail") == 0
    client.push({"class": send_receipt.name, "args": [2], "queue": "mail"})
    assert r.llen("queue:mail") == 1


def test_drain_refuses_to_run_once_its_mode_is_off() -> None:
    with fake() as queues:
        place_order.perform_async(1, [])
    with pytest.raises(RuntimeError, match="is off"):
        queues.drain()
    assert len(queues.jobs()) == 1 and done == []  # still there to look at


def test_the_job_argument_must_name_a_job() -> None:
    with fake() as queues, pytest.raises(TypeError, match="wire name"):
        queues.jobs(42)


# --- a user's pytest file, no Redis at all -------------------------------------------

USER_JOBS = '''
import asyncio
from forkq import Job, job

SENT, FOLLOWED, PRICES = [], [], []

@job(queue="mail")
def send_receipt(order_id):
    SENT.append(order_id)

@job
def follow_up(order_id):
    FOLLOWED.append(order_id)

@job
def place_order(order_id, items):
    send_receipt.perform_async(order_id)
    follow_up.perform_in(3600, order_id)

@job
async def fetch_price(sku):
    await asyncio.sleep(0)
    PRICES.append(sku)

class Invoice(Job, queue="billing"):
    def perform(self, order_id):
        place_order.perform_async(order_id, [])
'''

USER_TESTS = '''
import datetime

import pytest

import forkq
from forkq import testing

import shop_jobs as shop


@pytest.fixture(autouse=True)
def empty():
    for done in (shop.SENT, shop.FOLLOWED, shop.PRICES):
        done.clear()


def test_fake_collects_then_drains(forkq_fake):
    shop.place_order.perform_async(7, ["book"])
    assert [j["args"] for j in forkq_fake.jobs(shop.place_order)] == [[7, ["book"]]]
    assert forkq_fake.drain() == 2
    assert shop.SENT == [7] and shop.FOLLOWED == []
    assert [j["args"] for j in forkq_fake.scheduled(shop.follow_up)] == [[7]]
    assert forkq_fake.drain(include_scheduled=True) == 1
    assert shop.FOLLOWED == [7]


def test_fake_class_jobs_and_queues(forkq_fake):
    shop.Invoice.perform_async(3)
    assert len(forkq_fake.jobs(queue="billing")) == 1
    forkq_fake.drain(shop.Invoice)
    assert [j["args"] for j in forkq_fake.jobs()] == [[3, []]]
    assert forkq_fake.clear() == 1


def test_inline_runs_the_whole_chain(forkq_inline):
    shop.Invoice.perform_async(8)
    assert shop.SENT == [8] and shop.FOLLOWED == [8]


def test_async_jobs(forkq_inline):
    shop.fetch_price.perform_async("sku")
    assert shop.PRICES == ["sku"]


def test_async_jobs_drained(forkq_fake):
    shop.fetch_price.perform_async("sku2")
    forkq_fake.drain()
    assert shop.PRICES == ["sku2"]


@pytest.mark.parametrize("mode", ["forkq_fake", "forkq_inline"])
def test_non_json_args_fail_as_in_production(mode, request):
    request.getfixturevalue(mode)
    with pytest.raises(TypeError, match="datetime is not JSON-native"):
        shop.send_receipt.perform_async(datetime.datetime.now())


def test_a_failing_job_fails_the_test_where_it_runs(forkq_inline):
    with pytest.raises(TypeError):
        shop.place_order.perform_async(1)  # one argument short


def test_without_a_mode_pushes_reach_for_the_absent_redis():
    assert testing.active() is None  # the fixtures above switched their modes off
    with pytest.raises(forkq.EnqueueError, match="connecting to"):
        shop.send_receipt.perform_async(1)
'''


@pytest.mark.process
def test_a_users_test_file_passes_with_the_fixtures_and_no_redis(tmp_path: Path) -> None:
    (tmp_path / "shop_jobs.py").write_text(textwrap.dedent(USER_JOBS))
    (tmp_path / "test_shop.py").write_text(textwrap.dedent(USER_TESTS))
    url = closed_url()
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "FORKQ_"))}
    env.update(REDIS_URL=url, FORKQ_REDIS_URL=url, FORKQ_CLIENT_CONNECT_TIMEOUT="2")
    user_run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "test_shop.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    report = user_run.stdout + user_run.stderr
    assert user_run.returncode == 0, report
    assert "9 passed" in report, report


def test_result_answers_from_the_mode_once_the_job_ran() -> None:
    from . import jobs  # registers the test jobs (as the daemon's require does)

    with testing.fake() as mode:
        jid = str(jobs.answer.perform_async(5))
        with pytest.raises(forkq.ResultTimeoutError, match="drain"):
            forkq.result(jid)
        mode.drain()
        assert forkq.result(jid) == {"double": 10}
        unstorable = str(jobs.answer_set.perform_async())
        mode.drain()
        with pytest.raises(forkq.JobFailedError, match="cannot be stored as JSON"):
            forkq.result(unstorable)
    with testing.inline():
        assert forkq.result(str(jobs.answer_async.perform_async(3))) == [3, 3]


@job(registry=REG)
def call_api(n: int) -> None:
    with API_LIMIT:
        done.append(("call_api", n))


API_LIMIT = forkq.limiter.window("api", 1, 60.0)


@pytest.mark.parametrize("mode", [testing.fake, testing.inline])
def test_limiters_admit_at_once_without_redis_and_count_their_entries(mode) -> None:
    with mode(registry=REG) as on:
        for n in range(3):  # a window of 1 per minute: Redis would refuse the second
            call_api.perform_async(n)
        if isinstance(on, testing.Fake):
            on.drain()
        assert on.limiter_entries == {"api": 3}
        assert API_LIMIT.admitted_at is not None
        on.over_limit.add("api")  # the limit reached, to test what the code does then
        with pytest.raises(forkq.OverLimit, match="'api'"), API_LIMIT:
            pass
    with pytest.raises(redis.ConnectionError), API_LIMIT:  # the mode off: Redis is asked
        pass


# --- workflows in the modes -------------------------------------------------------------

@job(registry=REG, name="tm_double")
def double(value: Any) -> Any:
    done.append(("double", value))
    return value * 2


@job(registry=REG, name="tm_report")
def report(first: Any, tag: str) -> None:
    done.append((tag, first))


@job(registry=REG, name="tm_fmt")
def formatted(n: int, *, fmt: str = "txt") -> str:
    done.append(("fmt", (n, fmt)))
    return f"{n}.{fmt}"


@job(registry=REG, name="tm_grow")
def grow(count: int) -> None:
    with forkq.batch(forkq.current_batch()):
        for n in range(count):
            double.perform_async(n)


def test_inline_runs_a_chain_synchronously_passing_each_value_on() -> None:
    with inline():
        cid = forkq.chain(double.s(1), double.s(), double.s()).perform_async()
        assert done == [("double", 1), ("double", 2), ("double", 4)]
        status = forkq.chain_status(cid)
        assert status is not None and status.state == "succeeded" and status.step == 4


def test_fake_records_a_chain_and_drain_runs_its_steps_in_order() -> None:
    with fake() as mode:
        cid = forkq.chain(double.s(3), formatted.s(fmt="pdf")).perform_async()
        [first] = mode.jobs()
        assert first["chain"] == cid and first["chain_step"] == 1 and done == []
        assert mode.drain() == 2
        assert done == [("double", 3), ("fmt", (6, "pdf"))]


def test_a_batch_fires_its_callbacks_once_with_its_status_in_both_modes() -> None:
    for mode in (inline(), fake()):
        done.clear()
        with mode:
            with forkq.batch(on_success=report.s("success"), on_complete=report.s("complete"),
                             description="two") as b:
                double.perform_async(1)
                double.perform_async(2)
            if isinstance(mode, testing.Fake):
                assert {job["bid"] for job in mode.jobs()} == {b.bid}
                mode.drain()
            tags = [entry for entry in done if entry[0] in ("success", "complete")]
            assert [tag for tag, _ in tags] == ["complete", "success"]
            assert tags[1][1]["succeeded"] == 2 and tags[1][1]["description"] == "two"
            status = forkq.batch_status(b.bid)
            assert status is not None and status.success and status.progress == 1.0


def test_a_chord_gives_its_body_the_values_in_order() -> None:
    with fake() as mode:
        forkq.chord(forkq.group(double.s(1), double.s(2), double.s(3)),
                    report.s("total")).perform_async()
        mode.drain()
    assert done[-1] == ("total", [2, 4, 6])


def test_a_job_that_raises_dies_for_its_batch_and_its_chain() -> None:
    with fake() as mode:
        with forkq.batch(on_death=report.s("death"), on_success=report.s("success")) as b:
            explode.perform_async("no")
        cid = forkq.chain(explode.s("no"), double.s()).perform_async()
        with pytest.raises(RuntimeError):
            mode.drain(explode)
        with pytest.raises(RuntimeError):
            mode.drain(explode)
        assert mode.drain() == 1  # on_death's callback; the chain's next step never came
        status, chain = forkq.batch_status(b.bid), forkq.chain_status(cid)
        assert status is not None and set(status.fired) == {"death", "complete"}
        assert chain is not None and chain.state == "failed" and chain.failed_step == 1
    assert [tag for tag, _ in done] == ["death"]


def test_a_job_grows_its_own_batch_and_nested_batches_count_in_their_parent() -> None:
    with inline():
        with forkq.batch(on_success=report.s("parent")) as parent:
            with forkq.batch(on_success=report.s("child")):
                grow.perform_async(3)
            double.perform_async(10)
        assert [tag for tag, _ in done if tag in ("parent", "child")] == ["child", "parent"]
        status = forkq.batch_status(parent.bid)
        assert status is not None and status.total == 2 and status.success


def test_an_exception_in_a_batch_block_pushes_nothing_in_a_mode() -> None:
    with fake() as mode:
        with pytest.raises(KeyError), forkq.batch():
            double.perform_async(1)
            raise KeyError("x")
        assert mode.jobs() == []


def test_progress_lands_in_the_mode() -> None:
    @job(registry=REG, name="tm_progress")
    def counting() -> None:
        forkq.progress(3, total=4, note="almost")

    with inline() as mode:
        jid = counting.perform_async()
    assert mode.progress[str(jid)]["done"] == 3 and mode.progress[str(jid)]["note"] == "almost"


def test_a_batch_reopened_inside_another_block_is_no_child_of_it() -> None:
    with inline():
        with forkq.batch(on_success=report.s("first")) as first:
            pass  # empty: succeeded at once
        with forkq.batch(on_success=report.s("outer")) as outer:
            with forkq.batch(first.bid):
                double.perform_async(5)
            double.perform_async(6)
        status = forkq.batch_status(outer.bid)
        assert status is not None and status.total == 1 and status.success
        again = forkq.batch_status(first.bid)
        assert again is not None and again.total == 1
    assert [tag for tag, _ in done if tag in ("first", "outer")] == ["first", "outer"]
