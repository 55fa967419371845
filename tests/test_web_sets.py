"""The dashboard's Scheduled, Retries and Dead pages and the job page over HTTP (the WSGI app
called in-process, on the real throwaway Redis): lists and paging, search by class, jid, args
and error text with its "more…" cursor, bulk actions on a selection and on everything
matching (each checked in Redis), the job page and its actions, hostile members, escaping,
CSRF and the read-only role."""

from __future__ import annotations

import base64
import contextlib
import html
import json
import re
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

import pytest
import redis
import web_pages

from forkq import keys
from forkq.embedded import EmbeddedServer
from forkq.web import make_app
from forkq.web.security import Auth

from .conftest import run_bench
from .test_tls_acl import documented_acl
from .topology import PASSWORD, Node
from .web_client import Browser, serve

XSS = "<script>alert(1)</script>"
HOSTILE = b"\xff\xfe<b>not json</b>"


def job(n: int, **fields: Any) -> str:
    return json.dumps({"class": "Mailer", "args": [n, "hello"], "queue": "mail",
                       "jid": f"{n:024x}", "retry": True, "created_at": 1.7e9,
                       "enqueued_at": 1.7e9, **fields})


def jid(n: int) -> str:
    return f"{n:024x}"


@pytest.fixture
def served(server: EmbeddedServer) -> Iterator[Callable[..., Browser]]:
    """Factory: ``served(auth, wrap)`` serves a new app on a free port; a Browser for it."""
    with contextlib.ExitStack() as stack:

        def start(auth: Auth | None = None, wrap: Callable[[Any], Any] | None = None) -> Browser:
            app = make_app(server.url, auth=auth or Auth(), allow_anonymous=auth is None)
            return Browser(stack.enter_context(serve(wrap(app) if wrap else app)))

        yield start


@pytest.fixture
def web(served: Callable[..., Browser]) -> Browser:
    return served()


def rows(body: str) -> list[str]:
    """The jids of the table rows, in order."""
    return re.findall(r'<tr data-jid="([^"]*)"', body)


def flash(browser: Browser) -> str:
    """The message the last action left for the next page."""
    return unquote(browser.cookies.get("forkq_flash", ""))


def page_keys(text: str) -> list[str]:
    return re.findall(r'<tr data-jid="[^"]*" data-key="([^"]*)"', text)


def test_lists_page_in_each_sets_order(r: redis.Redis, web: Browser) -> None:
    r.zadd(keys.DEAD, {job(n): 1.7e9 + n for n in range(1, 31)})
    r.zadd(keys.SCHEDULE, {job(n): 1.7e9 + n for n in range(1, 4)})
    r.zadd(keys.RETRY, {job(n, retry_count=n): 1.7e9 + n for n in range(1, 4)})
    dead = web.get("/dead")
    assert dead.status == 200 and 'id="page-dead"' in dead.body and 'id="dead-table"' in dead.body
    assert rows(dead.body) == [jid(n) for n in range(30, 5, -1)]
    assert 'data-value="30"' in dead.body and 'data-page="2"' in dead.body
    assert rows(web.get("/dead?page=2").body) == [jid(n) for n in range(5, 0, -1)]
    assert rows(web.get("/dead?page=2&order=asc&per=25").body) == [jid(n) for n in range(26, 31)]
    assert rows(web.get("/scheduled").body) == [jid(1), jid(2), jid(3)]
    retries = web.get("/retries")
    assert rows(retries.body) == [jid(1), jid(2), jid(3)] and 'id="page-retries"' in retries.body
    assert rows(web.get("/dead?page=99").body) == []


