"""An app with a server middleware that records how long each job took inside it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import forkq
from forkq import client as clients
from forkq.middleware import JobContext


def _timed(context: JobContext, call_next: Callable[[], Any]) -> Any:
    started = time.monotonic()
    try:
        return call_next()
    finally:
        clients.default().redis.rpush("test:timed", json.dumps(
            {"jid": context.jid, "class": context.name, "took": time.monotonic() - started}))


forkq.server_middleware.add(_timed)
