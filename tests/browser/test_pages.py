"""The Dashboard, Busy, Queues, Periodic and Metrics pages in headless Chromium against a live
daemon: each shows what is in Redis and keeps itself up to date without a reload, and each
button acts (checked in Redis)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from forkq.client import Client
from forkq.embedded import EmbeddedServer
from forkq.ops.queues import Queue
from forkq.ops.sorted_sets import DeadSet

from ..conftest import push, records, until
from .harness import (
    LiveDaemon,
    WebServer,
    attribute_of,
    click,
    open_page,
    press,
    rows,
    running_daemon,
    settled,
    text_of,
    wait_until,
)

pytestmark = [pytest.mark.browser, pytest.mark.process]


def _number(text: str) -> int:
    return int(text.replace(",", "").strip() or 0)


def test_the_dashboard_shows_the_totals_and_follows_them_without_a_reload(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    open_page(browser, web, "/", "dashboard")
    before = _number(attribute_of(browser, "#stat-processed", "data-value"))
    assert before == int(rc.get("stat:processed") or 0)
    Client(rc).push_bulk({"class": "Record", "args": [["dash"]] * 5})
    # no driver.get: the page refreshes itself
    wait_until(browser, lambda d: _number(attribute_of(d, "#stat-processed", "data-value"))
               >= before + 5,
               20, lambda: f"processed stayed {before}; daemon log:\n{live.log()}")
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    wait_until(browser, lambda d: _number(text_of(
        d, f"#history-table tr[data-date='{today}'] td:nth-child(2)")) >= 5, 10,
        "today's history row does not show the jobs")
    version = rc.info()["redis_version"]
    assert text_of(browser, "#redis-facts dd[data-fact=redis_version]") == version
    click(browser, "a[data-days='30']")
    wait_until(browser, lambda d: len(rows(d, "history-table", "data-date")) == 30, 10,
               "the 30 days of history did not show")
    assert rows(browser, "history-table", "data-date")[0] == today
    wait_until(browser, lambda d: _number(attribute_of(d, "#throughput-chart", "data-points"))
               >= 1, 10,
               "the throughput chart never drew a point")


def _identity(rc: redis.Redis, daemon: LiveDaemon) -> str:
    """The daemon's process identity (waits for its first heartbeat)."""
    found: list[str] = []

    def look() -> bool:
        found[:] = [m.decode() for m in rc.smembers("processes")
                    if m.decode().split(":")[1] == str(daemon.pid)]
        return bool(found)

    until(look, 20, lambda: f"daemon {daemon.pid} never registered:\n{daemon.log()}")
    return found[0]


def _dead(rc: redis.Redis, jid: str) -> dict[str, Any] | None:
    entry = DeadSet(rc).find_job(jid)
    return None if entry is None else dict(json.loads(entry.raw))


