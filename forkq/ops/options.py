"""The operator commands' argument types: argparse calls each with the text given and turns
its ValueError into a usage error (exit 2). Apart from :mod:`forkq.ops.commands`, so that
building the command line's parser (which every ``forkq`` invocation does, the daemon's too)
imports nothing of the commands themselves."""

from __future__ import annotations

import math
from datetime import datetime

DEFAULT_LIMIT = 50
"""How many jobs a listing shows without ``--limit``."""


def retry_option(text: str) -> bool | int:
    """``--retry``: true, false or a number of retries."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    count = int(text)
    if count < 0:
        raise ValueError(text)
    return count


def seconds_option(text: str) -> float:
    """``--in``: a finite number of seconds."""
    value = float(text)
    if not math.isfinite(value) or abs(value) > 1e10:
        raise ValueError(text)
    return value


def when_option(text: str) -> float:
    """``--at``: epoch seconds, or an ISO 8601 time (local time unless it has an offset)."""
    try:
        value = float(text)
    except ValueError:
        return datetime.fromisoformat(text).timestamp()
    if not math.isfinite(value) or not 0 <= value < 1e11:
        raise ValueError(text)
    return value


def limit_option(text: str) -> int:
    """``--limit``: how many to list; 0 for all."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value
