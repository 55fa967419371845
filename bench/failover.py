"""Host failover: how fast a stopped daemon's jobs run again elsewhere, and what a freeze or a
network cut of one daemon costs.

Run from a clone: ``python bench/failover.py`` (10 host-death trials, a freeze and a 75 s cut
with the default ``host_failover`` of 15 s: ~12 min). It starts a private server and stops
every daemon by its pid. Two daemons (``--concurrency`` processors each) share the server;
every job appends its start and its end (jid, pid, its daemon's master pid, epoch) to a
file, never to Redis, so what ran where and when is known even for a daemon cut off.

- **host death** (``--trials``): steady load (a job of ``--work`` s every ``--every`` s) on
  both; the first daemon's whole process group is SIGSTOPped for good. The jobs its
  in-flight lists held 2.5 s later (those it ran, held, or that Redis handed to its blocked
  waits after the stop) must start on the other: prints, per trial, the seconds from the
  stop until the last of them started there; then the pushes stop and every job pushed must
  end (lost = pushed and never ended).
- **freeze**: the first daemon runs ``--concurrency`` jobs of ``--long`` s, alone; the
  other starts; the first is frozen for 2 x ``host_failover`` and thawed. Its jobs must run
  again on the other, it must log the lapse and start none of them again, and fetch again
  once its processors from before the lapse are gone.
- **partition** (``--cut``): the same with the first daemon behind a TCP proxy that stops
  forwarding for ``--cut`` s (bytes held, as TCP retransmits them) while it runs jobs of
  ``--long`` s: no job may run twice at once inside one daemon (two copies on two
  daemons, after the lapse, are allowed: at least once).

Exits 1 when a job is lost, a freeze or cut breaks its rule, or a trial times out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import redis

from forkq.embedded import EmbeddedServer
from forkq.tools.driver import DaemonProcess

JOBS = '''
import json, os, time
from forkq import Job

def _note(event, jid):
    line = json.dumps({"e": event, "jid": jid, "pid": os.getpid(), "ppid": os.getppid(),
                       "t": time.time()}) + "\\n"
    fd = os.open(os.environ["FAILOVER_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)

class Work(Job, name="Work"):
    def perform(self, seconds: float) -> None:
        _note("start", self.jid)
        time.sleep(seconds)
        _note("end", self.jid)
'''


class FailedError(Exception):
    """A rule broken or a wait timed out."""


def until(condition: Callable[[], Any], seconds: float, what: str) -> None:
    """Poll ``condition`` until it holds; :class:`FailedError` naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise FailedError(f"gave up waiting for {what}")
        time.sleep(0.05)


# -- a network cut ------------------------------------------------------------------------------


