"""Logging: one line per event, with pid and role.

Format: ``2026-11-21T06:27:00.123Z pid=4242 processor-1 INFO: message``. Under
journald (``JOURNAL_STREAM`` set) the timestamp is left out, as journald adds
its own. The role is per process: ``master``, ``processor-<slot>``. With a log
file, every process appends to it; USR2 makes each reopen it (:func:`reopen`).

One line per event whatever the data: a message's control characters are escaped
(:mod:`forkq.printable`), so a jid, a class name or an error message written into Redis by
any client cannot forge a line or send a terminal escape sequence. A traceback follows its
event's line as Python writes it, with the same escapes, except for the newlines that
separate its own lines; in its exceptions' messages and notes, newlines are escaped too (the
lines of an exception group's members stay indented under it). A message logged with
``extra=MULTILINE`` (TTIN's stack dumps, whose data parts are escaped by the caller) keeps
its newlines.

A failed job's traceback (logged with ``extra=JOB_FAILURE``) leaves out forkq's own frames
that lead to the job's code (the processor, the middleware chain, the runner: as pytest hides
its own), so it begins in the application; frames of forkq that the application called (a
``perform_async`` that failed) stay, and so does every frame when no application frame is
in it. ``log_level: debug`` keeps every frame.

With ``log_format: json`` (:func:`configure`) each event is instead ONE JSON object on one
line (:class:`_JsonFormatter`): ``time`` (ISO 8601, UTC), ``level``, ``role``, ``pid``,
``logger``, ``message``, and the fields a line about a job carries (:data:`JOB_FIELDS`,
given as ``extra=`` by the processor); a traceback is the ``exc_info`` string field and a
TTIN dump's newlines stay inside ``message``. JSON's encoder does the escaping there (every
character outside ASCII too), so the text format's escapes are not applied and a line can
never be split; the time is always written, journald or not.

Whatever a job does to its process's stderr (closes ``sys.stderr`` or fd 2), the daemon's
lines go on: they are written to a copy of fd 2 made at :func:`configure`, and a line that
cannot be written is dropped rather than raised into the code that logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Mapping
from types import FrameType, MappingProxyType
from typing import Any

from forkq.config import LOG_FORMATS
from forkq.errors import ConfigError
from forkq.printable import printable

_role = "master"


class _RoleFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.role = _role
        return True


MULTILINE: Mapping[str, object] = MappingProxyType({"multiline": True})
"""``extra=`` of a message whose newlines are its own (its data escaped by the caller)."""

JOB_FAILURE: Mapping[str, object] = MappingProxyType({"job_failure": True})
"""``extra=`` of a failed job's line: its traceback leaves out forkq's own frames."""

JOB_FIELDS = ("jid", "job", "queue", "duration", "outcome")
"""``extra=`` fields of a line about one job, written as they are by the JSON format (the
text format leaves them out: its message says it all): ``jid``, ``job`` (class), ``queue``,
and on a line that ends a run ``duration`` (seconds) and ``outcome`` (``done``, ``retry``,
``dead``, ``drop``, ``cancelled``, ``reschedule``, ``expired``); a float is written to the
microsecond."""

_OWN = os.path.dirname(os.path.abspath(__file__)).rsplit(os.sep, 1)[0] + os.sep
"""The forkq package's folder: frames of files in it are forkq's own."""
_APPLICATION = (os.path.join(_OWN, "examples.py"),)
"""Files of the package that are application code (the example jobs)."""

_FRAMES = ("Traceback ", "  ", "\nThe above exception", "\nDuring handling")
"""How the chunks of a formatted traceback that are not an exception's message begin."""


