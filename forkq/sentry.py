"""Sentry for forkq's daemon: each failure of a job is one Sentry event.

    import sentry_sdk
    from forkq.sentry import ForkqIntegration

    sentry_sdk.init(dsn=..., integrations=[ForkqIntegration()])   # in a module the daemon requires

Contract (``pip install forkq[sentry]``):

- **One event per failure.** A job whose body (or server middleware) raises is reported
  once, with ``mechanism: forkq, handled: false``, every time it fails: each retry's failure
  too. forkq's own line about the failure (``… fail: … -> retry``, logger
  ``forkq.daemon.children.job_run``) is not sent again by sentry-sdk's logging integration
  (``ignore_logger``, as the Celery and RQ integrations do with theirs): that logger's
  lines are neither events nor breadcrumbs.
- **Not reported:** a cancelled job (:class:`~forkq.errors.JobCancelledError`, or a job
  that ended after it saw its cancellation: the operator asked for it), and a job whose
  limiter had no room (:class:`~forkq.errors.OverLimit`: rescheduled, not a failure). A job
  that never reaches the middleware (an unknown class, a malformed payload) and a job whose
  process died (killed at its timeout, a crash) are not reported here; the daemon logs them,
  at ERROR, which sentry-sdk's logging integration sends as it sends any error line.
- **What an event holds:** transaction = the job's class; tags ``forkq.job``,
  ``forkq.queue``, ``forkq.jid`` (every failure of one job, its retries included, carries
  the same ``forkq.jid``: search ``forkq.jid:<jid>``); ``extra["forkq-job"]``: ``class``,
  ``jid``, ``queue``, ``retry_count`` (Sidekiq's field: absent on the first run, 0 on the
  first retry), ``attempt`` (1 on the first run) and ``args`` / ``kwargs``. Grouping is
  sentry-sdk's default (exception type and stack): the failures of one job fall in one
  issue, together with the same failure of other jobs of its class, rather than one issue
  per jid.
- **Arguments are personal data:** sent only when sentry-sdk's conventions allow it, as
  its Celery, RQ and Huey integrations decide: ``data_collection={"queues": ...}`` when the
  application gives ``data_collection``, else ``send_default_pii=True``; otherwise they are
  replaced by ``[Filtered]``. ``before_send`` sees the event and may scrub anything.
- **Scopes:** each job runs in an isolation scope of its own with no breadcrumbs, so what
  one job records never reaches the next job's events.
- **Fork safety:** ``sentry_sdk.init`` runs in the master, before it forks. In a child,
  after the fork, the client gets a new transport built from its options (an HTTP transport
  inherited from the master would share its pooled connections with the master, and its
  sending thread does not exist in the child; a new one starts at the child's first event).
  A processor that stops normally (graceful stop, quiet, ``max_jobs`` / ``max_memory_mb``
  recycling) flushes its pending events before it exits (an ``on_child_exit`` hook, bounded
  by the client's ``shutdown_timeout``); a SIGKILLed child loses those not yet sent.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import sentry_sdk
from sentry_sdk import utils as sentry_utils
from sentry_sdk.integrations import Integration
from sentry_sdk.integrations.logging import ignore_logger
from sentry_sdk.scope import should_send_default_pii
from sentry_sdk.transport import make_transport
from sentry_sdk.utils import capture_internal_exceptions, event_from_exception

from forkq import hooks, signature
from forkq.daemon.children import job_run
from forkq.errors import JobCancelledError, OverLimit
from forkq.middleware import SERVER, JobContext

_HAS_DATA_COLLECTION: Callable[[Any], bool] = getattr(
    sentry_utils, "has_data_collection_enabled", lambda options: False)
"""sentry-sdk's test for an application's ``data_collection`` option (none before it had
that option: then ``send_default_pii`` alone decides)."""

try:
    from sentry_sdk.tracing import TransactionSource
    _TASK_SOURCE: Any = TransactionSource.TASK
except ImportError:  # pragma: no cover - sentry-sdk 2.0 names it in tracing too
    _TASK_SOURCE = "task"


FILTERED: str = getattr(sentry_utils, "SENSITIVE_DATA_SUBSTITUTE", "[Filtered]")
"""What stands for job arguments that may not be sent (sentry-sdk's own word for it)."""

NOT_REPORTED: tuple[type[BaseException], ...] = (JobCancelledError, OverLimit)
"""Exceptions that end a job without being an error of it (cancelled, rescheduled)."""


class ForkqIntegration(Integration):
    """sentry-sdk's integration for forkq's daemon (identifier ``forkq``): give it to
    ``sentry_sdk.init(integrations=[...])`` in a module of ``require``."""

    identifier = "forkq"
    origin = f"auto.queue.{identifier}"

    @staticmethod
    def setup_once() -> None:
        """Once per process: the server middleware, the ignored logger, the fork and exit
        hooks (each inert while no client has this integration)."""
        SERVER.add(_report_failures)
        ignore_logger(job_run.log.name)
        hooks.on_child_exit(_flush)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_new_transport)


