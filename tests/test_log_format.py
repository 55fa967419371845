"""``log_format: json``: one JSON object per line, with the job's fields on job lines.

Unit tests of the formatter and the setting, and a whole daemon run (jobs that complete,
fail with a traceback, are retried and die; a TTIN stack dump; a HUP reload; a TERM stop)
whose every logged line parses as JSON.
"""

from __future__ import annotations

import datetime
import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from forkq import config
from forkq.client import Client
from forkq.daemon import logs
from forkq.errors import ConfigError
from tests.conftest import Daemon, push, records, until

COMMON = {"time", "level", "role", "pid", "logger", "message"}


def _objects(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as the JSON object it must be."""
    objects = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise AssertionError(f"line {number} is not JSON ({exc}): {line!r}") from None
        assert isinstance(value, dict), line
        objects.append(value)
    return objects


def test_a_record_is_one_object_with_the_common_fields_and_the_job_fields(
        tmp_path: Path, root_handlers: None) -> None:
    path = tmp_path / "forkq.log"
    logs.configure("info", str(path), "json")
    logs.set_role("processor-3")
    try:
        log = logging.getLogger("forkq.t")
        log.info("Record jid=%s start", "j1", extra={"jid": "j1", "job": "Record",
                                                     "queue": "default"})
        log.info("Record jid=%s done: 2 ms", "j1",
                 extra={"jid": "j1", "job": "Record", "queue": "default", "duration": 0.002,
                        "outcome": "done"})
        log.warning("plain \x1b[2J line\nwith a newline é")
    finally:
        logs.set_role("master")
    start, done, plain = _objects(path.read_text())
    assert set(start) == COMMON | {"jid", "job", "queue"}
    assert start["level"] == "INFO" and start["role"] == "processor-3"
    assert start["logger"] == "forkq.t" and start["message"] == "Record jid=j1 start"
    assert isinstance(start["pid"], int)
    stamp = datetime.datetime.fromisoformat(start["time"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == datetime.timedelta(0) and start["time"].endswith("Z")
    assert done["duration"] == 0.002 and done["outcome"] == "done"
    assert plain["message"] == "plain \x1b[2J line\nwith a newline é"  # the encoder escapes
    assert plain["level"] == "WARNING" and "jid" not in plain
    assert path.read_text().isascii()


def test_a_traceback_and_a_multiline_message_stay_inside_their_object(
        tmp_path: Path, root_handlers: None) -> None:
    path = tmp_path / "forkq.log"
    logs.configure("info", str(path), "json")
    log = logging.getLogger("forkq.t")
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        log.error("Boom jid=%s fail", "j2", exc_info=True,
                  extra={**logs.JOB_FAILURE, "jid": "j2", "outcome": "dead"})
    log.warning("TTIN: idle\n%s", logs.stack(sys._getframe()), extra=logs.MULTILINE)
    log.info("with a stack", stack_info=True)
    fail, dump, stacked = _objects(path.read_text())
    assert fail["exc_info"].startswith("Traceback (most recent call last):\n")
    assert fail["exc_info"].endswith("ValueError: bad\nvalue")
    assert 'raise ValueError("bad\\nvalue")' in fail["exc_info"]
    assert fail["outcome"] == "dead" and fail["message"] == "Boom jid=j2 fail"
    assert dump["message"].startswith("TTIN: idle\n  File ")
    assert "exc_info" not in dump
    assert stacked["stack_info"].startswith("Stack (most recent call last):")


def test_the_text_format_is_unchanged_by_the_job_fields(
        tmp_path: Path, root_handlers: None) -> None:
    path = tmp_path / "forkq.log"
    logs.configure("info", str(path))
    logging.getLogger("forkq.t").info("Record jid=%s done: 2 ms", "j1", extra={
        "jid": "j1", "job": "Record", "queue": "default", "duration": 0.002, "outcome": "done"})
    line = path.read_text()
    assert line.endswith(" master INFO: Record jid=j1 done: 2 ms\n")
    assert "outcome" not in line and "{" not in line


def test_log_format_is_a_setting_with_a_flag_and_a_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "forkq.yml").write_text("log_format: json\n")
    parser = config.argparse.ArgumentParser()
    config.add_flags(parser)

    def load(*argv: str, **environ: str) -> config.Config:
        return config.load(parser.parse_args(list(argv)), environ)

    assert load().log_format == "text"
    assert load("-C", "forkq.yml").log_format == "json"
    assert load("--log-format", "JSON").log_format == "json"
    assert load(FORKQ_LOG_FORMAT="json").log_format == "json"
    with pytest.raises(ConfigError, match="log_format"):
        load("--log-format", "xml")
    with pytest.raises(ConfigError, match="log_format"):
        logs.configure("info", "", "xml")


JOB_LOGGER = "forkq.daemon.children.job_run"


def test_a_whole_daemon_run_logs_only_json_objects(daemon: Callable[..., Daemon],
                                                   r: redis.Redis) -> None:
    body = """
        concurrency: 2
        timeout: 2
        require: jobs
        log_format: json
        """
    d = daemon(body)
    done = push(r, "Record", "one")
    retried = push(r, "Boom", "will retry")
    dead = Client(r).push({"class": "Boom", "args": ["dies"], "retry": 0})
    until(lambda: any(row["jid"] == done for row in records(r)), 30, d.log)
    until(lambda: r.zcard("retry") == 1 and r.zcard("dead") == 1, 30, d.log)

    push(r, "Sleep", 60, "ttin")
    until(lambda: r.llen("test:started") == 1, 30, d.log)
    d.signal(signal.SIGTTIN)
    until(lambda: "TTIN: running Sleep" in d.log(), 30, d.log)

    Path(d.config_file).write_text(Path(d.config_file).read_text().replace(
        "concurrency: 2", "concurrency: 3"))
    d.signal(signal.SIGHUP)
    until(lambda: "reload: " in d.log(), 30, d.log)
    d.signal(signal.SIGTERM)
    d.wait(60)

    objects = _objects(d.log())  # the whole file, every line
    for obj in objects:
        assert set(obj) >= COMMON, obj
    roles = {obj["role"] for obj in objects}
    assert "master" in roles and "scheduler" in roles and "processor-0" in roles, roles
    job_lines = [obj for obj in objects if obj["logger"] == JOB_LOGGER]
    for obj in job_lines:
        assert {"jid", "job", "queue"} <= set(obj), obj
        assert obj["message"].startswith(f"{obj['job']} jid={obj['jid']} "), obj

    def lines(jid: str | None) -> list[dict[str, Any]]:
        return [obj for obj in job_lines if obj["jid"] == jid]

    start, finish = lines(done)
    assert start["message"].endswith(" start") and "outcome" not in start
    assert finish["outcome"] == "done" and finish["duration"] >= 0 and finish["job"] == "Record"
    retry = [obj for obj in lines(retried) if obj.get("outcome") == "retry"]
    assert len(retry) == 1 and retry[0]["level"] == "WARNING"
    assert "ValueError: will retry" in retry[0]["exc_info"]
    assert retry[0]["exc_info"].startswith("Traceback (most recent call last):\n")
    last = lines(dead)[-1]
    assert last["outcome"] == "dead" and last["level"] == "ERROR" and last["duration"] >= 0
    assert last["queue"] == "default" and "exc_info" in last
    dumps = [obj for obj in objects if obj["message"].startswith("TTIN: ")]
    assert any("\n  File " in obj["message"] for obj in dumps), dumps
    assert any(obj["message"].startswith("reload: ") for obj in objects)
