"""An application with Sentry, for tests/test_sentry.py; the daemon imports it (``require:
sentry_app``), so ``sentry_sdk.init`` runs in the master before it forks, as in production.

The real sentry-sdk with a transport that records: each event (not a transaction, a
session or a log) becomes a JSON line appended to the file named by ``FORKQ_SENTRY_EVENTS``,
with the pid and thread that wrote it and the pid that made the transport. Like
sentry-sdk's HTTP transport it sends from its own background thread (sentry-sdk's
``BackgroundWorker``), after ``FORKQ_SENTRY_DELAY`` seconds: an event still pending when a
child exits without flushing is lost, as it would be over HTTP. ``FORKQ_SENTRY_PII=1`` sets
``send_default_pii``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport
from sentry_sdk.worker import BackgroundWorker

from forkq import Job
from forkq import client as clients
from forkq.errors import JobCancelledError
from forkq.sentry import ForkqIntegration


class RecordingTransport(Transport):
    """Appends each envelope's event to a file, from a background thread."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.path = os.environ["FORKQ_SENTRY_EVENTS"]
        self.delay = float(os.environ.get("FORKQ_SENTRY_DELAY", "0"))
        self.worker = BackgroundWorker()
        self.made_in = os.getpid()

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is None:
            return
        line = json.dumps({"event": event, "pid": os.getpid(), "made_in": self.made_in},
                          default=repr)
        self.worker.submit(lambda: self._write(line))

    def _write(self, line: str) -> None:
        time.sleep(self.delay)
        row = json.loads(line)
        row["thread"] = threading.current_thread().name
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")

    def flush(self, timeout: float, callback: Any = None) -> None:
        self.worker.flush(timeout, callback)

    def kill(self) -> None:
        self.worker.kill()


sentry_sdk.init(
    dsn="https://public@sentry.invalid/1",
    transport=RecordingTransport,
    integrations=[ForkqIntegration()],
    send_default_pii=os.environ.get("FORKQ_SENTRY_PII") == "1",
    shutdown_timeout=10,
)


def _count(key: str) -> int:
    return int(clients.default().redis.incr(key))


class SentryFlaky(Job, name="SentryFlaky", retry=3):
    """Fails its first ``fails`` runs (counted under ``test:sentry:<marker>``), then
    records its completion in ``test:sentry:done``; leaves a breadcrumb each run."""

    def perform(self, marker: str, fails: int, secret: str) -> None:
        sentry_sdk.add_breadcrumb(message=f"flaky-{marker}")
        if _count(f"test:sentry:{marker}") <= fails:
            raise ValueError(f"flaky {marker}")
        clients.default().redis.rpush("test:sentry:done", self.jid)


class SentryDead(Job, name="SentryDead", retry=0):
    """Fails once, for good (dead at once: its line is logged at ERROR)."""

    def perform(self, marker: str, secret: str) -> None:
        raise KeyError(f"dead {marker}")


class SentryCrumb(Job, name="SentryCrumb"):
    """Succeeds, leaving a breadcrumb and an error line of its own logger behind."""

    def perform(self, marker: str) -> None:
        sentry_sdk.add_breadcrumb(message=f"crumb-{marker}")
        logging.getLogger("sentry_app").warning("crumb %s", marker)
        clients.default().redis.rpush("test:sentry:done", self.jid)


class SentryCancelled(Job, name="SentryCancelled"):
    """Ends as a cancelled job does."""

    def perform(self, marker: str) -> None:
        raise JobCancelledError(f"cancelled {marker}")
