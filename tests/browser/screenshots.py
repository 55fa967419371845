"""The dashboard's screenshots in docs/screenshots/, taken by headless Chromium.

    .venv/bin/python -m tests.browser.screenshots [--out docs/screenshots]

On a throwaway server (never your Redis) it seeds an application's worth of data: a month of
daily history, scheduled jobs, a backlog in a paused queue and in a queue no daemon serves;
then runs a live daemon with the jobs of :mod:`tests.browser.demo_jobs` and periodic entries,
feeds it short jobs (job metrics), payments that keep failing (retries), imports that fail
at once (dead) and two long reports (busy), serves ``forkq web`` on a free port, opens each
page at 1280x900 and saves ``<page>.png``. Every process it starts is stopped by its pid at
the end, also on failure. Requires Debian's chromium and chromium-driver.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from forkq.client import Client
from forkq.embedded import EmbeddedServer
from forkq.subprocesses import wait_for

from ..conftest import server_binary
from .harness import (
    ROOT,
    LiveDaemon,
    WebServer,
    attribute_of,
    chromium,
    running_daemon,
    serving,
    wait_until,
)

DAEMON_CONFIG = """\
concurrency: 4
require: tests.browser.demo_jobs
tag: billing
labels: [eu-west-1]
queues: [[critical, 3], [default, 2], mailers, media, reports]
periodic:
  - name: nightly-invoices
    cron: "0 2 * * *"
    class: SyncInvoices
    args: [all]
    timezone: Europe/Berlin
  - name: weekly-digest
    cron: "0 7 * * 1"
    class: SendWelcomeEmail
    args: [0, digest]
    queue: mailers
    timezone: America/New_York
  - name: thumbnails-sweep
    cron: "*/15 * * * *"
    class: ResizeImage
    args: [/srv/uploads/pending, [64, 256]]
