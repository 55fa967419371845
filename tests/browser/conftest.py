"""Fixtures of the browser tests, shared by a whole module to keep them fast: a throwaway
Redis of the module's own (the session server's ``r`` fixture flushes it between tests; a
live daemon must not lose its records), a live ``forkq run`` on it with the test jobs of
tests/jobs.py, ``forkq web`` on a free port, and one headless Chromium. Every process is
stopped by its pid at the module's end, also when a test failed.

A module may set ``DAEMON_CONFIG`` (YAML) and ``WEB_ENV`` (the environment of ``forkq web``,
e.g. its passwords) to change what it runs. ``forkq web`` reads the daemon's config file
(its periodic entries) and refreshes its pages every second. Tests share the server, so each
test works on names of its own (queues, jids) and never expects an empty set.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from selenium.webdriver.remote.webdriver import WebDriver

from forkq.client import Client
from forkq.embedded import EmbeddedServer

from ..conftest import records, throwaway_server, until
from .harness import LiveDaemon, WebServer, chromium, running_daemon

DAEMON_CONFIG = """\
concurrency: 2
require: jobs
tag: browser
queues: [default, busy, pausable]
periodic:
  - name: browser-nightly
    cron: "0 3 * * *"
    class: Record
    args: [periodic]
    queue: periodic-out
    timezone: Europe/Berlin
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch folder for the module (configs, logs)."""
    return tmp_path_factory.mktemp("browser")


@pytest.fixture(scope="module")
def redis_server() -> Iterator[EmbeddedServer]:
    """A throwaway server on a unix socket for this module alone."""
    with throwaway_server("fq-web-") as srv:
        yield srv


@pytest.fixture(scope="module")
def rc(redis_server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A client to the module's server (never flushed while the module runs)."""
    client: redis.Redis = redis.Redis(unix_socket_path=redis_server.socket, protocol=2)
    yield client
    client.close()


@pytest.fixture(scope="module")
def live(request: pytest.FixtureRequest, redis_server: EmbeddedServer, rc: redis.Redis,
         folder: Path) -> Iterator[LiveDaemon]:
    """A live daemon for the module (``DAEMON_CONFIG`` of the module, else the default),
    given once it has run a first job. That job waits in ``default`` when it starts, so the
    leader's first sample of the queues (taken at once, then every minute) has that queue;
    and the totals stay put until a test pushes something."""
    config = getattr(request.module, "DAEMON_CONFIG", DAEMON_CONFIG)
    jid = Client(rc).push({"class": "Record", "args": ["waiting at the start"]})
    with running_daemon(redis_server.url, folder / "daemon", config) as daemon:
        until(lambda: jid in [row["jid"] for row in records(rc)], 30,
              lambda: f"the daemon never ran its first job; log:\n{daemon.log()}")
        until(lambda: rc.get("stat:processed") == b"1", 10, "stat:processed never counted it")
        yield daemon


@pytest.fixture(scope="module")
def web(request: pytest.FixtureRequest, redis_server: EmbeddedServer, live: LiveDaemon,
        folder: Path) -> Iterator[WebServer]:
    """``forkq web`` on the module's server with the daemon's config (``WEB_ENV`` of the
    module added to its environment)."""
    env = getattr(request.module, "WEB_ENV", {})
    server = WebServer(redis_server.url, folder / "web.log", env=env,
                       args=("-C", live.config_file, "--refresh", "1"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium for the module."""
    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()
