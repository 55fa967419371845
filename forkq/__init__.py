"""forkq: a prefork background-job daemon on Redis, wire-compatible with Sidekiq.

Public surface: :func:`job`, :class:`Job`, :class:`Client`, :func:`cancel_requested`,
:func:`current_job`, :func:`result`, :func:`progress`, the workflows (:func:`batch`,
:func:`batch_status`, :func:`current_batch`, :func:`chain`, :func:`group`, :func:`chord`,
:func:`chain_status`; signatures from ``job.s(...)``), the middleware chains
``client_middleware`` / ``server_middleware``, the lifecycle hooks
``on_child_boot`` / ``on_child_exit``, the rate and concurrency limiters
(:mod:`forkq.limiter`, raising :class:`OverLimit`), and ``__version__``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from forkq import limiter
from forkq.batches import Batch, BatchStatus, batch
from forkq.batches import current as current_batch
from forkq.batches import status as batch_status
from forkq.canvas import chain, chain_status, chord, group
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
from forkq.progress import progress
from forkq.registry import Job, job
from forkq.signature import Signature

__all__ = [
    "Batch",
    "BatchStatus",
    "Client",
    "EnqueueError",
    "Job",
    "JobCancelledError",
    "JobFailedError",
    "JobKilledError",
    "JobTimeoutError",
    "OverLimit",
    "ResultTimeoutError",
    "Signature",
    "__version__",
    "batch",
    "batch_status",
    "cancel_requested",
    "chain",
    "chain_status",
    "chord",
    "client_middleware",
    "current_batch",
    "current_job",
    "group",
    "job",
    "limiter",
    "on_child_boot",
    "on_child_exit",
    "progress",
    "result",
    "server_middleware",
]
