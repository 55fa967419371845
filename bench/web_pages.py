"""How long each dashboard page takes to render server-side, at scale.

Run from a clone: ``python bench/web_pages.py`` (about a minute).

Fills a private throwaway server (never a given one: it writes ~100 MB) with what a large
installation holds: :data:`DEAD` dead jobs, :data:`QUEUES` queues of a few jobs each (some
paused), retries, scheduled jobs, process records with busy workers, counters and history,
job metrics (Sidekiq 8's minute hashes and forkq's own series and queue samples) for
every minute of the last hour, and :data:`BATCHES` batches (``forkq.batch``; their jobs wait
in :data:`BATCH_QUEUE`, one of the queues), the newest with :data:`BIG_BATCH` jobs, a child
batch and a chain. Then calls the WSGI app in-process (no HTTP server, no
socket: the figure is the app's own time, Redis round trips and rendering included) for each
page, :data:`RENDERS` times after one warm-up, and prints per page the median and the
maximum, the Redis commands one render sends (from ``INFO commandstats``), the page's size,
and PASS when the maximum is under :data:`LIMIT_MS` (issue #15, item 6). A page the app does
not serve (404) is listed as missing and fails.

Exit status 0 when every page passes.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.typing import EncodableT

import forkq
from forkq import batches, cron, keys
from forkq.client import Client
from forkq.connection import connect
from forkq.embedded import EmbeddedServer
from forkq.metrics import layout
from forkq.ops import set_pages
from forkq.ops.sorted_sets import DeadSet, RetrySet, ScheduledSet
from forkq.web import make_app
from forkq.web.security import Auth

DEAD = 100_000
QUEUES = 1_000
JOBS_PER_QUEUE = 5
RETRIES = 10_000
SCHEDULED = 10_000
PROCESSES = 20
CLASSES = 200
RENDERS = 7
LIMIT_MS = 100.0
LOOKUP_LIMIT_MS = 2000.0
"""The bound of the job page by jid: a search of every queue and set (``forkq job``'s),
O(jobs), as Sidekiq Web's search is; opened on demand, never refreshed by itself."""
BATCH = 2_000
BATCHES = 1_000
BIG_BATCH = 20_000
BATCH_QUEUE = "q0000"

WSGI = Callable[..., Any]


@dataclass(frozen=True)
class Timing:
    """One page: its label and path, the status and size of its answer, the render times in
    milliseconds and the Redis commands one render sent."""

    label: str
    path: str
    status: int
    size: int
    times_ms: list[float]
    commands: int

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def worst(self) -> float:
        return max(self.times_ms)

    @property
    def limit_ms(self) -> float:
        return LOOKUP_LIMIT_MS if self.path.startswith("/job/") else LIMIT_MS

    @property
    def passed(self) -> bool:
        return self.status == 200 and self.worst < self.limit_ms


def run(*, renders: int = RENDERS) -> int:
    """Fill a throwaway server, time every page, print the table; 0 when every page passes."""
    with tempfile.TemporaryDirectory(prefix="forkq-bench-web-") as tmp:
        server = EmbeddedServer(os.path.join(tmp, "srv"), persistent=False)
        server.start()
        try:
            r = connect(server.url)
            started = time.monotonic()
            entry_keys = fill(r, time.time())
            entry_keys["batch"] = fill_batches(r)
            print(f"filled in {time.monotonic() - started:.1f} s: {r.dbsize():,} keys, "
                  f"{r.info('memory')['used_memory_human']}", file=sys.stderr, flush=True)
            app = make_app(server.url, auth=Auth(), allow_anonymous=True,
                           periodic=periodic_entries())
            timings = [time_page(app, r, label, path, renders) for label, path in pages(entry_keys)]
            print(table(timings, r))
            r.close()
        finally:
            server.stop()
    return 0 if all(t.passed for t in timings) else 1


def pages(entry_keys: dict[str, str]) -> list[tuple[str, str]]:
    """Every page of the dashboard, with the worst cases of the big sets; ``entry_keys`` names
    one entry of each set (``scheduled``, ``retries``, ``dead``) for the job pages, and the
    biggest batch (``batch``)."""
    return [
        ("Dashboard", "/"), ("Busy", "/busy"), ("Queues", "/queues"),
        ("Queues, last page", "/queues?page=999"),
        ("a queue", "/queues/q0500"), ("Scheduled", "/scheduled"), ("Retries", "/retries"),
        ("Dead", "/dead"), ("Dead, page 4000", "/dead?page=4000"),
        ("Dead, search by class", "/dead?q=Job137"),
        ("Dead, search: no match", "/dead?q=no-such-text"),
        ("Dead, search in args", "/dead?q=user-4242&field=args"),
        ("a dead job", f"/dead/{entry_keys['dead']}"),
        ("a retry", f"/retries/{entry_keys['retries']}"),
        ("a scheduled job", f"/scheduled/{entry_keys['scheduled']}"), ("Periodic", "/periodic"),
        ("Batches", "/batches"), ("a batch", f"/batch/{entry_keys.get('batch', '0' * 24)}"),
        ("Flow control", "/flow"), ("a job by jid (lookup)", f"/job/{DEAD // 2:024x}"),
        ("Metrics", "/metrics/jobs"), ("/metrics (Prometheus)", "/metrics"),
    ]


# --- filling ---------------------------------------------------------------------------------


def backtrace(n: int) -> str:
    lines = [f"/srv/app/jobs/worker_{n % 7}.py:{10 + i}:in `perform'" for i in range(12)]
    return base64.b64encode(zlib.compress(json.dumps(lines).encode())).decode()


def job(n: int, now: float, **fields: Any) -> dict[str, Any]:
    return {"retry": True, "queue": f"q{n % QUEUES:04d}", "class": f"App::Job{n % CLASSES}",
            "args": [n, {"user": f"user-{n}", "note": "some ordinary text"}],
            "jid": f"{n:024x}", "created_at": now - 3600, "enqueued_at": now - 3600, **fields}


def failed(n: int, now: float, died: float) -> dict[str, Any]:
    return job(n, now, error_class="RuntimeError", error_message=f"failure number {n}",
               failed_at=died, retry_count=25, error_backtrace=backtrace(n))


def fill(r: redis.Redis, now: float) -> dict[str, str]:
    """Write the data set; returns the key of one entry of each set, from its middle."""
    pipe = r.pipeline(transaction=False)
    for n in range(DEAD):
        died = now - 86400 * 30 * n / DEAD
        pipe.zadd(keys.DEAD, {json.dumps(failed(n, now, died)): died})
        if n % BATCH == BATCH - 1:
            pipe.execute()
    for n in range(RETRIES):
        pipe.zadd(keys.RETRY, {json.dumps(failed(DEAD + n, now, now - 60)): now + n})
        if n % BATCH == BATCH - 1:
            pipe.execute()
    for n in range(SCHEDULED):
        pipe.zadd(keys.SCHEDULE, {json.dumps(job(2 * DEAD + n, now)): now + 60 + n})
        if n % BATCH == BATCH - 1:
            pipe.execute()
    for q in range(QUEUES):
        name = f"q{q:04d}"
        pipe.sadd(keys.QUEUES, name)
        pipe.lpush(keys.queue(name), *(json.dumps(job(3 * DEAD + q * 10 + i, now))
                                       for i in range(JOBS_PER_QUEUE)))
        if q % 10 == 0:
            pipe.sadd(keys.PAUSED, name)
    pipe.execute()
    fill_processes(r, now)
    fill_stats(r, now)
    fill_metrics(r, now)
    return {name: set_pages.entry_key(set_pages.page(
        jobset(r), jobset(r).size() // 2, size=1).entries[0])
        for name, jobset in (("dead", DeadSet), ("retries", RetrySet), ("scheduled", ScheduledSet))}


def fill_processes(r: redis.Redis, now: float) -> None:
    """Sidekiq 6.4.1-shaped process records, each with 10 busy workers."""
    pipe = r.pipeline(transaction=False)
    for p in range(PROCESSES):
        identity = f"host{p}:{1000 + p}:{p:012x}"
        info = {"hostname": f"host{p}", "started_at": now - 3600, "pid": 1000 + p,
                "tag": "bench", "concurrency": 10, "queues": ["q0001", "q0002"],
                "labels": [], "identity": identity}
        pipe.sadd(keys.PROCESSES, identity)
        pipe.hset(identity, mapping={"info": json.dumps(info), "busy": 10, "beat": now,
                                     "quiet": "false", "rss": 150_000})
        pipe.expire(identity, 3600)
        pipe.hset(f"{identity}:workers", mapping={
            f"t{w}": json.dumps({"queue": "q0001", "run_at": int(now) - w,
                                 "payload": json.dumps(job(4 * DEAD + p * 10 + w, now))})
            for w in range(10)})
    pipe.execute()


def fill_stats(r: redis.Redis, now: float) -> None:
    pipe = r.pipeline(transaction=False)
    pipe.set("stat:processed", 123_456_789)
    pipe.set("stat:failed", 1_234_567)
    for day in range(90):
        date = time.strftime("%Y-%m-%d", time.gmtime(now - day * 86400))
        pipe.set(f"stat:processed:{date}", 1_000_000 + day)
        pipe.set(f"stat:failed:{date}", 10_000 + day)
    pipe.execute()


def fill_metrics(r: redis.Redis, now: float) -> None:
    """Sidekiq 8's minute hashes for :data:`CLASSES` classes, forkq's series for every (queue,
    class) pair the queues hold, and a queue sample per queue, for each of the last 60
    minutes (what a busy hour leaves)."""
    pipe = r.pipeline(transaction=False)
    for minute in range(60):
        at = now - 60 * minute
        pipe.hset(layout.jobs8(at), mapping={
            f"App::Job{c}|{metric}": value for c in range(CLASSES)
            for metric, value in (("p", 100 + c), ("f", c % 3), ("ms", 2000 + c))})
        pipe.hset(layout.queue_samples(layout.minute_of(at)), mapping={
            f"q{q:04d}": json.dumps([JOBS_PER_QUEUE, 1.5]) for q in range(QUEUES)})
        pipe.execute()
    series: dict[EncodableT, EncodableT] = {}
    for q in range(QUEUES):
        klass = f"App::Job{q % CLASSES}"
        for metric in ("p", "f", "us", "b3", "b7"):
            series[layout.series_field(f"q{q:04d}", klass, metric)] = 10 + q
    r.hset(layout.JOBS, mapping=series)


@forkq.job(name="App::BatchDone")
def batch_done(status: Any) -> None:
    """A batch's callback (never run here: its template is what the batch page reads)."""


@forkq.job(name="App::Import", queue=BATCH_QUEUE)
def import_row(n: int) -> None:
    """A batch's member (never run here)."""


def fill_batches(r: redis.Redis) -> str:
    """:data:`BATCHES` batches of a few jobs each, with the real API, then the newest: one
    of :data:`BIG_BATCH` jobs with callbacks, a child batch and a chain; its bid."""
    client = Client(r)
    for n in range(BATCHES - 1):
        with batches.batch(client=client, description=f"import {n}"):
            client.push(import_row.s(n).item())
    with batches.batch(client=client, description="the big import",
                       on_success=batch_done.s(), on_complete=batch_done.s(),
                       on_death=batch_done.s()) as big:
        client.push_bulk({"class": "App::Import", "queue": BATCH_QUEUE,
                          "args": [[n] for n in range(BIG_BATCH)]})
        with batches.batch(client=client, description="its child"):
            client.push(import_row.s(-1).item())
        forkq.chain(import_row.s(-2), import_row.s()).perform_async(client=client)
    return big.bid


def periodic_entries() -> tuple[cron.Periodic, ...]:
    return tuple(cron.Periodic(name=f"report-{i}", cron=f"{i % 60} * * * *",
                               job=f"App::Report{i}") for i in range(20))


# --- timing ----------------------------------------------------------------------------------


def call(app: WSGI, path: str) -> tuple[int, int]:
    """GET ``path`` from the app in-process; (status, body size)."""
    path, _, query = path.partition("?")
    environ = {"REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": path,
               "QUERY_STRING": query, "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "9191",
               "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
               "wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr,
               "HTTP_ACCEPT": "text/html"}
    status: list[int] = []

    def start_response(line: str, headers: list[tuple[str, str]]) -> None:
        status.append(int(line.split()[0]))

    body = b"".join(app(environ, start_response))
    return status[0], len(body)


def commands_sent(r: redis.Redis) -> int:
    """Commands the server has run (``INFO commandstats``, this INFO included)."""
    stats = r.info("commandstats")
    return sum(int(entry["calls"]) for entry in stats.values() if isinstance(entry, dict))


def time_page(app: WSGI, r: redis.Redis, label: str, path: str, renders: int) -> Timing:
    call(app, path)  # warm-up: templates compiled, scripts loaded, connection made
    before = commands_sent(r)
    status, size = call(app, path)
    commands = commands_sent(r) - before - 1
    times = []
    for _ in range(renders):
        started = time.perf_counter()
        call(app, path)
        times.append((time.perf_counter() - started) * 1000)
    return Timing(label, path, status, size, times, commands)


def table(timings: list[Timing], r: redis.Redis) -> str:
    sizes = (f"dead {r.zcard(keys.DEAD):,}, retry {r.zcard(keys.RETRY):,}, "
             f"schedule {r.zcard(keys.SCHEDULE):,}, queues {r.scard(keys.QUEUES):,} "
             f"({JOBS_PER_QUEUE} jobs each), batches {r.zcard(keys.BATCHES):,} (their "
             f"{r.llen(keys.queue(BATCH_QUEUE)) - JOBS_PER_QUEUE:,} jobs in {BATCH_QUEUE}), "
             f"processes {r.scard(keys.PROCESSES)}")
    lines = [f"forkq web: server-side render time per page ({sizes}); "
             f"{len(timings[0].times_ms)} renders each, in-process WSGI call",
             "",
             f"{'page':<24} {'path':<34} {'status':>6} {'KiB':>6} {'cmds':>5} "
             f"{'median ms':>9} {'max ms':>7}  bound",
             "-" * 107]
    for t in timings:
        verdict = "PASS" if t.passed else ("MISSING" if t.status == 404 else "FAIL")
        path = t.path if len(t.path) <= 34 else t.path[:33] + "…"
        lines.append(f"{t.label:<24} {path:<34} {t.status:>6} {t.size / 1024:>6.1f} "
                     f"{t.commands:>5} {t.median:>9.1f} {t.worst:>7.1f}  "
                     f"< {t.limit_ms:.0f} ms {verdict}")
    passed = sum(t.passed for t in timings)
    lines += ["", f"{passed} of {len(timings)} pages under their bound (max of the renders): "
              f"{LIMIT_MS:.0f} ms, the search by jid {LOOKUP_LIMIT_MS:.0f} ms"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python bench/web_pages.py``; 0 when every page passes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=RENDERS,
                        help="renders of each page after its warm-up")
    args = parser.parse_args(argv)
    random.seed(1)
    return run(renders=args.renders)


if __name__ == "__main__":
    sys.exit(main())
