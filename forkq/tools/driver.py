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
from collections.abc import Mapping
from typing import IO, Any

import redis

from forkq.subprocesses import terminate


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


def answers(client: redis.Redis) -> bool:
    """True when the server answers PING."""
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
