"""A tiny around-chain, used for client middleware and server middleware.

A middleware is a callable ``(context, call_next) -> result``. It may act
before and after ``call_next()``, change the context, or not call
``call_next`` at all, which stops the chain: the chain then returns ``None``
(for the client this means "do not push", as a Sidekiq client middleware that
does not ``yield``).

Client middleware receives the payload dict about to be pushed (with its
``queue``); server middleware receives a :class:`JobContext`. The two chains every process
uses live here (:data:`CLIENT`, :data:`SERVER`, exported as ``forkq.client_middleware`` and
``forkq.server_middleware``), so a web process that adds client middleware loads nothing of
the daemon.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from forkq import payload as payloads

C = TypeVar("C")
R = TypeVar("R")

Middleware = Callable[[C, Callable[[], R | None]], R | None]


class Chain(Generic[C, R]):
    """An ordered list of middleware; the first added is the outermost."""

    def __init__(self, entries: Iterable[Middleware[C, R]] = ()) -> None:
        self._entries: list[Middleware[C, R]] = list(entries)

    def add(self, middleware: Middleware[C, R]) -> None:
        """Append ``middleware`` as the innermost entry."""
        self._entries.append(middleware)

    def remove(self, middleware: Middleware[C, R]) -> None:
        """Remove ``middleware``; ValueError if it is not in the chain."""
        self._entries.remove(middleware)

    def __len__(self) -> int:
        return len(self._entries)

    def run(self, context: C, final: Callable[[], R]) -> R | None:
        """Run ``final`` wrapped by every middleware; None if one stopped the chain."""
        if not self._entries:
            return final()
        return self._step(0, context, final)

    def _step(self, index: int, context: C, final: Callable[[], R]) -> R | None:
        if index == len(self._entries):
            return final()
        return self._entries[index](context, lambda: self._step(index + 1, context, final))


@dataclass
class JobContext:
    """What server middleware sees of the job being run."""

    name: str
    jid: str
    queue: str
    payload: payloads.Payload
    args: list[Any]
    cancel_seen: bool = False
    """Set when :func:`forkq.cancel_requested` told this job that its cancellation was
    asked: whatever the job does next (returns, raises), it is filed as cancelled."""
    progress_at: float = 0.0
    """When :func:`forkq.progress` last wrote this job's progress (epoch seconds)."""


_CURRENT: ContextVar[JobContext | None] = ContextVar("forkq_current_job", default=None)


def current_job() -> JobContext | None:
    """The job running in this thread or task of a processor (a coroutine job's tasks see
    it too); None outside a job."""
    return _CURRENT.get()


def set_current(context: JobContext) -> Token[JobContext | None]:
    """Make ``context`` the :func:`current_job`; give the token to :func:`reset_current`
    when the job is over (a processor's hot path: no context manager per job)."""
    return _CURRENT.set(context)


def reset_current(token: Token[JobContext | None]) -> None:
    """End what :func:`set_current` began: the job before (usually none) is current again."""
    _CURRENT.reset(token)


@contextmanager
def running(context: JobContext) -> Iterator[None]:
    """Make ``context`` the :func:`current_job` for the duration of the block."""
    token = set_current(context)
    try:
        yield
    finally:
        reset_current(token)


ClientChain = Chain[payloads.Payload, payloads.Payload]
ServerChain = Chain[JobContext, Any]

CLIENT: ClientChain = Chain()
"""The client middleware chain every :class:`~forkq.client.Client` uses unless given its own."""

SERVER: ServerChain = Chain()
"""The server middleware chain the daemon runs every job through; add to it at import time."""
