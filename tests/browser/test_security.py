"""Authentication, the read-only role, CSRF and escaping, in headless Chromium against a live
daemon (and with plain HTTP for the requests a browser would not send). ``forkq web`` runs
here with an admin and a read-only password."""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from forkq.client import Client
from forkq.ops import set_pages
from forkq.ops.queues import Queue
from forkq.ops.sorted_sets import DeadSet

from ..conftest import push
from .harness import (
    Http,
    LiveDaemon,
    WebServer,
    attribute_of,
    hold_still,
    login,
    open_page,
    press,
    rows,
    settled,
    text_of,
    wait_until,
)

pytestmark = [pytest.mark.browser, pytest.mark.process]

ADMIN_PASSWORD = "correct horse battery staple"
READONLY_PASSWORD = "just looking"
WEB_ENV = {"FORKQ_WEB_PASSWORD": ADMIN_PASSWORD, "FORKQ_WEB_READONLY_PASSWORD": READONLY_PASSWORD}
PAGES = {"/": "dashboard", "/busy": "busy", "/queues": "queues", "/scheduled": "scheduled",
         "/retries": "retries", "/dead": "dead", "/periodic": "periodic",
         "/metrics/jobs": "metrics"}


@pytest.fixture
def visitor(browser: WebDriver, web: WebServer) -> Iterator[WebDriver]:
    """The module's browser with no session (logged out, no cookies)."""
    browser.get(web.url + "/login")
    browser.delete_all_cookies()
    yield browser
    browser.delete_all_cookies()


def test_with_a_password_every_page_needs_a_login(visitor: WebDriver, web: WebServer) -> None:
    for path in PAGES:
        visitor.get(web.url + path)
        wait_until(visitor, lambda d: d.find_elements(By.ID, "page-login"), 10,
                   f"{path} did not ask for a login")
        assert "/login" in visitor.current_url
    plain = Http(web.url)
    assert plain.get("/queues").status in (302, 303)
    assert plain.get("/queues", {"Accept": "application/json"}).status == 401
    assert plain.get("/", {"Authorization": "Bearer wrong"}).status == 401
    assert plain.get("/", {"Authorization": f"Bearer {ADMIN_PASSWORD}"}).status == 200


def test_a_wrong_password_is_refused_and_the_right_one_opens_the_page_asked_for(
        visitor: WebDriver, web: WebServer) -> None:
    visitor.get(web.url + "/queues")
    field = wait_until(visitor, lambda d: d.find_elements(By.NAME, "password"), 10)[0]
    field.send_keys("guess")
    field.submit()
    wait_until(visitor, lambda d: text_of(d, "#login-problem") == "wrong password", 10,
               "no complaint about the wrong password")
    field = visitor.find_element(By.NAME, "password")
    field.send_keys(ADMIN_PASSWORD)
    field.submit()
    wait_until(visitor, lambda d: d.current_url.endswith("/queues"), 10,
               "the login did not go back to the page asked for")
    assert text_of(visitor, "#role") == "admin"


def test_the_read_only_role_sees_the_live_data(visitor: WebDriver, web: WebServer,
                                               rc: redis.Redis) -> None:
    login(visitor, web.url, READONLY_PASSWORD)
    assert text_of(visitor, "#role") == "readonly"
    open_page(visitor, web, "/", "dashboard")
    shown = attribute_of(visitor, "#stat-processed", "data-value")
    assert int(shown or -1) == int(rc.get("stat:processed") or 0)
    assert "read-only" in text_of(visitor, "footer")


def _wrong(token: str) -> str:
    """``token`` with its first character changed (an "x" in front of its tail was the
    token itself for one token in 64)."""
    return ("y" if token[0] == "x" else "x") + token[1:]


def test_a_post_without_or_with_a_wrong_csrf_token_is_refused(web: WebServer) -> None:
    plain = Http(web.url)
    assert plain.get("/login").status == 200
    token = plain.cookie("forkq_csrf")
    assert len(token) >= 16, "the login form's visit sets the CSRF cookie"
    for fields in ({"password": ADMIN_PASSWORD},
                   {"password": ADMIN_PASSWORD, "csrf_token": _wrong(token)}):
        answer = plain.post("/login", fields)
        assert answer.status == 403, answer
        assert "CSRF" in answer.body
        assert not plain.cookie("forkq_session"), "a refused login opened a session"
    answer = plain.post("/login", {"password": ADMIN_PASSWORD, "csrf_token": token})
    assert answer.status in (302, 303) and plain.cookie("forkq_session")


