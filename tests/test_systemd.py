"""systemd integration without systemd running: sd_notify datagrams and the unit files.

The :class:`~forkq.daemon.master.sdnotify.Notifier` tests bind a real
``AF_UNIX``/``SOCK_DGRAM`` socket (a path
under ``tmp_path``, and once an abstract ``@name``) and read back exactly what systemd would
receive. The unit-file tests check the directives forkq relies on, that the shipped files are
``forkq systemd-unit``'s output for the documented path, that the command's unit passes
``systemd-analyze verify`` and rates at most 3.0 in ``systemd-analyze security``, and run the
daemon inside the unit's sandbox rebuilt without systemd (:mod:`tests.sandbox`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis

from forkq.config import Config
from forkq.daemon.master.sdnotify import Notifier
from forkq.embedded import EmbeddedServer
from forkq.errors import EXIT_CONFIG, EXIT_NOPERM
from forkq.ops import systemd_unit

from . import debian, sandbox
from .conftest import (
    ROOT,
    TESTS,
    NotifyReceiver,
    push,
    records,
    run_forkq,
    throwaway_server,
    until,
)

UNITS = ROOT / "systemd"


# --- sd_notify ---------------------------------------------------------------------------------


def notifier_for(rcv: NotifyReceiver, **environ: str) -> Notifier:
    return Notifier.from_environ({"NOTIFY_SOCKET": rcv.notify_socket, **environ})


def test_messages_arrive_byte_exact(receiver: NotifyReceiver) -> None:
    notifier = notifier_for(receiver)
    assert notifier.enabled
    assert notifier.ready("3 of 5 busy")
    assert receiver.recv() == b"READY=1\nSTATUS=3 of 5 busy"
    assert notifier.status("quiet")
    assert receiver.recv() == b"STATUS=quiet"
    assert notifier.stopping()
    assert receiver.recv() == b"STOPPING=1"
    assert notifier.send(READY=1, STATUS="caf\u00e9")
    assert receiver.recv() == "READY=1\nSTATUS=caf\u00e9".encode()
    notifier.close()


def test_reloading_carries_the_monotonic_clock_in_microseconds(receiver: NotifyReceiver) -> None:
    notifier = notifier_for(receiver)
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notifier.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    match = re.fullmatch(rb"RELOADING=1\nMONOTONIC_USEC=(\d+)", receiver.recv())
    assert match is not None
    assert before <= int(match.group(1)) <= after
    notifier.close()


def test_abstract_socket_address() -> None:
    rcv = NotifyReceiver(f"@forkq-test-{os.getpid()}-{uuid.uuid4().hex}")
    try:
        notifier = notifier_for(rcv)
        assert notifier.ready("up")
        assert rcv.recv() == b"READY=1\nSTATUS=up"
        notifier.close()
    finally:
        rcv.close()


def test_a_newline_in_a_value_cannot_forge_a_field(receiver: NotifyReceiver) -> None:
    notifier = notifier_for(receiver)
    assert notifier.status("line one\nREADY=1")
    assert receiver.recv() == b"STATUS=line one READY=1"
    assert not notifier.send()
    assert receiver.pending() == []
    notifier.close()


def test_close_then_send_reopens(receiver: NotifyReceiver) -> None:
    notifier = notifier_for(receiver)
    assert notifier.status("a")
    notifier.close()
    notifier.close()
    assert notifier.status("b")
    assert [receiver.recv(), receiver.recv()] == [b"STATUS=a", b"STATUS=b"]
    notifier.close()


def test_from_environ_defaults_to_os_environ(receiver: NotifyReceiver,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", receiver.notify_socket)
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = Notifier.from_environ()
    assert notifier.enabled and notifier.watchdog_interval == 1.5
    assert notifier.stopping()
    assert receiver.recv() == b"STOPPING=1"
    notifier.close()


@pytest.mark.parametrize(("environ", "interval"), [
    ({"WATCHDOG_USEC": "2000000"}, 1.0),
    ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "4242"}, 15.0),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "4243"}, None),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "not-a-pid"}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "-5"}, None),
    ({"WATCHDOG_USEC": "2s"}, None),
    ({"WATCHDOG_USEC": ""}, None),
    ({"WATCHDOG_PID": "4242"}, None),
])
def test_watchdog_interval_from_the_environment(environ: dict[str, str],
                                                interval: float | None) -> None:
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": "/nonexistent/notify", **environ},
                                     pid=4242)
    assert notifier.watchdog_interval == interval


def test_watchdog_is_rate_limited(receiver: NotifyReceiver) -> None:
    notifier = notifier_for(receiver, WATCHDOG_USEC="2000000")
    assert notifier.watchdog(100.0)
    assert not notifier.watchdog(100.0)
    assert not notifier.watchdog(100.9)
    assert receiver.pending() == [b"WATCHDOG=1"]
    assert notifier.watchdog(101.0)
    assert not notifier.watchdog(101.5)
    assert notifier.watchdog(103.0)
    assert receiver.pending() == [b"WATCHDOG=1", b"WATCHDOG=1"]
    notifier.close()


def test_watchdog_for_another_pid_sends_nothing(receiver: NotifyReceiver) -> None:
    notifier = notifier_for(receiver, WATCHDOG_USEC="2000000", WATCHDOG_PID=str(os.getpid() + 1))
    assert notifier.enabled and notifier.watchdog_interval is None
    assert not notifier.watchdog(100.0)
    assert receiver.pending() == []
    notifier.close()


def test_a_failed_ping_is_retried_on_the_next_call(tmp_path: Path) -> None:
    path = tmp_path / "late.sock"
    notifier = Notifier.from_environ({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000"})
    assert not notifier.watchdog(100.0)
    rcv = NotifyReceiver(str(path))
    try:
        assert notifier.watchdog(100.0)
        assert rcv.recv() == b"WATCHDOG=1"
    finally:
        rcv.close()
        notifier.close()


def test_disabled_without_notify_socket_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_socket(*args: object, **kwargs: object) -> socket.socket:
        raise AssertionError("a disabled notifier opened a socket")

    monkeypatch.setattr(socket, "socket", no_socket)
    for environ in ({}, {"NOTIFY_SOCKET": ""}, {"WATCHDOG_USEC": "2000000"}):
        notifier = Notifier.from_environ(environ)
        assert not notifier.enabled
        assert notifier.watchdog_interval is None
        assert not notifier.ready("up")
        assert not notifier.reloading()
        assert not notifier.stopping()
        assert not notifier.status("x")
        assert not notifier.send(READY=1)
        assert not notifier.watchdog(100.0)
        notifier.close()


def test_send_to_a_missing_socket_returns_false(tmp_path: Path) -> None:
    for address in (str(tmp_path / "absent.sock"), f"@forkq-absent-{uuid.uuid4().hex}"):
        notifier = Notifier.from_environ({"NOTIFY_SOCKET": address})
        assert notifier.enabled
        assert not notifier.ready("up")
        assert not notifier.stopping()
        notifier.close()


# --- unit files --------------------------------------------------------------------------------

COMMON = {
    "Unit": {
        "After": "network-online.target redis-server.service",
        "Wants": "network-online.target",
    },
    "Service": {
        "Type": "notify",
        "NotifyAccess": "main",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "KillMode": "mixed",
        "KillSignal": "SIGTERM",
        "TimeoutStopSec": "40",
        "TimeoutStartSec": "60",
        "Restart": "on-failure",
        "RestartSec": "2",
        "RestartPreventExitStatus": f"{EXIT_CONFIG} {EXIT_NOPERM}",
        "WatchdogSec": "30",
        "User": "forkq",
        "Group": "forkq",
        "Environment": "PYTHONUNBUFFERED=1",
        "UMask": "0027",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "AmbientCapabilities": "",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "PrivateMounts": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "ProtectControlGroups": "yes",
        "ProtectClock": "yes",
        "ProtectHostname": "yes",
        "ProtectProc": "invisible",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "RestrictNamespaces": "yes",
        "RemoveIPC": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "SystemCallArchitectures": "native",
        "SystemCallErrorNumber": "EPERM",
    },
    "Install": {"WantedBy": "multi-user.target"},
}
SYSCALL_FILTER = ["@system-service", "~@privileged"]

# A single daemon owns /var/lib/forkq; each template instance gets /var/lib/forkq/NAME so that
# two embedded servers (the default embedded_dir is .forkq under the working directory) never
# share a data directory.
SPECIFIC = {
    "forkq.service": {
        "ExecStart": "/opt/forkq/venv/bin/forkq -C /etc/forkq/forkq.yml",
        "WorkingDirectory": "/var/lib/forkq",
        "StateDirectory": "forkq",
        "LogsDirectory": "forkq",
        "RuntimeDirectory": "forkq",
        "ReadWritePaths": "/var/lib/forkq",
    },
    "forkq@.service": {
        "ExecStart": "/opt/forkq/venv/bin/forkq -C /etc/forkq/%i.yml -g %i",
        "WorkingDirectory": "/var/lib/forkq/%i",
        "StateDirectory": "forkq/%i",
        "LogsDirectory": "forkq/%i",
        "RuntimeDirectory": "forkq/%i",
        "ReadWritePaths": "/var/lib/forkq/%i",
    },
}


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections → key → every value given, in order (systemd allows repeated keys)."""
    return parse_unit(path.read_text(), path.name)


