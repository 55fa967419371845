"""The job payload: building, encoding and decoding Sidekiq's job JSON. No I/O.

A payload is a JSON object with at least ``class`` (str), ``args`` (list),
``queue``, ``jid`` (24 lowercase hex), ``retry`` and ``created_at``; immediate
pushes add ``enqueued_at``. Timestamps are float epoch seconds in plain decimal.
Unknown keys are kept verbatim through every rewrite. Sidekiq 8 writes integer
milliseconds; :func:`epoch_seconds` reads both.
"""

from __future__ import annotations

import secrets
from typing import Any

from forkq import wirejson
from forkq.errors import MalformedJobError

Payload = dict[str, Any]

RETRY_DEFAULT: bool | int = True


def new_jid() -> str:
    """A fresh job id: 24 lowercase hex characters, as ``SecureRandom.hex(12)``."""
    return secrets.token_hex(12)


def build(
    name: str,
    args: list[Any] | tuple[Any, ...],
    *,
    queue: str,
    retry: bool | int = RETRY_DEFAULT,
    options: dict[str, Any] | None = None,
    now: float,
) -> Payload:
    """A new payload in Sidekiq's key order: retry, queue, options, args, class, jid, created_at."""
    payload: Payload = {"retry": retry, "queue": queue}
    if options:
        payload.update(options)
    payload["args"] = list(args)
    payload["class"] = name
    payload["jid"] = new_jid()
    payload["created_at"] = now
    return payload


def encode(payload: Payload) -> str:
    """Payload → JSON text identical to Ruby's; raises TypeError for non-JSON-native args."""
    return wirejson.dumps(payload)


def decode(raw: str | bytes) -> Payload:
    """JSON text → payload, checking the shape a processor needs.

    Raises :class:`MalformedJobError` unless the text is a JSON object with a
    string ``class`` and a list ``args``.
    """
    try:
        payload = wirejson.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedJobError(f"payload is not valid JSON: {exc}") from None
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


def epoch_seconds(value: Any) -> float | None:
    """A timestamp field as float seconds: floats are seconds, integers milliseconds (Sidekiq 8)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value / 1000.0 if isinstance(value, int) else float(value)


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def unrunnable(raw: bytes, queue: str, now: float) -> Payload:
    """The payload to bury for a job that cannot run: the original object when the
    raw text is a JSON object, else a stand-in keeping the raw text under ``raw``."""
    try:
        decoded = wirejson.loads(raw)
    except (ValueError, UnicodeDecodeError):
        decoded = None
    if isinstance(decoded, dict):
        return decoded
    return {
        "retry": False,
        "queue": queue,
        "class": "forkq.Unrunnable",
        "args": [],
        "jid": new_jid(),
        "created_at": now,
        "raw": raw.decode("utf-8", "replace"),
    }
