"""Coroutine jobs: an ``async def`` job runs to completion on its processor's event loop.

A job's body is called as any other (:meth:`~forkq.registry.JobSpec.call`, inside the server
middleware); when it returns an awaitable, the processor gives it to its runner, which runs
it to its end and returns its result or raises its exception
(:mod:`~forkq.daemon.children.job_run`), so middleware, the retry policy and the log see
a coroutine job exactly as a plain one.

Two runners, one per way a processor runs jobs:

- :class:`EventLoop` (``async_concurrency: 1``): one loop per child, created at its first
  coroutine job and reused for every later one, run from the child's main thread.
- :class:`LoopThread` (``async_concurrency`` > 1): the loop runs in a thread of its own;
  each lane (:mod:`forkq.daemon.children.processor`) submits its coroutine from its thread and
  waits for the outcome, so up to N coroutine jobs progress at once in one process.

Timeout: with a limit (the job's ``timeout`` option, else ``job_timeout``) the coroutine is
cancelled when it runs longer and the job fails with
:class:`~forkq.errors.JobTimeoutError` (retry policy, then dead), while the process goes on.
A coroutine that blocks the loop (``time.sleep`` instead of ``await asyncio.sleep``) or
ignores its cancellation is stopped the plain way: the master kills the child
:data:`KILL_GRACE` seconds after the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from forkq.errors import JobTimeoutError

KILL_GRACE = 5.0
"""Seconds past a coroutine job's timeout before the master kills its child (the loop did
not cancel it: blocked, or the job swallowed the cancellation)."""

Runner = Callable[[Awaitable[Any], float], Any]
"""Runs an awaitable to completion with a timeout in seconds (0 = none); its result."""


class EventLoop:
    """The event loop of a processor running one job at a time, in its main thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, awaitable: Awaitable[Any], timeout: float) -> Any:
        """Run ``awaitable`` on this child's loop (created at the first call) to its end."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
        return self._loop.run_until_complete(bounded(awaitable, timeout))

    def close(self) -> None:
        """Close the loop, if one was made."""
        if self._loop is not None:
            self._loop.close()
            self._loop = None


class LoopThread:
    """An event loop running in a thread of its own, shared by a processor's lanes."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="forkq-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def run(self, awaitable: Awaitable[Any], timeout: float) -> Any:
        """From a lane's thread: run ``awaitable`` on the loop and wait for its outcome."""
        return asyncio.run_coroutine_threadsafe(bounded(awaitable, timeout), self._loop).result()

    def close(self) -> None:
        """Stop the loop (coroutines still pending are dropped) and close it."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()


async def bounded(awaitable: Awaitable[Any], timeout: float) -> Any:
    """Await ``awaitable``; past ``timeout`` seconds (> 0) cancel it and raise
    :class:`JobTimeoutError`. A ``TimeoutError`` the job raises itself stays its own."""
    task = asyncio.ensure_future(_coroutine(awaitable))
    if timeout <= 0:
        return await task
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise JobTimeoutError(f"the job ran longer than its timeout of {timeout:g}s; "
                              "it was cancelled")
    return task.result()


async def _coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
