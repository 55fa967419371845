"""JSON text byte-identical to Ruby's ``JSON.generate`` (json gem 2.6).

Sidekiq's API finds sorted-set members by re-generating their JSON
(``SortedEntry#reschedule`` does ``ZINCRBY`` with ``JSON.generate(item)``), so a
member whose bytes differ from Ruby's output gets duplicated instead of moved
(sidekiq-wire.md §1a). Sidekiq Pro's Lua also rewrites ``enqueued_at`` with a
``%d+.%d+`` pattern, so timestamps must never be written in exponent form.

Rules: compact separators, raw UTF-8, short escapes for ``" \\ \\b \\f \\n \\r \\t``,
other C0 controls as lowercase ``\\u00xx``, key order kept, NaN/Infinity refused,
floats as Ruby's ``Float#to_s`` (the shortest round-trip digits, as Python's
``repr``, laid out in fixed notation when ``-4 < decpt <= 15`` or ``decpt == 16``
with 17 digits, else ``D.DDDe+XX``; always one fractional digit).

Only JSON-native values are accepted (dict with str keys, list, tuple, str, int,
float, bool, None): anything else raises :class:`TypeError` naming its path, as
Sidekiq 7's ``on_complex_arguments: :raise`` does. Decoding is plain
:func:`json.loads`: Sidekiq always parses, so any valid JSON is readable.
"""

from __future__ import annotations

import json
import math
from typing import Any

_encode_str = json.encoder.encode_basestring  # the C version when available: no ASCII escaping


def dumps(value: Any) -> str:
    """Return ``value`` as Ruby's ``JSON.generate`` would write it."""
    parts: list[str] = []
    _encode(value, parts, "$")
    return "".join(parts)


def loads(text: str | bytes) -> Any:
    """Parse JSON text (any valid JSON; UTF-8 when given bytes)."""
    return json.loads(text)


def ruby_float(value: float) -> str:
    """Format a finite float like Ruby's ``Float#to_s``."""
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not allowed in JSON")
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    digits, decpt = _shortest_digits(abs(value))
    if 0 < decpt <= 15 or (decpt == 16 and len(digits) == 17):
        if decpt >= len(digits):
            return f"{sign}{digits}{'0' * (decpt - len(digits))}.0"
        return f"{sign}{digits[:decpt]}.{digits[decpt:]}"
    if -4 < decpt <= 0:
        return f"{sign}0.{'0' * -decpt}{digits}"
    exponent = decpt - 1
    return f"{sign}{digits[0]}.{digits[1:] or '0'}e{exponent:+03d}"


def _shortest_digits(value: float) -> tuple[str, int]:
    """Shortest round-trip digits of a positive float and its decimal point position.

    The value equals ``0.DIGITS * 10**decpt``.
    """
    mantissa, _, exp_text = repr(value).partition("e")
    whole, _, frac = mantissa.partition(".")
    raw = (whole + frac).lstrip("0")
    leading_zeros = len(whole + frac) - len(raw)
    decpt = len(whole) - leading_zeros + (int(exp_text) if exp_text else 0)
    return raw.rstrip("0") or "0", decpt


def _encode(value: Any, out: list[str], path: str) -> None:
    if isinstance(value, str):
        if not value.isascii():
            _check_utf8(value, path)
        out.append(_encode_str(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(ruby_float(value))
    elif isinstance(value, dict):
        _encode_object(value, out, path)
    elif isinstance(value, (list, tuple)):
        _encode_array(value, out, path)
    else:
        raise TypeError(
            f"{path}: {type(value).__name__} is not JSON-native; "
            "pass str, int, float, bool, None, list or dict"
        )


def _check_utf8(value: str, path: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TypeError(f"{path}: string is not valid UTF-8 ({exc.reason})") from None


def _encode_object(value: dict[Any, Any], out: list[str], path: str) -> None:
    out.append("{")
    first = True
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"{path}: object keys must be str, got {type(key).__name__}")
        if not first:
            out.append(",")
        first = False
        out.append(_encode_str(key))
        out.append(":")
        _encode(item, out, f"{path}.{key}")
    out.append("}")


def _encode_array(value: list[Any] | tuple[Any, ...], out: list[str], path: str) -> None:
    out.append("[")
    for index, item in enumerate(value):
        if index:
            out.append(",")
        _encode(item, out, f"{path}[{index}]")
    out.append("]")
