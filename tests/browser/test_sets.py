"""The Scheduled, Retries and Dead pages and a job's page in headless Chromium against a live
daemon: jobs the daemon failed show up without a reload, a job's page shows its payload,
error and backtrace, every button acts on a selection and on a search filter (checked in
Redis, and by the daemon running what was retried), and search finds by class, jid, args
and error text."""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
from typing import Any

import pytest
import redis
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from forkq.client import Client
from forkq.ops.sorted_sets import DeadSet, RetrySet, ScheduledSet

from ..conftest import attempts, records, until
from .harness import (
    LiveDaemon,
    WebServer,
    click,
    hold_still,
    open_page,
    press,
    rows,
    settled,
    text_of,
    wait_until,
)

pytestmark = [pytest.mark.browser, pytest.mark.process]


def _push(rc: redis.Redis, klass: str, *args: Any, **options: Any) -> str:
    jid = Client(rc).push({"class": klass, "args": list(args), **options})
    assert jid is not None
    return jid


def _bury(rc: redis.Redis, klass: str, *args: Any, message: str = "it broke") -> str:
    """A dead entry as the daemon files one (for jobs that must run once retried)."""
    jid = secrets.token_hex(12)
    now = time.time()
    payload = {"class": klass, "args": list(args), "queue": "default", "jid": jid,
               "retry": True, "created_at": now - 90, "enqueued_at": now - 90,
               "failed_at": now - 60, "retry_count": 25, "error_class": "RuntimeError",
               "error_message": message}
    rc.zadd("dead", {json.dumps(payload): time.time()})  # died now: the latest
    return jid


def _search(driver: WebDriver, page: str, query: str, field: str = "any") -> list[str]:
    """Search ``page`` through its form; the jids listed. The live refresh is held first: a
    visitor's focus on the box holds it, but WebDriver's ``clear()`` blurs the box again, and
    a refresh that swaps ``<main>`` while keys are sent fails them ("element not
    interactable", seen with the page refreshing every second on a loaded host)."""
    hold_still(driver)
    form = f"#{page}-search"
    box = driver.find_element(By.CSS_SELECTOR, f"{form} input[name=q]")
    box.clear()
    box.send_keys(query)
    Select(driver.find_element(By.CSS_SELECTOR, f"{form} select[name=field]")).select_by_value(
        field)
    driver.execute_script("window.forkqBeforeSearch = true;")  # gone with this document
    box.send_keys(Keys.ENTER)
    # The page before (an earlier search) matches any test of the URL or of the page's
    # elements, and the new one is read while it loads: wait until the old document is gone,
    # the new one is whole and its URL asks for this search.
    wait_until(driver, lambda d: _loaded(d, query, field) and d.find_elements(
        By.ID, f"page-{page}"), 10, "the search did not load")
    return rows(driver, f"{page}-table", "data-jid")


def _loaded(driver: WebDriver, query: str, field: str) -> bool:
    """Whether the document that replaced the one marked before the search is whole and
    asks for ``query`` in ``field`` (False while the browser is between documents: it
    answers with an error then)."""
    try:
        state = driver.execute_script(
            "return window.forkqBeforeSearch ? 'old' : document.readyState;")
        return state == "complete" and _asks(driver.current_url, query, field)
    except WebDriverException:
        return False


def _asks(url: str, query: str, field: str) -> bool:
    """Whether ``url`` is a search for ``query`` in ``field``."""
    asked = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    return asked.get("q") == [query] and asked.get("field") == [field]


def _tick(driver: WebDriver, page: str, jid: str) -> None:
    click(driver, f'#{page}-table tr[data-jid="{jid}"] input[name=key]')