def test_hostile_members_and_keys_never_break_a_page(r: redis.Redis, web: Browser) -> None:
    r.zadd(keys.DEAD, {HOSTILE: 2, job(1): 1, "[1,2]": 3})
    dead = web.get("/dead")
    assert dead.status == 200 and rows(dead.body) == ["", "", jid(1)]
    assert dead.body.count("not a job") == 2 and "&lt;b&gt;not json&lt;/b&gt;" in dead.body
    hostile_key = page_keys(dead.body)[1]
    shown = web.get(f"/dead/{hostile_key}")
    assert shown.status == 200 and 'id="job-raw"' in shown.body and 'name="retry"' not in shown.body
    assert web.post(f"/dead/{hostile_key}", {"delete": ""}).status == 303
    assert r.zscore(keys.DEAD, HOSTILE) is None
    r.set(keys.RETRY, "a string")
    retries = web.get("/retries")
    assert retries.status == 200 and 'id="retries-problem"' in retries.body
    assert "&#39;retry&#39; is not a sorted set" in retries.body
    assert web.get("/retries?q=x").status == 200
    broken = web.get("/retries/1.0-0123456789abcdef")
    assert broken.status == 200 and 'id="job-problem"' in broken.body


def test_every_job_value_is_escaped(r: redis.Redis, web: Browser) -> None:
    r.zadd(keys.RETRY, {job(1, **{"class": XSS, "error_class": XSS, "error_message": XSS,
                                 "args": [XSS, {XSS: XSS}], "queue": XSS, XSS: XSS}): 1.7e9})
    listing = web.get("/retries")
    key = page_keys(listing.body)[0]
    for page in (listing, web.get(f"/retries/{key}"), web.get("/retries?q=script")):
        assert page.status == 200 and XSS not in page.body
        assert html.escape(XSS, quote=False) in page.body
    assert "script-src" not in listing.header("Content-Security-Policy")
    assert "default-src 'self'" in listing.header("Content-Security-Policy")


def test_search_by_class_jid_args_and_error(r: redis.Redis, web: Browser) -> None:
    r.zadd(keys.DEAD, {
        job(1, **{"class": "Billing::Invoice"}): 1,
        job(2, args=["order 77", {"note": 'said "hi"'}]): 2,
        job(3, error_class="Net::ReadTimeout", error_message="upstream took 30 s"): 3,
        job(4): 4,
    })
    assert rows(web.get("/dead?q=billing::invoice").body) == [jid(1)]
    assert rows(web.get(f"/dead?q={jid(4)[-6:]}&field=jid").body) == [jid(4)]
    assert rows(web.get("/dead?q=order+77&field=args").body) == [jid(2)]
    assert rows(web.get("/dead?q=said+%22hi%22").body) == [jid(2)]
    assert rows(web.get("/dead?q=READTIMEOUT&field=error").body) == [jid(3)]
    assert rows(web.get("/dead?q=took+30&field=error").body) == [jid(3)]
    assert rows(web.get("/dead?q=mailer&field=class").body) == [jid(4), jid(3), jid(2)]
    assert rows(web.get("/dead?q=nothing-like-this").body) == []
    assert "whole set was searched" in web.get("/dead?q=mailer").body


def test_search_of_a_large_set_continues_with_more(r: redis.Redis, web: Browser) -> None:
    r.zadd(keys.DEAD, {job(n, error_message="needle" if n % 2000 == 0 else "hay"): n
                       for n in range(1, 40_001)})
    found: set[str] = set()
    path, pages = "/dead?q=needle&field=error", 0
    while True:
        page = web.get(path)
        assert page.status == 200
        found |= set(rows(page.body))
        more = re.search(r'<a href="([^"]*)" id="search-more"', page.body)
        pages += 1
        if more is None:
            break
        path = html.unescape(more.group(1))
        assert "cursor=" in path and pages < 100
    assert found == {jid(n) for n in range(2000, 40_001, 2000)}
    assert pages > 1  # one request never scanned the whole set


def _form_keys(r: redis.Redis, name: str, *jids: int) -> list[str]:
    from forkq.ops.records import SortedEntry
    from forkq.ops.set_pages import entry_key
    entries = [SortedEntry(m, score=s) for m, s in r.zrange(name, 0, -1, withscores=True)]
    return [entry_key(e) for e in entries if e.jid in {jid(n) for n in jids}]