def parse_unit(text: str, name: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"{name}:{number}: keep directives on one line"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"{name}:{number}: {raw!r}"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.mark.parametrize("name", sorted(SPECIFIC))
def test_unit_declares_what_forkq_relies_on(name: str) -> None:
    unit = read_unit(UNITS / name)
    expected = {**COMMON, "Service": {**COMMON["Service"], **SPECIFIC[name]}}
    for section, directives in expected.items():
        for key, value in directives.items():
            assert unit.get(section, {}).get(key) == [value], f"{name} [{section}] {key}"
    assert unit["Service"]["SystemCallFilter"] == SYSCALL_FILTER
    assert float(unit["Service"]["TimeoutStopSec"][0]) > Config().timeout + 5, (
        "TimeoutStopSec must exceed the default graceful-stop timeout plus a margin")


def test_template_instance_selects_config_and_tag() -> None:
    exec_start = read_unit(UNITS / "forkq@.service")["Service"]["ExecStart"][0]
    assert exec_start.split()[1:] == ["-C", "/etc/forkq/%i.yml", "-g", "%i"]


def test_the_shipped_units_are_the_commands_output_for_the_documented_path() -> None:
    """systemd/ holds what ``forkq systemd-unit [--instance]`` writes for an installation in
    /opt/forkq/venv: one template, so the two files and the command cannot drift apart."""
    assert systemd_unit.DEFAULT_FORKQ == "/opt/forkq/venv/bin/forkq"
    assert (UNITS / "forkq.service").read_text() == systemd_unit.render(
        systemd_unit.UnitOptions())
    assert (UNITS / "forkq@.service").read_text() == systemd_unit.render(
        systemd_unit.UnitOptions(instance=True))


def test_a_python_in_a_home_folder_is_named_as_hidden_by_protect_home(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    assert systemd_unit.hidden_at_home("/opt/forkq/venv/bin/forkq") == ""
    assert systemd_unit.hidden_at_home("/home/ann/.local/bin/forkq -x") == (
        "/home/ann/.local/bin/forkq")
    monkeypatch.setattr(sys, "executable", "/root/.pyenv/versions/3.11.7/bin/python3")
    assert systemd_unit.hidden_at_home("/opt/forkq/venv/bin/forkq").startswith("/root/")


def systemd_analyze() -> str:
    """The ``systemd-analyze`` tool (Debian's systemd package, installed when missing and
    possible)."""
    if shutil.which("systemd-analyze") is None:
        debian.install("systemd")
    tool = shutil.which("systemd-analyze")
    assert tool, "systemd-analyze is needed: apt-get install systemd"
    return tool


def generated(*flags: str) -> str:
    """What ``forkq systemd-unit`` prints, run by this installation."""
    done = run_forkq("systemd-unit", *flags)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.process
@pytest.mark.parametrize(("flags", "as_name"), [
    ((), "forkq.service"),
    (("--instance",), "forkq@test.service"),
])
def test_the_generated_unit_passes_systemd_analyze_verify(tmp_path: Path, flags: tuple[str, ...],
                                                           as_name: str) -> None:
    """The shipped files name /opt/forkq/venv/bin/forkq, which verify requires to exist
    ("is not executable"); the command writes this installation's real path, unchanged here.
    verify only warns (exit status 0) about unknown keys or bad values, so its stderr is read
    too. It does not check that User=forkq exists (systemd 252, as root, with no such user:
    no message)."""
    text = generated(*flags)
    program = parse_unit(text, as_name)["Service"]["ExecStart"][0].split()[0]
    assert program == str(Path(sys.executable).with_name("forkq"))
    assert os.access(program, os.X_OK)
    unit = tmp_path / as_name
    unit.write_text(text)
    result = subprocess.run([systemd_analyze(), "verify", "--man=no", str(unit)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    complaints = [line for line in result.stderr.splitlines() if as_name in line]
    assert complaints == [], result.stderr


EXPOSURE = re.compile(r"Overall exposure level for (\S+): ([0-9.]+) (\w+)")


@pytest.mark.process
@pytest.mark.parametrize(("flags", "as_name"), [
    ((), "forkq.service"),
    (("--instance",), "forkq@test.service"),
])
def test_the_generated_unit_rates_at_most_3_in_systemd_analyze_security(
        tmp_path: Path, flags: tuple[str, ...], as_name: str) -> None:
    unit = tmp_path / as_name
    unit.write_text(generated(*flags))
    result = subprocess.run([systemd_analyze(), "security", "--offline=yes", "--no-pager",
                             str(unit)], capture_output=True, text=True, timeout=60,
                            check=False)
    found = EXPOSURE.search(result.stdout)
    assert found is not None, result.stdout + result.stderr
    print(found.group(0))
    assert found.group(1) == as_name and float(found.group(2)) <= 3.0, found.group(0)


@pytest.mark.process
@pytest.mark.parametrize("flags", [
    ["--user", "forkq\nExecStartPre=/bin/sh"], ["--config", "forkq.yml"],
    ["--config", "/etc/forkq/my config.yml"], ["--forkq", "/opt/x/bin/forkq\nUser=root"],
    ["--config", "/etc/forkq/%n.yml"],
])
def test_systemd_unit_refuses_a_value_that_would_write_more_than_it_says(
        flags: list[str]) -> None:
    done = run_forkq("systemd-unit", *flags)
    assert done.returncode == 65 and done.stdout == "", done
    assert done.stderr.startswith(f"forkq: systemd-unit: {flags[0]} "), done.stderr


def test_the_example_log_and_pid_files_are_writable_under_the_units_hardening() -> None:
    """etc/forkq.yml's example paths sit in the directories forkq.service makes writable
    (LogsDirectory=, RuntimeDirectory=) despite ProtectSystem=strict."""
    example = (ROOT / "etc" / "forkq.yml").read_text()
    paths = dict(re.findall(r"^# (log_file|pid_file): (\S+)", example, re.MULTILINE))
    service = read_unit(UNITS / "forkq.service")["Service"]
    assert service["ProtectSystem"] == ["strict"]
    assert Path(paths["log_file"]).parent == Path("/var/log") / service["LogsDirectory"][0]
    assert Path(paths["pid_file"]).parent == Path("/run") / service["RuntimeDirectory"][0]


# --- the daemon inside the unit's sandbox ------------------------------------------------------
#
# No systemd runs here, so the generated unit's sandbox is rebuilt as closely as this host
# allows (tests/sandbox.py: which directives are rebuilt and which are not) around the unit's
# own ExecStart, and the daemon is driven as systemd would: Type=notify readiness, HUP, TERM.

PROBE = """
import errno, json, os, socket
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines()
              if ":\\t" in line)
seen = {key: status[key].strip() for key in ("NoNewPrivs", "CapBnd", "CapEff", "Seccomp")}
seen["uid"] = os.getuid()

def attempt(name, act):
    try:
        act()
        seen[name] = "ok"
    except OSError as exc:
        seen[name] = errno.errorcode.get(exc.errno, str(exc.errno))

attempt("write /etc", lambda: open("/etc/forkq-probe", "w"))
attempt("write the checkout", lambda: open(os.environ["CHECKOUT"] + "/forkq-probe", "w"))
attempt("write the state folder", lambda: open("probe", "w").close())
attempt("write /proc/sys", lambda: open("/proc/sys/kernel/hostname", "w"))
attempt("list /root", lambda: os.listdir("/root"))
attempt("netlink socket", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
attempt("tcp socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close())
attempt("chroot", lambda: os.chroot("/"))
seen["/tmp"] = sorted(os.listdir("/tmp"))
print(json.dumps(seen))
"""


class Sandboxed:
    """The throwaway Redis and notify socket the sandbox may reach, and its state folder."""

    def __init__(self, tmp_path: Path, server: EmbeddedServer, receiver: NotifyReceiver) -> None:
        assert os.geteuid() == 0, "rebuilding the unit's sandbox (unshare, mount, setpriv) " \
            "needs root"
        self.server, self.receiver = server, receiver
        reachable = [Path(server.socket), Path(receiver.notify_socket)]
        for socket_path in reachable:  # the daemon runs as nobody, as User= would not be root
            os.chmod(socket_path.parent, 0o755)
            os.chmod(socket_path, 0o777)
        self.state = tmp_path / "state"  # stands for /var/lib/forkq (StateDirectory=)
        self.state.mkdir()
        os.chown(self.state, sandbox.NOBODY, sandbox.NOBODY)
        self.config = self.state / "forkq.yml"
        self.config.write_text(f"concurrency: 2\nrequire: jobs\nredis_url: {server.url}\n")
        self.unit = generated("--config", str(self.config))
        # a checkout (and its venv) under /tmp, as a fresh clone made with mktemp is: where
        # the installed unit's forkq would live, outside the private /tmp, it stays in view
        self.installed = tuple(path for path in {ROOT, Path(sys.prefix)}
                               if path.is_relative_to("/tmp") and not path > ROOT)
        for path in self.installed:  # mktemp's 0700: the unit's user (nobody) must reach it
            os.chmod(path, os.stat(path).st_mode | 0o005)
        self.keep = [self.state, *(path.parent for path in reachable)]

    def start(self, command: list[str], output: Any) -> subprocess.Popen[bytes]:
        """``command`` in the sandbox, from the state folder (WorkingDirectory=)."""
        script = sandbox.script(self.unit, keep=self.keep, state=self.state, command=command,
                                expose=sandbox.interpreter_home(), installed=self.installed)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(self.state),
               "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", "PYTHONUNBUFFERED": "1",
               "NOTIFY_SOCKET": self.receiver.notify_socket, "CHECKOUT": str(ROOT)}
        return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                 script], cwd=self.state, env=env, stdout=output,
                                stderr=subprocess.STDOUT)


@pytest.fixture
def sandboxed(tmp_path: Path, receiver: NotifyReceiver) -> Iterator[Sandboxed]:
    systemd_analyze()  # its syscall groups build the filter
    with throwaway_server("fq-sd-") as server:
        yield Sandboxed(tmp_path, server, receiver)


@pytest.mark.process
def test_the_sandbox_rebuilt_from_the_generated_unit_holds(sandboxed: Sandboxed) -> None:
    """The emulation is real, so the next test means something: nobody, no capability,
    no new privileges, a seccomp filter, a read-only system, a private /tmp, no home."""
    probe = sandboxed.start([sys.executable, "-c", PROBE], subprocess.PIPE)
    out, _ = probe.communicate(timeout=60)
    assert probe.returncode == 0, out.decode()
    seen = json.loads(out.decode().strip().splitlines()[-1])
    assert seen == {
        "uid": sandbox.NOBODY, "NoNewPrivs": "1", "CapBnd": "0000000000000000",
        "CapEff": "0000000000000000", "Seccomp": "2",
        "write /etc": "EROFS", "write the checkout": "EROFS", "write the state folder": "ok",
        "write /proc/sys": "EROFS", "list /root": "EACCES", "netlink socket": "EPERM",
        "tcp socket": "ok", "chroot": "EPERM",
        "/tmp": sorted({path.relative_to("/tmp").parts[0]
                        for path in (*sandboxed.keep, *sandboxed.installed)})}, seen


@pytest.mark.process
def test_the_daemon_runs_jobs_inside_the_generated_units_sandbox(
        sandboxed: Sandboxed, tmp_path: Path) -> None:
    """The unit's ExecStart, in its sandbox: READY=1 once the processors fetch, jobs run and a
    failure is filed, HUP reloads (RELOADING=1, READY=1), TERM stops it cleanly (exit 0)."""
    exec_start = parse_unit(sandboxed.unit, "forkq.service")["Service"]["ExecStart"][0]
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        master = sandboxed.start(exec_start.split(), log)
    children: set[int] = set()
    try:
        rcv = sandboxed.receiver
        rcv.wait(lambda m: "READY=1" in m, 60)
        r = redis.Redis(unix_socket_path=sandboxed.server.socket, protocol=2)
        children |= {p.pid for p in psutil.Process(master.pid).children(recursive=True)}
        jids = [push(r, "Record", n) for n in range(3)]
        failing = push(r, "Boom", "sandboxed")
        until(lambda: sorted(row["jid"] for row in records(r)) == sorted(jids), 30,
              log_path.read_text)
        until(lambda: r.zcard("retry") == 1, 30, log_path.read_text)
        assert failing in r.zrange("retry", 0, -1)[0].decode()
        master.send_signal(signal.SIGHUP)
        rcv.wait(lambda m: "RELOADING=1" in m, 30)
        master.send_signal(signal.SIGTERM)
        assert master.wait(timeout=60) == 0, log_path.read_text()
        rcv.wait(lambda m: "STOPPING=1" in m, 5)
        r.close()
    finally:
        if master.poll() is None:
            children |= {p.pid for p in psutil.Process(master.pid).children(recursive=True)}
            master.kill()
            master.wait(timeout=10)
        for pid in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
    text = log_path.read_text()
    assert "Bye!" in text, text
    for trouble in ("Operation not permitted", "Permission denied", "Read-only file system"):
        assert trouble not in text, text
