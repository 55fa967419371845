"""forkq: a prefork background-job daemon on Redis, wire-compatible with Sidekiq.

Public surface: :func:`job`, :class:`Job`, :class:`Client`, :func:`cancel_requested`,
:func:`current_job`, :func:`result`, the middleware chains
``client_middleware`` / ``server_middleware``, the lifecycle hooks
``on_child_boot`` / ``on_child_exit``, the rate and concurrency limiters
(:mod:`forkq.limiter`, raising :class:`OverLimit`), and ``__version__``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from forkq import limiter
from forkq.client import Client, cancel_requested, result
from forkq.errors import (
    EnqueueError,
    JobCancelledError,
    JobFailedError,
    JobKilledError,
    JobTimeoutError,
    OverLimit,
    ResultTimeoutError,
)
from forkq.hooks import on_child_boot, on_child_exit
from forkq.middleware import CLIENT as client_middleware  # noqa: N811
from forkq.middleware import SERVER as server_middleware  # noqa: N811
from forkq.middleware import current_job
from forkq.registry import Job, job

__all__ = [
    "Client",
    "EnqueueError",
    "Job",
    "JobCancelledError",
    "JobFailedError",
    "JobKilledError",
    "JobTimeoutError",
    "OverLimit",
    "ResultTimeoutError",
    "__version__",
    "cancel_requested",
    "client_middleware",
    "current_job",
    "job",
    "limiter",
    "on_child_boot",
    "on_child_exit",
    "result",
    "server_middleware",
]