def test_an_admin_action_without_the_csrf_token_is_refused_and_changes_nothing(
        web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    _bury(rc, "Record", "stays")
    push(rc, "Record", "stays", queue="csrf-plain")
    before = _snapshot(rc, "csrf-plain")
    plain = Http(web.url)
    assert plain.post("/login", {"password": ADMIN_PASSWORD}).status == 403
    bearer = {"Authorization": f"Bearer {ADMIN_PASSWORD}"}
    assert plain.get("/dead", bearer).status == 200
    token = plain.cookie("forkq_csrf")
    for path, fields in (("/dead/bulk", {"delete_all": "1", "q": ""}),
                         ("/queues/clear", {"name": "csrf-plain"}),
                         ("/busy/stop", {"all": "1"})):
        for forged in ({}, {"csrf_token": token[::-1]}):
            answer = plain.post(path, {**fields, **forged}, bearer)
            assert answer.status == 403 and "CSRF" in answer.body, (path, answer.status)
    assert _snapshot(rc, "csrf-plain") == before
    assert live.process is not None and live.process.poll() is None, "the daemon still runs"


def test_every_answer_has_the_content_security_policy_and_no_action_answers_a_get(
        web: WebServer) -> None:
    plain = Http(web.url)
    answer = plain.get("/login")
    policy = answer.headers.get("Content-Security-Policy", "")
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, policy
    assert "<script>" not in answer.body and " onclick=" not in answer.body
    authorised = {"Authorization": f"Bearer {ADMIN_PASSWORD}"}
    assert plain.get("/logout", authorised).status == 405


@pytest.fixture
def admin(visitor: WebDriver, web: WebServer) -> WebDriver:
    """The module's browser logged in as admin."""
    login(visitor, web.url, ADMIN_PASSWORD)
    return visitor


@pytest.fixture
def readonly(visitor: WebDriver, web: WebServer) -> WebDriver:
    """The module's browser logged in with the read-only password."""
    login(visitor, web.url, READONLY_PASSWORD)
    return visitor


def _refused(driver: WebDriver, why: str) -> None:
    """Wait for the 403 page that says ``why``."""
    wait_until(driver, lambda d: d.find_elements(By.ID, "page-error")
               and text_of(d, "main h1") == "403", 10, "the action was not refused")
    assert why in text_of(driver, "#error-message")


def test_a_form_with_a_forged_or_missing_csrf_token_is_refused_and_changes_nothing(
        admin: WebDriver, web: WebServer, rc: redis.Redis) -> None:
    push(rc, "Record", 1, queue="csrf")
    push(rc, "Record", 2, queue="csrf")
    open_page(admin, web, "/queues/csrf", "queue")
    hold_still(admin)
    admin.execute_script("document.querySelectorAll('input[name=csrf_token]')"
                         ".forEach(function (f) { f.value = 'forged-' + f.value; });")
    press(admin, "main", "pause")
    _refused(admin, "CSRF")
    open_page(admin, web, "/queues/csrf", "queue")
    hold_still(admin)
    admin.execute_script("document.querySelectorAll('input[name=csrf_token]')"
                         ".forEach(function (f) { f.remove(); });")
    press(admin, "main", "clear", confirm=True)
    _refused(admin, "CSRF")
    assert not Queue(rc, "csrf").is_paused() and rc.llen("queue:csrf") == 2


def test_the_read_only_role_sees_the_buttons_disabled_and_every_action_is_refused(
        readonly: WebDriver, web: WebServer, live: LiveDaemon, rc: redis.Redis) -> None:
    jid = push(rc, "Record", "kept", queue="looked-at")
    Client(rc).push({"class": "Record", "args": ["later"], "at": time.time() + 3600})
    rc.zadd("retry", {json.dumps({"class": "Record", "args": [], "jid": "r" * 24,
                                  "queue": "default", "retry_count": 1}): time.time() + 3600})
    dead_key = _bury(rc, "<b>dead</b>", "<script>alert(4)</script>")[1]
    for path, name in (("/dead", "dead"), ("/retries", "retries"), ("/scheduled", "scheduled"),
                       (f"/dead/{dead_key}", "job")):
        open_page(readonly, web, path, name)
        buttons = settled(lambda: [(b.get_attribute("name"), b.is_enabled()) for b in
                                   readonly.find_elements(By.CSS_SELECTOR, "main button")])
        enabled = [b for b, on in buttons if on and b != "search"]
        assert buttons and not enabled, (path, buttons)
    open_page(readonly, web, "/queues/looked-at", "queue")
    assert jid in rows(readonly, "queue-table", "data-jid"), "read-only sees the jobs"
    buttons = settled(lambda: [(b.get_attribute("name"), b.is_enabled()) for b in
                               readonly.find_elements(By.CSS_SELECTOR, "main button")])
    assert buttons and not [name for name, enabled in buttons if enabled], buttons
    # a visitor who enables the button anyway is refused by the server
    hold_still(readonly)
    readonly.execute_script("document.querySelectorAll('main button')"
                            ".forEach(function (b) { b.disabled = false; });")
    press(readonly, "main", "pause")
    _refused(readonly, "read-only")
    identity = next(m.decode() for m in rc.smembers("processes"))
    before = _snapshot(rc, "looked-at")
    plain = Http(web.url)
    bearer = {"Authorization": f"Bearer {READONLY_PASSWORD}"}
    assert plain.get("/queues", bearer).status == 200
    token = plain.cookie("forkq_csrf")
    for path, fields in (("/queues/pause", {"name": "looked-at"}),
                         ("/queues/clear", {"name": "looked-at"}),
                         ("/queues/delete", {"name": "looked-at", "job": jid}),
                         ("/busy/quiet", {"identity": identity}),
                         ("/busy/stop", {"all": "1"}),
                         ("/busy/cancel", {"jid": jid}),
                         ("/periodic/enqueue", {"name": "browser-nightly"}),
                         ("/dead/bulk", {"delete_all": "1", "q": ""}),
                         ("/retries/bulk", {"retry_all": "1", "q": ""}),
                         ("/scheduled/bulk", {"kill_all": "1", "q": ""}),
                         (f"/dead/{dead_key}", {"delete": "1"})):
        answer = plain.post(path, {**fields, "csrf_token": token}, bearer)
        assert answer.status == 403 and "read-only" in answer.body, (path, answer.status)
    assert _snapshot(rc, "looked-at") == before
    assert live.process is not None and live.process.poll() is None, "the daemon still runs"


def _bury(rc: redis.Redis, klass: str, *args: Any) -> tuple[str, str]:
    """A dead entry with markup in its class, args and error; its jid and its page's key."""
    jid = secrets.token_hex(12)
    payload = {"class": klass, "args": list(args), "queue": "default", "jid": jid,
               "error_class": "<i>Err</i>", "error_message": "<script>alert(5)</script>",
               "failed_at": time.time(), "retry_count": 0}
    rc.zadd("dead", {json.dumps(payload): time.time()})
    entry = DeadSet(rc).find_job(jid)
    assert entry is not None
    return jid, set_pages.entry_key(entry)


def _snapshot(rc: redis.Redis, queue: str) -> tuple[Any, ...]:
    """What the refused actions would have changed."""
    return (rc.lrange(f"queue:{queue}", 0, -1), sorted(rc.smembers("forkq:paused")),
            [rc.hget(m, "quiet") for m in sorted(rc.smembers("processes"))],
            [rc.lrange(f"{m.decode()}-signals", 0, -1) for m in sorted(rc.smembers("processes"))],
            rc.llen("queue:periodic-out"), rc.zcard("dead"), rc.zcard("retry"),
            rc.zcard("schedule"))


def test_a_job_whose_args_are_markup_shows_as_text_and_runs_no_script(
        admin: WebDriver, web: WebServer, rc: redis.Redis) -> None:
    admin.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": (
        "window.__alerts = []; window.alert = function (m) { window.__alerts.push(String(m)); };")})
    hostile = "<script>alert(1)</script>"
    jid = push(rc, "Record", hostile, "<img src=x onerror=alert(2)>", queue="xss")
    queue = "<img src=x onerror=alert(3)>"
    push(rc, "<b>Bold</b>", hostile, queue=queue)
    open_page(admin, web, "/queues/xss", "queue")
    wait_until(admin, lambda d: hostile in text_of(d, f'#queue-table tr[data-jid="{jid}"]'), 10,
               "the markup is not shown as text")
    _no_script_ran(admin)
    open_page(admin, web, "/queues", "queues")
    assert queue in text_of(admin, "#queues-table")
    _no_script_ran(admin)
    open_page(admin, web, "/queues/" + urllib.parse.quote(queue, safe=""), "queue")
    assert "<b>Bold</b>" in text_of(admin, "#queue-table")
    _no_script_ran(admin)
    dead, key = _bury(rc, "<b>Bold</b>", hostile)
    open_page(admin, web, "/dead", "dead")
    wait_until(admin, lambda d: hostile in text_of(d, f'#dead-table tr[data-jid="{dead}"]'), 10)
    assert "<i>Err</i>" in text_of(admin, f'#dead-table tr[data-jid="{dead}"]')
    _no_script_ran(admin)
    open_page(admin, web, f"/dead/{key}", "job")
    assert text_of(admin, "#job-class") == "<b>Bold</b>"
    assert hostile in text_of(admin, "#job-args") and hostile in text_of(admin, "#job-payload")
    assert text_of(admin, "#job-error-message") == "<script>alert(5)</script>"
    _no_script_ran(admin)


def _no_script_ran(driver: WebDriver) -> None:
    """No alert is open, none was called (the hook of the XSS test records every call), and
    the page holds no element a job's value made."""
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - the property raises when no alert is open
    assert driver.execute_script("return window.__alerts") == []
    made = driver.execute_script("return document.querySelectorAll("
                                 "'main script, main img, main b, main i, [onerror]').length")
    assert made == 0
