"""Jobs with an application's names, for the dashboard's screenshots
(``python -m tests.browser.screenshots``): short ones that mostly succeed, a payment that is
always declined (its retries wait an hour, so they stay on the Retries page), and a long
report that keeps the Busy page busy. The daemon imports this module with
``require: tests.browser.demo_jobs``."""

from __future__ import annotations

import random
import time
from typing import Any

from forkq import Job


class CardDeclinedError(Exception):
    """What a payment provider answers for a card it refuses."""


class SendWelcomeEmail(Job, name="SendWelcomeEmail", queue="mailers"):
    def perform(self, user_id: int, locale: str = "en") -> None:
        time.sleep(random.uniform(0.01, 0.08))


class ResizeImage(Job, name="ResizeImage", queue="media"):
    def perform(self, path: str, sizes: list[int]) -> None:
        time.sleep(random.uniform(0.05, 0.3))


class SyncInvoices(Job, name="SyncInvoices", retry=5, retry_in=lambda count, exc: 3600):
    def perform(self, account: str, *options: Any) -> None:
        time.sleep(random.uniform(0.1, 0.6))
        if random.random() < 0.1:
            raise TimeoutError(f"billing API did not answer for account {account}")


class ChargeCard(Job, name="ChargeCard", queue="critical", retry=3, backtrace=8,
                 retry_in=lambda count, exc: 3600 * (count + 1)):
    def perform(self, order_id: int, amount_cents: int) -> None:
        time.sleep(random.uniform(0.02, 0.1))
        raise CardDeclinedError(f"card declined for order {order_id}: insufficient funds")


class ImportCsv(Job, name="ImportCsv", retry=0, backtrace=8):
    def perform(self, upload: str) -> None:
        raise ValueError(f"{upload}: line 1204: expected 7 columns, got 6")


class GenerateReport(Job, name="GenerateReport", queue="reports"):
    def perform(self, name: str, month: str, seconds: float = 600) -> None:
        time.sleep(seconds)
