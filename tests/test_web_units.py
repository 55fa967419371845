"""The dashboard's pure parts, without a server: sessions and passwords, route patterns,
paging, the display filters and the SVG chart scaling."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from forkq.errors import ConfigError
from forkq.web import charts, routes, security
from forkq.web.security import Auth


def test_a_session_is_signed_expires_and_names_its_role() -> None:
    auth = Auth(admin_password="a-pw", readonly_password="r-pw")
    value = auth.session("readonly", now=1000.0)
    assert auth.session_role(value, now=1001.0) == "readonly"
    assert auth.session_role(value, now=1000.0 + security.SESSION_SECONDS + 1) is None
    rest = value.split(".", 1)[1]
    assert auth.session_role("admin." + rest, now=1001.0) is None, "the role is signed"
    assert Auth(admin_password="other", readonly_password="r-pw").session_role(
        value, now=1001.0) is None, "a new password ends every session"
    assert Auth(admin_password="a-pw", readonly_password="r-pw", secret="s").session_role(
        value, now=1001.0) is None
    for junk in ("", ".", "admin", "admin.1.x.", "x" * 500, "é.1.2.3"):
        assert auth.session_role(junk) is None


def test_passwords_and_headers_open_their_role_only() -> None:
    auth = Auth(admin_password="a-pw", readonly_password="r-pw")
    assert auth.role_for("a-pw") == "admin" and auth.role_for("r-pw") == "readonly"
    assert auth.role_for("") is None and auth.role_for("a-pw ") is None
    assert auth.header_role("Bearer r-pw") == "readonly"
    assert auth.header_role("bearer  a-pw ") == "admin"
    basic = base64.b64encode(b"any:user:a-pw").decode()
    assert auth.header_role(f"Basic {basic}") is None, "the password follows the first colon"
    assert auth.header_role("Basic " + base64.b64encode(b"prom:r-pw").decode()) == "readonly"
    assert auth.header_role("Basic !!!") is None and auth.header_role("Token a-pw") is None
    assert Auth(readonly_password="r-pw").role_for("") is None, "no admin password: no admin"
    assert not Auth().enabled and Auth().role_for("") is None


def test_passwords_from_the_environment_and_files(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text("  from-file\n")
    auth = Auth.from_environ({"FORKQ_WEB_PASSWORD_FILE": str(path),
                              "FORKQ_WEB_READONLY_PASSWORD": "reader"})
    assert (auth.admin_password, auth.readonly_password) == ("from-file", "reader")
    assert Auth.from_environ({}, readonly_file=str(path)).readonly_password == "from-file"
    with pytest.raises(ConfigError, match="not both"):
        Auth.from_environ({"FORKQ_WEB_PASSWORD": "x", "FORKQ_WEB_PASSWORD_FILE": str(path)})
    with pytest.raises(ConfigError, match="cannot read"):
        Auth.from_environ({}, admin_file=str(tmp_path / "missing"))


def test_only_loopback_binds_go_without_a_password() -> None:
    for host in ("127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost"):
        assert security.is_loopback(host), host
        security.check_bind(host, Auth())
    for host in ("0.0.0.0", "::", "", "10.0.0.5", "example.com"):
        assert not security.is_loopback(host), host
        with pytest.raises(ConfigError, match="refusing to listen"):
            security.check_bind(host, Auth())
        security.check_bind(host, Auth(readonly_password="x"))


def test_csrf_tokens_must_match_and_not_be_empty() -> None:
    token = security.new_csrf_token()
    assert len(token) >= 24 and token != security.new_csrf_token()
    assert security.csrf_ok(token, token)
    assert not security.csrf_ok(token, token[:-1]) and not security.csrf_ok("", "")
    assert not security.csrf_ok(token, "\udcff")


def test_route_patterns() -> None:
    one = routes._compile("/queues/<name>")
    rest = routes._compile("/queues/<path:name>")
    found = one.match("/queues/mail")
    assert found is not None and found.group("name") == "mail"
    assert one.match("/queues/a/b") is None and one.match("/queues/") is None
    deep = rest.match("/queues/a/b c")
    assert deep is not None and deep.group("name") == "a/b c"
    assert routes._compile("/a.b").match("/aXb") is None, "literal parts are escaped"
    with pytest.raises(ValueError):
        routes.route("PUT", "/x")


def test_paging_is_clamped() -> None:
    assert routes.paginate(0, 5, 25) == {"page": 1, "pages": 1, "per_page": 25, "total": 0,
                                         "start": 0, "stop": 0}
    last = routes.paginate(60, 99, 25)
    assert (last["page"], last["start"], last["stop"]) == (3, 50, 60)
    assert list(routes.pages_around(10, 20, 2)) == [1, 8, 9, 10, 11, 12, 20]


def test_display_filters_take_any_value() -> None:
    assert routes.duration(0.25) == "250 ms" and routes.duration(75) == "1m 15s"
    assert routes.duration(3 * 86400 + 3600) == "3d 01h"
    assert routes.duration(float("nan")) == "" and routes.duration("x") == ""
    assert routes._moment(100.0, now=160.0) == "1m 00s ago"
    assert routes._moment(200.0, now=160.0) == "in 40.0 s"
    assert routes._moment(True) == "" and routes._moment(float("inf")) == ""
    assert routes._utc(1e300) == "" and routes._utc(0) == "1970-01-01 00:00:00 UTC"
    assert routes._short("x" * 100, 10) == "x" * 9 + "…"
    assert routes._short({"a": "<b>"}) == '{"a": "<b>"}'


def test_charts_scale_into_their_box() -> None:
    empty = charts.line([])
    assert empty.points == ""
    chart = charts.line([(0, 0), (30, 5), (60, 10)], width=600, height=100)
    assert chart.points == "0.0,100.0 300.0,50.0 600.0,0.0"
    assert chart.top == 10
    flat = charts.line([(5, 0)], width=600, height=100)
    assert flat.points == "600.0,100.0" and flat.top == 1
    assert charts.bar_widths([0, 5, 10]) == [0.0, 50.0, 100.0]
    assert charts.bar_widths([0, 0]) == [0.0, 0.0]


# --- login throttling ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_throttle_refuses_an_address_after_five_failures_for_the_rest_of_its_window() -> None:
    from forkq.web.throttle import Throttle
    clock = Clock()
    throttle = Throttle(clock=clock)
    for _ in range(4):
        throttle.failed("10.0.0.1")
        clock.now += 5
    assert throttle.retry_after("10.0.0.1") == 0, "four failures are allowed"
    throttle.failed("10.0.0.1")  # the fifth, 20 s after the first
    assert throttle.retry_after("10.0.0.1") == 40
    assert throttle.retry_after("10.0.0.2") == 0, "another address is not refused"
    clock.now += 39.5
    assert throttle.retry_after("10.0.0.1") == 1
    clock.now += 0.5  # the window of the first failure has ended
    assert throttle.retry_after("10.0.0.1") == 0
    throttle.failed("10.0.0.1")
    assert throttle.retry_after("10.0.0.1") == 0, "a new window counts from one"
    assert len(throttle) == 1


def test_the_throttle_table_is_bounded_and_forgets_ended_windows_first() -> None:
    from forkq.web.throttle import Throttle
    clock = Clock()
    throttle = Throttle(limit=2, window=60, capacity=3, clock=clock)
    throttle.failed("old")
    clock.now += 30
    for address in ("a", "a", "b"):
        throttle.failed(address)
    assert throttle.retry_after("a") == 60
    clock.now += 31  # "old"'s window has ended: it goes first when room is needed
    throttle.failed("c")
    assert len(throttle) == 3 and throttle.retry_after("a") == 29, "only the ended one went"
    throttle.failed("d")  # full: the oldest window ("a") goes
    assert len(throttle) == 3 and throttle.retry_after("a") == 0
    for n in range(1000):
        throttle.failed(f"flood-{n}")
    assert len(throttle) == 3, "full: the oldest window is dropped, never more than capacity"
    with pytest.raises(ValueError):
        Throttle(limit=0)
