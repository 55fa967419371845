"""The app a daemon under test ``require``s for tests/test_opentelemetry.py (and the web app
tests/otel_web.py imports): it sets an SDK tracer provider whose exporter appends each
finished span as one JSON line to the file named by ``FORKQ_TEST_SPANS``, and defines the
jobs those tests push."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from forkq import Job


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What the tests read of a finished span."""
    context = span.get_span_context()
    assert context is not None
    return {"name": span.name, "kind": span.kind.name,
            "trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}",
            "parent_id": f"{span.parent.span_id:016x}" if span.parent else None,
            "status": span.status.status_code.name,
            "attributes": dict(span.attributes or {}),
            "events": [event.name for event in span.events], "pid": os.getpid()}


class JsonLinesExporter(SpanExporter):
    """Appends each span to ``path`` as a line of JSON (one write per line, O_APPEND: the
    processes of a daemon share the file)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(span)) + "\n" for span in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


if os.environ.get("FORKQ_TEST_SPANS"):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(
        os.environ["FORKQ_TEST_SPANS"])))
    trace.set_tracer_provider(provider)


class OtelOk(Job, name="OtelOk"):
    """Succeeds."""

    def perform(self, *args: Any) -> None:
        pass


class OtelFail(Job, name="OtelFail", retry=1):
    """Always fails: one retry, then dead."""

    def perform(self, *args: Any) -> None:
        raise RuntimeError(f"failing on purpose: {args}")
