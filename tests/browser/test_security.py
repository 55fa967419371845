"""Authentication, the read-only role, CSRF and escaping, in headless Chromium against a live
daemon (and with plain HTTP for the requests a browser would not send). ``forkq web`` runs
here with an admin and a read-only password."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from .harness import Http, WebServer, attribute_of, login, open_page, text_of, wait_until

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


def test_a_post_without_or_with_a_wrong_csrf_token_is_refused(web: WebServer) -> None:
    plain = Http(web.url)
    assert plain.get("/login").status == 200
    token = plain.cookie("forkq_csrf")
    assert len(token) >= 16, "the login form's visit sets the CSRF cookie"
    for fields in ({"password": ADMIN_PASSWORD},
                   {"password": ADMIN_PASSWORD, "csrf_token": "x" + token[1:]}):
        answer = plain.post("/login", fields)
        assert answer.status == 403, answer
        assert "CSRF" in answer.body
        assert not plain.cookie("forkq_session"), "a refused login opened a session"
    answer = plain.post("/login", {"password": ADMIN_PASSWORD, "csrf_token": token})
    assert answer.status in (302, 303) and plain.cookie("forkq_session")


def test_every_answer_has_the_content_security_policy_and_no_action_answers_a_get(
        web: WebServer) -> None:
    plain = Http(web.url)
    answer = plain.get("/login")
    policy = answer.headers.get("Content-Security-Policy", "")
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, policy
    assert "<script>" not in answer.body and " onclick=" not in answer.body
    authorised = {"Authorization": f"Bearer {ADMIN_PASSWORD}"}
    assert plain.get("/logout", authorised).status == 405
