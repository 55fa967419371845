"""``forkq web`` as a subprocess: it serves the dashboard on loopback without a password,
refuses another address without one (exit 78), takes passwords from files, reads the periodic
entries of ``-C``, and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from forkq.embedded import EmbeddedServer

from .conftest import ROOT, TESTS
from .web_client import Browser, CliWeb, start_cli

EX_CONFIG = 78


@pytest.fixture
def web_cli(server: EmbeddedServer, tmp_path: Path) -> Iterator[Callable[..., CliWeb]]:
    """Factory: ``web_cli(*args, **env)`` runs ``forkq web --redis-url URL --port 0 ARGS``;
    every one started is stopped by its pid in teardown."""
    started: list[CliWeb] = []
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FORKQ_")}

    def start(*args: str, **env: str) -> CliWeb:
        environ = {**clean, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", **env}
        web = start_cli("--redis-url", server.url, "--port", "0", *args,
                        log_path=tmp_path / f"web-{len(started)}.log", env=environ)
        started.append(web)
        return web

    yield start
    for web in started:
        web.stop()


def test_serves_on_loopback_and_stops_on_sigterm(web_cli: Any, r: redis.Redis) -> None:
    r.lpush("queue:mail", '{"class":"Record","args":[],"jid":"j1"}')
    r.sadd("queues", "mail")
    web = web_cli()
    assert web.base.startswith("http://127.0.0.1:"), web.log()
    assert "auth: off (loopback only)" in web.log()
    browser = Browser(web.base)
    assert browser.get("/").status == 200
    assert browser.get("/queues").has_row("data-queue", "mail")
    assert browser.post("/queues/pause", {"name": "mail"}).status == 303
    assert r.sismember("forkq:paused", "mail")
    assert web.stop() == 0
    assert "SIGTERM: stopping" in web.log()


STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z pid=\d+ web INFO: ")


def test_the_access_log_lines_carry_the_daemon_s_timestamp_pid_and_role(
        web_cli: Any, tmp_path: Path) -> None:
    """Each request's line, and the start and stop lines, look like the daemon's own (a UTC
    timestamp, pid, role, level); under journald, which stamps lines itself, no timestamp."""
    web = web_cli()
    assert Browser(web.base).get("/queues").status == 200
    assert web.stop() == 0
    lines = web.log().splitlines()
    access = [line for line in lines if '"GET /queues HTTP/1.1" 200' in line]
    assert len(access) == 1 and STAMPED.match(access[0]), lines
    assert access[0].split(" web INFO: ", 1)[1].startswith("127.0.0.1 "), access
    for said in ("serving http://127.0.0.1:", "SIGTERM: stopping"):
        [line] = [line for line in lines if said in line]
        assert STAMPED.match(line), line
    daemon_like = logs_format_sample(tmp_path)
    assert re.match(STAMPED.pattern.replace(" web ", " master "), daemon_like), daemon_like

    journald = web_cli(JOURNAL_STREAM="8:1234")
    assert Browser(journald.base).get("/").status == 200
    assert journald.stop() == 0
    [line] = [line for line in journald.log().splitlines() if '"GET / HTTP/1.1" 200' in line]
    assert re.match(r"^pid=\d+ web INFO: 127\.0\.0\.1 ", line), line


def logs_format_sample(tmp_path: Path) -> str:
    """One line as the daemon's log configuration writes it (role ``master``)."""
    out = tmp_path / "sample.log"
    code = ("from forkq.daemon import logs; import logging; logs.configure('info', "
            f"{str(out)!r}); logging.getLogger('x').info('sample')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out.read_text().splitlines()[0]


def test_refuses_a_non_loopback_bind_without_a_password(web_cli: Any) -> None:
    web = web_cli("--bind", "0.0.0.0")
    assert web.process.wait(timeout=20) == EX_CONFIG
    assert "refusing to listen on '0.0.0.0' without authentication" in web.log()


def test_a_non_loopback_bind_with_passwords_from_files_asks_for_them(
        web_cli: Any, tmp_path: Path) -> None:
    admin, reader = tmp_path / "admin.pw", tmp_path / "reader.pw"
    admin.write_text("adm1n-pw\n")
    reader.write_text("  read-pw \n")
    web = web_cli("--bind", "0.0.0.0", "--readonly-password-file", str(reader),
                  FORKQ_WEB_PASSWORD_FILE=str(admin))
    assert web.base, web.log()
    assert "auth: admin + read-only" in web.log()
    base = web.base.replace("0.0.0.0", "127.0.0.1")
    assert Browser(base).get("/").status == 303
    assert Browser(base).get("/", Authorization="Bearer read-pw").status == 200
    assert Browser(base).get("/", Authorization="Bearer adm1n-pw").status == 200
    assert Browser(base).get("/", Authorization="Bearer adm1n").status == 401


def test_an_empty_password_file_is_a_configuration_error(web_cli: Any, tmp_path: Path) -> None:
    empty = tmp_path / "empty.pw"
    empty.write_text("\n")
    web = web_cli("--password-file", str(empty))
    assert web.process.wait(timeout=20) == EX_CONFIG
    assert "is empty" in web.log()
    missing = web_cli("--password-file", str(tmp_path / "nope"))
    assert missing.process.wait(timeout=20) == EX_CONFIG


def test_reads_periodic_entries_from_the_config_file(web_cli: Any, tmp_path: Path,
                                                     server: EmbeddedServer) -> None:
    config = tmp_path / "forkq.yml"
    config.write_text("require: jobs\nperiodic:\n  - name: nightly\n    cron: '0 3 * * *'\n"
                      "    class: Record\n    timezone: Asia/Tokyo\n")
    web = web_cli("-C", str(config))
    page = Browser(web.base).get("/periodic")
    assert "Asia/Tokyo" in page.row("data-periodic", "nightly"), web.log()


def test_without_a_password_it_answers_only_to_loopback_host_names(
        web_cli: Any, r: redis.Redis) -> None:
    """The DNS-rebinding guard: a page of another site whose name resolves to 127.0.0.1
    sends its own name as Host; without a password that is refused before the app runs."""
    r.sadd("queues", "mail")
    web = web_cli()
    port = web.base.rstrip("/").rpartition(":")[2]
    browser = Browser(web.base)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]", "localhost"):
        assert browser.get("/", Host=host).status == 200, host
    for host in (f"evil.example:{port}", "evil.example", f"192.168.1.5:{port}", "[::1"):
        refused = browser.get("/", Host=host)
        assert refused.status == 403 and "DNS rebinding" in refused.body, host
    posted = browser.post("/queues/pause", {"name": "mail"},
                          headers={"Host": f"attacker.example:{port}"})
    assert posted.status == 403 and not r.sismember("forkq:paused", "mail")
    assert web.stop() == 0
