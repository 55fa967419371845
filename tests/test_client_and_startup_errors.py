"""The client never hangs, says what it enqueued; start-up errors say what is wrong.

Issue #11, findings 6 and 11: pushes against a hung (SIGSTOPped) server used to block
forever; a log or pid file in a missing directory gave a traceback and exit 1; a wrong
Redis password was reported as "Redis did not answer" (exit 69), like a server that is
down.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import forkq
from forkq import client as clients
from forkq.errors import EXIT_CONFIG, EXIT_NOPERM
from forkq.subprocesses import wait_for

from .conftest import run_forkq, server_binary


@pytest.fixture
def hung_server() -> Iterator[str]:
    """A throwaway redis-server on a unix socket, SIGSTOPped: it accepts, never answers."""
    data_dir = tempfile.mkdtemp(prefix="fq-hung-")
    sock = os.path.join(data_dir, "r.sock")
    server = subprocess.Popen([server_binary(), "--port", "0",
                               "--unixsocket", sock, "--save", "", "--dir", data_dir],
                              stdout=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: os.path.exists(sock), 10)
        assert wait_for(lambda: redis.Redis(unix_socket_path=sock).ping(), 10)
        os.kill(server.pid, signal.SIGSTOP)
        yield f"unix://{sock}"
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.parametrize("call", ["perform_async", "perform_in", "push_bulk"])
def test_a_push_to_a_hung_server_raises_within_its_timeout(hung_server: str, call: str) -> None:
    client = forkq.Client(url=hung_server, timeout=1, connect_timeout=1)
    clients.configure(client)
    started = time.monotonic()
    try:
        with pytest.raises(forkq.EnqueueError) as failed:
            if call == "push_bulk":
                client.push_bulk({"class": "Record", "args": [[1], [2]]})
            else:
                job = forkq.job(name=f"HungTarget{call}")(lambda n: None)
                job.perform_async(1) if call == "perform_async" else job.perform_in(60, 1)
    finally:
        clients.configure(None)
    took = time.monotonic() - started
    assert took < 10, f"took {took:.1f}s"  # a bound on a hang, not a timing claim
    assert isinstance(failed.value.__cause__, redis.TimeoutError | redis.ConnectionError)
    assert failed.value.enqueued == [] and (failed.value.unknown or failed.value.not_enqueued)


def test_the_default_clients_timeouts_come_from_the_environment(
        hung_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORKQ_REDIS_URL", hung_server)
    monkeypatch.setenv("FORKQ_CLIENT_TIMEOUT", "0.5")
    monkeypatch.setenv("FORKQ_CLIENT_CONNECT_TIMEOUT", "0.5")
    clients.configure(None)
    try:
        kwargs = clients.default().redis.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 0.5 and kwargs["socket_connect_timeout"] == 0.5
    finally:
        clients.configure(None)
    monkeypatch.setenv("FORKQ_CLIENT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="FORKQ_CLIENT_TIMEOUT"):
        forkq.Client()


def test_a_refused_push_raises_and_tells_what_was_enqueued(r: redis.Redis) -> None:
    r.set("queue:broken", "a string")
    client = forkq.Client(r)
    with pytest.raises(forkq.EnqueueError) as failed:
        client.push_bulk({"class": "Record", "args": [[1], [2]], "queue": "broken"})
    assert len(failed.value.not_enqueued) == 2 and failed.value.unknown == []
    pushed = client.push({"class": "Record", "args": [3], "queue": "fine"})
    assert pushed and r.llen("queue:fine") == 1


def test_nothing_sent_is_certainly_not_enqueued(tmp_path: Path) -> None:
    client = forkq.Client(url=f"unix://{tmp_path}/nobody.sock", timeout=1, connect_timeout=1)
    with pytest.raises(forkq.EnqueueError) as failed:
        client.push({"class": "Record", "args": []})
    assert len(failed.value.not_enqueued) == 1 and failed.value.unknown == []


@pytest.mark.process
@pytest.mark.parametrize("setting", ["--logfile", "--pidfile"])
def test_a_log_or_pid_file_in_a_missing_directory_exits_78_naming_it(
        tmp_path: Path, setting: str) -> None:
    missing = tmp_path / "no" / "such" / "forkq.out"
    done = run_forkq("run", "-r", "jobs", setting, str(missing), "--redis-url",
                     f"unix://{tmp_path}/nobody.sock", cwd=tmp_path, timeout=30)
    name = "log_file" if setting == "--logfile" else "pid_file"
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert f"config error: {name}: " in done.stderr and str(missing) in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def password_server() -> Iterator[str]:
    """A throwaway redis-server that wants a password; its URL without one."""
    data_dir = tempfile.mkdtemp(prefix="fq-auth-")
    sock = os.path.join(data_dir, "r.sock")
    server = subprocess.Popen([server_binary(), "--port", "0",
                               "--unixsocket", sock, "--save", "", "--dir", data_dir,
                               "--requirepass", "right"], stdout=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: os.path.exists(sock), 10)
        yield f"unix://{sock}"
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.parametrize("command", [["run", "-r", "jobs", "-c", "1"], ["status"]])
@pytest.mark.parametrize("auth", ["wrong", "none"])
def test_a_refused_password_exits_77_saying_so(password_server: str, tmp_path: Path,
                                              command: list[str], auth: str) -> None:
    sock = password_server.removeprefix("unix://")
    url = f"unix://:wrong@{sock}" if auth == "wrong" else password_server
    done = run_forkq(*command, "--redis-url", url, cwd=tmp_path, timeout=60)
    assert done.returncode == EXIT_NOPERM, (done.returncode, done.stderr)
    assert "Redis refused authentication" in done.stderr, done.stderr
    assert "did not answer" not in done.stderr and "Traceback" not in done.stderr
