"""The job payload: building, encoding and decoding Sidekiq's job JSON. No I/O.

A payload is a JSON object with at least ``class`` (str), ``args`` (list),
``queue``, ``jid`` (24 lowercase hex), ``retry`` and ``created_at``; immediate
pushes add ``enqueued_at``. Timestamps are float epoch seconds in plain decimal.
Unknown keys are kept verbatim through every rewrite. Sidekiq 8 writes integer
milliseconds; :func:`epoch_seconds` reads both.

One boundary decides what a job is: :func:`decode` turns any bytes into a payload
that :func:`encode` can write back, or raises :class:`MalformedJobError`, never
anything else. A job that cannot run is buried as :func:`unrunnable` makes it,
keeping its raw bytes.

Optional fields, one rule: **a field of the wrong type counts as absent** and its
default applies; the accessors below are the only readers. ``retry``: ``true``, an
integer (retries allowed; negative = 0) or ``false``/``null`` (drop on failure),
anything else = the default (``max_retries``); ``retry_count``: an integer, else a
first failure; ``retry_for``: a number of seconds; ``queue`` and ``retry_queue``:
a non-empty string; ``backtrace``: ``true`` (every line) or an integer N (the first N),
else none; ``dead``: only ``false`` keeps a job out of the dead set; ``timeout``: a
positive number of seconds; ``jid``: a string; timestamps (``created_at``,
``enqueued_at``, ``failed_at``, ``at``): numbers, see :func:`epoch_seconds`.
"""

from __future__ import annotations

import base64
import hashlib
import math
import secrets
from collections.abc import Sequence
from typing import Any

from forkq import wirejson
from forkq.errors import MalformedJobError

Payload = dict[str, Any]

RETRY_DEFAULT: bool | int = True


def new_jid() -> str:
    """A fresh job id: 24 lowercase hex characters, as ``SecureRandom.hex(12)``."""
    return secrets.token_hex(12)


def new_jids(count: int) -> list[str]:
    """``count`` fresh job ids as :func:`new_jid` makes them, from one read of the system's
    random source (a bulk push of 20,000 jobs spent ~10 % of its time in 20,000 reads)."""
    text = secrets.token_hex(12 * count)
    return [text[start:start + 24] for start in range(0, 24 * count, 24)]


def build(
    name: str,
    args: list[Any] | tuple[Any, ...],
    *,
    queue: str,
    retry: bool | int = RETRY_DEFAULT,
    options: dict[str, Any] | None = None,
    now: float,
    jid: str | None = None,
) -> Payload:
    """A new payload in Sidekiq's key order: retry, queue, options, args, class, jid, created_at.

    ``jid`` defaults to a fresh one (:func:`new_jid`)."""
    payload: Payload = {"retry": retry, "queue": queue}
    if options:
        payload.update(options)
    payload["args"] = list(args)
    payload["class"] = name
    payload["jid"] = new_jid() if jid is None else jid
    payload["created_at"] = now
    return payload


def encode_immediate(
    name: str,
    arg_lists: Sequence[Any],
    jids: list[str],
    *,
    queue: str,
    retry: bool | int = RETRY_DEFAULT,
    options: dict[str, Any] | None = None,
    now: float,
) -> list[bytes]:
    """The bytes :func:`encode_bytes` writes for each payload that :func:`build` makes of
    ``(arg_lists[i], jids[i])``, pushed now (``enqueued_at`` = ``now``): byte for byte the
    same, but the fields the jobs share are encoded once, so that a bulk push of many jobs
    encodes little more than their args. Each of ``arg_lists`` is a list or a tuple;
    ``jids`` are fresh ones (:func:`new_jids`: hex, nothing to escape). Raises
    TypeError/ValueError as :func:`encode` does for the first job that cannot be written,
    with the same message. (Options named like a field :func:`build` sets itself take
    the slow way: each payload encoded on its own.)"""
    encoded: list[bytes] = []
    if not arg_lists:
        return encoded
    if options and not _BUILT.isdisjoint(options):
        return [encode_bytes(_pushed_now(name, args, jid, queue, retry, options, now))
                for args, jid in zip(arg_lists, jids, strict=True)]
    dumps = wirejson.dumps
    try:
        shared: Payload = {"retry": retry, "queue": queue, **(options or {})}
        tail = '","created_at":' + dumps(now)
        if "enqueued_at" in shared:  # an option of that name: the push sets it where it is
            shared["enqueued_at"] = now
        else:
            tail += ',"enqueued_at":' + dumps(now)
        tail += "}"
        head = dumps(shared)[:-1] + ',"args":'  # an object's members, joined by commas
        middle = ',"class":' + dumps(name) + ',"jid":"'
        for args, jid in zip(arg_lists, jids, strict=True):
            # [args]: encoded at the depth args has in a payload (nesting is bounded)
            encoded.append((head + dumps([args])[1:-1] + middle + jid + tail).encode("utf-8"))
    except (TypeError, ValueError):
        for args, jid in list(zip(arg_lists, jids, strict=True))[len(encoded):]:
            encode(_pushed_now(name, args, jid, queue, retry, options, now))  # its own message
        raise
    return encoded


_BUILT = frozenset({"args", "class", "jid", "created_at"})
"""The fields :func:`build` sets after the options (an option of such a name is replaced)."""


def _pushed_now(name: str, args: Any, jid: str, queue: str, retry: Any,
                options: dict[str, Any] | None, now: float) -> Payload:
    """The payload :func:`build` makes, as an immediate push sends it."""
    payload = build(name, args, queue=queue, retry=retry, options=options, now=now, jid=jid)
    payload["enqueued_at"] = now
    return payload


