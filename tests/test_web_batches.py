"""The dashboard's Batches pages and the workflow part of the job page over HTTP (the WSGI
app served in-thread, the real session Redis; one test runs a daemon so callbacks fire and
members die): the list of the newest batches, one batch (status, callbacks, parent,
members by kind), a job's batch link, its chain's steps and its progress, what a wrong-typed
key or hostile bytes make of them (a notice, never a 500), and escaping.

The batches are made with the real API (``forkq.batch``, ``forkq.chain``, ``forkq.chord``)
through a ``Client`` on the session server made the default one."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from html import unescape
from typing import Any

import pytest
import redis

import forkq
from forkq import keys
from forkq.canvas import ChainStatus
from forkq.client import Client
from forkq.embedded import EmbeddedServer
from forkq.progress import write as write_progress
from forkq.web import Auth, make_app, workflows
from forkq.web.mount import mount

from . import flows
from .conftest import records, until
from .web_client import Browser, serve

XSS = "<script>alert(1)</script>"
PARKED = "batch-parked"  # no daemon serves it: the jobs pushed there stay pending


@pytest.fixture
def web(server: EmbeddedServer) -> Iterator[Callable[..., Browser]]:
    """Factory: ``web(wrap=None)`` serves a new app; a Browser for it."""
    with contextlib.ExitStack() as stack:

        def start(wrap: Callable[[Any], Any] | None = None) -> Browser:
            app = make_app(server.url, auth=Auth(), allow_anonymous=True)
            return Browser(stack.enter_context(serve(wrap(app) if wrap else app)))

        yield start


@pytest.fixture
def client(default_client: Client) -> Client:
    """The default client of the test (tests/conftest.py)."""
    return default_client


def _parked(n: int) -> str:
    jid = flows.item.set(queue=PARKED).perform_async(n)
    assert jid
    return jid


def _notice(body: str) -> str:
    assert 'id="damaged-keys"' in body, body[:3000]
    return unescape(body.split('id="damaged-keys"', 1)[1].split("</ul>", 1)[0])


def _cell(row: str, name: str) -> str:
    found = re.search(rf'data-field="{name}"[^>]*>(.*?)</td>', row, re.S)
    assert found, row
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", found.group(1))).split())


# --- the list -------------------------------------------------------------------------------


def test_the_batches_page_lists_the_newest_first_with_their_counts_and_state(
        web: Any, r: redis.Redis, client: Client) -> None:
    with forkq.batch(description="first import") as first:
        for n in range(3):
            _parked(n)
    with forkq.batch(description="second import",
                     on_success=flows.callback.s("success")) as second:
        _parked(10)
        with forkq.batch(description="its child"):
            _parked(11)
    page = web().get("/batches")
    assert page.status == 200 and 'id="page-batches"' in page.body
    assert 'href="/batches" data-nav="batches" aria-current="page">Batches</a>' in page.body
    bids = re.findall(r'<tr data-bid="([^"]+)"', page.body)
    child = next(bid for bid in bids if bid not in (first.bid, second.bid))
    # newest first; a child is created with its parent, in the same moment
    assert len(bids) == 3 and bids[-1] == first.bid and second.bid in bids[:2]
    assert 'id="batches-count">3<' in page.body and 'id="batches-empty"' not in page.body
    row = page.row("data-bid", first.bid)
    assert f'href="/batch/{first.bid}"' in row
    assert _cell(row, "description") == "first import"
    assert (_cell(row, "total"), _cell(row, "pending"), _cell(row, "failures")) == ("3", "3", "0")
    assert _cell(row, "progress") == "0 %" and '<progress value="0" max="100"' in row
    assert 'data-state="open"' in row and "data-death" not in row
    assert re.fullmatch(r"(\d+(\.\d)? (ms|s)|<0.1 ms) ago", _cell(row, "created")), row
    second_row = page.row("data-bid", second.bid)
    assert (_cell(second_row, "total"), _cell(second_row, "pending")) == ("2", "2"), \
        "a job and a child batch"
    assert _cell(page.row("data-bid", child), "description") == "its child"
    assert 'id="damaged-keys"' not in page.body


def test_the_batches_page_says_when_there_is_none(web: Any, r: redis.Redis) -> None:
    page = web().get("/batches")
    assert page.status == 200 and 'id="batches-count">0<' in page.body
    assert 'id="batches-empty"' in page.body and "no batch" in page.text()


def test_the_batches_page_shows_the_newest_100(web: Any, r: redis.Redis,
                                               client: Client) -> None:
    made = []
    for n in range(workflows.BATCHES_SHOWN + 3):
        with forkq.batch(description=f"batch {n}") as b:
            _parked(n)
        made.append(b.bid)
    page = web().get("/batches")
    bids = re.findall(r'<tr data-bid="([^"]+)"', page.body)
    assert bids == made[::-1][:workflows.BATCHES_SHOWN]


# --- one batch ------------------------------------------------------------------------------


def test_a_batch_page_shows_its_status_callbacks_parent_and_members_by_kind(
        web: Any, r: redis.Redis, client: Client) -> None:
    with forkq.batch(description="nightly", on_success=flows.callback.s("success"),
                     on_complete=flows.callback.s("complete")) as parent:
        jids = [_parked(n) for n in range(2)]
        with forkq.batch(description="the child") as child:
            _parked(5)
        cid = forkq.chain(flows.step.s(1, "a").set(queue=PARKED), flows.step.s("b")
                          ).perform_async()
    chain = forkq.chain_status(cid)
    assert chain is not None
    browser = web()
    page = browser.get(f"/batch/{parent.bid}")
    assert page.status == 200 and 'id="page-batch"' in page.body
    text = page.text()
    assert f"Batch {parent.bid} nightly" in text
    assert 'data-state="open"' in page.body.split('id="batch-state"', 1)[1][:200]
    assert "0 %: 0 of 4 members succeeded" in text
    assert 'id="batch-pending">4<' in page.body and 'id="batch-failures">0<' in page.body
    assert 'id="batch-parent"><span class="muted">none' in page.body
    for event, wanted in (("success", True), ("complete", True), ("death", False)):
        row = page.row("data-event", event)
        assert "data-fired" not in row and _cell(row, "fired") == "not fired", row
        jid = parent_status(parent.bid).callbacks.get(event, "")
        assert bool(jid) == wanted
        if wanted:
            assert f'href="/job/{jid}"' in row and _cell(row, "jid") == jid
        else:
            assert _cell(row, "jid") == "no callback"
    assert 'id="failed-count">0<' in page.body and 'id="failed-table-empty"' in page.body
    pending = re.findall(r'<tr data-member="([^"]+)" data-kind="(\w+)"', page.body)
    assert sorted(pending) == sorted([(jids[0], "job"), (jids[1], "job"),
                                      (child.bid, "batch"), (cid, "chain")])
    assert f'href="/job/{jids[0]}"' in page.row("data-member", jids[0])
    assert f'href="/batch/{child.bid}"' in page.row("data-member", child.bid)
    chain_row = page.row("data-member", cid)
    first_step = chain.steps[0][1]
    assert _cell(chain_row, "where") == f"step 1 of 2 (running): wf_step {first_step}"
    assert f'href="/job/{first_step}"' in chain_row
    assert 'id="members-more"' not in page.body and 'id="damaged-keys"' not in page.body

    child_page = browser.get(f"/batch/{child.bid}")
    assert child_page.status == 200
    assert f'id="batch-parent"><a class="mono" href="/batch/{parent.bid}">' in child_page.body
    assert "death" in child_page.text() and 'id="batch-total">1<' in child_page.body


def parent_status(bid: str) -> forkq.BatchStatus:
    status = forkq.batch_status(bid)
    assert status is not None
    return status


def test_a_batch_page_shows_up_to_100_members_of_each_and_says_there_are_more(
        web: Any, r: redis.Redis, client: Client) -> None:
    with forkq.batch() as b:
        for n in range(workflows.MEMBERS_SHOWN + 20):
            _parked(n)
    page = web().get(f"/batch/{b.bid}")
    assert page.status == 200
    assert page.body.count('data-kind="job"') == workflows.MEMBERS_SHOWN
    assert 'id="members-more"' in page.body and 'id="pending-count">120<' in page.body


def test_a_batch_that_does_not_exist_answers_404_and_what_it_names_is_escaped(
        web: Any, r: redis.Redis) -> None:
    page = web().get("/batch/no-such-batch")
    assert page.status == 404 and 'id="batch-missing"' in page.body
    assert "No batch no-such-batch: it never was, or it has expired" in page.text()
    hostile = web().get("/batch/%3Cscript%3Ealert%281%29%3C%2Fscript%3E")
    assert hostile.status == 404 and XSS not in hostile.body and "&lt;script&gt;" in hostile.body


def test_what_any_client_wrote_in_a_batch_is_escaped_and_bytes_break_nothing(
        web: Any, r: redis.Redis, client: Client) -> None:
    with forkq.batch(description=XSS) as b:
        _parked(1)
    meta = keys.batch(b.bid)
    r.sadd(f"{meta}:pending", XSS, b"\xff\xfe-not-utf8")
    r.sadd(f"{meta}:failed", XSS)
    r.hset(meta, mapping={"total": "many", "created_at": "yesterday", "parent": XSS,
                          "complete_at": b"\xff", "cbjid:death": XSS})
    r.zadd(keys.BATCHES, {b"\xff\xfe": time.time(), XSS: time.time()})
    r.hset(keys.batch(XSS), mapping={"description": b"\xc3(", "total": "1"})
    browser = web()
    for path in ("/batches", f"/batch/{b.bid}", "/batch/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"):
        page = browser.get(path)
        assert page.status == 200, (path, page.body[:3000])
        assert XSS not in page.body and "<script>alert" not in page.body, path
    page = browser.get(f"/batch/{b.bid}")
    assert 'href="/batch/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"' in page.body, "the parent"
    assert 'href="/job/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"' in page.body, "a member"
    assert 'data-fired' in page.row("data-event", "complete")
    assert "\ufffd" in page.body, "bytes that are no UTF-8 are shown replaced"


def test_a_wrong_typed_batch_key_is_named_and_nothing_answers_500(
        web: Any, r: redis.Redis, client: Client) -> None:
    with forkq.batch(description="sets broken") as broken_sets:
        _parked(1)
    with forkq.batch(description="fine") as fine:
        _parked(2)
    with forkq.batch(description="record broken") as broken_record:
        _parked(3)
    pending = f"{keys.batch(broken_sets.bid)}:pending"
    r.delete(pending)
    r.set(pending, "damaged")
    r.delete(keys.batch(broken_record.bid))
    r.set(keys.batch(broken_record.bid), "damaged")
    browser = web()
    page = browser.get("/batches")
    assert page.status == 200
    notice = _notice(page.body)
    assert f"key {pending!r} is not a set (it is a string)" in notice, notice
    assert f"key {keys.batch(broken_record.bid)!r} is not a hash" in notice, notice
    assert "data-damaged" in page.row("data-bid", broken_sets.bid)
    assert "data-damaged" not in page.row("data-bid", fine.bid)
    one = browser.get(f"/batch/{broken_sets.bid}")
    assert one.status == 200 and "data-damaged" in one.body
    assert repr(pending) in _notice(one.body)
    record = browser.get(f"/batch/{broken_record.bid}")
    assert record.status == 200 and 'id="batch-problem"' in record.body
    assert "is not a hash: the batch cannot be read" in unescape(record.body)

    r.delete(keys.BATCHES)
    r.set(keys.BATCHES, "damaged")
    page = browser.get("/batches")
    assert page.status == 200 and 'id="batches-empty"' in page.body
    assert "key 'forkq:batches' is not a zset (it is a string)" in _notice(page.body)


def test_a_batch_whose_total_is_no_count_is_listed_with_a_total_of_none(
        web: Any, r: redis.Redis, client: Client) -> None:
    made = {}
    for total in ("inf", "nan", "1e400", "3"):
        with forkq.batch(description=f"total {total}") as b:
            jid = _parked(1)
        r.hset(keys.batch(b.bid), "total", total)
        made[total] = (b.bid, jid)
    browser = web()
    page = browser.get("/batches")
    assert page.status == 200
    assert set(re.findall(r'<tr data-bid="([^"]+)"', page.body)) == {
        bid for bid, _ in made.values()}
    for total in ("inf", "nan", "1e400"):
        bid, jid = made[total]
        assert forkq.batch_status(bid).total == 0  # type: ignore[union-attr]
        assert browser.get(f"/batch/{bid}").status == 200
        assert browser.get(f"/job/{jid}").status == 200


def test_under_a_prefix_the_batch_links_carry_it(web: Any, r: redis.Redis,
                                                 client: Client) -> None:
    with forkq.batch() as b:
        jid = _parked(1)

    def host(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"host app"]

    browser = web(wrap=lambda dashboard: mount("/ops/forkq", dashboard, host))
    page = browser.get("/ops/forkq/batches")
    assert page.status == 200 and 'href="/ops/forkq/batches" data-nav="batches"' in page.body
    assert f'href="/ops/forkq/batch/{b.bid}"' in page.row("data-bid", b.bid)
    one = browser.get(f"/ops/forkq/batch/{b.bid}")
    assert f'href="/ops/forkq/job/{jid}"' in one.row("data-member", jid)
    job = browser.get(f"/ops/forkq/job/{jid}")
    assert f'href="/ops/forkq/batch/{b.bid}"' in job.body


# --- a job's batch, chain and progress ------------------------------------------------------


def test_the_job_page_links_its_batch_and_shows_its_progress(web: Any, r: redis.Redis,
                                                            client: Client) -> None:
    with forkq.batch(description="reports") as b:
        jid = _parked(1)
        _parked(2)
    write_progress(client, jid, {"done": 3, "total": 10, "note": f"row 3 {XSS}",
                                 "at": time.time() - 5})
    page = web().get(f"/job/{jid}")
    assert page.status == 200
    batch = page.body.split('id="job-batch"', 1)[1].split("</td>", 1)[0]
    assert f'href="/batch/{b.bid}"' in batch and 'data-state="open"' in batch
    assert "2 of 2 members pending" in unescape(batch) and "reports" in batch
    shown = page.body.split('id="job-progress"', 1)[1].split("</td>", 1)[0]
    assert '<progress value="30" max="100"' in shown
    assert 'id="job-progress-done">3<' in shown and 'id="job-progress-total">10<' in shown
    assert "row 3 &lt;script&gt;" in shown and XSS not in page.body
    assert re.search(r"said \d+(\.\d)? s ago", shown), shown
    assert 'id="job-chain"' not in page.body and 'id="chain-table"' not in page.body


def test_the_job_page_of_a_chains_step_shows_the_chains_steps(web: Any, r: redis.Redis,
                                                              client: Client) -> None:
    with forkq.batch(description="chained") as b:
        cid = forkq.chain(flows.step.s(1, "a").set(queue=PARKED), flows.step.s("b"),
                          flows.step.s("c")).perform_async()
    chain = forkq.chain_status(cid)
    assert chain is not None
    (first_class, first), (_, second), (_, third) = chain.steps
    page = web().get(f"/job/{first}")
    assert page.status == 200
    assert "running, at step 1 of 3" in page.body.split('id="job-chain"', 1)[1][:600]
    steps = re.findall(r'<tr data-step="(\d)" data-jid="([^"]*)" data-state="([^"]+)"',
                       page.body)
    assert steps == [("1", first, "running"), ("2", second, "waiting"),
                     ("3", third, "waiting")]
    row = page.row("data-step", "1")
    assert 'aria-current="step"' in row and "(this job)" in row and first_class in row
    assert f'href="/job/{third}"' in page.row("data-step", "3")
    payload = unescape(page.body.split('id="job-payload">', 1)[1].split("</pre>", 1)[0])
    assert '"chain"' in payload and '"bid"' not in payload, "a step names its chain only"
    assert f'href="/batch/{b.bid}"' in page.body.split('id="job-batch"', 1)[1][:300]
    assert 'id="job-progress"' not in page.body


def test_a_job_found_nowhere_still_shows_the_progress_it_reported(web: Any, r: redis.Redis,
                                                                  client: Client) -> None:
    write_progress(client, "finished-jid", {"done": 7, "note": "done", "at": time.time()})
    page = web().get("/job/finished-jid")
    assert page.status == 404 and 'id="job-missing"' in page.body
    shown = page.body.split('id="job-progress"', 1)[1].split("</td>", 1)[0]
    assert 'id="job-progress-done">7<' in shown and "job-progress-total" not in shown
    assert "<progress" not in shown, "no total: no share"
    assert 'id="job-progress"' not in web().get("/job/other-jid").body


def test_the_job_page_names_a_wrong_typed_batch_chain_or_progress_key(
        web: Any, r: redis.Redis, client: Client) -> None:
    with forkq.batch() as b:
        plain = _parked(1)
        cid = forkq.chain(flows.step.s(1, "a").set(queue=PARKED), flows.step.s("b")
                          ).perform_async()
    chain = forkq.chain_status(cid)
    assert chain is not None
    step = chain.steps[0][1]
    damaged = (keys.batch(b.bid), keys.chain(cid), keys.progress(plain), keys.progress(step))
    for key in damaged:
        r.delete(key)
        r.set(key, "damaged")
    browser = web()
    page = browser.get(f"/job/{plain}")
    assert page.status == 200, page.body[:3000]
    notice = _notice(page.body)
    for key in (keys.batch(b.bid), keys.progress(plain)):
        assert f"key {key!r} is not a hash (it is a string)" in notice, notice
    assert "its record is damaged" in page.body and 'id="job-progress"' not in page.body
    page = browser.get(f"/job/{step}")
    assert page.status == 200, page.body[:3000]
    notice = _notice(page.body)
    for key in (keys.chain(cid), keys.progress(step)):
        assert f"key {key!r} is not a hash (it is a string)" in notice, notice
    assert "its record is damaged" in page.body and 'id="job-progress"' not in page.body
    assert 'id="job-batch"' not in page.body, "its batch is known from its chain only"
    r.delete(keys.batch(b.bid))
    assert browser.get(f"/batch/{b.bid}").status == 404, "the record is gone: no batch"


def test_a_chain_record_naming_a_billion_steps_is_named_not_read(web: Any, r: redis.Redis,
                                                                  client: Client) -> None:
    cid = forkq.chain(flows.step.s(1, "a").set(queue=PARKED), flows.step.s("b")
                      ).perform_async()
    chain = forkq.chain_status(cid)
    assert chain is not None
    r.hset(keys.chain(cid), "n", 10**9)
    page = web().get(f"/job/{chain.steps[0][1]}")
    assert page.status == 200
    assert "names 1,000,000,000 steps but has no step 1,000,000,000" in _notice(page.body)
    assert "its record is damaged" in page.body and 'id="chain-table"' not in page.body
    r.hset(keys.chain(cid), "n", 2)
    assert 'id="chain-table"' in web().get(f"/job/{chain.steps[0][1]}").body


# --- on a daemon: callbacks fire, members die, a chain fails --------------------------------


@pytest.mark.slow
def test_after_a_run_the_pages_show_fired_callbacks_a_failed_member_and_a_failed_chain(
        web: Any, r: redis.Redis, daemon: Any, client: Client) -> None:
    with forkq.batch(description="with a death", on_success=flows.callback.s("success"),
                     on_complete=flows.callback.s("complete"),
                     on_death=flows.callback.s("death")) as b:
        doomed = flows.doomed.perform_async(1)
        for n in range(3):
            flows.item.perform_async(n)
        cid = forkq.chain(flows.item.s(5), flows.broken_step.s()).perform_async()
    assert doomed
    d = daemon("concurrency: 2\nrequire: flows\nlog_level: warning\n")
    until(lambda: {row["tag"] for row in records(r, "test:wf:callbacks")} == {"complete",
                                                                               "death"},
          60, d.log)
    # complete fires once both failed once; the chain's step is retried once, then dies
    until(lambda: getattr(forkq.chain_status(cid), "state", "") == "failed", 30, d.log)
    browser = web()
    status = parent_status(b.bid)
    page = browser.get(f"/batch/{b.bid}")
    assert page.status == 200
    assert 'data-state="complete"' in page.body and "data-death" in page.body
    assert 'id="batch-failures">2<' in page.body and 'id="batch-pending">2<' in page.body
    assert "60 %: 3 of 5 members succeeded" in page.text()
    for event in ("complete", "death"):
        row = page.row("data-event", event)
        assert "data-fired" in row and re.match(r"fired .* ago", _cell(row, "fired")), row
        assert f'href="/job/{status.callbacks[event]}"' in row
    assert "data-fired" not in page.row("data-event", "success")
    failed = dict(re.findall(r'<tr data-member="([^"]+)" data-kind="(\w+)" data-failed',
                             page.body.split('id="failed-table"', 1)[1].split("</table>")[0]))
    assert failed == {doomed: "job", cid: "chain"}
    assert "step 2 of 2 (failed): wf_broken_step" in _cell(page.row("data-member", cid), "where")

    listed = browser.get("/batches").row("data-bid", b.bid)
    assert 'data-state="complete"' in listed and "data-death" in listed
    assert _cell(listed, "progress") == "60 %"

    dead = browser.get(f"/job/{doomed}")
    assert 'data-place="dead"' in dead.body and f'href="/batch/{b.bid}"' in dead.body
    assert 'data-state="complete"' in dead.body.split('id="job-batch"', 1)[1][:800]
    chain = forkq.chain_status(cid)
    assert chain is not None and chain.state == "failed"
    step = browser.get(f"/job/{chain.steps[1][1]}")
    assert "failed at step 2 of 2" in step.body
    states = re.findall(r'<tr data-step="\d" data-jid="[^"]*" data-state="([^"]+)"', step.body)
    assert states == ["done", "failed"]


# --- the pure parts -------------------------------------------------------------------------


def _status(total: int, pending: int, fired: tuple[str, ...] = ()) -> forkq.BatchStatus:
    return forkq.BatchStatus("b", "", total, pending, 0, 1.7e9,
                             fired=dict.fromkeys(fired, 1.7e9))


def test_a_batchs_state_and_percentage_never_show_it_finished_before_it_is() -> None:
    assert workflows.BatchRow(_status(3, 3)).state == "open"
    assert workflows.BatchRow(_status(3, 1, ("complete",))).state == "complete"
    assert workflows.BatchRow(_status(3, 0, ("complete", "success"))).state == "succeeded"
    assert workflows.BatchRow(_status(1000, 1)).percent == 99, "rounded down"
    assert workflows.BatchRow(_status(1000, 0)).percent == 100
    assert workflows.BatchRow(_status(0, 0)).percent == 100, "an empty batch succeeded"
    assert workflows.BatchRow(_status(2, 5)).percent == 0, "more pending than total: 0"
    for done, total in ((1.0, 0.0), (float("nan"), 2.0), (1.0, float("inf")), (5.0, -1.0)):
        assert workflows.percent(done, total) == 0
    assert workflows.Progress(3.0, None, "", None).percent is None
    assert workflows.Progress(30.0, 10.0, "", None).percent == 100


def test_a_chains_steps_are_done_running_waiting_failed_or_not_run() -> None:
    steps = [("a", "j1"), ("b", "j2"), ("c", "j3")]

    def states(state: str, step: int, failed: int | None = None) -> list[str]:
        chain = ChainStatus("c", state, step, steps, failed)
        return [found.state for found in workflows.steps_of(chain)]

    assert states("running", 1) == ["running", "waiting", "waiting"]
    assert states("running", 2) == ["done", "running", "waiting"]
    assert states("succeeded", 4) == ["done", "done", "done"]
    assert states("failed", 2, 2) == ["done", "failed", "not run"]
    assert [(s.index, s.klass, s.jid) for s in workflows.steps_of(
        ChainStatus("c", "running", 1, steps))] == [
        (1, "a", "j1"), (2, "b", "j2"), (3, "c", "j3")]
