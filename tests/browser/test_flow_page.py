"""The Flow control page in headless Chromium against a live daemon: reached by its nav link,
it shows the concurrency limits' keys, the limiters in use, the groups waiting and the unique
locks that are in Redis (and follows them without a reload), names a key of the wrong type,
says when a section is empty, and a unique lock's job link opens the job's page, which shows
the lock.

The jobs pushed here go to queues the daemon does not serve (``tenants``, ``flow-parked``), so
they stay where they are while the pages are read."""

from __future__ import annotations

import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from forkq import limiter, unique
from forkq.client import Client

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

PREFIXES = ("forkq:slots:", "forkq:limiter:", "forkq:groups:", "forkq:unique:")
BROKEN = "forkq:limiter:window:broken"


def _clear_flow(rc: redis.Redis) -> None:
    """Drop every flow-control key of the module's server (none of the daemon's jobs uses
    flow control)."""
    for prefix in PREFIXES:
        found = list(rc.scan_iter(match=prefix + "*", count=1000))
        if found:
            rc.delete(*found)


def _fill(rc: redis.Redis) -> str:
    """A concurrency key (2 running, 1 waiting), a window limiter used once, a group of one
    job waiting, a unique job's lock and a limiter key of the wrong type; the locked job's
    jid."""
    client = Client(rc)
    rc.sadd("forkq:slots:limited:acct-1", "j1", "j2")
    rc.rpush("forkq:slots:limited:acct-1:blocked", "{}")
    with limiter.window("api", 5, 60, client=client):
        pass
    assert client.push({"class": "tenant", "queue": "tenants", "args": ["acme", 1],
                        "group": "acme"})
    jid = client.push({"class": "Record", "queue": "flow-parked", "args": ["locked"],
                       "unique_for": 600})
    assert jid
    rc.set(BROKEN, "x")
    return jid


def _cell(driver: WebDriver, table: str, attribute: str, value: str, field: str) -> str:
    return text_of(driver, f'#{table} tr[{attribute}="{value}"] [data-field={field}]')


def test_the_flow_page_shows_what_flow_control_holds_and_a_locks_job_page_shows_the_lock(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    _clear_flow(rc)
    jid = _fill(rc)
    open_page(browser, web, "/", "dashboard")
    click(browser, '#nav a[data-nav="flow"]')
    wait_until(browser, lambda d: d.find_elements(By.ID, "page-flow"), 15,
               "the nav link did not open the Flow control page")
    assert attribute_of(browser, '#nav a[data-nav="flow"]', "aria-current") == "page"

    assert rows(browser, "concurrency-table", "data-key") == ["limited:acct-1"]
    assert _cell(browser, "concurrency-table", "data-key", "limited:acct-1", "running") == "2"
    assert _cell(browser, "concurrency-table", "data-key", "limited:acct-1", "waiting") == "1"
    assert rows(browser, "limiters-table", "data-limiter") == ["window:api"]
    assert _cell(browser, "limiters-table", "data-limiter", "window:api", "used") == "1"
    assert rows(browser, "groups-table", "data-group") == ["acme"]
    assert _cell(browser, "groups-table", "data-group", "acme", "waiting") == "1"
    queue_link = '#groups-table tr[data-group="acme"] a'
    assert text_of(browser, queue_link) == "tenants"
    assert attribute_of(browser, queue_link, "href") == web.url + "/queues/tenants"
    assert rows(browser, "locks-table", "data-jid") == [jid]
    lock = unique.lock_key(unique.digest("Record", "flow-parked", ["locked"]))
    assert rows(browser, "locks-table", "data-lock") == [lock]
    assert _cell(browser, "locks-table", "data-jid", jid, "ttl") in ("10m 00s", *(
        f"9m {s}s" for s in range(50, 60)))
    for section in ("concurrency", "limiters", "groups", "locks"):
        assert text_of(browser, f"#{section}-count") == "1", section
        assert not browser.find_elements(By.ID, f"{section}-empty"), section
    notice = text_of(browser, "#damaged-keys")
    assert BROKEN in notice and "holds another type" in notice, notice

    rc.sadd("forkq:slots:limited:acct-2", "j3")  # no reload: the page refreshes itself
    wait_until(browser, lambda d: "limited:acct-2" in rows(d, "concurrency-table", "data-key"),
               10, "a new concurrency key did not show without a reload")

    click(browser, f'#locks-table tr[data-jid="{jid}"] [data-field=jid] a')
    wait_until(browser, lambda d: d.find_elements(By.ID, "job-lock"), 15,
               lambda: f"the lock's job link did not open the job's page with its lock; "
                       f"log:\n{web.log()[-3000:]}")
    assert browser.current_url == f"{web.url}/job/{jid}"
    assert text_of(browser, "#job-jid") == jid
    assert text_of(browser, "#job-lock-key") == lock
    assert attribute_of(browser, "#job-lock", "data-held") == "mine"
    assert "held by this job" in text_of(browser, "#job-lock")
    assert text_of(browser, "#job-lock-ttl").endswith(" left")
    assert "queued in flow-parked" in text_of(browser, '#job-places li[data-place="queued"]')


def test_the_flow_page_says_each_section_is_empty(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    _clear_flow(rc)
    open_page(browser, web, "/flow", "flow")
    expected = {"concurrency": "no job runs or waits under a concurrency limit",
                "limiters": "no limiter in use",
                "groups": "no group waits in a queue with groups",
                "locks": "no unique lock held"}
    for section, line in expected.items():
        assert text_of(browser, f"#{section}-count") == "0", section
        assert text_of(browser, f"#{section}-empty") == line, section
    assert not browser.find_elements(By.ID, "damaged-keys")
    assert not browser.find_elements(By.ID, "locks-shown")
