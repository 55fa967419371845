"""JSON text byte-identical to Ruby's ``JSON.generate`` (json gem 2.6).

Sidekiq's API finds sorted-set members by re-generating their JSON
(``SortedEntry#reschedule`` does ``ZINCRBY`` with ``JSON.generate(item)``), so a
member whose bytes differ from Ruby's output gets duplicated instead of moved
(docs/sidekiq-wire.md §1a). Sidekiq Pro's Lua also rewrites ``enqueued_at`` with a
``%d+.%d+`` pattern, so timestamps must never be written in exponent form.

Rules: compact separators, raw UTF-8, short escapes for ``" \\ \\b \\f \\n \\r \\t``,
other C0 controls as lowercase ``\\u00xx``, key order kept, NaN/Infinity refused,
floats as Ruby's ``Float#to_s`` (the shortest round-trip digits, as Python's
``repr``, laid out in fixed notation when ``-4 < decpt <= 15`` or ``decpt == 16``
with 17 digits, else ``D.DDDe+XX``; always one fractional digit).

Only JSON-native values are accepted (dict with str keys, list, tuple, str, int,
float, bool, None): anything else raises :class:`TypeError` naming its path, as
Sidekiq 7's ``on_complex_arguments: :raise`` does.

One contract both ways: :func:`loads` accepts exactly the text whose value :func:`dumps`
can write back, so whatever forkq decodes it can re-encode (into a retry or dead entry,
a queue). It raises :class:`ValueError` (and nothing else) for text that is not strict
UTF-8, not JSON, or JSON that Ruby's generator refuses: ``NaN``/``Infinity`` (or a
number so large it overflows to infinity), a lone UTF-16 surrogate (``"\\ud800"``),
or nesting deeper than :data:`MAX_NESTING` (Ruby's ``JSON`` default: 100 levels, so
Sidekiq itself cannot parse such a job either). :func:`dumps` raises ValueError for
the same nesting and non-finite floats.

Two encoders, one output. The exact encoder (:func:`dumps_exact`, pure Python) implements
the rules above for every value. :func:`dumps` first asks :func:`_plain` whether the value
is one where the C-accelerated :mod:`json` encoder writes the very same bytes: only the
exact types ``dict`` (``str`` keys), ``list``, ``tuple``, ``str``, ``int``, ``bool``,
``None``, and floats that Python's ``repr`` and Ruby's ``Float#to_s`` both lay out in
fixed notation (0.0, or ``1e-4 <= |x| < 1e15``), strings without lone surrogates, nested
at most :data:`MAX_NESTING` deep. Strings go through the same ``encode_basestring`` either
way. Anything else (a float outside that band, a subclass, an ``IntEnum``, a non-str key,
a lone surrogate) takes the exact encoder, which writes it or raises. tests/test_fuzz.py
checks that the two agree on generated values; tests/test_sidekiq_interop.py compares
:func:`dumps` with Ruby.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

try:
    from _json import make_encoder as _make_encoder
except ImportError:  # a Python without the C accelerator
    _make_encoder = None  # type: ignore[assignment,misc]

_encode_str = json.encoder.encode_basestring  # the C version when available: no ASCII escaping

MAX_NESTING = 100
"""Arrays and objects nested deeper than this are refused both ways (Ruby's default)."""

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any) -> str:
    """Return ``value`` as Ruby's ``JSON.generate`` would write it (TypeError/ValueError
    for what it cannot write, as :func:`dumps_exact`)."""
    return _fast(value) if _plain(value, 1) else dumps_exact(value)


def dumps_bytes(value: Any) -> bytes:
    """:func:`dumps` as UTF-8 bytes: what goes over the wire."""
    return dumps(value).encode("utf-8")


def check(value: Any) -> None:
    """Raise what :func:`dumps` would raise for ``value``, encoding it only when it is not
    plainly JSON-native (the common case costs one walk over the value)."""
    if not _plain(value, 1):
        dumps_exact(value)


def dumps_exact(value: Any) -> str:
    """The reference encoder: every rule of this module in pure Python, for every value."""
    parts: list[str] = []
    _encode(value, parts, "$", 1)
    return "".join(parts)


_FAST = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                         check_circular=False)  # _plain bounds the depth: no cycles get here


def _c_encoder() -> Callable[[Any], str]:
    """``_FAST.encode``, without building its C encoder object on every call: the one that
    ``JSONEncoder.iterencode`` builds from ``_FAST``'s settings, built once (the encoder
    object's own path where Python has no C accelerator)."""
    if _make_encoder is None:
        return _FAST.encode
    encode = _make_encoder(None, _FAST.default, _encode_str, None, ":", ",", False, False,
                           False)
    return lambda value: "".join(encode(value, 0))


