"""The dashboard over HTTP (the WSGI app served in-thread on a real socket, the real session
Redis, a real daemon where processes matter): every page shows the live data, every button
acts (checked in Redis), and the security rules hold (CSRF, roles, login, headers, escaping,
no action by GET)."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import time
from collections.abc import Callable, Iterator
from html import unescape
from typing import Any

import pytest
import redis

import forkq
from forkq import cron, keys, limiter, unique
from forkq.client import Client
from forkq.config import Config
from forkq.daemon.master import heartbeats
from forkq.embedded import EmbeddedServer
from forkq.errors import ConfigError
from forkq.metrics import layout
from forkq.ops.records import SortedEntry
from forkq.ops.set_pages import entry_key
from forkq.web import Auth, Throttle, make_app
from forkq.web.mount import mount

from .conftest import records, until
from .test_tls_acl import documented_acl
from .topology import PASSWORD, Node
from .web_client import Browser, serve

ADMIN, READER = "s3cret-admin", "s3cret-reader"
XSS = "<script>alert(1)</script>"


@pytest.fixture
def web(server: EmbeddedServer, r: redis.Redis) -> Iterator[Callable[..., Browser]]:
    """Factory: ``web(auth=None, **make_app options)`` serves a new app; a Browser for it."""
    with contextlib.ExitStack() as stack:

        def start(auth: Auth | None = None, wrap: Callable[[Any], Any] | None = None,
                  **options: Any) -> Browser:
            app = make_app(server.url, auth=auth or Auth(),
                           allow_anonymous=auth is None, **options)
            return Browser(stack.enter_context(serve(wrap(app) if wrap else app)))

        yield start


def _push(r: redis.Redis, queue: str, *args: Any, klass: str = "Record") -> str:
    jid = Client(r).push({"class": klass, "args": list(args), "queue": queue})
    assert jid
    return jid


# --- pages show the data ----------------------------------------------------------------


def test_dashboard_shows_totals_history_and_redis_facts(web: Any, r: redis.Redis) -> None:
    r.set("stat:processed", 1234)
    r.set("stat:failed", 56)
    r.set(keys.daily("stat:processed", keys.utc_date()), 77)
    _push(r, "default", 1)
    r.zadd("dead", {json.dumps({"class": "X", "jid": "d" * 24}): time.time()})
    page = web().get("/")
    assert page.status == 200
    assert 'id="page-dashboard"' in page.body
    assert 'id="stat-processed" data-value="1234"' in page.body
    assert 'id="stat-failed" data-value="56"' in page.body
    assert '<div class="value" id="stat-enqueued">1</div>' in page.body
    assert '<div class="value" id="stat-dead">1</div>' in page.body
    assert "77" in page.row("data-date", keys.utc_date())
    assert '<div class="value" id="stat-today-processed">77</div>' in page.body
    assert '<div class="value" id="stat-failure-rate">0.0 %</div>' in page.body
    assert 'data-fact="redis_version"' in page.body and 'data-fact="connected_clients"' in page.body
    assert 'id="throughput-chart"' in page.body
    assert len(web().get("/?days=30").body.split("data-date=")) - 1 == 30


def test_every_response_carries_the_security_headers_and_assets_are_shipped(web: Any) -> None:
    browser = web()
    page = browser.get("/")
    csp = page.header("Content-Security-Policy")
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "form-action 'self'" in csp
    assert page.header("X-Content-Type-Options") == "nosniff"
    assert page.header("X-Frame-Options") == "DENY"
    assert page.header("Cache-Control") == "no-store"
    assert "<script>" not in page.body and " style=" not in page.body, "no inline script/style"
    for asset in ("/static/forkq.js", "/static/forkq.css", "/static/favicon.svg"):
        assert f'"{asset}"' in page.body
        got = browser.get(asset)
        assert got.status == 200 and got.body, asset
        assert "default-src 'self'" in got.header("Content-Security-Policy")
    assert browser.get("/static/../app.py").status == 404
    assert browser.get("/static/nope.js").status == 404


@pytest.mark.slow
def test_busy_page_shows_processes_and_running_jobs_and_its_buttons_act(
        web: Any, r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 2\nrequire: jobs\ntag: webtest\n")
    gated = _push(r, "default", "g1", 60, klass="Gate")
    until(lambda: records(r, "test:started"), 20, lambda: d.log())
    browser = web()

    def busy_page() -> Any:
        return browser.get("/busy")

    until(lambda: f'data-jid="{gated}"' in busy_page().body, 15)
    page = busy_page()
    identity = next(i.decode() for i in r.smembers("processes"))
    row = page.row("data-identity", identity)
    assert "webtest" in row and f">{d.pid}<" in row
    assert '<td class="num">2</td>' in row  # concurrency
    assert "leader" in row
    work = page.row("data-jid", gated)
    assert "Gate" in work and "g1" in work
    # cancel the running job: Gate ignores the request, so its processor is killed after
    # cancel_grace (5 s) and the job filed to dead
    done = browser.post("/busy/cancel", {"jid": gated})
    assert done.status == 303
    flash = unescape(browser.get("/busy").body)  # names the job, not a Redis key
    assert f"Gate {gated}: running; asked to stop" in flash, flash
    assert "forkq:inflight" not in flash
    until(lambda: any(json.loads(m).get("jid") == gated for m in r.zrange("dead", 0, -1)), 15,
          lambda: d.log())
    # quiet the process: the remote signal is queued, the process goes quiet at its beat
    assert browser.post("/busy/quiet", {"identity": identity}).status == 303
    until(lambda: r.hget(identity, "quiet") == b"true", 15, lambda: d.log())
    assert "quiet" in busy_page().row("data-identity", identity)
    # stop it: the daemon exits
    assert browser.post("/busy/stop", {"identity": identity}).status == 303
    until(lambda: not d.alive(), 30, lambda: d.log())


def test_queues_page_and_its_actions(web: Any, r: redis.Redis) -> None:
    for n in range(3):
        _push(r, "mail", n)
    _push(r, "reports", 1)
    r.sadd(keys.PAUSED, "reports")
    browser = web()
    page = browser.get("/queues")
    assert 'id="page-queues"' in page.body
    mail = page.row("data-queue", "mail")
    assert '<td class="num" data-field="size">3</td>' in mail
    assert "paused" not in mail
    assert "paused" in page.row("data-queue", "reports")
    # pause, resume
    assert browser.post("/queues/pause", {"name": "mail"}).status == 303
    assert r.sismember(keys.PAUSED, "mail")
    assert "paused" in browser.get("/queues").row("data-queue", "mail")
    browser.post("/queues/resume", {"name": "reports"})
    assert not r.sismember(keys.PAUSED, "reports")
    # clear
    done = browser.post("/queues/clear", {"name": "reports"})
    assert done.status == 303 and done.header("Location") == "/queues"
    assert not r.exists("queue:reports") and not r.sismember("queues", "reports")
    flashed = browser.get("/queues")
    assert "cleared reports: 1 job dropped" in flashed.body
    assert "cleared reports" not in browser.get("/queues").body, "a flash shows once"


def test_the_busy_page_says_1_process_and_1_processor_not_1_processes(
        web: Any, r: redis.Redis) -> None:
    identity = "host:1:0123abcd"
    one = Config(concurrency=1)
    heartbeats.beat(r, identity, info=heartbeats.process_info(one, identity, 1, time.time()),
                    busy={}, quiet=False, rss_kb=1, concurrency=1)
    heading = web().get("/busy").body.split("<h1>", 1)[1].split("</h1>", 1)[0]
    assert "0 of 1 processor busy, 1 process<" in heading, heading


def test_a_queue_page_pages_its_jobs_and_deletes_one_by_its_bytes(web: Any,
                                                                   r: redis.Redis) -> None:
    jids = [_push(r, "bulk", n) for n in range(60)]  # newest (jids[-1]) at the left end
    browser = web()
    first = browser.get("/queues/bulk")
    assert first.status == 200 and 'id="page-queue"' in first.body
    assert first.has_row("data-jid", jids[-1]) and not first.has_row("data-jid", jids[-26])
    second = browser.get("/queues/bulk?page=2")
    assert second.has_row("data-jid", jids[-26]) and second.has_row("data-jid", jids[-50])
    assert not second.has_row("data-jid", jids[-1])
    assert browser.get("/queues/bulk?page=3").has_row("data-jid", jids[0])
    assert browser.get("/queues/bulk?page=99").has_row("data-jid", jids[0]), "clamped"
    member = r.lindex("queue:bulk", 5)
    assert member is not None and json.loads(member)["jid"] == jids[-6]
    done = browser.post("/queues/delete", {"name": "bulk", "job": base64.b64encode(member),
                                           "back": "queue"})
    assert done.status == 303 and done.header("Location") == "/queues/bulk"
    assert r.llen("queue:bulk") == 59
    assert jids[-6] not in [json.loads(m)["jid"] for m in r.lrange("queue:bulk", 0, -1)]
    again = browser.post("/queues/delete", {"name": "bulk", "job": base64.b64encode(member)})
    assert again.status == 303 and r.llen("queue:bulk") == 59
    assert "no longer in bulk" in browser.get("/queues").body


def test_a_queue_name_with_a_slash_and_odd_characters(web: Any, r: redis.Redis) -> None:
    jid = _push(r, "team/a b%2F&c", 1)
    browser = web()
    listing = browser.get("/queues")
    assert 'href="/queues/team%2Fa%20b%252F%26c"' in listing.body
    page = browser.get("/queues/team%2Fa%20b%252F%26c")
    assert page.has_row("data-jid", jid), page.main()


def test_periodic_page_lists_entries_and_enqueues_now(web: Any, r: redis.Redis) -> None:
    entries = cron.read_entries([
        {"name": "nightly", "cron": "0 3 * * *", "class": "Record", "args": ["eu"],
         "timezone": "Europe/Berlin", "queue": "reports"},
        {"name": "often", "cron": "*/5 * * * *", "class": "Record"}])
    r.hset(keys.PERIODIC, mapping={"nightly": time.time() - 3600, "retired": time.time() - 60})
    browser = web(periodic=entries)
    page = browser.get("/periodic")
    nightly = page.row("data-periodic", "nightly")
    assert "0 3 * * *" in nightly and "Europe/Berlin" in nightly and "reports" in nightly
    assert "1h 00m ago" in nightly and "in " in nightly  # last tick, next tick
    assert "never" in page.row("data-periodic", "often")
    assert page.has_row("data-periodic", "retired"), "names Redis knows are listed too"
    done = browser.post("/periodic/enqueue", {"name": "nightly"})
    assert done.status == 303
    jobs = [json.loads(m) for m in r.lrange("queue:reports", 0, -1)]
    assert len(jobs) == 1 and jobs[0]["class"] == "Record" and jobs[0]["args"] == ["eu"]
    assert jobs[0]["periodic"] == "nightly"
    assert browser.post("/periodic/enqueue", {"name": "nope"}).status == 303
    assert r.llen("queue:reports") == 1


def test_metrics_page_shows_classes_histogram_and_queue_series(web: Any, r: redis.Redis) -> None:
    now = time.time()
    r.hset(layout.jobs8(now), mapping={"Hard|p": 10, "Hard|f": 2, "Hard|ms": 4000,
                                       "Easy|p": 5, "Easy|ms": 50, "Quick|p": 10,
                                       "Quick|ms": 4})
    r.execute_command("BITFIELD", layout.histogram8("Hard", now), "INCRBY", "u16", "#3", 8)
    for minutes_ago, size in ((3, 5), (2, 9), (1, 4)):
        r.hset(layout.queue_samples(layout.minute_of(now - 60 * minutes_ago)),
               "default", json.dumps([size, 1.5]))
    r.sadd("queues", "default")
    page = web().get("/metrics/jobs")
    assert page.status == 200 and 'id="page-metrics"' in page.body
    hard = page.row("data-class", "Hard")
    assert '"executions">10<' in hard and '"failures">2<' in hard and ">500 ms<" in hard
    quick = page.row("data-class", "Quick")  # 0.4 ms a run: not "0 ms", not "0.0 ms"
    assert '"avg">0.4 ms<' in quick and '"total">4.0 ms<' in quick, quick
    assert page.body.index('data-class="Hard"') < page.body.index('data-class="Easy"')
    assert "8" in page.row("data-bucket", "<= 65 ms")
    assert 'id="queue-series" data-points="3"' in page.body
    easy = web().get("/metrics/jobs?minutes=480&class=Easy")
    assert 'id="histogram-class">Easy<' in easy.body


def test_metrics_scrape_exposes_the_cluster_to_prometheus(web: Any, r: redis.Redis,
                                                          daemon: Any) -> None:
    d = daemon("concurrency: 1\nrequire: jobs\n")
    _push(r, "default", 1)
    until(lambda: r.llen("queue:default") == 0 and r.hlen(layout.JOBS), 20, lambda: d.log())
    page = web().get("/metrics", Accept="text/plain")
    assert page.status == 200 and page.header("Content-Type").startswith("text/plain")
    assert "version=" in page.header("Content-Type")
    assert 'forkq_jobs_processed_total{job_class="Record",queue="default"} 1.0' in page.body
    assert "forkq_processes 1.0" in page.body
    jobs = web().get("/metrics/jobs")  # the same flush wrote Sidekiq's keys the page reads
    assert '"executions">1<' in jobs.row("data-class", "Record")
    assert "default-src 'self'" in page.header("Content-Security-Policy")


# --- security -----------------------------------------------------------------------------


def test_a_post_without_or_with_a_wrong_csrf_token_is_refused_and_changes_nothing(
        web: Any, r: redis.Redis) -> None:
    _push(r, "mail", 1)
    browser = web()
    browser.get("/queues")
    for token in ("", "x" * 32):
        refused = browser.post("/queues/clear", {"name": "mail"}, csrf=token)
        assert refused.status == 403 and "CSRF" in refused.body
    other = Browser(browser.base)  # another visitor's token does not do either
    refused = other.post("/queues/pause", {"name": "mail"}, csrf=browser.csrf())
    assert refused.status == 403
    assert r.llen("queue:mail") == 1 and not r.sismember(keys.PAUSED, "mail")


def test_no_action_is_reachable_by_get(web: Any, r: redis.Redis) -> None:
    _push(r, "mail", 1)
    browser = web()
    for path in ("/queues/clear", "/queues/pause", "/queues/delete", "/busy/stop",
                 "/busy/quiet", "/busy/cancel", "/periodic/enqueue", "/logout"):
        got = browser.get(f"{path}?name=mail")
        if path.startswith("/queues/"):
            assert got.status == 200, "GET shows the queue of that name, acting on nothing"
        else:
            assert got.status == 405 and "POST" in got.header("Allow"), path
    assert r.llen("queue:mail") == 1 and not r.sismember(keys.PAUSED, "mail")
    assert browser.request("PUT", "/queues").status == 405


def test_job_values_are_escaped(web: Any, r: redis.Redis) -> None:
    jid = _push(r, XSS, XSS, {"k": XSS}, klass=XSS)
    r.hset(keys.PERIODIC, XSS, time.time())
    identity = f"{XSS}:1:abc"  # a process record and a running job, as any client may write
    r.sadd("processes", identity)
    r.hset(identity, mapping={"info": json.dumps({"hostname": XSS, "tag": XSS, "pid": 1,
                                                  "labels": [XSS], "queues": [XSS],
                                                  "version": XSS}),
                              "busy": 1, "beat": time.time(), "quiet": "false"})
    r.hset(f"{identity}:work", "t1", json.dumps({
        "queue": XSS, "run_at": int(time.time()),
        "payload": json.dumps({"class": XSS, "jid": XSS, "args": [XSS]})}))
    now = time.time()
    r.hset(layout.jobs8(now), mapping={f"{XSS}|p": 1, f"{XSS}|ms": 5})
    browser = web(periodic=cron.read_entries([{"name": XSS, "cron": "0 3 * * *",
                                               "class": XSS, "args": [XSS]}]))
    for path in ("/queues", f"/queues/{XSS}", "/periodic", "/", "/metrics/jobs", "/busy",
                 f"/metrics/jobs?class={XSS}&queue={XSS}"):
        page = browser.get(path)
        assert page.status == 200, path
        assert XSS not in page.body and "<script>alert" not in page.body, path
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in browser.get(f"/queues/{XSS}").row(
        "data-jid", jid)
    busy = browser.get("/busy")
    assert "&lt;script&gt;" in busy.row("data-identity", identity)
    assert "&lt;script&gt;" in busy.row("data-jid", XSS)
    assert "&lt;script&gt;" in browser.get("/metrics/jobs").row("data-class", XSS)


def test_login_roles_and_scraper_headers(web: Any, r: redis.Redis) -> None:
    _push(r, "mail", 1)
    browser = web(auth=Auth(admin_password=ADMIN, readonly_password=READER))
    anonymous = browser.get("/queues")
    assert anonymous.status == 303 and anonymous.header("Location") == "/login?next=%2Fqueues"
    assert browser.get("/queues", Accept="*/*").status == 401
    assert 'Basic realm="forkq"' in browser.get("/metrics/jobs", Accept="*/*").header(
        "WWW-Authenticate")
    assert browser.post("/queues/pause", {"name": "mail"}).status == 401
    assert browser.get("/login").status == 200
    assert browser.login("wrong").status == 403
    assert browser.get("/").status == 303
    # read-only: sees everything, acts on nothing
    reader = Browser(browser.base)
    assert reader.login(READER).status == 303
    page = reader.get("/queues")
    assert page.status == 200 and page.has_row("data-queue", "mail")
    assert "disabled" in page.row("data-queue", "mail")
    for path, fields in (("/queues/pause", {"name": "mail"}), ("/queues/clear", {"name": "mail"}),
                         ("/busy/quiet", {"all": "1"}), ("/periodic/enqueue", {"name": "x"})):
        refused = reader.post(path, fields)
        assert refused.status == 403 and "read-only" in refused.body, path
    assert r.llen("queue:mail") == 1 and not r.sismember(keys.PAUSED, "mail")
    # admin acts
    admin = Browser(browser.base)
    admin.login(ADMIN)
    assert admin.post("/queues/pause", {"name": "mail"}).status == 303
    assert r.sismember(keys.PAUSED, "mail")
    # a tampered session is no session
    forged = Browser(browser.base, cookies=dict(reader.cookies))
    forged.cookies["forkq_session"] = "admin" + forged.cookies["forkq_session"][8:]
    assert forged.get("/queues").status == 303
    # logging out ends the session
    assert admin.post("/logout").status == 303
    assert admin.get("/queues").status == 303
    # programs: Bearer or Basic with the password
    for header, status in ((f"Bearer {READER}", 200), (f"Bearer {ADMIN}", 200),
                           ("Bearer nope", 401), ("Basic " + base64.b64encode(
                               f"prom:{READER}".encode()).decode(), 200),
                           ("Basic " + base64.b64encode(b"prom:nope").decode(), 401)):
        got = Browser(browser.base).get("/metrics/jobs", Authorization=header, Accept="*/*")
        assert got.status == status, header
    scraper = Browser(browser.base, headers={"Authorization": f"Bearer {READER}"})
    scrape = scraper.get("/metrics", Accept="*/*")
    assert scrape.status == 200 and "forkq_queue_size" in scrape.body
    assert Browser(browser.base).get("/metrics", Accept="text/html").status == 401
    assert scraper.post("/queues/clear", {"name": "mail"}).status == 403
    assert r.llen("queue:mail") == 1


def test_login_goes_only_to_a_path_inside_the_app(web: Any) -> None:
    browser = web(auth=Auth(admin_password=ADMIN))
    for target, expected in (("/queues", "/queues"), ("//evil.example/x", "/"),
                             ("https://evil.example/", "/"), ("/\\evil.example", "/")):
        done = Browser(browser.base).post("/login", {"password": ADMIN, "next": target})
        assert done.status == 303 and done.header("Location") == expected, target


def test_make_app_refuses_to_run_open_unless_told(server: EmbeddedServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("FORKQ_WEB_PASSWORD", "FORKQ_WEB_PASSWORD_FILE",
                     "FORKQ_WEB_READONLY_PASSWORD", "FORKQ_WEB_READONLY_PASSWORD_FILE"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ConfigError, match="no password configured"):
        make_app(server.url)
    monkeypatch.setenv("FORKQ_WEB_PASSWORD", ADMIN)
    app: Any = make_app(server.url)
    assert app.auth.admin_password == ADMIN
    with pytest.raises(ConfigError, match="must differ"):
        Auth(admin_password="same", readonly_password="same")


def test_mounted_under_a_prefix_every_url_carries_it(web: Any, r: redis.Redis) -> None:
    _push(r, "mail", 1)

    def host(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"host app " + environ["PATH_INFO"].encode()]

    browser = web(wrap=lambda dashboard: mount("/ops/forkq/", dashboard, host))
    assert browser.get("/ops/other").body == "host app /ops/other"
    assert browser.get("/ops/forkqx").body == "host app /ops/forkqx"
    page = browser.get("/ops/forkq/queues")
    assert page.status == 200
    assert 'href="/ops/forkq/queues/mail"' in page.body
    assert 'action="/ops/forkq/queues/pause"' in page.body
    assert 'src="/ops/forkq/static/forkq.js"' in page.body
    assert browser.get("/ops/forkq/static/forkq.css").status == 200
    fresh = Browser(browser.base).get("/ops/forkq/")
    assert "Path=/ops/forkq;" in fresh.header("Set-Cookie")
    done = browser.post("/ops/forkq/queues/pause", {"name": "mail"})
    assert done.status == 303 and done.header("Location") == "/ops/forkq/queues"
    assert r.sismember(keys.PAUSED, "mail")


def test_redis_down_answers_503_not_a_traceback() -> None:
    app = make_app("redis://127.0.0.1:1/0", auth=Auth(), allow_anonymous=True)
    with serve(app) as base:
        page = Browser(base).get("/queues")
    assert page.status == 503 and "Redis did not answer" in page.body


def test_wrong_typed_keys_are_reported_not_fatal(web: Any, r: redis.Redis) -> None:
    r.sadd("queues", "broken", "fine")
    r.set("queue:broken", "not a list")
    _push(r, "fine", 1)
    r.set(keys.PAUSED, "not a set")
    r.set(keys.PERIODIC, "not a hash")
    browser = web(periodic=cron.read_entries([{"name": "n", "cron": "0 3 * * *",
                                               "class": "Record"}]))
    page = browser.get("/queues")
    assert page.status == 200
    assert "is not a list" in page.row("data-queue", "broken")
    broken = browser.get("/queues/broken")
    assert broken.status == 200 and "'queue:broken' is not a list" in unescape(broken.body)
    assert '"size">1<' in page.row("data-queue", "fine")
    assert "is not a set" in page.body
    periodic = browser.get("/periodic")
    assert periodic.status == 200 and "is not a hash" in periodic.body
    dashboard = browser.get("/")
    assert dashboard.status == 200 and "'queue:broken' is of the wrong type" in unescape(
        dashboard.body)
    assert '<div class="value" id="stat-enqueued">1</div>' in dashboard.body, "the rest shows"
    assert 'id="history-table"' in dashboard.body


def test_every_page_and_button_works_as_the_documented_least_privilege_acl_user(
        tmp_path: Any, daemon: Any) -> None:
    node = Node(tmp_path / "acl", ["--requirepass", PASSWORD])
    node.start()
    try:
        admin = node.client()
        admin.execute_command(*documented_acl("acl-secret"), "~test:*")
        url = f"redis://forkq:acl-secret@127.0.0.1:{node.port}/0"
        d = daemon("concurrency: 1\nrequire: jobs\n", redis_url=url)
        gated = Client(url=url).push({"class": "Patient", "args": [60]})
        for n in range(3):
            Client(url=url).push({"class": "Record", "args": [n], "queue": "mail"})
        with forkq.batch(client=Client(url=url)) as batch:
            Client(url=url).push({"class": "Record", "args": ["b"], "queue": "mail"})
        entries = cron.read_entries([{"name": "n", "cron": "0 3 * * *", "class": "Record"}])
        with serve(make_app(url, auth=Auth(), allow_anonymous=True, periodic=entries)) as base:
            browser = Browser(base)
            until(lambda: f'data-jid="{gated}"' in browser.get("/busy").body, 30, d.log)
            for path in ("/", "/busy", "/queues", "/queues/mail", "/periodic", "/metrics/jobs",
                         "/metrics", "/flow", f"/job/{gated}", "/batches",
                         f"/batch/{batch.bid}"):
                page = browser.get(path)
                assert page.status == 200, (path, page.body[-3000:])
                assert 'id="damaged-keys"' not in page.body, (path, page.body[-3000:])
            member = admin.lindex("queue:mail", 0)
            assert member is not None
            identity = next(i.decode() for i in admin.smembers("processes"))
            for path, fields in (("/queues/pause", {"name": "mail"}),
                                 ("/queues/resume", {"name": "mail"}),
                                 ("/queues/delete", {"name": "mail",
                                                     "job": base64.b64encode(member)}),
                                 ("/queues/clear", {"name": "mail"}),
                                 ("/periodic/enqueue", {"name": "n"}),
                                 ("/busy/cancel", {"jid": gated}),
                                 ("/busy/quiet", {"identity": identity})):
                assert browser.post(path, fields).status == 303, path
            assert not admin.exists("queue:mail") and admin.llen("queue:default") == 1
            until(lambda: admin.hget(identity, "quiet") == b"true", 15, d.log)
        denied = admin.acl_log()
        assert denied == [], json.dumps(denied, default=str, indent=1)
    finally:
        node.stop()


# --- a wrong-typed key never answers 500 -------------------------------------------------

DAMAGE_PAGES = ("/", "/?days=90", "/busy", "/queues", "/queues/other", "/scheduled", "/retries",
                "/dead", "/dead?q=x", "/periodic", "/metrics/jobs?class=Record&queue=other",
                "/flow", "/batches")


def _damaged_key(name: str) -> tuple[str, str, tuple[str, ...]]:
    """(the key, the type it is made, the pages that must name it) for a key nickname."""
    now = time.time()
    named = {
        "queues": (keys.QUEUES, ("/", "/?days=90", "/queues", "/queues/other", "/metrics/jobs")),
        "processes": (keys.PROCESSES, ("/", "/busy")),
        "paused": (keys.PAUSED, ("/queues", "/queues/other")),
        "processed": (keys.STAT_PROCESSED, ("/",)),
        "failed": (keys.STAT_FAILED, ("/",)),
        "processed-today": (keys.daily(keys.STAT_PROCESSED, keys.utc_date(now)), ("/",)),
        "failed-no-number": (keys.STAT_FAILED, ("/",)),
        "failed-today-no-number": (keys.daily(keys.STAT_FAILED, keys.utc_date(now)), ("/",)),
        "failed-80-days-ago": (keys.daily(keys.STAT_FAILED, keys.utc_date(now - 80 * 86400)),
                               ("/?days=90",)),
        "schedule": (keys.SCHEDULE, ("/", "/scheduled")),
        "retry": (keys.RETRY, ("/", "/retries")),
        "dead": (keys.DEAD, ("/", "/dead", "/dead?q=x", "/dead/")),
        "periodic": (keys.PERIODIC, ("/periodic",)),
        "dear-leader": (keys.DEAR_LEADER, ("/busy",)),
        "metrics-jobs": (layout.JOBS, ()),
        "metrics-minute": (layout.jobs8(now), ("/metrics/jobs",)),
        "metrics-histogram": (layout.histogram8("Record", now), ("/metrics/jobs",)),
        "metrics-queue-sample": (layout.queue_samples(layout.minute_of(now)), ("/metrics/jobs",)),
    }
    key, pages = named[name]
    if name.endswith("no-number"):
        return key, "junk", pages
    string_keys = (keys.STAT_PROCESSED, keys.STAT_FAILED, keys.DEAR_LEADER)
    is_string = key in string_keys or key.startswith("stat:") or key.startswith("h|")
    return key, "hash" if is_string else "string", pages


@pytest.mark.parametrize("nickname", [
    "queues", "processes", "paused", "processed", "failed", "processed-today",
    "failed-no-number", "failed-today-no-number", "failed-80-days-ago", "schedule", "retry",
    "dead", "periodic", "dear-leader",
    "metrics-jobs", "metrics-minute", "metrics-histogram", "metrics-queue-sample"])
def test_a_wrong_typed_key_is_named_on_every_page_that_reads_it_and_nothing_answers_500(
        web: Any, r: redis.Redis, nickname: str) -> None:
    key, kind, naming = _damaged_key(nickname)
    queued = _push(r, "other", 1)
    for zset in (keys.RETRY, keys.DEAD):
        r.zadd(zset, {json.dumps({"class": "Record", "args": [], "jid": "e" * 24}): 1.7e9})
    member, score = r.zrange(keys.DEAD, 0, 0, withscores=True)[0]
    entry_page = "/dead/" + entry_key(SortedEntry(member, score=score))
    r.delete(key)
    if kind == "hash":
        r.hset(key, "damaged", "yes")
    elif kind == "junk":
        r.set(key, "12 jobs")
    else:
        r.set(key, "damaged")
    browser = web(periodic=cron.read_entries([{"name": "n", "cron": "0 3 * * *",
                                               "class": "Record"}]))
    for path in (*DAMAGE_PAGES, entry_page):
        page = browser.get(path)
        assert page.status == 200, (path, page.body[:3000])
        if path.partition("?")[0] in naming or path in naming or (
                path == entry_page and "/dead/" in naming):
            assert repr(key) in unescape(page.body), (path, page.body[:3000])
        else:
            assert 'id="damaged-keys"' not in page.body, (path, page.body[:3000])
    scrape = browser.get("/metrics", Accept="text/plain")
    assert scrape.status == 200
    if nickname in ("queues", "processes", "paused", "processed", "failed", "schedule",
                    "retry", "dead", "metrics-jobs"):
        assert re.search(r"^forkq_metrics_skipped_keys [1-9]", scrape.body, re.M), scrape.body
    # actions on other items still work: a job deleted from a queue, an entry from a set
    job = base64.b64encode(r.lindex("queue:other", 0)).decode()
    done = browser.post("/queues/delete", {"name": "other", "job": job})
    assert done.status == 303 and r.llen("queue:other") == 0, queued
    zset, path = (keys.DEAD, "dead") if key == keys.RETRY else (keys.RETRY, "retries")
    member, score = r.zrange(zset, 0, 0, withscores=True)[0]
    entry = SortedEntry(member, score=score)
    done = browser.post(f"/{path}/bulk", [("delete", "1"), ("key", entry_key(entry))])
    assert done.status == 303 and r.zcard(zset) == 0


def test_failed_logins_are_throttled_per_address_and_sessions_go_on(web: Any) -> None:
    clock = [1000.0]
    browser = web(auth=Auth(admin_password=ADMIN, readonly_password=READER),
                  throttle=Throttle(clock=lambda: clock[0]))
    session = Browser(browser.base)
    assert session.login(ADMIN).status == 303, "a correct password does not count"
    for _ in range(3):
        assert Browser(browser.base).login("wrong").status == 403
    for header in ("Bearer nope", "Basic " + base64.b64encode(b"prom:nope").decode()):
        assert browser.get("/metrics", Authorization=header).status == 401
    clock[0] += 15
    for attempt in (lambda b: b.login(ADMIN),
                    lambda b: b.get("/metrics", Authorization=f"Bearer {READER}")):
        refused = attempt(Browser(browser.base))
        assert refused.status == 429 and refused.header("Retry-After") == "45"
        assert "too many failed logins" in refused.body
    assert session.get("/queues").status == 200, "a session is no password check"
    assert browser.get("/login").status == 200
    clock[0] += 45
    assert Browser(browser.base).login(ADMIN).status == 303
    assert browser.get("/metrics", Authorization=f"Bearer {READER}").status == 200


@pytest.mark.parametrize(("damaged", "path", "fields"), [
    (keys.PAUSED, "/queues/pause", {"name": "other"}),
    (keys.PAUSED, "/queues/resume", {"name": "other"}),
    (keys.QUEUES, "/queues/clear", {"name": "other"}),
    ("queue:other", "/queues/clear", {"name": "other"}),
    (keys.PROCESSES, "/busy/quiet", {"all": "1"}),
    (keys.RETRY, "/retries/bulk", {"delete_all": "1"}),
    (keys.RETRY, "/retries/bulk", {"retry": "1", "key": "1700000000-abc"}),
    (keys.DEAD, "/dead/1700000000-abc", {"delete": "1"}),
])
def test_an_action_on_a_wrong_typed_key_names_it_and_never_answers_500(
        web: Any, r: redis.Redis, damaged: str, path: str, fields: dict[str, str]) -> None:
    _push(r, "other", 1)
    r.delete(damaged)
    r.set(damaged, "damaged")
    browser = web(periodic=cron.read_entries([{"name": "n", "cron": "0 3 * * *",
                                               "class": "Record"}]))
    done = browser.post(path, fields)  # 409 (the key named), or back with a flash naming it
    assert done.status in (303, 409), (done.status, done.body[:3000])
    shown = browser.get(done.header("Location")) if done.status == 303 else done
    assert shown.status in (200, 409) and repr(damaged) in unescape(shown.body), shown.body


# --- flow control ------------------------------------------------------------------------


def _fill_flow(r: redis.Redis) -> str:
    """What ``forkq limits`` and ``forkq uniques`` show: a concurrency key (2 running, 1
    waiting), a window limiter used once, a group of 3 jobs waiting, a unique lock, and a
    limiter key of the wrong type; the jid holding the lock."""
    client = Client(r)
    r.sadd("forkq:slots:limited:acct-1", "j1", "j2")
    r.rpush("forkq:slots:limited:acct-1:blocked", "{}")
    with limiter.window("api", 5, 60, client=client):
        pass
    for n in range(3):
        client.push({"class": "tenant", "queue": "tenants", "args": ["acme", n], "group": "acme"})
    jid = client.push({"class": "Record", "args": [1], "unique_for": 600})
    assert jid
    r.set("forkq:limiter:window:broken", "x")
    return jid


def test_the_flow_page_shows_limits_limiters_groups_and_locks_and_names_a_damaged_key(
        web: Any, r: redis.Redis) -> None:
    jid = _fill_flow(r)
    page = web().get("/flow")
    assert page.status == 200 and 'id="page-flow"' in page.body
    assert 'href="/flow" data-nav="flow" aria-current="page">Flow control</a>' in page.body
    slots = page.row("data-key", "limited:acct-1")
    assert '"running">2<' in slots and '"waiting">1<' in slots
    assert '"used">1<' in page.row("data-limiter", "window:api")
    group = page.row("data-group", "acme")
    assert 'href="/queues/tenants"' in group and '"waiting">3<' in group
    lock = page.row("data-jid", jid)
    digest = unique.digest("Record", "default", [1])
    assert f'data-lock="forkq:unique:{digest}"' in lock
    assert f'href="/job/{jid}"' in lock and re.search(r'"ttl">(9m 5\ds|10m 00s)<', lock), lock
    for section, count in (("concurrency", 1), ("limiters", 1), ("groups", 1), ("locks", 1)):
        assert f'id="{section}-count">{count}<' in page.body, section
        assert f'id="{section}-empty"' not in page.body, section
    assert 'id="locks-shown"' not in page.body
    notice = unescape(page.body.split('id="damaged-keys"', 1)[1].split("</ul>", 1)[0])
    assert "'forkq:limiter:window:broken' holds another type" in notice, notice
    assert "it is a string" in notice
    assert 'data-limiter="window:broken"' not in page.body, "skipped, not shown"


def test_the_flow_page_says_when_each_section_is_empty(web: Any, r: redis.Redis) -> None:
    page = web().get("/flow")
    assert page.status == 200 and 'id="damaged-keys"' not in page.body
    for section in ("concurrency", "limiters", "groups", "locks"):
        assert f'id="{section}-count">0<' in page.body, section
        assert f'id="{section}-empty"' in page.body, section
    text = page.text()
    assert "no job runs or waits under a concurrency limit" in text
    assert "no limiter in use" in text and "no group waits in a queue with groups" in text
    assert "no unique lock held" in text


def test_the_flow_page_shows_the_first_100_unique_locks_of_more(web: Any,
                                                                 r: redis.Redis) -> None:
    with r.pipeline(transaction=False) as pipe:
        for n in range(105):
            pipe.set(f"{keys.UNIQUE_PREFIX}{n:040x}", f"jid-{n:03d}", ex=600)
        pipe.execute()
    page = web().get("/flow")
    assert 'id="locks-count">105<' in page.body
    assert "the first 100 of 105" in page.text()
    assert page.body.count("<tr data-lock=") == 100
    assert page.has_row("data-jid", "jid-099") and not page.has_row("data-jid", "jid-100")


def test_the_flow_page_escapes_what_any_client_wrote(web: Any, r: redis.Redis) -> None:
    r.sadd(f"forkq:slots:{XSS}:k", "j1")
    Client(r).push({"class": "tenant", "queue": XSS, "args": [1], "group": XSS})
    r.set(keys.UNIQUE_PREFIX + "a" * 40, XSS, ex=60)
    r.set(f"forkq:limiter:window:{XSS}", "x")
    page = web().get("/flow")
    assert page.status == 200
    assert XSS not in page.body and "<script>alert" not in page.body
    assert 'href="/job/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"' in page.body
    assert 'href="/queues/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"' in page.body
    assert "&lt;script&gt;" in page.row("data-key", f"{XSS}:k")
    missing = web().get("/job/%3Cscript%3Ealert%281%29%3C%2Fscript%3E")
    assert missing.status == 404 and XSS not in missing.body and "&lt;script&gt;" in missing.body


def test_under_a_prefix_the_flow_page_links_carry_it(web: Any, r: redis.Redis) -> None:
    jid = _fill_flow(r)

    def host(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"host app"]

    browser = web(wrap=lambda dashboard: mount("/ops/forkq", dashboard, host))
    page = browser.get("/ops/forkq/flow")
    assert page.status == 200 and 'href="/ops/forkq/flow" data-nav="flow"' in page.body
    assert 'href="/ops/forkq/queues/tenants"' in page.row("data-group", "acme")
    assert f'href="/ops/forkq/job/{jid}"' in page.row("data-jid", jid)
    job = browser.get(f"/ops/forkq/job/{jid}")
    assert job.status == 200 and 'href="/ops/forkq/queues/default"' in job.body


# --- a job by its jid: its places, its unique lock, its concurrency line -------------------


def test_the_job_page_by_jid_shows_where_it_is_and_its_unique_lock(web: Any,
                                                                   r: redis.Redis) -> None:
    jid = Client(r).push({"class": "Record", "args": [1], "unique_for": 600})
    assert jid
    browser = web()
    page = browser.get(f"/job/{jid}")
    assert page.status == 200 and 'id="page-job"' in page.body
    assert 'data-place="queued"' in page.body and 'href="/queues/default"' in page.body
    assert f'id="job-jid">{jid}<' in page.body and 'id="job-class">Record<' in page.body
    lock = page.body.split('id="job-lock"', 1)[1].split("</td>", 1)[0]
    digest = unique.digest("Record", "default", [1])
    assert 'data-held="mine"' in lock and f"forkq:unique:{digest}" in lock
    assert "held by this job" in lock and re.search(r"(9m 5\ds|10m 00s) left", lock), lock
    assert "data-norefresh" in page.body, "a lookup is O(jobs): the page does not refresh"
    r.set(f"forkq:unique:{digest}", "another-jid", ex=30)
    lock = browser.get(f"/job/{jid}").body.split('id="job-lock"', 1)[1].split("</td>", 1)[0]
    assert 'data-held="other"' in lock and 'href="/job/another-jid"' in lock
    r.delete(f"forkq:unique:{digest}")
    lock = browser.get(f"/job/{jid}").body.split('id="job-lock"', 1)[1].split("</td>", 1)[0]
    assert 'data-held="free"' in lock and "free" in lock and "left" not in lock
    r.hset(f"forkq:unique:{digest}", "x", "y")
    damaged = browser.get(f"/job/{jid}")
    assert damaged.status == 200 and 'data-held="free"' in damaged.body
    assert f"'forkq:unique:{digest}' is not a string (it is a hash)" in unescape(damaged.body)


def test_the_job_page_says_a_job_waits_in_a_concurrency_limits_line(web: Any,
                                                                   r: redis.Redis) -> None:
    ahead = json.dumps({"class": "Limited", "args": [0], "jid": "a" * 24, "queue": "default"})
    job = json.dumps({"class": "Limited", "args": [1], "jid": "b" * 24, "queue": "default",
                      "concurrency_key": "acct-1", "concurrency_limit": 2})
    r.sadd("forkq:slots:Limited:acct-1", "j1", "j2")
    r.rpush("forkq:slots:Limited:acct-1:blocked", ahead, job)
    page = web().get("/job/" + "b" * 24)
    assert page.status == 200
    place = page.body.split('data-place="blocked"', 1)[1].split("</li>", 1)[0]
    assert "waiting for a concurrency slot of Limited" in unescape(place)
    assert 'href="/flow"' in place
    line = unescape(page.body.split('id="job-concurrency"', 1)[1].split("</td>", 1)[0])
    assert "forkq:slots:Limited:acct-1:blocked" in line and "(limit 2)" in line
    assert "1 job ahead of it" in line, line
    assert 'id="job-lock"' not in page.body, "it names no unique lock"


def test_the_job_page_of_a_jid_found_nowhere_answers_404(web: Any, r: redis.Redis) -> None:
    page = web().get("/job/no-such-jid")
    assert page.status == 404 and 'id="job-missing"' in page.body
    assert "No job no-such-jid" in page.text()


def test_the_job_page_links_a_retry_to_its_entry_and_the_entry_shows_its_lock(
        web: Any, r: redis.Redis) -> None:
    digest = unique.digest("Record", "default", [7])
    jid = "c" * 24
    member = json.dumps({"class": "Record", "args": [7], "jid": jid, "queue": "default",
                         "retry_count": 1, "unique_for": 600, "unique_digest": digest})
    r.zadd(keys.RETRY, {member: time.time() + 60})
    r.set(f"forkq:unique:{digest}", jid, ex=600)
    browser = web()
    found = browser.get(f"/job/{jid}")
    score = r.zscore(keys.RETRY, member)
    assert score is not None
    entry = entry_key(SortedEntry(member.encode(), score=score))
    assert 'data-place="retry"' in found.body and f'href="/retries/{entry}"' in found.body
    page = browser.get(f"/retries/{entry}")
    assert page.status == 200
    lock = page.body.split('id="job-lock"', 1)[1].split("</td>", 1)[0]
    assert 'data-held="mine"' in lock and f"forkq:unique:{digest}" in lock
