"""Driving a real ``forkq run`` daemon as a subprocess (for ``demo``, ``bench`` and tests).

:class:`DaemonProcess` starts ``python -m forkq run -C <file>``, knows its pid,
and stops it by that pid: TERM, then KILL after a deadline. It never looks
processes up by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

import redis


class DaemonProcess:
    """One daemon subprocess."""

    def __init__(self, config_file: str, *, env: Mapping[str, str] | None = None,
                 stderr: IO[Any] | int | None = None, cwd: str | None = None,
                 new_session: bool = False) -> None:
        self.config_file = config_file
        self.new_session = new_session
        self.env = dict(os.environ if env is None else env)
        self.stderr = stderr
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The master's pid."""
        assert self.process is not None, "daemon not started"
        return self.process.pid

    def start(self) -> None:
        """Start the master."""
        self.process = subprocess.Popen(
            [sys.executable, "-m", "forkq", "run", "-C", self.config_file],
            env=self.env, stderr=self.stderr, stdin=subprocess.DEVNULL, cwd=self.cwd,
            start_new_session=self.new_session,
        )

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the master."""
        os.kill(self.pid, signum)

    def wait(self, timeout: float) -> int:
        """Wait for the master to exit; its status (raises TimeoutExpired)."""
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """TERM, wait up to ``timeout``, then KILL; the exit status (None if never started)."""
        if self.process is None:
            return None
        return terminate(self.process, timeout)


def terminate(process: subprocess.Popen[bytes], timeout: float) -> int:
    """Stop ``process`` by its pid: TERM, wait up to ``timeout``, then KILL; its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def wait_for(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``condition`` until true or ``timeout`` seconds pass; the last result."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def answers(client: redis.Redis) -> bool:
    """True when the server answers PING."""
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