def test_busy_shows_the_running_job_for_how_long_and_cancel_stops_it(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    identity = _identity(rc, live)
    open_page(browser, web, "/busy", "busy")
    wait_until(browser, lambda d: identity in rows(d, "processes-table", "data-identity"), 10)
    jid = push(rc, "Patient", 120, queue="busy")
    row = f'#work-table tr[data-jid="{jid}"]'
    wait_until(browser, lambda d: text_of(d, f"{row} [data-field=running]"), 20,
               lambda: f"the running job never showed on Busy; log:\n{live.log()}")
    assert attribute_of(browser, row, "data-identity") == identity
    busy = f'#processes-table tr[data-identity="{identity}"] [data-field=busy]'
    assert int(text_of(browser, busy) or 0) >= 1
    press(browser, row, "cancel", confirm=True)
    # Patient never looks at cancel_requested(): it is killed after cancel_grace (5 s)
    until(lambda: _dead(rc, jid), 20, lambda: f"not cancelled; log:\n{live.log()}")
    assert (_dead(rc, jid) or {})["error_class"] == "forkq.JobCancelledError"
    wait_until(browser, lambda d: jid not in rows(d, "work-table", "data-jid"), 15)


def test_quiet_and_stop_reach_a_process(browser: WebDriver, web: WebServer,
                                        redis_server: EmbeddedServer, folder: Path,
                                        rc: redis.Redis) -> None:
    with running_daemon(redis_server.url, folder / "victim",
                        "concurrency: 1\nrequire: jobs\ntag: victim\nqueues: [victim]\n") as victim:
        identity = _identity(rc, victim)
        row = f'#processes-table tr[data-identity="{identity}"]'
        open_page(browser, web, "/busy", "busy")
        press(browser, row, "quiet")
        until(lambda: rc.hget(identity, "quiet") == b"true", 15,
              lambda: f"never quiet; log:\n{victim.log()}")
        wait_until(browser, lambda d: "quiet" in text_of(d, f"{row} [data-field=state]"), 10,
                   "the process does not show as quiet")
        press(browser, row, "stop", confirm=True)
        until(lambda: victim.process is not None and victim.process.poll() is not None, 20,
              lambda: f"never stopped; log:\n{victim.log()}")
        assert victim.process is not None and victim.process.returncode == 0, victim.log()
        wait_until(browser, lambda d: identity not in rows(d, "processes-table",
                                                           "data-identity"), 15)


def test_queues_show_size_latency_and_paused_live_and_pause_resume_clear_act(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    served = push(rc, "Record", "listed", queue="pausable")  # a served queue, listed once used
    until(lambda: served in [row["jid"] for row in records(rc)], 15, lambda: live.log())
    open_page(browser, web, "/queues", "queues")
    for n in range(3):
        push(rc, "Record", n, queue="parked")
    row = '#queues-table tr[data-queue="parked"]'
    wait_until(browser, lambda d: text_of(d, f"{row} [data-field=size]") == "3", 10,
               "a new queue did not show without a reload")
    assert text_of(browser, f"{row} [data-field=latency]")
    press(browser, '#queues-table tr[data-queue="pausable"]', "pause")
    until(lambda: Queue(rc, "pausable").is_paused(), 10)
    pausable = '#queues-table tr[data-queue="pausable"]'
    wait_until(browser, lambda d: "paused" in text_of(d, f"{pausable} [data-field=state]"), 10)
    jid = push(rc, "Record", "after resume", queue="pausable")
    press(browser, pausable, "resume")
    until(lambda: not Queue(rc, "pausable").is_paused(), 10)
    until(lambda: jid in [row["jid"] for row in records(rc)], 15,
          lambda: f"the resumed queue was not served; log:\n{live.log()}")
    press(browser, row, "clear", confirm=True)
    until(lambda: rc.llen("queue:parked") == 0, 10)
    wait_until(browser, lambda d: text_of(d, f"{row} [data-field=size]") in ("", "0"), 10)


def test_a_queue_page_lists_its_jobs_in_pages_and_deletes_one(
        browser: WebDriver, web: WebServer, rc: redis.Redis) -> None:
    jids = Client(rc).push_bulk({"class": "Record", "queue": "paged",
                                 "args": [[n] for n in range(60)]})
    open_page(browser, web, "/queues/paged", "queue")
    first = wait_until(browser, lambda d: rows(d, "queue-table", "data-jid"), 10)
    assert set(first) <= set(jids) and len(first) < 60
    assert text_of(browser, "#queue-facts [data-field=size]") == "60"
    settled(lambda: browser.find_element(By.CSS_SELECTOR, "nav.pager a[data-page='2']").click())
    second = wait_until(browser, lambda d: "page=2" in d.current_url
                        and rows(d, "queue-table", "data-jid"), 10)
    assert set(second) <= set(jids) and not set(second) & set(first)
    victim = second[0]
    press(browser, f'#queue-table tr[data-jid="{victim}"]', "delete", confirm=True)
    until(lambda: rc.llen("queue:paged") == 59, 10)
    assert victim not in [json.loads(j)["jid"] for j in rc.lrange("queue:paged", 0, -1)]
    jid = push(rc, "Record", "newest", queue="paged")
    open_page(browser, web, "/queues/paged", "queue")
    assert jid in rows(browser, "queue-table", "data-jid")


def test_periodic_lists_each_entry_and_enqueue_now_pushes_it(
        browser: WebDriver, web: WebServer, rc: redis.Redis) -> None:
    open_page(browser, web, "/periodic", "periodic")
    row = '#periodic-table tr[data-periodic="browser-nightly"]'
    cells = settled(lambda: [cell.text for cell in browser.find_elements(By.CSS_SELECTOR,
                                                                          f"{row} td")])
    assert "0 3 * * *" in cells and "Europe/Berlin" in cells and "Record" in cells, cells
    assert text_of(browser, f"{row} [data-field=next]"), "no next tick"
    press(browser, row, "enqueue")
    until(lambda: rc.llen("queue:periodic-out") == 1, 10)
    [job] = [json.loads(j) for j in rc.lrange("queue:periodic-out", 0, -1)]
    assert (job["class"], job["args"]) == ("Record", ["periodic"])


def test_metrics_show_executions_failures_and_durations_per_class_and_a_queue_over_time(
        browser: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    open_page(browser, web, "/metrics/jobs", "metrics")
    row = '#metrics-table tr[data-class="Record"]'
    before = _number(text_of(browser, f"{row} [data-field=executions]"))
    Client(rc).push_bulk({"class": "Record", "args": [["metered"]] * 8})
    Client(rc).push_bulk({"class": "Boom", "args": [["metered"]] * 2, "retry": False})
    # written with the children's heartbeats; shown by the page's own refresh
    wait_until(browser, lambda d: _number(text_of(d, f"{row} [data-field=executions]"))
               >= before + 8, 30, lambda: f"Record's executions stayed at {before}")
    wait_until(browser, lambda d: _number(text_of(
        d, '#metrics-table tr[data-class="Boom"] [data-field=failures]')) >= 2, 30,
        "Boom's failures never showed")
    assert text_of(browser, f"{row} [data-field=avg]").endswith("ms")
    click(browser, f"{row} a")
    wait_until(browser, lambda d: text_of(d, "#histogram-class") == "Record", 10)
    counts = settled(lambda: [_number(cell.text) for cell in browser.find_elements(
        By.CSS_SELECTOR, "#histogram-table tr[data-bucket] td:nth-child(2)")])
    assert sum(counts) >= 8, counts
    click(browser, '#page-metrics a[data-queue="default"]')
    wait_until(browser, lambda d: text_of(d, "#series-queue") == "default"
               and _number(attribute_of(d, "#queue-series", "data-points")) >= 1, 10,
               "no sample of queue default")
    click(browser, "h1 a[data-minutes='480']")
    wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "h1 strong[data-minutes='480']")
               and _number(text_of(d, f"{row} [data-field=executions]")) >= before + 8, 10)