def test_a_job_the_daemon_buries_shows_on_dead_and_its_page_shows_error_and_backtrace(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    open_page(browser, web, "/dead", "dead")
    message = f"boom-{secrets.token_hex(4)}"
    jid = _push(rc, "Boom", message, retry=0, backtrace=5)
    row = f'#dead-table tr[data-jid="{jid}"]'
    wait_until(browser, lambda d: message in text_of(d, row), 20,
               lambda: f"the dead job never showed; log:\n{live.log()}")
    assert "ValueError" in text_of(browser, row)
    click(browser, f"{row} a.job-link")
    wait_until(browser, lambda d: d.find_elements(By.ID, "page-job"), 10)
    assert text_of(browser, "#job-jid") == jid
    assert text_of(browser, "#job-class") == "Boom"
    assert text_of(browser, "#job-error-class") == "ValueError"
    assert text_of(browser, "#job-error-message") == message
    backtrace = text_of(browser, "#job-backtrace")
    assert "jobs.py" in backtrace and "perform" in backtrace, backtrace
    payload = json.loads(text_of(browser, "#job-payload"))
    assert (payload["jid"], payload["args"]) == (jid, [message])
    press(browser, "#job-actions", "delete")
    until(lambda: DeadSet(rc).find_job(jid) is None, 10)
    wait_until(browser, lambda d: d.find_elements(By.ID, "page-dead"), 10)
    assert jid not in rows(browser, "dead-table", "data-jid")


def test_retry_now_on_dead_runs_the_job_again(browser: WebDriver, web: WebServer,
                                               live: LiveDaemon, rc: redis.Redis) -> None:
    jid = _bury(rc, "Record", "raised from the dead")
    open_page(browser, web, "/dead", "dead")
    _tick(browser, "dead", jid)
    press(browser, "#dead-form", "retry")
    until(lambda: jid in [row["jid"] for row in records(rc)], 15,
          lambda: f"the retried job never ran; log:\n{live.log()}")
    assert DeadSet(rc).find_job(jid) is None


def test_retries_show_a_failing_job_and_retry_kill_delete_act_on_the_selection(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    open_page(browser, web, "/retries", "retries")
    marker = f"retrying-{secrets.token_hex(4)}"
    again, killed, deleted = (_push(rc, "SlowRetry", f"{marker}-{n}") for n in range(3))
    wait_until(browser, lambda d: {again, killed, deleted} <= set(rows(d, "retries-table",
                                                                       "data-jid")), 20,
               lambda: f"the failing jobs never showed on Retries; log:\n{live.log()}")
    assert "slow " + marker in text_of(browser, f'#retries-table tr[data-jid="{again}"]')
    _tick(browser, "retries", again)
    press(browser, "#retries-form", "retry")
    until(lambda: len(attempts(rc, again)) == 2, 15,
          lambda: f"the retried job never ran again; log:\n{live.log()}")
    open_page(browser, web, "/retries", "retries")
    _tick(browser, "retries", killed)
    press(browser, "#retries-form", "kill")
    until(lambda: DeadSet(rc).find_job(killed) is not None, 10)
    assert RetrySet(rc).find_job(killed) is None
    open_page(browser, web, "/retries", "retries")
    _tick(browser, "retries", deleted)
    press(browser, "#retries-form", "delete")
    until(lambda: RetrySet(rc).find_job(deleted) is None, 10)
    assert DeadSet(rc).find_job(deleted) is None


def test_scheduled_jobs_show_live_and_enqueue_now_kill_delete_act(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    open_page(browser, web, "/scheduled", "scheduled")
    later = time.time() + 3600
    now_jid, kill_jid, delete_jid = (_push(rc, "Record", f"later-{n}", at=later)
                                     for n in range(3))
    wait_until(browser, lambda d: {now_jid, kill_jid, delete_jid} <= set(
        rows(d, "scheduled-table", "data-jid")), 10, "the scheduled jobs did not show")
    _tick(browser, "scheduled", now_jid)
    press(browser, "#scheduled-form", "retry")
    until(lambda: now_jid in [row["jid"] for row in records(rc)], 15,
          lambda: f"the job enqueued now never ran; log:\n{live.log()}")
    open_page(browser, web, "/scheduled", "scheduled")
    _tick(browser, "scheduled", kill_jid)
    _tick(browser, "scheduled", delete_jid)
    press(browser, "#scheduled-form", "kill")
    until(lambda: DeadSet(rc).find_job(kill_jid) is not None
          and DeadSet(rc).find_job(delete_jid) is not None, 10)
    open_page(browser, web, "/dead", "dead")
    _tick(browser, "dead", delete_jid)
    press(browser, "#dead-form", "delete")
    until(lambda: DeadSet(rc).find_job(delete_jid) is None, 10)
    assert DeadSet(rc).find_job(kill_jid) is not None
    assert ScheduledSet(rc).find_job(kill_jid) is None


def test_search_finds_by_class_jid_args_and_error_text(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    token = secrets.token_hex(4)
    needles = [_bury(rc, "Record", f"needle-{token}", n) for n in range(3)]
    hay = _bury(rc, "Record", f"hay-{token}")
    odd = _bury(rc, f"Odd{token}", "x", message=f"disk full {token}")
    open_page(browser, web, "/dead", "dead")
    assert sorted(_search(browser, "dead", f"needle-{token}", "args")) == sorted(needles)
    assert _search(browser, "dead", needles[1], "jid") == [needles[1]]
    assert _search(browser, "dead", f"Odd{token}", "class") == [odd]
    assert _search(browser, "dead", f"disk full {token}", "error") == [odd]
    assert _search(browser, "dead", f"needle-{token}", "error") == []
    assert sorted(_search(browser, "dead", token)) == sorted([*needles, hay, odd])


def test_bulk_actions_on_everything_matching_a_search_leave_the_rest(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    token = secrets.token_hex(4)
    later = time.time() + 7200
    doomed = [_push(rc, "Record", f"doomed-{token}", n, at=later) for n in range(4)]
    spared = [_push(rc, "Record", f"spared-{token}", n, at=later) for n in range(2)]
    open_page(browser, web, "/scheduled", "scheduled")
    assert sorted(_search(browser, "scheduled", f"doomed-{token}")) == sorted(doomed)
    press(browser, "#scheduled-all-form", "delete_all", confirm=True)
    until(lambda: all(ScheduledSet(rc).find_job(j) is None for j in doomed), 10)
    assert all(ScheduledSet(rc).find_job(j) is not None for j in spared)
    assert all(DeadSet(rc).find_job(j) is None for j in doomed), "deleted, not killed"
    # the select-all box, then one action on the whole selection
    assert sorted(_search(browser, "scheduled", f"spared-{token}")) == sorted(spared)
    click(browser, "#scheduled-table input[data-select-all]")
    wait_until(browser, lambda d: settled(lambda: all(
        box.is_selected() for box in d.find_elements(
            By.CSS_SELECTOR, "#scheduled-table input[name=key]"))), 5)
    press(browser, "#scheduled-form", "kill")
    until(lambda: all(DeadSet(rc).find_job(j) is not None for j in spared), 10)
    assert all(ScheduledSet(rc).find_job(j) is None for j in spared)


def test_dead_is_paged_latest_first(browser: WebDriver, web: WebServer, rc: redis.Redis) -> None:
    token = secrets.token_hex(4)
    buried = [_bury(rc, "Record", f"paged-{token}", n) for n in range(30)]
    open_page(browser, web, "/dead?per=25", "dead")
    latest_first = buried[::-1]  # buried one after the other: the last has the latest score
    assert rows(browser, "dead-table", "data-jid") == latest_first[:25]
    click(browser, "nav.pager a[data-page='2']")
    second = wait_until(browser, lambda d: "page=2" in d.current_url
                        and rows(d, "dead-table", "data-jid"), 10)
    assert second[:5] == latest_first[25:]
