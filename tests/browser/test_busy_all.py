"""Busy's "quiet all" and "stop all" in headless Chromium: every live process of the cluster
(two daemons here) is asked, and acts. A module of its own: it stops its daemons."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from selenium.webdriver.remote.webdriver import WebDriver

from forkq.embedded import EmbeddedServer

from ..conftest import until
from .harness import LiveDaemon, WebServer, open_page, press, rows, running_daemon, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.process]


def _identities(rc: redis.Redis, *daemons: LiveDaemon) -> list[str]:
    """The daemons' process identities, once each has beaten."""
    pids = {str(d.pid) for d in daemons}
    found: list[str] = []

    def look() -> bool:
        found[:] = sorted(m.decode() for m in rc.smembers("processes")
                          if m.decode().split(":")[1] in pids)
        return len(found) == len(pids)

    until(look, 20, lambda: "\n".join(d.log() for d in daemons))
    return found


def test_quiet_all_then_stop_all_reach_every_process(
        browser: WebDriver, web: WebServer, live: LiveDaemon, redis_server: EmbeddedServer,
        folder: Path, rc: redis.Redis) -> None:
    with running_daemon(redis_server.url, folder / "second",
                        "concurrency: 1\nrequire: jobs\ntag: second\n") as second:
        identities = _identities(rc, live, second)
        open_page(browser, web, "/busy", "busy")
        wait_until(browser, lambda d: sorted(rows(d, "processes-table", "data-identity"))
                   == identities, 10, "both processes do not show")
        press(browser, "h2", "quiet-all", confirm=True)
        until(lambda: all(rc.hget(i, "quiet") == b"true" for i in identities), 15,
              lambda: "not all quiet:\n" + live.log() + second.log())
        press(browser, "h2", "stop-all", confirm=True)
        for daemon in (live, second):
            until(lambda d=daemon: d.process is not None and d.process.poll() is not None,
                  20, lambda d=daemon: f"still running:\n{d.log()}")
            assert daemon.process is not None and daemon.process.returncode == 0, daemon.log()
        wait_until(browser, lambda d: not rows(d, "processes-table", "data-identity"), 20,
                   "stopped processes still show")
