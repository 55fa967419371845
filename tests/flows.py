"""Jobs of the workflow tests (batches, chains, chords); the daemon requires ``flows``.

Each records in Redis lists under ``test:`` what it did and when (``time.time()``), so a
test can check that a callback ran once, and after the last job it waited for.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import forkq
from forkq import client as clients


def _note(key: str, **fields: Any) -> None:
    clients.default().redis.rpush(key, json.dumps({**fields, "at": time.time(),
                                                   "pid": os.getpid()}))


@forkq.job(name="wf_item")
def item(n: int, seconds: float = 0.0) -> int:
    """Sleeps ``seconds``, records its end, returns ``2 * n``."""
    if seconds:
        time.sleep(seconds)
    _note("test:wf:ran", n=n, jid=forkq.current_job().jid)  # type: ignore[union-attr]
    return 2 * n


@forkq.job(name="wf_flaky", retry=5, retry_in=lambda count, exc: 1)
def flaky(n: int) -> int:
    """Fails its first two runs, then succeeds (recorded)."""
    runs = clients.default().redis.incr(f"test:wf:flaky:{n}")
    if runs <= 2:
        raise RuntimeError(f"flaky {n}: run {runs} fails")
    _note("test:wf:ran", n=n, jid=forkq.current_job().jid)  # type: ignore[union-attr]
    return n


@forkq.job(name="wf_doomed", retry=0)
def doomed(n: int) -> None:
    """Always fails; ``retry=0``: dead at once."""
    raise RuntimeError(f"doomed {n}")


@forkq.job(name="wf_callback")
def callback(status: Any, tag: str) -> None:
    """A batch's callback: records its tag and what it was given."""
    _note("test:wf:callbacks", tag=tag, status=status)


@forkq.job(name="wf_grow")
def grow(count: int) -> None:
    """Adds ``count`` wf_item jobs to its own batch, then records that it did."""
    with forkq.batch(forkq.current_batch()):
        for n in range(count):
            item.perform_async(1000 + n)
    _note("test:wf:ran", n=-1, jid=forkq.current_job().jid)  # type: ignore[union-attr]


@forkq.job(name="wf_step")
def step(value: Any, label: str) -> list[Any]:
    """A chain's step: what it was given plus its label."""
    _note("test:wf:steps", label=label, value=value)
    return [*(value if isinstance(value, list) else [value]), label]


@forkq.job(name="wf_broken_step", retry=1, retry_in=lambda count, exc: 1)
def broken_step(value: Any) -> None:
    """A chain's step that always fails (one retry)."""
    _note("test:wf:steps", label="broken", value=value)
    raise RuntimeError("broken step")


@forkq.job(name="wf_kwargs")
def with_kwargs(n: int, *, fmt: str = "txt") -> str:
    """Records its keyword argument."""
    _note("test:wf:ran", n=n, fmt=fmt)
    return f"{n}.{fmt}"


@forkq.job(name="wf_slow_step")
def slow_step(value: Any, label: str, seconds: float) -> list[Any]:
    """A chain's step that records its start, sleeps ``seconds``, then ends as wf_step."""
    _note("test:wf:started", label=label)
    time.sleep(seconds)
    return step(value, label)