def encode(payload: Payload) -> str:
    """Payload → JSON text identical to Ruby's; raises TypeError for non-JSON-native args."""
    return wirejson.dumps(payload)


def encode_bytes(payload: Payload) -> bytes:
    """:func:`encode` as the UTF-8 bytes that go to Redis (the client's one encode)."""
    return wirejson.dumps_bytes(payload)


def check(payload: Payload) -> None:
    """Raise what :func:`encode` would raise (TypeError for non-JSON-native args), usually
    without encoding."""
    wirejson.check(payload)


def decode(raw: str | bytes) -> Payload:
    """Any bytes → a payload that :func:`encode` can write back, or :class:`MalformedJobError`.

    The text must be strict UTF-8 JSON that Ruby's generator could have written (see
    :mod:`forkq.wirejson`: no NaN/Infinity, lone surrogates or nesting beyond 100),
    holding an object with a string ``class`` and a list ``args``.
    """
    try:
        payload = wirejson.loads(raw)
    except ValueError as exc:
        raise MalformedJobError(f"payload is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(payload, dict):
        raise MalformedJobError(
            f"payload must be a JSON object, got a JSON {_json_type(payload)}"
        )
    if not isinstance(payload.get("class"), str):
        raise MalformedJobError("payload has no string 'class'")
    if "args" not in payload:
        raise MalformedJobError("payload has no 'args'")
    if not isinstance(payload["args"], list):
        raise MalformedJobError(
            f"payload 'args' must be a JSON array, got a JSON {_json_type(payload['args'])}"
        )
    return payload


def text_field(payload: Payload, name: str) -> str | None:
    """A field that must be a non-empty string (``queue``, ``retry_queue``); None otherwise."""
    value = payload.get(name)
    return value if isinstance(value, str) and value else None


def int_field(payload: Payload, name: str) -> int | None:
    """A field that must be an integer (``retry_count``; Sidekiq's API ``retry`` makes it -1
    from 0); None otherwise (a bool is no integer)."""
    value = payload.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number_field(payload: Payload, name: str) -> float | None:
    """A field that must be a finite number (``retry_for``, ``timeout``); None otherwise."""
    value = payload.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer beyond float range
        return None


def check_expires_in(value: Any) -> None:
    """TypeError/ValueError naming ``expires_in`` unless it is a positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expires_in must be a number of seconds, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"expires_in must be a positive number of seconds, got {value!r}")


def stamp_expiry(payload: Payload, at: float | None, now: float) -> None:
    """Give a job with ``expires_in`` its ``expires_at``: the epoch after which it is not
    started (Sidekiq Pro's expiring jobs), counted from when it is due (``at``, else now)."""
    if "expires_in" in payload:
        start = at if at is not None and at > now else now
        payload["expires_at"] = start + float(payload["expires_in"])


def expired(payload: Payload, now: float) -> float | None:
    """Seconds since the job's ``expires_at`` passed, or None when it has not (or the job
    has none: absent, or not a finite number)."""
    value = number_field(payload, "expires_at")
    if value is None or not math.isfinite(value) or now <= value:
        return None
    return now - value


MAX_RESULT_TTL = 10 * 365 * 24 * 3600
"""Seconds a result is kept at most (a longer ``result_ttl`` is kept this long)."""


def result_ttl(payload: Payload) -> int:
    """The job's ``result_ttl`` in whole seconds (1 .. :data:`MAX_RESULT_TTL`), or 0 when it
    wants none (absent, not a positive number: a field of the wrong type counts as absent)."""
    value = number_field(payload, "result_ttl")
    if value is None or not value > 0:
        return 0
    return max(1, round(min(value, MAX_RESULT_TTL)))


def jid(payload: Payload) -> str:
    """The job id, or "" when the payload has no string ``jid``."""
    value = payload.get("jid")
    return value if isinstance(value, str) else ""


def backtrace_limit(payload: Payload) -> int | None:
    """How many backtrace lines to keep: ``backtrace: true`` = all (-1), an integer N = N
    (at least 0); None (no backtrace) for anything else."""
    value = payload.get("backtrace")
    if value is True:
        return -1
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value, 0)
    return None


def kill_key_id(payload: Payload, raw: bytes) -> str:
    """What a job's deaths are counted under: its jid, else a digest of its bytes."""
    return jid(payload) or "sha1:" + hashlib.sha1(raw).hexdigest()


def epoch_seconds(value: Any) -> float | None:
    """A timestamp field as float seconds: floats are seconds, integers milliseconds (Sidekiq 8)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return value / 1000.0 if isinstance(value, int) else float(value)
    except OverflowError:  # an integer beyond float range
        return None


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def unrunnable(raw: bytes, queue: str, now: float) -> Payload:
    """The payload to bury for a job that cannot run.

    The original object when the bytes are a JSON object forkq can write back (a wrong
    shape, an unknown class), else a stand-in of class ``forkq.Unrunnable`` keeping the
    bytes exactly: as text under ``raw`` when they are UTF-8, else base64 under
    ``raw_base64``. Either way :func:`encode` can write the result."""
    try:
        decoded = wirejson.loads(raw)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        return decoded
    stand_in: Payload = {"retry": False, "queue": queue, "class": "forkq.Unrunnable",
                         "args": [], "jid": new_jid(), "created_at": now}
    try:
        stand_in["raw"] = raw.decode("utf-8")  # strict: what decodes, encodes
    except UnicodeDecodeError:
        stand_in["raw_base64"] = base64.b64encode(raw).decode("ascii")
    return stand_in