_fast = _c_encoder()
_ATOMS = frozenset({int, bool, type(None)})
_FIXED_LOW, _FIXED_HIGH = 1e-4, 1e15
"""Floats in [low, high) have Ruby's and Python's fixed layout (decimal point position
-3 to 15); both print the same shortest round-trip digits there."""


def _plain(value: Any, depth: int) -> bool:
    """Whether ``value`` (a container at nesting ``depth``) is one that the C encoder writes
    exactly as Ruby would: exact JSON types only, strings valid UTF-8, floats in the band
    where both languages write them alike, nesting within MAX_NESTING."""
    kind = type(value)
    if kind is str:
        return value.isascii() or is_utf8(value)
    if kind in _ATOMS:
        return True
    if kind is float:
        return bool(value == 0.0 or _FIXED_LOW <= abs(value) < _FIXED_HIGH)
    if depth > MAX_NESTING:
        return False
    if kind is dict:
        for key in value:
            if type(key) is not str or not (key.isascii() or is_utf8(key)):
                return False
        value = value.values()
    elif kind is not list and kind is not tuple:
        return False
    for item in value:
        kind = type(item)
        if kind in _ATOMS or (kind is str and item.isascii()):
            continue  # the common leaves, without a call
        if kind is float:  # a payload's created_at / enqueued_at: no call either
            if item == 0.0 or _FIXED_LOW <= abs(item) < _FIXED_HIGH:
                continue
            return False
        if not _plain(item, depth + 1):
            return False
    return True


def is_utf8(text: str) -> bool:
    """False when ``text`` holds a lone surrogate (not encodable as UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def loads(text: str | bytes) -> Any:
    """Parse JSON text that :func:`dumps` could write back; ValueError for anything else.

    Bytes must be strict UTF-8. The checks cost one scan for ``\\ud8..`` escapes and a
    bracket count, plus a walk of the value only when the text could break a rule.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")  # UnicodeDecodeError is a ValueError
    try:
        value = _decode(text)
    except RecursionError:
        raise ValueError(f"nesting deeper than {MAX_NESTING} levels") from None
    if text.count("[") + text.count("{") > MAX_NESTING:
        _check_depth(value)
    if _SURROGATE_ESCAPE.search(text):
        _check_surrogates(value)
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in JSON")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"number {literal[:40]} is out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
"""One decoder for every :func:`loads` (``json.loads`` with options builds one per call)."""

_SCAN: Callable[[str, int], tuple[Any, int]] = vars(_DECODER)["scan_once"]
"""The decoder's C scanner (``JSONDecoder.__init__`` sets it): one value at an index."""


def _decode(text: str) -> Any:
    """``_DECODER.decode(text)``, calling its C scanner directly when the text is one value
    from its first to its last character (a payload); anything else (whitespace around
    it, trailing data, no value) goes through the decoder, which accepts or names it."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        return _DECODER.decode(text)
    return value if end == len(text) else _DECODER.decode(text)


def _containers(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [item for item in value.values() if isinstance(item, (dict, list))]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, (dict, list))]
    return []


def _check_depth(value: Any) -> None:
    """ValueError when arrays and objects nest deeper than MAX_NESTING (no recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > MAX_NESTING:
            raise ValueError(f"nesting deeper than {MAX_NESTING} levels")
        level = [child for parent in level for child in _containers(parent)]


def _strings(value: Any) -> list[str]:
    stack, found = [value], []
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            found.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _check_surrogates(value: Any) -> None:
    """ValueError when a decoded string (or key) holds a lone surrogate."""
    for string in _strings(value):
        if _SURROGATE.search(string):
            raise ValueError("string holds a lone UTF-16 surrogate (not valid Unicode)")


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


def _encode(value: Any, out: list[str], path: str, depth: int) -> None:
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
    elif isinstance(value, (dict, list, tuple)):
        if depth > MAX_NESTING:
            raise ValueError(f"{path}: nesting deeper than {MAX_NESTING} levels")
        if isinstance(value, dict):
            _encode_object(value, out, path, depth)
        else:
            _encode_array(value, out, path, depth)
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


def _encode_object(value: dict[Any, Any], out: list[str], path: str, depth: int) -> None:
    out.append("{")
    first = True
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"{path}: object keys must be str, got {type(key).__name__}")
        if not key.isascii():
            _check_utf8(key, f"{path} key")
        if not first:
            out.append(",")
        first = False
        out.append(_encode_str(key))
        out.append(":")
        _encode(item, out, f"{path}.{key}", depth + 1)
    out.append("}")


def _encode_array(
    value: list[Any] | tuple[Any, ...], out: list[str], path: str, depth: int
) -> None:
    out.append("[")
    for index, item in enumerate(value):
        if index:
            out.append(",")
        _encode(item, out, f"{path}[{index}]", depth + 1)
    out.append("]")
