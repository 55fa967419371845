"""The Ruby side of ``forkq bench --sidekiq`` (:mod:`side_by_side`): Debian's Sidekiq 6.4.1
as a :class:`~forkq.tools.bench_systems.System`, and Sidekiq's own client timed by a Ruby
script.

:class:`SidekiqSystem` runs ``processes`` separate ``sidekiq -c <threads>`` commands
(each its own Ruby process) with ``ruby/bench_worker.rb``, the same job body as forkq's,
logging at WARN. A process counts as up once its identity (``host:<pid>:<nonce>``) is in
the ``processes`` set. :func:`ruby_enqueue` runs ``ruby/bench_enqueue.rb``, which times
``Sidekiq::Client.push`` and ``push_bulk`` and prints its figures as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import IO

import redis

from forkq import keys
from forkq.connection import text
from forkq.errors import ForkqError
from forkq.subprocesses import terminate
from forkq.tools.bench_jobs import QUEUE

INSTALL = "apt-get install -y ruby-sidekiq"
STOP_TIMEOUT = 15.0


RUBY = Path(__file__).resolve().parent / "ruby"


def ruby_file(name: str) -> str:
    """The path of a Ruby script of ``bench/ruby``."""
    return str(RUBY / name)


def _which(command: str) -> str:
    found = shutil.which(command)
    if found is None:
        raise ForkqError(f"bench --sidekiq needs Ruby's Sidekiq 6.4.1 ('{command}' is not on "
                         f"PATH): {INSTALL}")
    return found


def check_installed() -> None:
    """ForkqError with the fix when ``sidekiq`` or ``ruby`` is missing."""
    _which("sidekiq")
    _which("ruby")


class SidekiqSystem:
    """``processes`` Sidekiq processes of ``threads`` threads each on ``url``; their logs go to
    ``<tmp>/sidekiq-<processes>x<threads>.log``."""

    side = "sidekiq"
    job_class = "ForkqBenchWork"

    def __init__(self, tmp: str, url: str, r: redis.Redis, *, processes: int,
                 threads: int) -> None:
        self.label = f"sidekiq {processes}x{threads}"
        self.workers = processes * threads
        self.log_path = os.path.join(tmp, f"sidekiq-{processes}x{threads}.log")
        self._url = url
        self._r = r
        self._count = processes
        self._threads = threads
        self._running: list[subprocess.Popen[bytes]] = []
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        """Spawn the Sidekiq processes."""
        command = [_which("sidekiq"), "-r", ruby_file("bench_worker.rb"), "-q", QUEUE,
                   "-c", str(self._threads), "-t", "5"]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        for _ in range(self._count):
            self._running.append(subprocess.Popen(
                command, env={**os.environ, "REDIS_URL": self._url}, stdout=self._log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    def ready(self) -> bool:
        """Every process has registered its identity in ``processes``."""
        registered = {text(member).split(":")[-2] for member in self._r.smembers(keys.PROCESSES)
                      if text(member).count(":") >= 2}
        return all(str(pid) in registered for pid in self.roots())

    def roots(self) -> list[int]:
        """The Ruby processes' pids."""
        return [process.pid for process in self._running]

    def stop(self) -> None:
        """TERM each process by pid, KILL after :data:`STOP_TIMEOUT`."""
        try:
            for process in self._running:
                if process.poll() is None:
                    process.terminate()
            for process in self._running:
                terminate(process, STOP_TIMEOUT)
        finally:
            self._running = []
            if self._log is not None:
                self._log.close()
                self._log = None


VERSIONS = ('require "sidekiq"; puts "ruby #{RUBY_VERSION}, sidekiq #{Sidekiq::VERSION}, '
            'redis-rb #{Redis::VERSION}"')


def versions() -> str:
    """What the Sidekiq side runs on: ``ruby <v>, sidekiq <v>, redis-rb <v>`` (the client
    library its job body uses, as redis-py is forkq's), as the ``ruby`` on PATH loads them
    (the one :func:`ruby_enqueue` runs; Debian's ``sidekiq`` runs ``/usr/bin/ruby``).
    ForkqError when it cannot."""
    try:
        found = subprocess.run([_which("ruby"), "-e", VERSIONS], capture_output=True,
                               timeout=60, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise ForkqError("ruby did not load sidekiq within 60 s") from None
    if found.returncode != 0:
        why = found.stderr.decode(errors="replace")[-500:]
        raise ForkqError(f"ruby could not load sidekiq ({INSTALL}): {why}")
    return found.stdout.decode(errors="replace").strip()


def ruby_enqueue(url: str, jobs: int, chunk: int) -> dict[str, float]:
    """``{"one_by_one": jobs/s, "bulk": jobs/s}`` of Sidekiq's Ruby client pushing ``jobs`` jobs
    of the benchmark class to :data:`QUEUE` (the script deletes the queue after each part)."""
    process = subprocess.Popen(
        [_which("ruby"), ruby_file("bench_enqueue.rb"), str(jobs), QUEUE, str(chunk)],
        env={**os.environ, "REDIS_URL": url}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL)
    try:
        out, err = process.communicate(timeout=600)
    finally:
        terminate(process, 5)
    if process.returncode != 0:
        raise ForkqError(f"ruby bench_enqueue.rb exited {process.returncode}: "
                         f"{err.decode(errors='replace')[-2000:]}")
    figures: dict[str, float] = json.loads(out)
    return figures