def test_bulk_on_the_selection(r: redis.Redis, web: Browser) -> None:
    now = time.time()  # dead entries older than 180 days are trimmed by the next kill
    r.zadd(keys.DEAD, {job(n, retry_count=5): now - 100 + n for n in range(1, 6)})
    r.zadd(keys.RETRY, {job(n): n for n in range(11, 14)})
    r.zadd(keys.SCHEDULE, {job(n): n for n in range(21, 23)})
    chosen = _form_keys(r, keys.DEAD, 1, 2)
    answer = web.post("/dead/bulk", [("retry", ""), *(("key", k) for k in chosen)])
    assert answer.status == 303 and answer.header("Location") == "/dead"
    assert "retry now: 2 done" in flash(web)
    queued = sorted(json.loads(m)["jid"] for m in r.lrange("queue:mail", 0, -1))
    assert queued == [jid(1), jid(2)] and r.zcard(keys.DEAD) == 3
    assert r.sismember(keys.QUEUES, "mail")
    web.post("/dead/bulk", [("delete", ""), *(("key", k) for k in _form_keys(r, keys.DEAD, 3))])
    assert r.zcard(keys.DEAD) == 2 and "delete: 1 done" in flash(web)
    web.post("/retries/bulk", [("kill", ""), *(("key", k) for k in _form_keys(r, keys.RETRY,
                                                                              11, 12))])
    assert r.zcard(keys.RETRY) == 1 and r.zcard(keys.DEAD) == 4
    web.post("/scheduled/bulk", [("retry", ""), *(("key", k) for k in _form_keys(
        r, keys.SCHEDULE, 21))])
    assert r.zcard(keys.SCHEDULE) == 1 and r.llen("queue:mail") == 3
    web.post("/dead/bulk", [("retry", ""), *(("key", k) for k in chosen)])  # already retried
    assert "0 done, 2 no longer there" in flash(web)
    assert web.post("/dead/bulk", [("kill", ""), ("key", chosen[0])]).status == 303
    assert flash(web) == "no such action"


def test_bulk_on_everything_matching(r: redis.Redis, web: Browser) -> None:
    r.zadd(keys.RETRY, {job(n, error_class="Boom" if n % 2 else "Fine"): n for n in range(1, 21)})
    answer = web.post("/retries/bulk", {"kill_all": "", "q": "boom", "field": "error"})
    assert answer.status == 303 and "q=boom" in answer.header("Location")
    assert "kill: 10 done" in flash(web)
    dead = [json.loads(m) for m in r.zrange(keys.DEAD, 0, -1)]
    assert len(dead) == 10 and {d["error_class"] for d in dead} == {"Boom"}
    assert r.zcard(keys.RETRY) == 10
    web.post("/retries/bulk", {"retry_all": "", "q": "", "field": "any"})
    assert r.zcard(keys.RETRY) == 0 and r.llen("queue:mail") == 10
    web.post("/dead/bulk", {"delete_all": "", "q": "nothing"})
    assert r.zcard(keys.DEAD) == 10 and "nothing matched" in flash(web)
    web.post("/dead/bulk", {"delete_all": ""})
    assert r.exists(keys.DEAD) == 0


def test_job_page_and_its_actions(r: redis.Redis, web: Browser) -> None:
    trace = base64.b64encode(zlib.compress(json.dumps(
        ["app/jobs.py:12:in `perform'", "forkq/run.py:3"]).encode())).decode()
    r.zadd(keys.RETRY, {job(1, error_class="KeyError", error_message="'invoice'",
                           error_backtrace=trace, retry_count=4, failed_at=1.7e9,
                           tags=["a", "b"]): 1.8e9})
    key = page_keys(web.get("/retries").body)[0]
    page = web.get(f"/retries/{key}")
    assert page.status == 200 and 'id="page-job"' in page.body
    assert f'data-jid="{jid(1)}"' in page.body and 'id="job-class">Mailer' in page.body
    assert "app/jobs.py:12:in `perform&#39;" in page.body
    assert "KeyError" in page.body and "&#39;invoice&#39;" in page.body
    assert 'id="job-retry-count">4<' in page.body and "failed at" in page.body
    assert "&#34;tags&#34;: [\n    &#34;a&#34;," in page.body  # the payload, indented
    assert page.body.count('name="kill"') == 1
    answer = web.post(f"/retries/{key}", {"retry": ""})
    assert answer.status == 303 and r.zcard(keys.RETRY) == 0
    assert json.loads(r.lindex("queue:mail", 0) or b"{}")["retry_count"] == 3
    gone = web.get(f"/retries/{key}")
    assert gone.status == 404 and 'id="job-missing"' in gone.body
    r.zadd(keys.RETRY, {job(2): 1e20, job(3): -2.5, job(4): float("inf")})
    for key in page_keys(web.get("/retries").body):
        assert web.get(f"/retries/{key}").status == 200, key
        assert web.post(f"/retries/{key}", {"kill": ""}).status == 303
    assert r.zcard(keys.RETRY) == 0


