"""OpenTelemetry tracing of pushes and job runs (the ``forkq[otel]`` extra: the API only; the
SDK, its exporters and the tracer provider are the application's).

:func:`instrument` adds one client middleware and one server middleware to the chains every
process uses (:data:`forkq.middleware.CLIENT`, :data:`forkq.middleware.SERVER`);
:func:`uninstrument` removes them. Until then nothing of this module runs: a push or a job
costs what it did. The daemon calls :func:`instrument` itself with the setting
``opentelemetry: true``, after importing the ``require`` modules (where the application sets
its tracer provider) and before forking.

- **Push** (client middleware): a ``PRODUCER`` span ``send <queue>`` around the client
  middleware that follow it and the payload's completion; the W3C trace context of that
  span goes into the payload as top-level fields ``traceparent`` (and ``tracestate`` when
  not empty), as Ruby's opentelemetry-instrumentation-sidekiq writes and reads them, so a
  trace crosses Ruby ⇄ Python both ways. The Redis round trip comes after the chain, outside
  the span (a refused push is its caller's EnqueueError, not the span's).
- **Run** (server middleware): a ``CONSUMER`` span ``process <queue>``, the child of the
  context in the payload's fields (a new trace when there is none), around the job and the
  server middleware added after :func:`instrument`. A job that raises has the exception
  recorded and the status ``ERROR``; the exception goes on unchanged. Each attempt of a
  retried job is a span of its own, a child of the same ``send``.

Attributes (OpenTelemetry's messaging semantic conventions): ``messaging.system`` =
``"sidekiq"`` (the wire both forkq and Ruby's Sidekiq speak, and the value Ruby's
instrumentation writes: one queue's spans read the same whichever side ran them),
``messaging.destination.name`` = the queue, ``messaging.operation.type`` / ``.name`` =
``send`` or ``process``, ``messaging.message.id`` = the jid, ``messaging.sidekiq.job_class``
= the job's wire name, and on a retried job's run ``messaging.sidekiq.retry_count`` = the
payload's ``retry_count`` (Sidekiq's count: 0 on the first retry); ``error.type`` = the
exception's class on a failed run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from forkq import __version__, hooks
from forkq.middleware import CLIENT, SERVER, JobContext

SYSTEM = "sidekiq"
_PROPAGATOR = TraceContextTextMapPropagator()  # exactly traceparent / tracestate
_tracer: trace.Tracer | None = None
_flush_registered = False


def instrument(tracer_provider: trace.TracerProvider | None = None) -> None:
    """Trace every push of this process and every job it runs (module doc), with spans of
    ``tracer_provider`` (default: the global one, as set when the spans start). Calling it
    again changes nothing; :func:`uninstrument` undoes it."""
    global _tracer, _flush_registered
    if _tracer is not None:
        return
    _tracer = trace.get_tracer("forkq", __version__, tracer_provider)
    CLIENT.add(_send)
    SERVER.add(_process)
    if not _flush_registered:  # hooks cannot be removed: the hook checks _tracer instead
        hooks.on_child_exit(_flush)
        _flush_registered = True


def uninstrument() -> None:
    """Remove the middleware :func:`instrument` added (nothing when it was not called)."""
    global _tracer
    if _tracer is None:
        return
    CLIENT.remove(_send)
    SERVER.remove(_process)
    _tracer = None


def _send(payload: dict[str, Any], call_next: Callable[[], Any]) -> Any:
    queue = str(payload.get("queue", ""))
    tracer = _tracer or trace.get_tracer("forkq", __version__)
    with tracer.start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes={
            "messaging.system": SYSTEM, "messaging.destination.name": queue,
            "messaging.operation.type": "send", "messaging.operation.name": "send",
            "messaging.message.id": str(payload.get("jid", "")),
            "messaging.sidekiq.job_class": str(payload.get("class", ""))}):
        _PROPAGATOR.inject(payload)  # nothing when no SDK records the span
        return call_next()


def _process(job: JobContext, call_next: Callable[[], Any]) -> Any:
    parent = _PROPAGATOR.extract(job.payload)
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM, "messaging.destination.name": job.queue,
        "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.message.id": job.jid, "messaging.sidekiq.job_class": job.name}
    retry_count = job.payload.get("retry_count")
    if isinstance(retry_count, int) and not isinstance(retry_count, bool):
        attributes["messaging.sidekiq.retry_count"] = retry_count
    tracer = _tracer or trace.get_tracer("forkq", __version__)
    with tracer.start_as_current_span(
            f"process {job.queue}", context=parent, kind=SpanKind.CONSUMER,
            attributes=attributes, record_exception=False,
            set_status_on_exception=False) as span:
        try:
            return call_next()
        except BaseException as exc:  # recorded, then raised on unchanged
            span.record_exception(exc)
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise


def _flush() -> None:
    """In a processor child that stops normally: export the spans its provider still holds
    (children end with ``os._exit``, which skips the provider's own ``atexit`` flush)."""
    if _tracer is None:
        return
    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if callable(flush):
        flush()