class _Formatter(logging.Formatter):
    trim_job_frames = True  # False at log_level debug: every frame of a failed job
    _trimming = False  # set while a failed job's record is formatted (under the handler lock)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        """The record's line (and traceback), escaped; the record is left as it was found:
        logging caches a traceback's text on the record (``exc_text``) for whatever formats
        it next, so another handler's raw text is not used here, nor this one's there."""
        cached, record.exc_text = record.exc_text, None
        self._trimming = self.trim_job_frames and bool(getattr(record, "job_failure", False))
        try:
            return super().format(record)
        finally:
            record.exc_text = cached
            self._trimming = False

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        message = record.message
        record.message = printable(message, lines=bool(getattr(record, "multiline", False)))
        try:
            return super().formatMessage(record)
        finally:
            record.message = message

    def formatException(self, ei: Any) -> str:  # noqa: N802
        report = traceback.TracebackException(ei[0], ei[1], ei[2], compact=True)
        _escape_notes(report)
        if self._trimming:
            _each_report(report, _trim_own_frames)
        return "".join(map(_chunk, report.format())).rstrip("\n")

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return printable(stack_info, lines=True)


class _JsonFormatter(_Formatter):
    """One JSON object per record, on one line; nothing of it is escaped but by the encoder."""

    def format(self, record: logging.LogRecord) -> str:
        """The record's object: the common fields, the job's fields it carries, its
        traceback (trimmed as in the text format) as ``exc_info`` and a stack as
        ``stack_info``. The record is not changed."""
        line: dict[str, Any] = {
            "time": self.formatTime(record), "level": record.levelname,
            "role": getattr(record, "role", _role), "pid": record.process,
            "logger": record.name, "message": record.getMessage()}
        for name in JOB_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = round(value, 6) if isinstance(value, float) else value
        if record.exc_info:
            trim = self.trim_job_frames and bool(getattr(record, "job_failure", False))
            line["exc_info"] = _traceback_text(record.exc_info, trim=trim)
        if record.stack_info:
            line["stack_info"] = record.stack_info
        return json.dumps(line, default=repr)


def _traceback_text(ei: Any, *, trim: bool) -> str:
    """``ei``'s traceback in Python's format (without the escapes of the text format: the
    JSON encoder escapes it), with forkq's own frames before the application's left out when
    ``trim``."""
    report = traceback.TracebackException(ei[0], ei[1], ei[2], compact=True)
    if trim:
        _each_report(report, _trim_own_frames)
    return "".join(report.format()).rstrip("\n")


def _escape_notes(report: traceback.TracebackException) -> None:
    """Escape the notes (``add_note``) of ``report`` and of every exception chained or grouped
    in it: a note's lines come as chunks of their own, which :func:`_chunk` cannot tell from
    a traceback's own lines."""
    _each_report(report, _escape_own_notes)


def _escape_own_notes(item: Any) -> None:
    notes = getattr(item, "__notes__", None)
    if isinstance(notes, list):
        item.__notes__ = [printable(note) if isinstance(note, str) else note for note in notes]


def _each_report(report: traceback.TracebackException, act: Any) -> None:
    """``act`` on ``report`` and on every exception chained or grouped in it, once each."""
    pending: list[Any] = [report]
    seen: set[int] = set()
    while pending:
        item = pending.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        act(item)
        pending += [item.__cause__, item.__context__, *(getattr(item, "exceptions", None) or [])]


def _trim_own_frames(item: Any) -> None:
    """Leave out forkq's frames that come before the last frame of the application (none
    when the traceback holds no application frame)."""
    frames = list(item.stack)
    last = max((i for i, frame in enumerate(frames) if not _own(frame.filename)), default=None)
    if last is None:
        return
    kept = [frame for i, frame in enumerate(frames) if i > last or not _own(frame.filename)]
    item.stack = traceback.StackSummary.from_list(kept)


def _own(filename: str) -> bool:
    return filename.startswith(_OWN) and not filename.startswith(_APPLICATION)


def _chunk(text: str) -> str:
    """One chunk of a formatted traceback, escaped: a frame or a header keeps its newlines;
    an exception's message (``ValueError: ...``, a note) keeps only its last one."""
    if text.startswith(_FRAMES):
        return printable(text, lines=True)
    body, newline = (text[:-1], "\n") if text.endswith("\n") else (text, "")
    return printable(body) + newline


