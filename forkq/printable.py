"""Text from Redis made safe for a log line or the operator's terminal.

Whatever is in Redis may have been written by any client: a queue name, a jid, a class
name, a job's error message can hold control characters — a newline that forges a log line
or a table row, an escape sequence that a terminal acts on (colours, clearing the screen,
its title, on some terminals its clipboard). Before such text is printed, every control
character (Unicode category Cc: C0, DEL and C1) becomes a visible escape: ``\\n``, ``\\r``,
``\\t``, ``\\x1b``, ``\\x9b``. Other text, any language's letters included, is left as it is.
"""

from __future__ import annotations

_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})
_ESCAPES_BUT_NEWLINE = {code: text for code, text in _ESCAPES.items() if code != ord("\n")}


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with its control characters escaped; with ``lines``, newlines are kept (a
    block of several lines: a traceback, a table)."""
    if text.isprintable():  # the common case: nothing to escape (str.isprintable is C)
        return text
    return text.translate(_ESCAPES_BUT_NEWLINE if lines else _ESCAPES)