"""

# page file name → path in the app (a queue's and a job's page are filled in when known)
PAGES = ("dashboard", "busy", "queues", "queue", "scheduled", "retries", "dead", "job",
         "periodic", "metrics")
PATHS = {"dashboard": "/", "busy": "/busy", "queues": "/queues", "scheduled": "/scheduled",
         "retries": "/retries", "dead": "/dead", "periodic": "/periodic",
         "metrics": "/metrics/jobs?class=SendWelcomeEmail&queue=mailers"}
SIZE = (1280, 900)
ACCOUNTS = ("acme-corp", "globex", "initech", "umbrella", "hooli", "stark-industries")


def seed(client: redis.Redis, rng: random.Random) -> None:
    """What a running application leaves in Redis before the daemon starts."""
    today = dt.datetime.now(dt.timezone.utc).date()
    for day in range(30):
        date = (today - dt.timedelta(days=day)).isoformat()
        processed = rng.randint(38_000, 52_000) - day * 300
        client.set(f"stat:processed:{date}", processed)
        client.set(f"stat:failed:{date}", int(processed * rng.uniform(0.004, 0.02)))
    client.set("stat:processed", 1_284_512)
    client.set("stat:failed", 9_731)
    jobs = Client(client)
    now = time.time()
    for n in range(18):
        jobs.push({"class": "SendWelcomeEmail", "args": [40_100 + n, rng.choice(["en", "de"])],
                   "queue": "mailers", "at": now + 300 + n * 420})
    for n in range(6):
        jobs.push({"class": "SyncInvoices", "args": [ACCOUNTS[n], {"since": "2026-11-01"}],
                   "at": now + 3600 * (n + 1)})
    jobs.push_bulk({"class": "ResizeImage", "queue": "bulk",
                    "args": [[f"/srv/uploads/{rng.getrandbits(32):08x}.jpg", [64, 256, 1024]]
                             for _ in range(240)]})
    jobs.push_bulk({"class": "ResizeImage", "queue": "media",
                    "args": [[f"/srv/uploads/{rng.getrandbits(32):08x}.png", [64, 256]]
                             for _ in range(57)]})
    client.sadd("forkq:paused", "media")


def feed(client: redis.Redis, rng: random.Random, rounds: int) -> None:
    """Work for the live daemon: two long reports, failing payments and imports, then
    ``rounds`` half-second rounds of short jobs of several classes."""
    jobs = Client(client)  # pushes by name: each job's options are given here
    for report in ("revenue", "churn"):
        jobs.push({"class": "GenerateReport", "args": [report, "2026-10"], "queue": "reports"})
    for n in range(5):
        jobs.push({"class": "ChargeCard", "args": [918_200 + n, rng.randint(900, 25_000)],
                   "queue": "critical", "retry": 3, "backtrace": 8})
    for name in ("customers-2026-11.csv", "leads-q4.csv", "prices-eu.csv"):
        jobs.push({"class": "ImportCsv", "args": [f"/srv/imports/{name}"], "retry": 0,
                   "backtrace": 8})
    more(jobs, rng, rounds)


def more(jobs: Client, rng: random.Random, rounds: int,
         until: threading.Event | None = None) -> None:
    """``rounds`` half-second rounds of short jobs (stopping early when ``until`` is set)."""
    for _ in range(rounds):
        if until is not None and until.is_set():
            return
        jobs.push_bulk({"class": "SendWelcomeEmail", "queue": "mailers",
                        "args": [[rng.randint(1, 99_999), "en"] for _ in range(20)]})
        jobs.push_bulk({"class": "SyncInvoices", "retry": 5, "backtrace": 8,
                        "args": [[rng.choice(ACCOUNTS)] for _ in range(4)]})
        jobs.push({"class": "ResizeImage", "queue": "default",
                   "args": [f"/srv/avatars/{rng.getrandbits(24):06x}.png", [64]]})
        time.sleep(0.5)  # spread over time for the throughput chart and the metrics


def settle(client: redis.Redis, daemon: LiveDaemon) -> None:
    """Wait until the failures have landed and the long reports run."""
    ok = wait_for(lambda: client.zcard("retry") >= 5 and client.zcard("dead") >= 3
                  and any(int(client.hget(key, "busy") or 0) >= 2  # type: ignore[arg-type]
                          for key in client.smembers("processes")), 60, interval=0.2)
    if not ok:
        raise SystemExit("the daemon never produced the retries, dead jobs and busy reports: "
                         f"{client.zcard('retry')} retries, {client.zcard('dead')} dead; "
                         f"its log:\n{daemon.log()[-3000:]}")


def shoot(driver: WebDriver, web: WebServer, out: Path) -> list[Path]:
    """Open every page and save it (the dashboard once its live chart has a few points);
    the files written."""
    paths = dict(PATHS, queue="/queues/bulk")
    driver.get(web.url + "/dead")
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "main[id^=page-]"), 15)
    links = driver.find_elements(By.CSS_SELECTOR, "#dead-table a.job-link")
    if links:
        paths["job"] = links[0].get_attribute("href").removeprefix(web.url)  # type: ignore[union-attr]
    written = []
    for page in PAGES:
        if page not in paths:
            print(f"{page}: no link found, skipped", file=sys.stderr)
            continue
        driver.get(web.url + paths[page])
        wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "main[id^=page-]"), 15,
                   f"{page}: no <main id=page-…>")
        if page == "dashboard":
            wait_until(driver, lambda d: int(attribute_of(d, "#throughput-chart", "data-points")
                                             or 0) >= 8, 30, "the chart drew no line")
        target = out / f"{page}.png"
        driver.save_screenshot(str(target))
        written.append(target)
        print(f"{target} {target.stat().st_size // 1024} KB")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    scratch = Path(tempfile.mkdtemp(prefix="fq-shots-"))
    server = EmbeddedServer(str(scratch / "redis"), persistent=False, binary=server_binary())
    server.start()
    try:
        client = redis.Redis(unix_socket_path=server.socket, protocol=2)
        seed(client, rng)
        with running_daemon(server.url, scratch / "daemon", DAEMON_CONFIG) as daemon:
            feed(client, rng, rounds=40)
            settle(client, daemon)
            done = threading.Event()
            feeder = threading.Thread(target=more, args=(Client(client), rng, 600, done))
            feeder.start()
            try:
                with serving(server.url, scratch / "web.log",
                             args=("-C", daemon.config_file, "--refresh", "1")) as web:
                    driver = chromium(*SIZE)
                    try:
                        # the viewport itself, not the window, is SIZE
                        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
                            "width": SIZE[0], "height": SIZE[1], "deviceScaleFactor": 1,
                            "mobile": False})
                        shoot(driver, web, args.out)
                    finally:
                        driver.quit()
            finally:
                done.set()
                feeder.join()
        print(json.dumps({"processed": int(client.get("stat:processed") or 0)}))
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