def configure(level: str = "info", path: str = "", log_format: str = "text") -> None:
    """Send forkq's log lines to ``path`` (appending), else stderr, at ``level``, as text
    lines or (``log_format="json"``) JSON objects.

    No timestamp in a text line when writing to stderr under journald (``JOURNAL_STREAM``
    set). A process forked afterwards (every child) inherits the handler and its format.
    """
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format: {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    journald = bool(os.environ.get("JOURNAL_STREAM")) and not path
    fmt = "pid=%(process)d %(role)s %(levelname)s: %(message)s"
    handler: logging.Handler = _file_handler(path) if path else _StderrHandler(_own_stderr())
    formatter = (_JsonFormatter() if log_format == "json" else
                 _Formatter(fmt if journald else "%(asctime)s " + fmt))
    handler.setFormatter(formatter)
    handler.addFilter(_RoleFilter())
    logging.getLogger().handlers[:] = [handler]
    set_level(level)


def set_level(level: str) -> None:
    """Log at ``level`` from now on (a HUP's new ``log_level``); at ``debug`` a failed job's
    traceback keeps forkq's own frames. Children forked afterwards inherit it."""
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler.formatter, _Formatter):
            handler.formatter.trim_job_frames = level.lower() != "debug"
    root.setLevel(level.upper())


class _DropsUnwritable(logging.Handler):
    """A handler that never lets a line it could not write reach the code that logged."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """Let logging report the failure (to ``sys.stderr``); when even that fails (a job
        closed ``sys.stderr``), drop the line: logging would let that error escape into the
        code that logged, and a log line is never worth the process."""
        with contextlib.suppress(Exception):
            super().handleError(record)


class _StderrHandler(_DropsUnwritable, logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the daemon's own copy of stderr (:func:`_own_stderr`)."""


class _FileHandler(_DropsUnwritable, logging.FileHandler):
    """Appends to the log file."""


def _own_stderr() -> Any:
    """A stream of the daemon's own on a copy of fd 2, so that a job closing ``sys.stderr``
    (or fd 2) does not silence the daemon's log; ``sys.stderr`` itself when it has no fd."""
    try:
        fd = os.dup(sys.stderr.fileno())  # not inherited by a job's subprocesses (PEP 446)
    except (AttributeError, OSError, ValueError):
        return sys.stderr
    return os.fdopen(fd, "w", encoding=sys.stderr.encoding or "utf-8",
                     errors="backslashreplace", buffering=1)


def _file_handler(path: str) -> logging.FileHandler:
    """A handler appending to ``path``; ConfigError naming ``log_file`` when it cannot open."""
    try:
        return _FileHandler(path, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"log_file: cannot append to {path!r}: {exc.strerror or exc}") from None


def set_role(role: str) -> None:
    """Name this process's role in every following log line (called after fork)."""
    global _role
    _role = role


def reopen() -> bool:
    """USR2: reopen the log file (after logrotate moved it); a no-op when logging to stderr.

    The new file is opened before the old one is closed: when it cannot be opened (its
    directory is gone, permissions changed) lines keep going to the old file, the failure is
    logged there, and False is returned. Never raises.
    """
    reopened = True
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            reopened = _swap_stream(handler) and reopened
    return reopened


def _swap_stream(handler: logging.FileHandler) -> bool:
    try:
        stream = handler._open()
    except OSError as exc:
        logging.getLogger(__name__).error(
            "log_file: cannot reopen %r (%s); still writing to the file open before",
            handler.baseFilename, exc.strerror or exc)
        return False
    handler.acquire()
    try:
        old, handler.stream = handler.stream, stream
    finally:
        handler.release()
    if old is not None:
        old.close()
    return True


def stack(frame: FrameType | None) -> str:
    """A thread's stack, outermost call first, as indented lines (for TTIN dumps; control
    characters other than the newlines escaped)."""
    if frame is None:
        return "    (no frame)"
    return printable("".join(traceback.format_stack(frame)).rstrip("\n"), lines=True)