class Proxy:
    """A TCP forwarder to ``upstream`` on a free local port; :meth:`cut` stops forwarding in
    both directions (nothing is read, nothing closed: the bytes wait, as TCP retransmits
    them), :meth:`heal` resumes."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = threading.Event()
        self.open.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self) -> None:
        self.open.clear()

    def heal(self) -> None:
        self.open.set()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self.open.wait()
        server = socket.create_connection(self.upstream)
        for source, sink in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                self.open.wait()
                data = source.recv(65536)
                self.open.wait()
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


# -- daemons and jobs ---------------------------------------------------------------------------


class Run:
    """One scenario's server client, work directory, daemons and job events."""

    def __init__(self, url: str, work: str, args: argparse.Namespace) -> None:
        self.url, self.work, self.args = url, work, args
        self.r = redis.Redis.from_url(url)
        self.r.flushdb()
        self.events_path = os.path.join(work, f"events-{secrets.token_hex(4)}.jsonl")
        self.daemons: list[tuple[DaemonProcess, str]] = []

    def start(self, url: str | None = None) -> DaemonProcess:
        """A daemon (own process group) on ``url`` (default: the server), once ready."""
        n = len(self.daemons)
        config = os.path.join(self.work, f"forkq-{n}.yml")
        with open(config, "w") as f:
            f.write(f"concurrency: {self.args.concurrency}\nrequire: failover_jobs\n"
                    f"redis_url: {url or self.url}\nhost_failover: {self.args.failover}\n"
                    "fetch_batch: 1\ntimeout: 5\n")
        log_path = os.path.join(self.work, f"daemon-{secrets.token_hex(4)}.log")
        with open(log_path, "wb") as log_file:
            daemon = DaemonProcess(config, env={**os.environ, "PYTHONPATH": self.work,
                                                "FAILOVER_EVENTS": self.events_path},
                                   stderr=log_file, cwd=self.work, new_session=True)
            daemon.start()
        self.daemons.append((daemon, log_path))
        until(lambda: "ready:" in self.log(daemon), 30, "a daemon to be ready")
        return daemon

    def log(self, daemon: DaemonProcess) -> str:
        path = next(path for d, path in self.daemons if d is daemon)
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")

    def identity(self, daemon: DaemonProcess) -> str:
        for line in self.log(daemon).splitlines():
            if "identity " in line:
                return line.split("identity ", 1)[1].split(",", 1)[0]
        raise FailedError("no identity in the daemon's log")

    def push(self, seconds: float) -> str:
        jid = secrets.token_hex(12)
        now = time.time()
        self.r.lpush("queue:default", json.dumps({
            "class": "Work", "args": [seconds], "queue": "default", "retry": True, "jid": jid,
            "created_at": now, "enqueued_at": now}))
        return jid

    def events(self) -> list[dict[str, Any]]:
        try:
            with open(self.events_path) as f:
                return [json.loads(line) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def held_by(self, daemon: DaemonProcess) -> set[str]:
        """The jids in ``daemon``'s in-flight lists now."""
        jids = set()
        for key in self.r.scan_iter(f"forkq:inflight:{self.identity(daemon)}:*"):
            elements: list[bytes] = self.r.lrange(key, 0, -1)  # type: ignore[assignment]
            for element in elements:
                if element.startswith(b"{"):
                    jids.add(json.loads(element)["jid"])
        return jids

    def close(self) -> None:
        for daemon, _ in self.daemons:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(daemon.pid, signal.SIGCONT)
                daemon.stop(timeout=10)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(daemon.pid, signal.SIGKILL)  # its group: children a stop left


def started(events: list[dict[str, Any]], jid: str, ppid: int, after: float = 0.0
            ) -> list[float]:
    return [e["t"] for e in events
            if e["e"] == "start" and e["jid"] == jid and e["ppid"] == ppid and e["t"] > after]


def ended(events: list[dict[str, Any]]) -> set[str]:
    return {e["jid"] for e in events if e["e"] == "end"}


# -- the scenarios ------------------------------------------------------------------------------


SETTLE = 13.0
"""Seconds a new leader waits after connecting before its first sweep (the scheduler's
``RECONNECT_SETTLE``), with slack: the other daemon is warmed up that long, as in a fleet
that has been running."""


def host_deaths(run: Run) -> list[float]:
    """The host-death trials against one daemon kept running; the seconds from each stop
    until the stopped daemon's jobs all started on the other. :class:`FailedError` when a job is
    lost."""
    b = run.start()
    time.sleep(SETTLE)
    took = []
    for n in range(1, run.args.trials + 1):
        took.append(host_death(run, b))
        print(f"host death trial {n}: the stopped daemon's jobs all running again on the "
              f"other {took[-1]:.2f}s after the stop", flush=True)
    print(f"host death, host_failover {run.args.failover:.0f}s, {len(took)} trials: "
          f"p50 {statistics.median(took):.2f}s, max {max(took):.2f}s; lost 0", flush=True)
    return took


def host_death(run: Run, b: DaemonProcess) -> float:
    """One trial: a new daemon beside ``b``, stopped for good under load (then killed)."""
    args = run.args
    a = run.start()
    pushed: list[str] = []
    pushing = threading.Event()
    pushing.set()

    def pusher() -> None:
        while pushing.is_set():
            pushed.append(run.push(args.work))
            time.sleep(args.every)

    thread = threading.Thread(target=pusher, daemon=True)
    thread.start()
    try:
        until(lambda: sum(1 for e in run.events() if e["ppid"] == a.pid) >= 2, 30,
              "the first daemon to run jobs")
        time.sleep(1)
        os.killpg(a.pid, signal.SIGSTOP)
        stopped = time.time()
        time.sleep(2.5)  # a blocked wait Redis hands a job to times out within 2 s
        held = run.held_by(a)
        if not held:
            raise FailedError("the stopped daemon held no job: no load on it")
        until(lambda: all(started(run.events(), jid, b.pid, stopped) for jid in held),
              args.failover * 4, "the stopped daemon's jobs to start on the other")
        events = run.events()
        took = max(min(started(events, jid, b.pid, stopped)) for jid in held) - stopped
    finally:
        pushing.clear()
        thread.join()
        os.killpg(a.pid, signal.SIGKILL)
    until(lambda: set(pushed) <= ended(run.events()), 60, "every job pushed to end")
    return took


def freeze(run: Run) -> list[str]:
    """The freeze scenario; the rules it broke (none: [])."""
    args = run.args
    a = run.start()
    jids = [run.push(args.long) for _ in range(args.concurrency)]
    until(lambda: all(started(run.events(), jid, a.pid) for jid in jids), 30,
          "the first daemon to start its jobs")
    b = run.start()
    os.killpg(a.pid, signal.SIGSTOP)
    time.sleep(2 * args.failover)
    os.killpg(a.pid, signal.SIGCONT)
    until(lambda: all(started(run.events(), jid, b.pid) for jid in jids), 30,
          "the frozen daemon's jobs to start on the other")
    until(lambda: "fetching again" in run.log(a), args.long + 30,
          "the thawed daemon to fetch again")
    late = [run.push(0.1) for _ in range(4 * args.concurrency)]
    until(lambda: set(jids + late) <= ended(run.events()), args.long + 30,
          "every job to end")
    events = run.events()
    broken = []
    if "liveness key had lapsed" not in run.log(a):
        broken.append("the thawed daemon did not log the lapse")
    again = [jid for jid in jids if len(started(events, jid, a.pid)) > 1]
    if again:
        broken.append(f"the thawed daemon started {len(again)} recovered job(s) again")
    print(f"freeze {2 * args.failover:.0f}s: {len(jids)} jobs ran again on the other "
          f"daemon; the thawed one logged the lapse: "
          f"{'yes' if 'liveness key had lapsed' in run.log(a) else 'no'}; started one again: "
          f"{len(again)}; lost: {len(set(jids + late) - ended(events))}", flush=True)
    return broken


def partition(run: Run) -> list[str]:
    """The network-cut scenario; the rules it broke (none: [])."""
    args = run.args
    proxy = Proxy(("127.0.0.1", run.r.connection_pool.connection_kwargs["port"]))
    a = run.start(f"redis://127.0.0.1:{proxy.port}/0")
    jids = [run.push(args.long) for _ in range(args.concurrency)]
    until(lambda: all(started(run.events(), jid, a.pid) for jid in jids), 30,
          "the first daemon to start its jobs")
    run.start()
    proxy.cut()
    time.sleep(args.cut)
    proxy.heal()
    until(lambda: "fetching again" in run.log(a), args.long + 60,
          "the daemon cut off to fetch again")
    until(lambda: _all_ended(run.events(), jids), args.long + 60, "every copy of the jobs to end")
    overlaps = _overlaps(run.events())
    twice = sum(1 for jid in jids if len([e for e in run.events()
                                          if e["e"] == "start" and e["jid"] == jid]) > 1)
    print(f"partition {args.cut:.0f}s, jobs of {args.long:.0f}s: {twice} of {len(jids)} jobs "
          f"ran again on the other daemon; copies running at once inside one daemon: "
          f"{overlaps}; lost: {len(set(jids) - ended(run.events()))}", flush=True)
    return [f"{overlaps} job(s) ran twice at once inside one daemon"] if overlaps else []


def _all_ended(events: list[dict[str, Any]], jids: list[str]) -> bool:
    """Whether every start of every job in ``jids`` has its end."""
    count: dict[tuple[str, str], int] = defaultdict(int)
    for e in events:
        if e["jid"] in jids:
            count[(e["jid"], e["e"])] += 1
    return all(count[(jid, "start")] == count[(jid, "end")] > 0 for jid in jids)


def _overlaps(events: list[dict[str, Any]]) -> int:
    """How many times a job started in a daemon while another copy ran in that daemon."""
    running: dict[tuple[str, int], int] = defaultdict(int)
    found = 0
    for e in sorted(events, key=lambda e: e["t"]):
        copy = (e["jid"], e["ppid"])
        if e["e"] == "start":
            found += running[copy] > 0
            running[copy] += 1
        else:
            running[copy] -= 1
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="host-death trials")
    parser.add_argument("--failover", type=float, default=15.0, help="host_failover, s")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--work", type=float, default=0.3, help="a steady job's seconds")
    parser.add_argument("--every", type=float, default=0.1, help="seconds between pushes")
    parser.add_argument("--long", type=float, default=100.0, help="a long job's seconds")
    parser.add_argument("--cut", type=float, default=75.0, help="the network cut, s (0: none)")
    parser.add_argument("--no-freeze", action="store_true")
    args = parser.parse_args()
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "failover_jobs.py"), "w") as f:
            f.write(JOBS)
        with socket.create_server(("127.0.0.1", 0)) as probe:
            port = probe.getsockname()[1]  # a free port: the cut needs TCP
        server = EmbeddedServer(os.path.join(work, "srv"), persistent=False, port=port)
        server.start()
        try:
            if args.trials:
                _scenario(server.url, work, args, host_deaths, failed)
            if not args.no_freeze:
                failed += _scenario(server.url, work, args, freeze, failed)
            if args.cut:
                failed += _scenario(server.url, work, args, partition, failed)
        finally:
            server.stop()
    for rule in failed:
        print(f"FAILED: {rule}")
    return 1 if failed else 0


def _scenario(url: str, work: str, args: argparse.Namespace, scenario: Callable[[Run], Any],
              failed: list[str]) -> Any:
    run = Run(url, work, args)
    try:
        return scenario(run)
    except FailedError as exc:
        failed.append(f"{scenario.__name__}: {exc}")
        for daemon, _ in run.daemons:
            print(f"--- log of daemon {daemon.pid} ---\n{run.log(daemon)[-4000:]}")
        return []
    finally:
        run.close()


if __name__ == "__main__":
    sys.exit(main())
