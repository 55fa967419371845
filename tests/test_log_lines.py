"""Hostile data in the log and in listings: control characters become visible escapes, a
log line stays one line and a traceback keeps its frames; USR2 reopens the log file; a
hostile process record reads as empty. No server, no subprocess."""

from __future__ import annotations

import logging
from pathlib import Path

from forkq.daemon import logs
from forkq.ops import processes
from forkq.printable import printable


def test_usr2_reopens_the_log_file_and_keeps_the_old_one_when_it_cannot(
        tmp_path: Path, root_handlers: None) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / "forkq.log"
    logs.configure("info", str(path))
    logging.getLogger("t").info("first")
    path.rename(tmp_path / "rotated.log")
    assert logs.reopen()
    logging.getLogger("t").info("second")
    assert "second" in path.read_text() and "second" not in (tmp_path / "rotated.log").read_text()

    path.rename(tmp_path / "moved.log")
    folder.rmdir()
    assert not logs.reopen()  # the directory is gone: no exception, lines go on
    logging.getLogger("t").info("third")
    moved = (tmp_path / "moved.log").read_text()
    assert "cannot reopen" in moved and "third" in moved


def test_a_hostile_process_record_reads_as_empty() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    values = [deep if field == "info" else None for field in processes.FIELDS]
    record = processes.Process.from_hash("host:1:abc", values, leader="")
    assert record.info == {} and record.busy == 0
    assert processes._work("host:1:abc", "t", deep.encode()) is None


FORGED = "x\n2026-11-26T00:00:00.000Z pid=1 master ERROR: forged\x1b[2J\x9b31m\r\t"


def test_control_characters_become_visible_escapes_and_other_text_stays() -> None:
    assert printable(FORGED) == ("x\\n2026-11-26T00:00:00.000Z pid=1 master ERROR: "
                                 "forged\\x1b[2J\\x9b31m\\r\\t")
    assert printable("a\nb\x1b", lines=True) == "a\nb\\x1b"
    assert printable("queue:café 日本 \x7f") == "queue:café 日本 \\x7f"
    plain = "queue:default"
    assert printable(plain) is plain


def test_a_log_line_from_hostile_data_stays_one_line_and_a_traceback_keeps_its_frames(
        tmp_path: Path, root_handlers: None) -> None:
    path = tmp_path / "forkq.log"
    logs.configure("info", str(path))
    log = logging.getLogger("t")
    log.info("Record jid=%s start", FORGED)
    try:
        raise ValueError(f"bad value {FORGED}")
    except ValueError:
        log.exception("Boom jid=%s fail", "j1")
    log.warning("TTIN: %s\n%s", printable(FORGED), "  File x\n    code", extra=logs.MULTILINE)
    text = path.read_text()
    assert "\x1b" not in text and "\x9b" not in text and "\r" not in text
    lines = text.splitlines()
    assert [line for line in lines if "forged" in line and "pid=1" in line] == [
        line for line in lines if "\\n2026-11-26T00:00:00.000Z pid=1" in line]  # none forged
    assert lines[1].endswith("fail") and lines[2] == "Traceback (most recent call last):"
    assert lines[3].startswith('  File "') and lines[4].startswith("    raise ValueError")
    assert lines[5].startswith("ValueError: bad value x\\n2026-11-26") and len(lines) == 9
    assert lines[6].endswith("TTIN: x\\n2026-11-26T00:00:00.000Z pid=1 master ERROR: "
                             "forged\\x1b[2J\\x9b31m\\r\\t")
    assert lines[7:] == ["  File x", "    code"]


def test_a_traceback_another_handler_formatted_first_is_escaped_here_and_left_as_it_was(
        tmp_path: Path, root_handlers: None) -> None:
    """logging caches a traceback's text on the record for whatever formats it next, and an
    application's handler on a named logger formats before the root's."""
    path = tmp_path / "forkq.log"
    logs.configure("info", str(path))
    plain: list[str] = []
    other = logging.Handler()
    other.emit = lambda record: plain.append(logging.Formatter().format(record))  # type: ignore[method-assign]
    app = logging.getLogger("app")
    app.addHandler(other)
    try:
        try:
            error = ValueError(f"bad {FORGED}")
            error.add_note(f"note {FORGED}")
            raise error
        except ValueError:
            app.exception("job %s failed", FORGED)
    finally:
        app.removeHandler(other)
    text = path.read_text()
    assert "\x1b" not in text and "\r" not in text
    assert not [line for line in text.splitlines() if line.startswith("2026-11-26T00:00:00")]
    assert "note x\\n2026-11-26T00:00:00.000Z pid=1" in text
    assert "\x1b" in plain[0] and "\nnote x\n" in plain[0]  # the other handler's, untouched
