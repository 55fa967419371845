"""The Batches pages in headless Chromium against a live daemon: reached by the nav link, the
list shows a batch the daemon finished (succeeded, 100 %) above one whose jobs wait in a
queue no daemon serves (open, 0 %); that batch's page lists its callbacks and its pending
members by kind (jobs, a child batch, a chain), a member's link opens the job's page, which
links back to its batch, and the finished batch's page shows its success fired.

The daemon runs the jobs of tests/flows.py (the callbacks' and members' jobs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

import forkq
from forkq import client as clients
from forkq.client import Client

from .. import flows
from ..conftest import until
from .harness import (
    LiveDaemon,
    WebServer,
    attribute_of,
    click,
    open_page,
    rows,
    text_of,
    wait_until,
)

pytestmark = [pytest.mark.browser, pytest.mark.process]

DAEMON_CONFIG = """\
concurrency: 2
require: [jobs, flows]
tag: browser
queues: [default]
"""
PARKED = "batches-parked"


@pytest.fixture
def client(rc: redis.Redis) -> Iterator[Client]:
    """A client on the module's server, the default one for the test."""
    made = Client(rc)
    clients.configure(made)
    yield made
    clients.configure(None)


def _cell(driver: WebDriver, table: str, attribute: str, value: str, field: str) -> str:
    return text_of(driver, f'#{table} tr[{attribute}="{value}"] [data-field={field}]')


def test_the_batches_pages_show_a_finished_and_an_open_batch_and_link_their_members(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis,
        client: Client) -> None:
    with forkq.batch(description="parked import",
                     on_success=flows.callback.s("parked")) as parked:
        jobs = [flows.item.set(queue=PARKED).perform_async(n) for n in range(2)]
        with forkq.batch(description="parked child") as child:
            flows.item.set(queue=PARKED).perform_async(9)
        cid = forkq.chain(flows.step.s(1, "a").set(queue=PARKED), flows.step.s("b")
                          ).perform_async()
    with forkq.batch(description="finished import",
                     on_success=flows.callback.s("finished")) as finished:
        for n in range(3):
            flows.item.perform_async(n)
    until(lambda: getattr(forkq.batch_status(finished.bid), "success", False), 30, live.log)

    open_page(browser, web, "/", "dashboard")
    click(browser, '#nav a[data-nav="batches"]')
    wait_until(browser, lambda d: d.find_elements(By.ID, "page-batches"), 15,
               "the nav link did not open the Batches page")
    assert attribute_of(browser, '#nav a[data-nav="batches"]', "aria-current") == "page"
    listed = rows(browser, "batches-table", "data-bid")
    assert listed.index(finished.bid) < listed.index(parked.bid), "newest first"
    assert _cell(browser, "batches-table", "data-bid", finished.bid, "state") == "succeeded"
    assert _cell(browser, "batches-table", "data-bid", finished.bid, "progress") == "100 %"
    assert _cell(browser, "batches-table", "data-bid", parked.bid, "state") == "open"
    assert _cell(browser, "batches-table", "data-bid", parked.bid, "progress") == "0 %"
    assert _cell(browser, "batches-table", "data-bid", parked.bid, "pending") == "4"
    assert _cell(browser, "batches-table", "data-bid", parked.bid,
                 "description") == "parked import"

    click(browser, f'#batches-table tr[data-bid="{parked.bid}"] [data-field=bid] a')
    wait_until(browser, lambda d: d.find_elements(By.ID, "page-batch"), 15,
               "the bid's link did not open the batch's page")
    assert browser.current_url == f"{web.url}/batch/{parked.bid}"
    assert text_of(browser, "#batch-bid") == parked.bid
    assert text_of(browser, "#batch-state") == "open"
    assert rows(browser, "callbacks-table", "data-event") == ["complete", "success", "death"]
    assert _cell(browser, "callbacks-table", "data-event", "success", "fired") == "not fired"
    assert _cell(browser, "callbacks-table", "data-event", "death", "jid") == "no callback"
    members = rows(browser, "pending-table", "data-member")
    assert sorted(members) == sorted([*jobs, child.bid, cid])
    kinds = dict(zip(members, rows(browser, "pending-table", "data-kind"), strict=True))
    assert kinds == {jobs[0]: "job", jobs[1]: "job", child.bid: "batch", cid: "chain"}
    assert _cell(browser, "pending-table", "data-member", cid, "where").startswith(
        "step 1 of 2 (running): wf_step ")
    assert text_of(browser, "#failed-table-empty") == "none"

    click(browser, f'#pending-table tr[data-member="{jobs[0]}"] [data-field=member] a')
    wait_until(browser, lambda d: d.find_elements(By.ID, "job-batch"), 15,
               "a member's link did not open the job's page with its batch")
    assert browser.current_url == f"{web.url}/job/{jobs[0]}"
    assert text_of(browser, "#job-jid") == jobs[0]
    assert "open" in text_of(browser, "#job-batch")
    click(browser, "#job-batch a")
    wait_until(browser, lambda d: d.find_elements(By.ID, "page-batch"), 15,
               "the job's batch link did not open the batch's page")
    assert text_of(browser, "#batch-bid") == parked.bid

    open_page(browser, web, f"/batch/{finished.bid}", "batch")
    assert text_of(browser, "#batch-state") == "succeeded"
    assert attribute_of(browser, '#callbacks-table tr[data-event="success"]',
                        "data-fired") is not None
    assert _cell(browser, "callbacks-table", "data-event", "success",
                 "fired").startswith("fired ")
    assert rows(browser, "pending-table", "data-member") == []


def test_a_batch_that_does_not_exist_says_so(browser: WebDriver, web: WebServer,
                                             live: LiveDaemon) -> None:
    open_page(browser, web, "/batch/no-such-batch", "batch")
    assert text_of(browser, "#batch-missing").startswith("No batch no-such-batch")