def _report_failures(context: JobContext, call_next: Callable[[], Any]) -> Any:
    """Server middleware: run the job in an isolation scope of its own; report its
    failure (then let it go on to be filed as before)."""
    if sentry_sdk.get_client().get_integration(ForkqIntegration) is None:
        return call_next()
    with sentry_sdk.isolation_scope() as scope:
        scope.clear_breadcrumbs()
        sentry_sdk.get_current_scope().clear_breadcrumbs()  # forked from the one outside
        with capture_internal_exceptions():
            scope.set_transaction_name(context.name, source=_TASK_SOURCE)
            scope.set_tag("forkq.job", context.name)
            scope.set_tag("forkq.queue", context.queue)
            scope.set_tag("forkq.jid", context.jid)
            scope.add_event_processor(_event_processor(context))
        try:
            return call_next()
        except BaseException as exc:
            if _reportable(context, exc):
                _capture(exc)
            raise


def _reportable(context: JobContext, exc: BaseException) -> bool:
    """Whether the job's ending with ``exc`` is an error to report (see the module's
    "Not reported")."""
    return not context.cancel_seen and not isinstance(exc, NOT_REPORTED)


def _capture(exc: BaseException) -> None:
    client = sentry_sdk.get_client()
    with capture_internal_exceptions():
        event, hint = event_from_exception(
            exc, client_options=client.options,
            mechanism={"type": ForkqIntegration.identifier, "handled": False})
        sentry_sdk.capture_event(event, hint=hint)


def _event_processor(context: JobContext) -> Callable[[Any, Any], Any]:
    def add_job(event: Any, hint: Any) -> Any:
        with capture_internal_exceptions():
            event.setdefault("extra", {})["forkq-job"] = job_details(context)
        return event
    return add_job


def job_details(context: JobContext) -> dict[str, Any]:
    """The job as an event's ``extra["forkq-job"]`` shows it; its arguments only where the
    client's options allow personal data (``[Filtered]`` otherwise)."""
    payload = context.payload
    retry_count = payload.get("retry_count")
    details: dict[str, Any] = {
        "class": context.name, "jid": context.jid, "queue": context.queue,
        "retry_count": retry_count,
        "attempt": retry_count + 2 if isinstance(retry_count, int) else 1}
    if _arguments_allowed():
        details["args"] = context.args
        details["kwargs"] = payload.get(signature.KWARGS) or {}
    else:
        details["args"] = details["kwargs"] = FILTERED
    return details


def _arguments_allowed() -> bool:
    """sentry-sdk's rule for a queue's job arguments: ``data_collection["queues"]`` when the
    application configured ``data_collection``, else ``send_default_pii``."""
    options = sentry_sdk.get_client().options
    if _HAS_DATA_COLLECTION(options):
        return bool(options["data_collection"].get("queues"))
    return bool(should_send_default_pii())


def _new_transport() -> None:
    """After a fork, in the child: a transport of its own (see the module's "Fork safety");
    a transport given as an instance in the options stays that instance."""
    client = sentry_sdk.get_client()
    if client.get_integration(ForkqIntegration) is None or client.transport is None:
        return
    with capture_internal_exceptions():
        client.transport = make_transport(client.options)


def _flush() -> None:
    """A child's last step: send what is pending (``on_child_exit``)."""
    client = sentry_sdk.get_client()
    if client.get_integration(ForkqIntegration) is not None:
        client.flush()