def test_actions_need_post_csrf_and_the_admin_role(r: redis.Redis,
                                                   served: Callable[..., Browser]) -> None:
    r.zadd(keys.DEAD, {job(1): 1})
    web = served(Auth(admin_password="admin-pw", readonly_password="look-only"))
    web.headers["Authorization"] = "Bearer look-only"
    listing = web.get("/dead")
    assert listing.status == 200 and rows(listing.body) == [jid(1)]
    assert 'name="retry" class="" disabled' in listing.body
    key = page_keys(listing.body)[0]
    assert web.post("/dead/bulk", {"delete_all": ""}).status == 403
    assert web.post(f"/dead/{key}", {"delete": ""}).status == 403
    web.headers["Authorization"] = "Bearer admin-pw"
    assert web.post("/dead/bulk", {"delete_all": ""}, csrf="").status == 403
    assert web.post("/dead/bulk", {"delete_all": ""}, csrf="forged-token-1234").status == 403
    assert web.get(f"/dead/{key}?delete=1").status == 200
    assert web.get("/dead/bulk?delete_all=1").status == 404
    assert r.zcard(keys.DEAD) == 1
    assert web.post("/dead/bulk", {"delete_all": ""}).status == 303
    assert r.zcard(keys.DEAD) == 0


def mounted(prefix: str) -> Callable[[Any], Any]:
    """Wrap an app as a host application mounting it under ``prefix`` would."""

    def wrap(app: Any) -> Any:
        def dispatcher(environ: dict[str, Any], start_response: Any) -> Any:
            path = environ["PATH_INFO"]
            assert path.startswith(prefix), path
            environ = {**environ, "SCRIPT_NAME": prefix, "PATH_INFO": path[len(prefix):]}
            return app(environ, start_response)

        return dispatcher

    return wrap


def test_links_keep_the_mount_prefix(r: redis.Redis, served: Callable[..., Browser]) -> None:
    r.zadd(keys.DEAD, {job(n): n for n in range(30)})
    web = served(wrap=mounted("/ops/forkq"))
    web.base += "/ops/forkq"
    page = web.get("/dead")
    assert 'action="/ops/forkq/dead/bulk"' in page.body
    assert 'href="/ops/forkq/dead?page=2' in page.body
    key = page_keys(page.body)[0]
    assert f'href="/ops/forkq/dead/{key}"' in page.body
    answer = web.post("/dead/bulk", [("delete", ""), ("key", key)])
    assert answer.header("Location") == "/ops/forkq/dead" and r.zcard(keys.DEAD) == 29


SET_PAGES = ("Scheduled", "Retries", "Dead", "Dead, page 4000", "Dead, search by class",
             "Dead, search: no match", "Dead, search in args", "a dead job", "a retry",
             "a scheduled job")
"""The pages of this module, whose cost must not grow with the set they show."""
SET_PAGE_COMMANDS = 10
SET_PAGE_KIB = 32.0


