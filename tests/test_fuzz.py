"""Fuzz tier: generated payloads through the pure decode → plan → encode path (Hypothesis).

Whatever bytes arrive, :func:`forkq.payload.decode` gives a payload or raises
:class:`~forkq.errors.MalformedJobError` and nothing else; whatever forkq then writes
(a retry or dead entry, a stand-in for an unrunnable job, a due job's rewrite, an orphan's
dead entry) parses back. The fast encoder path (Python's C ``json`` where it writes Ruby's
bytes) writes exactly what the exact pure-Python encoder writes, and refuses what it
refuses. No Redis here: these are the pure functions the daemon's loops call for every
item.
"""

from __future__ import annotations

import enum
import json
import math
import random
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forkq import payload as payloads
from forkq import wirejson
from forkq.daemon import held_jobs
from forkq.daemon.children import due_jobs, failures
from forkq.errors import MalformedJobError, UnknownJobError
from forkq.registry import RetryRules

FIELDS = ["class", "args", "queue", "jid", "retry", "retry_count", "retry_for", "backtrace",
          "retry_queue", "at", "created_at", "enqueued_at", "failed_at", "retried_at", "dead",
          "timeout", "error_message", "error_class", "error_backtrace", "tags"]

LONE = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "a\ud83d", "\ude00b"])
TEXT = st.one_of(st.text(max_size=20), LONE, st.just("x" * 100_000))
NUMBERS = st.one_of(
    st.integers(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, -0.0, 1e308, 2**63]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


def _nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


DEEP = st.builds(_nest, SCALARS, st.integers(min_value=95, max_value=1200))


@st.composite
def payload_objects(draw: st.DrawFn) -> dict[str, Any]:
    """Objects over the payload's fields, each of any type (often the right one)."""
    obj: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=10, unique=True)):
        obj[name] = draw(st.one_of(_good(name), VALUES, DEEP))
    if draw(st.booleans()):
        obj.setdefault("class", "Job")
        obj.setdefault("args", draw(st.lists(VALUES, max_size=3)))
    return obj


def _good(name: str) -> st.SearchStrategy[Any]:
    return {"class": st.just("Job"), "args": st.lists(VALUES, max_size=3),
            "queue": st.just("default"), "retry": st.one_of(st.booleans(), st.integers(-2, 30)),
            "retry_count": st.integers(-1, 30), "backtrace": st.one_of(st.booleans(),
                                                                       st.integers(-5, 5)),
            }.get(name, VALUES)


def _json_text(value: Any, ascii_only: bool) -> str | None:
    try:
        return json.dumps(value, allow_nan=True, ensure_ascii=ascii_only)
    except (RecursionError, ValueError):
        return None


@st.composite
def raw_payloads(draw: st.DrawFn) -> bytes:
    """Bytes as any client could write them: JSON of hostile objects (escaped or raw UTF-8,
    lone surrogates as escapes or as UTF-8 bytes), cut or spliced text, or any bytes."""
    kind = draw(st.sampled_from(["object", "object", "value", "cut", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    value = draw(payload_objects()) if kind != "value" else draw(st.one_of(VALUES, DEEP))
    text = _json_text(value, draw(st.booleans())) or "[]"
    data = text.encode("utf-8", "surrogatepass")
    if kind == "cut":
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.binary(max_size=8)) + data[cut:]
    return data


def _writable(text: str) -> None:
    """What forkq writes must parse back (and re-encode to the same text)."""
    assert wirejson.dumps(wirejson.loads(text)) == text


def _failure_paths(payload: dict[str, Any], raw: bytes) -> None:
    rng = random.Random(0)
    exc = ValueError("boom \ud800 message")
    for max_retries in (0, 25):
        _writable(failures.plan(dict(payload), exc, max_retries=max_retries, rng=rng,
                             now=1_700_000_000.0).payload)
    failure = failures.plan(payloads.decode(raw), exc, max_retries=25, rng=rng, now=1.0,
                            rules=RetryRules(retry_in=lambda count, exc: 10.0**400))
    assert failure.score < float("inf")
    _writable(failures.bury(payloads.decode(raw), 1.0).payload)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw_payloads())
def test_decode_gives_a_writable_payload_or_malformed_job_error(raw: bytes) -> None:
    try:
        payload = payloads.decode(raw)
    except MalformedJobError:
        failure = failures.unrunnable(raw, "default", MalformedJobError("x"), 1.0)
        _writable(failure.payload)
        kept = wirejson.loads(failure.payload)
        if "raw" in kept:
            assert kept["raw"].encode("utf-8") == raw
        elif "raw_base64" in kept:
            import base64
            assert base64.b64decode(kept["raw_base64"]) == raw
        return
    _writable(payloads.encode(payload))
    _failure_paths(payload, raw)
    _writable(failures.unrunnable(raw, "q", UnknownJobError("x"), 1.0).payload)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw_payloads())
def test_the_leaders_rewrites_never_raise_and_write_what_parses(raw: bytes) -> None:
    job, queue = due_jobs.rewrite(raw, 1_700_000_000.0)
    assert isinstance(queue, str) and queue
    if job is not raw:
        _writable(str(job))
    held = held_jobs.Held("q", raw)
    mode, _, dead_entry = held_jobs._decide(held, count=True, how="test", now=1_700_000_000.0)
    assert mode in {"count", "bury"}
    if dead_entry:
        _writable(dead_entry)


