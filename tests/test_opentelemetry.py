"""OpenTelemetry tracing (forkq.opentelemetry) with the real SDK: the middleware in this
process (an in-memory exporter), and whole traces across a real uvicorn serving a FastAPI app
(tests/otel_web.py), the daemon (``opentelemetry: true``, tests/otel_app.py exporting to a
JSON-lines file) and a Ruby Sidekiq 6.4.1 client."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import forkq.opentelemetry as otel
from forkq import client as clients
from forkq import payload as payloads
from forkq.embedded import EmbeddedServer
from forkq.middleware import CLIENT, SERVER, JobContext
from forkq.subprocesses import wait_for

from .conftest import ROOT, TESTS, until
from .otel_app import span_record
from .test_sidekiq_interop import _need_ruby, _ruby_env

DAEMON = "concurrency: 2\nrequire: otel_app\nopentelemetry: true\nlog_level: warning\n"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """forkq instrumented in this process with an SDK provider of its own (the global one
    is left alone), exporting to memory; uninstrumented after the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        otel.uninstrument()


def test_nothing_is_added_to_the_chains_until_instrument_is_called() -> None:
    before = (len(CLIENT), len(SERVER))
    payload = CLIENT.run({"class": "X", "queue": "default", "jid": "j"}, lambda: "pushed")
    assert payload == "pushed"
    otel.instrument(tracer_provider=TracerProvider())
    otel.instrument()  # a second call changes nothing
    assert (len(CLIENT), len(SERVER)) == (before[0] + 1, before[1] + 1)
    otel.uninstrument()
    otel.uninstrument()
    assert (len(CLIENT), len(SERVER)) == before


def test_a_push_writes_traceparent_and_tracestate_from_a_producer_span(
        spans: InMemorySpanExporter) -> None:
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState, use_span

    outer = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                        trace_state=TraceState([("vendor", "v1")]))
    payload: dict[str, Any] = {"class": "Thing", "queue": "mail", "jid": "1" * 24}
    with use_span(NonRecordingSpan(outer)):
        CLIENT.run(payload, lambda: payload)
    (send,) = spans.get_finished_spans()
    assert send.name == "send mail" and send.kind == SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == 0xDEF
    assert payload["traceparent"] == f"00-{0xABC:032x}-{send.context.span_id:016x}-01"
    assert payload["tracestate"] == "vendor=v1"
    assert dict(send.attributes or {}) == {
        "messaging.system": "sidekiq", "messaging.destination.name": "mail",
        "messaging.operation.type": "send", "messaging.operation.name": "send",
        "messaging.message.id": "1" * 24, "messaging.sidekiq.job_class": "Thing"}