@pytest.mark.process
def test_bench_web_times_every_page_at_scale() -> None:
    """``bench/web_pages.py`` fills its own throwaway server (100,000 dead jobs, 1,000 queues)
    and prints one row per page, each served (200). The pages of this module answer at that
    scale with a page's worth of Redis commands and bytes, not the set's: their render time
    under the bench's 100 ms bound is the bench's figure (its exit status), never this test's,
    since a loaded host can miss any wall-clock bound."""
    done = run_bench("web_pages.py", timeout=300)
    # a row's label and path may hold spaces; its last nine cells are: status, KiB, cmds,
    # median ms, max ms, "<", bound, "ms", verdict
    rows = {line[:24].strip(): line.split()[-9:] for line in done.stdout.splitlines()
            if line.endswith(("PASS", "FAIL", "MISSING"))}
    assert "dead 100,000" in done.stdout and "queues 1,000" in done.stdout, done.stdout
    for label, _ in web_pages.pages(dict.fromkeys(("dead", "retries", "scheduled"), "k")):
        assert label in rows and rows[label][0] == "200", done.stdout
    for label in SET_PAGES:
        kib, commands = float(rows[label][1]), int(rows[label][2])
        assert commands <= SET_PAGE_COMMANDS and kib <= SET_PAGE_KIB, (label, done.stdout)
    failing = [row for row in rows.values() if row[-1] != "PASS"]
    assert done.returncode == (1 if failing else 0), done.stderr


def test_bench_web_times_every_page_the_app_serves() -> None:
    """Every GET route of the app (but the login form) is among ``bench/web_pages.py``'s pages,
    those with a parameter through an example path."""
    from forkq.web import routes, views
    views.load()
    timed = [path.split("?")[0] for _, path in web_pages.pages(
        dict.fromkeys(("dead", "retries", "scheduled"), "1.0-0123456789abcdef"))]
    for candidate in routes.ROUTES:
        if candidate.method != "GET" or candidate.pattern == "/login":
            continue
        assert any(candidate.regex.match(path) for path in timed), candidate.pattern


@pytest.mark.process
def test_every_set_page_and_action_works_as_the_documented_least_privilege_acl_user(
        tmp_path: Any) -> None:
    node = Node(tmp_path / "acl", ["--requirepass", PASSWORD])
    node.start()
    try:
        admin = node.client()
        admin.execute_command(*documented_acl("acl-secret"))
        url = f"redis://forkq:acl-secret@127.0.0.1:{node.port}/0"
        now = time.time()
        admin.zadd(keys.DEAD, {job(n, error_class="Boom"): now - n for n in range(1, 7)})
        admin.zadd(keys.RETRY, {job(n): now + n for n in range(11, 15)})
        admin.zadd(keys.SCHEDULE, {job(n): now + n for n in range(21, 24)})
        admin.zadd(keys.DEAD, {HOSTILE: now})
        admin.script_flush()
        with serve(make_app(url, auth=Auth(), allow_anonymous=True)) as base:
            web = Browser(base)
            for path in ("/scheduled", "/retries", "/dead", "/dead?q=boom&field=error",
                         "/dead?page=2&per=50&order=asc"):
                assert web.get(path).status == 200, path
            dead_keys = page_keys(web.get("/dead").body)
            assert web.get(f"/dead/{dead_keys[1]}").status == 200
            assert web.post("/dead/bulk", [("retry", ""), ("key", dead_keys[1])]).status == 303
            assert web.post(f"/dead/{dead_keys[2]}", {"delete": ""}).status == 303
            assert web.post("/retries/bulk", {"kill_all": "", "q": "mailer"}).status == 303
            assert web.post("/scheduled/bulk", {"retry_all": ""}).status == 303
            assert web.post("/dead/bulk", {"delete_all": "", "q": "boom"}).status == 303
            assert web.post("/dead/bulk", {"delete_all": ""}).status == 303
        assert admin.llen("queue:mail") == 4 and admin.zcard(keys.RETRY) == 0
        assert not admin.exists(keys.DEAD) and admin.zcard(keys.SCHEDULE) == 0
        denied = admin.acl_log()
        assert denied == [], json.dumps(denied, default=str, indent=1)
    finally:
        node.stop()