@settings(max_examples=300, deadline=None)
@given(st.one_of(VALUES, DEEP))
def test_loads_accepts_exactly_what_dumps_writes(value: Any) -> None:
    """Round trip both ways: dumps either refuses (TypeError/ValueError) or writes text that
    loads gives back; loads of Python's own JSON of the value refuses or re-dumps equal."""
    try:
        text = wirejson.dumps(value)
    except (TypeError, ValueError):
        text = None
    if text is not None:
        _writable(text)
    python_text = _json_text(value, ascii_only=True)
    if python_text is None:
        return
    try:
        decoded = wirejson.loads(python_text)
    except ValueError:
        assert text is None, "loads refused what dumps wrote"
        return
    assert text is not None, "loads accepted what dumps refuses"
    assert wirejson.dumps(decoded) == text


# --- the fast encoder path -------------------------------------------------------------

BAND_EDGES = [1e-4, math.nextafter(1e-4, 0.0), math.nextafter(1e-4, 1.0), 1e15,
              math.nextafter(1e15, 0.0), 1e16, math.nextafter(1e16, 0.0), 1e-5, 0.0, -0.0,
              999999999999999.9, 1234567890123456.0, 123456789012345680.0, 1e20, 1.5e-7, 0.1]
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.floats(-2e16, 2e16),
    st.floats(-1e-3, 1e-3), st.floats(1e9, 2e9),
    st.sampled_from(BAND_EDGES).flatmap(lambda x: st.sampled_from([x, -x])))


class _Text(str):
    """A str subclass: the exact encoder takes it, the fast path must not."""


class _Number(enum.IntEnum):
    ONE = 1


ODD = st.one_of(st.builds(_Text, st.text(max_size=5)), st.just(_Number.ONE),
                st.just({1: "int key"}), st.just({"x": {2}}), st.just(b"bytes"))
NATIVE = st.recursive(
    st.one_of(SCALARS, FLOATS, ODD),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=16)


def _outcome(encode: Any, value: Any) -> str | type[Exception]:
    """What ``encode(value)`` gives: its text, or the type of what it raised."""
    try:
        return str(encode(value))
    except (TypeError, ValueError) as exc:
        return type(exc)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(NATIVE, DEEP))
def test_the_fast_path_writes_the_exact_encoders_bytes(value: Any) -> None:
    exact = _outcome(wirejson.dumps_exact, value)
    assert _outcome(wirejson.dumps, value) == exact
    assert _outcome(wirejson.check, value) == ("None" if isinstance(exact, str) else exact)
    if isinstance(exact, str):
        assert wirejson.dumps_bytes(value) == exact.encode("utf-8")
    if wirejson._plain(value, 1):  # the C encoder's own output, not only dumps'
        assert wirejson._FAST.encode(value) == exact


def test_a_clients_payload_takes_the_fast_path() -> None:
    payload = payloads.build("HardWorker", ["bob", 1, 2.5, {"k": [None, True]}, "é\u2028"],
                             queue="default", options={"tags": ["a"]}, now=time.time())
    payload["enqueued_at"] = time.time()
    assert wirejson._plain(payload, 1)
    assert not wirejson._plain({**payload, "args": [1e20]}, 1)
    assert not wirejson._plain({**payload, "args": ["\ud800"]}, 1)


OPTIONS = st.dictionaries(st.one_of(st.sampled_from(
    ["tags", "enqueued_at", "retry_for", "dead", "args", "class", "jid", "created_at"]), TEXT),
    st.one_of(NATIVE, DEEP), max_size=3)


def _each_encoded(name: str, arg_lists: list[Any], jids: list[str], retry: Any,
                  options: dict[str, Any], now: float) -> list[bytes] | tuple[type, str]:
    """Each job's payload as build() makes it and a push sets ``enqueued_at``, encoded on
    its own; or what the first that cannot be written raised."""
    encoded = []
    try:
        for args, jid in zip(arg_lists, jids, strict=True):
            payload = payloads.build(name, args, queue="q", retry=retry, options=options,
                                     now=now, jid=jid)
            payload["enqueued_at"] = now
            encoded.append(payloads.encode_bytes(payload))
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    return encoded


@settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.lists(st.one_of(NATIVE, DEEP), max_size=3),
                          st.tuples(NATIVE)), max_size=4),
       st.one_of(st.booleans(), st.integers(), NATIVE), OPTIONS, TEXT,
       st.one_of(FLOATS, st.floats(min_value=1e9, max_value=4e9)))
def test_a_bulk_push_encodes_each_job_as_its_own_payload_would(
        arg_lists: list[Any], retry: Any, options: dict[str, Any], name: str,
        now: float) -> None:
    jids = payloads.new_jids(len(arg_lists))
    try:
        bulk: list[bytes] | tuple[type, str] = payloads.encode_immediate(
            name, arg_lists, jids, queue="q", retry=retry, options=options, now=now)
    except (TypeError, ValueError) as exc:
        bulk = type(exc), str(exc)
    assert bulk == _each_encoded(name, arg_lists, jids, retry, options, now)
