"""What an idle daemon costs its Redis, beside an idle Sidekiq process.

Run from a clone: ``python bench/idle.py`` (one ``forkq -c 8`` daemon with its scheduler,
then one ``sidekiq -c 8`` process, then the bare server, 60 s windows, alternated 3 times:
~12 min). Each system
runs alone on one private server, with nothing to do; after it is up and has settled, the
server's counters are read at both ends of the window (:mod:`redis_meter`). Prints, per
window: commands clients sent per second, every command run per second (scripts' inner
calls included), the server's CPU, the system's own CPU, and forkq's busiest commands.
A third system, the bare server (no client at all), gives the floor both stand on. Needs
Debian's ``ruby-sidekiq`` for the Sidekiq side (``--only forkq`` runs without it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import redis
import redis_meter
import sidekiq_side

from forkq.connection import connect
from forkq.embedded import server_url
from forkq.tools import bench_procs
from forkq.tools.bench_systems import ForkqSystem, System

READY_TIMEOUT = 60.0


class BareServer:
    """No processes at all: the server's own idle cost, measured the same way (the floor
    both systems stand on)."""

    label = "bare server"

    def start(self) -> None:
        """Nothing to start."""

    def ready(self) -> bool:
        return True

    def roots(self) -> list[int]:
        return []

    def stop(self) -> None:
        """Nothing to stop."""


def measure(system: System | BareServer, r: redis.Redis, *, settle: float,
            seconds: float) -> tuple[redis_meter.Usage, float]:
    """Start ``system``, let it settle, meter one window, stop it (also on failure): the
    server's usage and the system's own CPU (percent of a core)."""
    try:
        system.start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not system.ready():
            if time.monotonic() > deadline:
                raise SystemExit(f"{system.label} was not up within {READY_TIMEOUT:.0f} s")
            time.sleep(0.1)
        time.sleep(settle)
        own = bench_procs.tree_cpu_seconds(system.roots())
        first = redis_meter.read(r)
        time.sleep(seconds)
        second = redis_meter.read(r)
        own = bench_procs.tree_cpu_seconds(system.roots()) - own
    finally:
        system.stop()
        r.flushall()
    usage = redis_meter.between(first, second)
    return usage, 100.0 * own / usage.seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0, help="window length")
    parser.add_argument("--settle", type=float, default=15.0,
                        help="seconds after start-up before the window opens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("forkq", "sidekiq", "bare"))
    options = parser.parse_args(argv)
    sides = [side for side in ("forkq", "sidekiq", "bare") if options.only in (None, side)]
    if "sidekiq" in sides:
        sidekiq_side.check_installed()
    rows: dict[str, list[tuple[redis_meter.Usage, float]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="forkq-idle-") as tmp, \
            server_url(tmp, None) as url:
        r = connect(url)
        version = r.info("server")["redis_version"]
        for number in range(1, options.rounds + 1):
            for side in sides:
                system: System | BareServer = (
                    ForkqSystem(tmp, url, options.concurrency, scheduler=True)
                    if side == "forkq" else BareServer() if side == "bare" else
                    sidekiq_side.SidekiqSystem(tmp, url, r, processes=1,
                                               threads=options.concurrency))
                usage, own = measure(system, r, settle=options.settle,
                                     seconds=options.seconds)
                rows[side].append((usage, own))
                print(f"round {number} {system.label}: sent {usage.sent_per_second:.2f}/s, "
                      f"run {usage.run_per_second:.2f}/s, Redis CPU {usage.cpu_percent:.3f} % "
                      f"(running commands {usage.command_percent:.4f} %), "
                      f"own CPU {own:.2f} %\n    "
                      f"{redis_meter.breakdown(usage)}", flush=True)
        r.close()
    print(f"\nidle, one process with {options.concurrency} workers, {options.seconds:.0f} s "
          f"windows, medians of {options.rounds}, each alone on a private Redis {version}:")
    print("| system | commands sent/s | commands run/s | Redis CPU | own CPU |")
    print("|---|---:|---:|---:|---:|")
    for side, measured in rows.items():
        medians = [statistics.median(figures) for figures in zip(
            *[(u.sent_per_second, u.run_per_second, u.cpu_percent, own) for u, own in measured],
            strict=True)]
        print(f"| {side} | {medians[0]:.2f} | {medians[1]:.2f} | {medians[2]:.3f} % | "
              f"{medians[3]:.2f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
