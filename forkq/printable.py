"""Text from Redis made safe for a log line or the operator's terminal.

Whatever is in Redis may have been written by any client: a queue name, a jid, a class
name, a job's error message can hold control characters — a newline that forges a log line
or a table row, an escape sequence that a terminal acts on (colours, clearing the screen,
its title, on some terminals its clipboard). Before such text is printed, every control
character (Unicode category Cc: C0, DEL and C1), the Unicode line and paragraph separators
and the bidirectional overrides and isolates (which reorder what a terminal shows) become
visible escapes, as Python's ``repr`` writes them: ``\\n``, ``\\r``, ``\\t``, ``\\x1b``,
``\\x9b``, ``\\u2028``, ``\\u202e``. Other text, any language's letters included, is left as
it is; so is a backslash (text that holds a ``repr`` or an escaped name already reads the
same after a second pass), so a name that holds the four characters ``\\x1b`` shows as one
that holds ESC: ``--json`` gives the exact strings.
"""

from __future__ import annotations

import json
from typing import Any

_UNSAFE = (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F),
           *range(0x2066, 0x206A))
_ESCAPES = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _UNSAFE}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
_ESCAPES_BUT_NEWLINE = {code: text for code, text in _ESCAPES.items() if code != ord("\n")}
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in _UNSAFE if code >= 0x7F}
"""What ``json.dumps(ensure_ascii=False)`` leaves raw of :data:`_UNSAFE` (it escapes C0)."""


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with what this module names escaped; with ``lines``, newlines are kept (a
    block of several lines: a traceback, a listing)."""
    if text.isprintable():  # the common case: nothing to escape (str.isprintable is C)
        return text
    return text.translate(_ESCAPES_BUT_NEWLINE if lines else _ESCAPES)


def json_text(value: Any) -> str:
    """``value`` as one line of JSON, non-ASCII text raw (``ensure_ascii=False``) but for
    what a terminal would act on, which JSON's own ``\\u`` escapes write: once decoded, the
    same strings."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False).translate(_JSON_ESCAPES)
