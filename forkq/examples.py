"""Example jobs, used by ``forkq demo`` and the shipped ``etc/forkq.yml``.

``HardWorker`` carries an explicit wire name, so a Ruby app can enqueue it with
``Sidekiq::Client.push("class" => "HardWorker", "args" => ["bob", 1])``.
"""

from __future__ import annotations

import logging
import time

from forkq import Client, Job, job

log = logging.getLogger(__name__)


@job(queue="critical", retry=5)
def send_welcome(user_id: int) -> None:
    """Pretend to send a welcome e-mail."""
    log.info("sending the welcome e-mail to user %s", user_id)


@job(name="HardWorker")
def hard_worker(name: str, count: int) -> None:
    """Sidekiq's README job, under the name Ruby uses."""
    log.info("hard work for %s, %d time(s)", name, count)
    time.sleep(0.01 * count)


class MonthlyReport(Job, queue="low"):
    """A class-based job."""

    def perform(self, month: str) -> None:
        log.info("report for %s built (jid %s)", month, self.jid)


def enqueue_all(client: Client) -> list[str]:
    """Push one batch of every example job; the jids."""
    jids = [
        client.push({"class": send_welcome, "args": [42], "queue": "critical"}),
        client.push({"class": "HardWorker", "args": ["bob", 3]}),
        client.push({"class": MonthlyReport.job_name, "args": ["2026-11"], "queue": "low"}),
    ]
    jids += client.push_bulk({"class": send_welcome, "args": [[n] for n in range(1, 8)],
                              "queue": "critical"})
    return [jid for jid in jids if jid]
