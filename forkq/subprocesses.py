"""Stopping a subprocess by its pid, and polling for a condition with a deadline.

Used by the embedded server, the subprocess driver and the tools: nothing here looks a
process up by name.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable


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
