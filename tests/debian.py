"""Debian packages the tests need: installed on first need when they can be.

The README's test command must work on a fresh Debian machine with nothing but Python:
when a test finds a package missing and runs as root with ``apt-get`` (a fresh machine, CI),
:func:`install` installs it once; elsewhere the test fails, saying what to install. Several
xdist workers may ask at once: apt-get waits for the dpkg lock rather than failing.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

LOCK_WAIT = ["-o", "DPkg::Lock::Timeout=900"]


@functools.cache
def install(*packages: str) -> None:
    """Install ``packages`` with apt-get when running as root (once per process); a failed or
    impossible install is left to the caller's own check, which names what is missing."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", *LOCK_WAIT, "update", "-qq"],
                    ["apt-get", *LOCK_WAIT, "install", "-y", "-qq", *packages]):
        subprocess.run(command, env=env, capture_output=True, timeout=1200, check=False)