def test_a_failing_run_is_an_error_span_and_the_exception_goes_on(
        spans: InMemorySpanExporter) -> None:
    payload: dict[str, Any] = {"class": "Thing", "queue": "q", "jid": "2" * 24,
                               "retry_count": 3,
                               "traceparent": f"00-{7:032x}-{9:016x}-01"}
    job = JobContext("Thing", "2" * 24, "q", payload, [])

    def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        SERVER.run(job, fail)
    (run,) = spans.get_finished_spans()
    assert run.name == "process q" and run.kind == SpanKind.CONSUMER
    assert run.context.trace_id == 7 and run.parent is not None and run.parent.span_id == 9
    assert run.status.status_code.name == "ERROR" and "KeyError" in str(run.status.description)
    assert [event.name for event in run.events] == ["exception"]
    attributes = dict(run.attributes or {})
    assert attributes["messaging.sidekiq.retry_count"] == 3
    assert attributes["messaging.message.id"] == "2" * 24
    assert attributes["error.type"] == "KeyError"
    assert SERVER.run(JobContext("Thing", "3", "q", {}, []), lambda: "ok") == "ok"
    assert spans.get_finished_spans()[-1].parent is None  # no fields: a trace of its own


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _runs(path: Path, jid: str) -> list[dict[str, Any]]:
    return [s for s in _read(path)
            if s["name"].startswith("process ") and s["attributes"].get(
                "messaging.message.id") == jid]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _uvicorn(server: EmbeddedServer, spans_file: Path, log: Path) -> Iterator[str]:
    """A real uvicorn serving tests/otel_web.py on a free port; stopped by its pid on
    leaving, also after a failure. Yields its base URL once it answers."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}",
           "FORKQ_REDIS_URL": server.url, "FORKQ_TEST_SPANS": str(spans_file)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "otel_web:app", "--host",
                                 "127.0.0.1", "--port", str(port)], env=env, cwd=TESTS,
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            def up() -> bool:
                assert proc.poll() is None, log.read_text()
                with contextlib.suppress(OSError), socket.create_connection(
                        ("127.0.0.1", port), timeout=1):
                    return True
                return False

            assert wait_for(up, 30), log.read_text()
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.mark.process
def test_a_request_its_push_and_the_jobs_run_are_one_trace(
        server: EmbeddedServer, r: redis.Redis, daemon: Callable[..., Any],
        tmp_path: Path) -> None:
    daemon_spans, web_spans = tmp_path / "daemon-spans.jsonl", tmp_path / "web-spans.jsonl"
    d = daemon(DAEMON, FORKQ_TEST_SPANS=str(daemon_spans))
    with _uvicorn(server, web_spans, tmp_path / "uvicorn.log") as base:
        answer = httpx.get(f"{base}/enqueue", params={"n": 5}, timeout=30)
        assert answer.status_code == 200, answer.text
        jid = answer.json()["jid"]
        until(lambda: _runs(daemon_spans, jid), 30, lambda: d.log() + str(_read(daemon_spans)))
        until(lambda: len(_read(web_spans)) >= 2, 30, lambda: str(_read(web_spans)))
    web = {s["span_id"]: s for s in _read(web_spans)}
    (request,) = [s for s in web.values() if s["kind"] == "SERVER"]
    (send,) = [s for s in web.values() if s["name"] == "send default"]
    (run,) = _runs(daemon_spans, jid)
    assert request["name"] == "GET /enqueue" and request["parent_id"] is None
    assert send["kind"] == "PRODUCER"
    ancestors, span = [], send
    while span["parent_id"] is not None:  # the handler's spans, up to the request's
        span = web[span["parent_id"]]
        ancestors.append(span["name"])
    assert span is request, ancestors
    assert run["kind"] == "CONSUMER" and run["name"] == "process default"
    assert run["parent_id"] == send["span_id"] and run["status"] == "UNSET"
    assert request["trace_id"] == send["trace_id"] == run["trace_id"]
    assert run["pid"] != d.pid, "the job ran in a processor child"
    assert run["attributes"]["messaging.sidekiq.job_class"] == "OtelOk"
    assert send["attributes"]["messaging.message.id"] == jid


@pytest.mark.ruby
def test_a_ruby_push_carrying_traceparent_continues_its_trace_in_the_daemon(
        server: EmbeddedServer, r: redis.Redis, daemon: Callable[..., Any],
        tmp_path: Path) -> None:
    _need_ruby()
    spans_file = tmp_path / "daemon-spans.jsonl"
    d = daemon(DAEMON, FORKQ_TEST_SPANS=str(spans_file))
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    script = ('require "sidekiq"\n'
              'puts Sidekiq::Client.push("class" => "OtelOk", "args" => [1], '
              f'"traceparent" => "00-{trace_id}-{parent}-01")\n')
    done = subprocess.run(["ruby", "-e", script], env=_ruby_env(server), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    jid = done.stdout.strip()
    until(lambda: _runs(spans_file, jid), 30, d.log)
    (run,) = _runs(spans_file, jid)
    assert run["trace_id"] == trace_id and run["parent_id"] == parent
    assert run["name"] == "process default" and run["kind"] == "CONSUMER"


@pytest.mark.process
def test_each_attempt_of_a_failing_job_is_an_error_span_with_its_retry_count(
        server: EmbeddedServer, r: redis.Redis, daemon: Callable[..., Any],
        tmp_path: Path, spans: InMemorySpanExporter) -> None:
    spans_file = tmp_path / "daemon-spans.jsonl"
    d = daemon(DAEMON, FORKQ_TEST_SPANS=str(spans_file))
    jid = clients.Client(r).push({"class": "OtelFail", "args": ["x"], "retry": 1})
    assert jid is not None
    (send,) = [span_record(s) for s in spans.get_finished_spans()]
    until(lambda: r.zcard("retry") == 1, 30, d.log)
    (member,) = r.zrange("retry", 0, -1)
    assert payloads.decode(member)["retry_count"] == 0
    r.zadd("retry", {member: 0}, xx=True)  # due now, instead of after Sidekiq's backoff
    until(lambda: r.zcard("dead") == 1, 60, d.log)
    until(lambda: len(_runs(spans_file, jid)) == 2, 30, lambda: str(_read(spans_file)))
    first, second = _runs(spans_file, jid)
    for run in (first, second):
        assert run["status"] == "ERROR" and run["events"] == ["exception"]
        assert run["parent_id"] == send["span_id"] and run["trace_id"] == send["trace_id"]
        assert run["attributes"]["error.type"] == "RuntimeError"
    assert "messaging.sidekiq.retry_count" not in first["attributes"]
    assert second["attributes"]["messaging.sidekiq.retry_count"] == 0
