"""The Dashboard, Busy, Queues, Periodic and Metrics pages in headless Chromium against a live
daemon: each shows what is in Redis and keeps itself up to date without a reload, and each
button acts (checked in Redis)."""

from __future__ import annotations

import datetime as dt

import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from forkq.client import Client

from .harness import LiveDaemon, WebServer, open_page, text_of, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.process]


def _number(text: str) -> int:
    return int(text.replace(",", "").strip() or 0)


def test_the_dashboard_shows_the_totals_and_follows_them_without_a_reload(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    open_page(browser, web, "/", "dashboard")
    before = _number(browser.find_element(By.ID, "stat-processed").get_attribute("data-value")
                     or "0")
    assert before == int(rc.get("stat:processed") or 0)
    Client(rc).push_bulk({"class": "Record", "args": [["dash"]] * 5})
    # no driver.get: the page refreshes itself
    wait_until(browser, lambda d: _number(d.find_element(By.ID, "stat-processed")
                                          .get_attribute("data-value") or "0") >= before + 5,
               20, lambda: f"processed stayed {before}; daemon log:\n{live.log()}")
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    wait_until(browser, lambda d: _number(text_of(
        d, f"#history-table tr[data-date='{today}'] td:nth-child(2)")) >= 5, 10,
        "today's history row does not show the jobs")
    version = rc.info()["redis_version"]
    assert text_of(browser, "#redis-facts dd[data-fact=redis_version]") == version
    wait_until(browser, lambda d: int(d.find_element(By.ID, "throughput-chart")
                                      .get_attribute("data-points") or 0) >= 1, 10,
               "the throughput chart never drew a point")
