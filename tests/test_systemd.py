"""systemd integration without systemd running: sd_notify datagrams and the unit files.

The :class:`~forkq.daemon.master.sdnotify.Notifier` tests bind a real
``AF_UNIX``/``SOCK_DGRAM`` socket (a path
under ``tmp_path``, and once an abstract ``@name``) and read back exactly what systemd would
receive. The unit-file tests always check the directives forkq relies on, and also run
``systemd-analyze verify`` where that tool exists. No Redis is needed.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from forkq.config import Config
from forkq.daemon.master.sdnotify import Notifier
from forkq.errors import EXIT_CONFIG, EXIT_NOPERM

from .conftest import ROOT, NotifyReceiver

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
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "RestrictNamespaces": "yes",
        "SystemCallArchitectures": "native",
    },
    "Install": {"WantedBy": "multi-user.target"},
}

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
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: keep directives on one line"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"{path.name}:{number}: {raw!r}"
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
    assert float(unit["Service"]["TimeoutStopSec"][0]) > Config().timeout + 5, (
        "TimeoutStopSec must exceed the default graceful-stop timeout plus a margin")


def test_template_instance_selects_config_and_tag() -> None:
    exec_start = read_unit(UNITS / "forkq@.service")["Service"]["ExecStart"][0]
    assert exec_start.split()[1:] == ["-C", "/etc/forkq/%i.yml", "-g", "%i"]


def real_executable() -> str:
    """An existing executable to stand in for /opt/forkq/venv/bin/forkq, which verify checks."""
    script = Path(sys.executable).with_name("forkq")
    if script.is_file() and os.access(script, os.X_OK):
        return str(script)
    return shutil.which("forkq") or sys.executable


@pytest.mark.process
@pytest.mark.parametrize(("name", "as_name"), [
    ("forkq.service", "forkq.service"),
    ("forkq@.service", "forkq@test.service"),
])
def test_unit_passes_systemd_analyze_verify(tmp_path: Path, name: str, as_name: str) -> None:
    # The directives are checked by the test above on every machine; this adds systemd's own
    # parser where it is installed. verify only warns (exit status 0) about unknown keys or bad
    # values, so its stderr is read too. It does not check that User=forkq exists (systemd 252,
    # as root, with no such user: no message), so the unit is verified unchanged except for
    # ExecStart, whose binary verify does require ("Command ... is not executable").
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return
    text = (UNITS / name).read_text()
    text = text.replace("ExecStart=/opt/forkq/venv/bin/forkq ", f"ExecStart={real_executable()} ")
    assert "/opt/forkq/venv/bin/forkq" not in text
    unit = tmp_path / as_name
    unit.write_text(text)
    result = subprocess.run([tool, "verify", "--man=no", str(unit)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    complaints = [line for line in result.stderr.splitlines() if as_name in line]
    assert complaints == [], result.stderr


def test_the_example_log_and_pid_files_are_writable_under_the_units_hardening() -> None:
    """etc/forkq.yml's example paths sit in the directories forkq.service makes writable
    (LogsDirectory=, RuntimeDirectory=) despite ProtectSystem=strict."""
    example = (ROOT / "etc" / "forkq.yml").read_text()
    paths = dict(re.findall(r"^# (log_file|pid_file): (\S+)", example, re.MULTILINE))
    service = read_unit(UNITS / "forkq.service")["Service"]
    assert service["ProtectSystem"] == ["strict"]
    assert Path(paths["log_file"]).parent == Path("/var/log") / service["LogsDirectory"][0]
    assert Path(paths["pid_file"]).parent == Path("/run") / service["RuntimeDirectory"][0]
