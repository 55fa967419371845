"""The systems ``forkq bench`` runs: what each must offer, and the forkq daemon as one.

A :class:`System` is one configuration under test (``forkq -c4``, ``sidekiq 2x10``): it
starts its processes, says when every worker is up, gives the root pids of its process
tree (for CPU and PSS), and stops them by those pids. Its workers run the benchmark job
(registered as :data:`JOB_CLASS` by :mod:`forkq.tools.bench_jobs`, and in Ruby by
``bench/ruby/bench_worker.rb`` of a clone) from :data:`QUEUE`.
"""

from __future__ import annotations

import compileall
import os
from typing import IO, Protocol

import forkq
from forkq.tools import bench_procs
from forkq.tools.bench_jobs import JOB_CLASS, QUEUE
from forkq.tools.driver import DaemonProcess


def compile_forkq() -> bool:
    """Compile forkq's modules to bytecode, as ``pip install`` does, so that launch → first
    job times forkq as installed: a source checkout installed in editable mode, run with
    ``PYTHONDONTWRITEBYTECODE`` set, would compile every module at every launch (~70 ms on
    the benchmark machine). Python reads bytecode under that setting; it only never writes
    it. Files already compiled are left as they are. True when every module compiled (False
    when the package directory is read-only: launch then includes compiling)."""
    package = os.path.dirname(os.path.abspath(forkq.__file__))
    return bool(compileall.compile_dir(package, quiet=2))


class System(Protocol):
    """One configuration under test; the constructor starts nothing."""

    label: str  # the table's column heading
    side: str  # "forkq" or "sidekiq": which side of the ratio
    job_class: str  # the class name pushed in payloads
    workers: int  # jobs it can run at once

    def start(self) -> None:
        """Spawn its processes and return at once."""

    def ready(self) -> bool:
        """True once every worker process is up."""

    def roots(self) -> list[int]:
        """Pids whose process trees are the system."""

    def stop(self) -> None:
        """Stop every process it started, by pid (TERM, then KILL after a deadline)."""


class ForkqSystem:
    """``python -m forkq run`` with ``concurrency`` processors on ``queue``, logging at
    warning, without the scheduler unless ``scheduler``, importing ``require`` (a module
    name or a ``.py`` path; the benchmark job's module unless told); its log goes to
    ``<tmp>/forkq-c<concurrency>.log``."""

    side = "forkq"

    def __init__(self, tmp: str, url: str, concurrency: int, *, job_class: str = JOB_CLASS,
                 require: str = "forkq.tools.bench_jobs", scheduler: bool = False,
                 queue: str = QUEUE) -> None:
        self.label = f"forkq -c{concurrency}"
        self.job_class = job_class  # what its drains push (``require`` registers it)
        self.require = require
        self.scheduler = scheduler
        self.queue = queue
        self.workers = concurrency
        self._tmp = tmp
        self._url = url
        self._daemon: DaemonProcess | None = None
        self._log: IO[bytes] | None = None

    @property
    def log_path(self) -> str:
        """Where the daemon's log goes."""
        return os.path.join(self._tmp, f"forkq-c{self.workers}.log")

    def start(self) -> None:
        """Write the config and spawn the master."""
        path = os.path.join(self._tmp, f"bench-c{self.workers}.yml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"concurrency: {self.workers}\nqueues: [{self.queue}]\n"
                    f"require: {self.require}\nredis_url: {self._url}\n"
                    f"log_level: warning\nscheduler: {str(self.scheduler).lower()}\n")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._daemon = DaemonProcess(path, stderr=self._log)
        self._daemon.start()

    def ready(self) -> bool:
        """The master and all its processors exist."""
        return len(bench_procs.tree(self.roots())) >= 1 + self.workers

    def roots(self) -> list[int]:
        """The master's pid."""
        return [] if self._daemon is None else [self._daemon.pid]

    def stop(self) -> None:
        """Stop the master by pid (it stops its children)."""
        try:
            if self._daemon is not None:
                self._daemon.stop()
        finally:
            self._daemon = None
            if self._log is not None:
                self._log.close()
                self._log = None
