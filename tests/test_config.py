"""Unit tests of forkq.config: precedence, YAML reading, every error message, import_required."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from forkq.config import SETTINGS, Config, add_flags, import_required, load, load_file
from forkq.errors import ConfigError

from .conftest import ROOT
from .test_docs import docs_hooks

Write = Callable[..., str]

URL_KINDS = ("expected 'embedded' or a redis://, rediss://, unix://, redis+sentinel://, "
             "rediss+sentinel:// or sentinel:// URL")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Write:
    """Write a dedented YAML file under a temporary cwd; returns its relative path."""
    monkeypatch.chdir(tmp_path)

    def write(text: str, name: str = "forkq.yml") -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return name

    return write


def load_yaml(write: Write, text: str, *argv: str, environ: Mapping[str, str] | None = None,
              ) -> Config:
    return load(parse("-C", write(text), *argv), environ or {})


def error_of(action: Callable[[], object]) -> str:
    with pytest.raises(ConfigError) as caught:
        action()
    message = str(caught.value)
    assert "\n" not in message
    return message


def yaml_error(write: Write, text: str, environ: Mapping[str, str] | None = None) -> str:
    return error_of(lambda: load_yaml(write, text, environ=environ))


# --- the table and the dataclass ------------------------------------------------------------


def test_settings_table_covers_every_config_field() -> None:
    names = [setting.name for setting in SETTINGS]
    fields = [f.name for f in dataclasses.fields(Config) if f.name != "origins"]
    assert sorted(names) == sorted(fields)
    assert len(set(names)) == len(names)
    assert all(setting.doc for setting in SETTINGS)


def test_defaults_come_from_config() -> None:
    by_name = {setting.name: setting for setting in SETTINGS}
    assert by_name["concurrency"].default == 5
    assert by_name["queues"].default == (("default", 1),)


def test_add_flags_defaults_are_none_and_repeatables_accumulate() -> None:
    args = parse()
    assert all(value is None for value in vars(args).values())
    args = parse("-q", "a,3", "--queue", "b", "-r", "x", "-r", "y.py")
    assert args.queue == ["a,3", "b"]
    assert args.require == ["x", "y.py"]


def test_config_is_frozen_and_equality_ignores_origins() -> None:
    config = Config(origins={"concurrency": "flag -c"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.concurrency = 3  # type: ignore[misc]
    assert config == Config()
    assert config.origin("concurrency") == "flag -c"
    assert config.origin("timeout") == "default"


# --- precedence ------------------------------------------------------------------------------


def test_defaults_without_any_source() -> None:
    config = load(parse(), {})
    assert config == Config()
    assert config.origin("concurrency") == "default"
    assert config.config_file is None


def test_file_over_default(write: Write) -> None:
    config = load_yaml(write, "concurrency: 7\n")
    assert config.concurrency == 7
    assert config.origin("concurrency") == "forkq.yml:1:14"
    assert config.config_file == str(Path("forkq.yml").resolve())
    assert config.origin("config_file") == "flag -C"


def test_env_over_file(write: Write) -> None:
    config = load_yaml(write, "concurrency: 7\n", environ={"FORKQ_CONCURRENCY": "9"})
    assert config.concurrency == 9
    assert config.origin("concurrency") == "env FORKQ_CONCURRENCY"


def test_flag_over_env(write: Write) -> None:
    config = load_yaml(write, "concurrency: 7\n", "-c", "11", environ={"FORKQ_CONCURRENCY": "9"})
    assert config.concurrency == 11
    assert config.origin("concurrency") == "flag -c"


def test_redis_url_fallback_is_below_the_file_and_above_the_default(write: Write) -> None:
    environ = {"REDIS_URL": "redis://fallback:6379/1"}
    assert load(parse(), environ).redis_url == "redis://fallback:6379/1"
    assert load(parse(), environ).origin("redis_url") == "env REDIS_URL"
    config = load_yaml(write, "redis_url: redis://file/2\n", environ=environ)
    assert config.redis_url == "redis://file/2"
    environ["FORKQ_REDIS_URL"] = "unix:///run/redis.sock"
    assert load_yaml(write, "redis_url: redis://file/2\n", environ=environ).redis_url == (
        "unix:///run/redis.sock")
    config = load_yaml(write, "redis_url: redis://file/2\n", "--redis-url", "embedded",
                       environ=environ)
    assert (config.redis_url, config.origin("redis_url")) == ("embedded", "flag --redis-url")


def test_config_path_from_env(write: Write) -> None:
    path = write("tag: from-env-path\n", "etc/forkq.yml")
    config = load(parse(), {"FORKQ_CONFIG": path})
    assert config.tag == "from-env-path"
    assert config.origin("tag") == "etc/forkq.yml:1:6"
    assert config.origin("config_file") == "env FORKQ_CONFIG"


def test_empty_env_variable_counts_as_unset(write: Write) -> None:
    config = load_yaml(write, "tag: file\n", environ={"FORKQ_TAG": "", "REDIS_URL": ""})
    assert config.tag == "file"
    assert config.redis_url == Config.redis_url


def test_flags_replace_the_file_queue_list(write: Write) -> None:
    config = load_yaml(write, "queues: [a, b, c]\n", "-q", "x,2", "-q", "y")
    assert config.queues == (("x", 2), ("y", 1))


def test_every_env_variable() -> None:
    environ = {
        "FORKQ_CONCURRENCY": "3", "FORKQ_TIMEOUT": "1.5", "FORKQ_QUEUES": "critical,3 default;low",
        "FORKQ_STRICT": "yes", "FORKQ_REQUIRE": "a.jobs, b.py", "FORKQ_REDIS_URL": "rediss://h/0",
        "FORKQ_TAG": "t", "FORKQ_LABELS": "x,y", "FORKQ_MAX_RETRIES": "0",
        "FORKQ_EMBEDDED_DIR": "/var/lib/forkq", "FORKQ_LOG_LEVEL": "DEBUG", "FORKQ_ENV": "staging",
    }
    config = load(parse(), environ)
    assert config == Config(
        concurrency=3, timeout=1.5, queues=(("critical", 3), ("default", 1), ("low", 1)),
        strict=True, require=("a.jobs", "b.py"), redis_url="rediss://h/0", tag="t",
        labels=("x", "y"), max_retries=0, embedded_dir="/var/lib/forkq", log_level="debug",
        environment="staging",
    )
    assert config.origin("queues") == "env FORKQ_QUEUES"


@pytest.mark.parametrize(("text", "expected"), [
    ("true", True), ("FALSE", False), ("1", True), ("0", False), ("yes", True), ("no", False),
])
def test_env_bools(text: str, expected: bool) -> None:
    assert load(parse(), {"FORKQ_STRICT": text}).strict is expected


def test_every_flag() -> None:
    args = parse("-c", "2", "-t", "0", "-q", "a,2", "-r", "m", "-g", "tg", "-e", "production",
                 "-L", "warning", "--redis-url", "unix:///tmp/r.sock")
    config = load(args, {})
    assert (config.concurrency, config.timeout, config.queues) == (2, 0.0, (("a", 2),))
    assert (config.require, config.tag, config.environment) == (("m",), "tg", "production")
    assert (config.log_level, config.redis_url) == ("warning", "unix:///tmp/r.sock")


# --- YAML reading ----------------------------------------------------------------------------


def test_full_sidekiq_style_file(write: Write) -> None:
    config = load_yaml(write, """\
        :concurrency: 10
        :timeout: 8
        :queues:
          - [critical, 3]
          - [default, 2]
          - low
          - "bulk,4"
          - [single]
        :require: myapp.jobs
        :labels: [blue, green]
        :max_retries: 3
        :tag: app
        :log_level: ERROR
        """)
    assert config.concurrency == 10
    assert config.timeout == 8.0 and isinstance(config.timeout, float)
    assert config.queues == (("critical", 3), ("default", 2), ("low", 1), ("bulk", 4),
                             ("single", 1))
    assert config.strict is False
    assert config.require == ("myapp.jobs",)
    assert config.labels == ("blue", "green")
    assert (config.max_retries, config.tag, config.log_level) == (3, "app", "error")
    assert config.origin("queues") == "forkq.yml:4:3"


def test_require_as_list(write: Write) -> None:
    assert load_yaml(write, "require: [a.b, jobs.py]\n").require == ("a.b", "jobs.py")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n", "~\n"])
def test_empty_file_gives_defaults(write: Write, text: str) -> None:
    config = load_yaml(write, text)
    assert config == Config(config_file=config.config_file)


def test_strict_defaults_to_true_when_all_weights_are_one(write: Write) -> None:
    assert load_yaml(write, "queues: [a, b]\n").strict is True
    assert load_yaml(write, "queues: [a, [b, 2]]\n").strict is False
    assert load(parse(), {}).strict is True


def test_explicit_strict_wins(write: Write) -> None:
    assert load_yaml(write, "queues: [a, [b, 2]]\nstrict: true\n").strict is True
    assert load_yaml(write, "queues: [a, b]\nstrict: false\n").strict is False
    assert load(parse("-q", "a,5"), {"FORKQ_STRICT": "true"}).strict is True


def test_interpolation(write: Write) -> None:
    environ = {"N": "8", "HOST": "cache", "T": "123", "W": "4"}
    config = load_yaml(write, """\
        concurrency: ${N}
        redis_url: redis://${HOST}:${PORT:-6380}/0
        tag: ${T}
        timeout: ${MISSING:-2.5}
        queues: [[a, "${W}"], "b,${W}"]
        strict: ${S:-true}
        """, environ=environ)
    assert config.concurrency == 8
    assert config.redis_url == "redis://cache:6380/0"
    assert config.tag == "123"
    assert config.timeout == 2.5
    assert config.queues == (("a", 4), ("b", 4))
    assert config.strict is True


def test_interpolation_default_applies_to_empty_variable(write: Write) -> None:
    assert load_yaml(write, "tag: ${T:-x}\n", environ={"T": ""}).tag == "x"
    assert load_yaml(write, "tag: a${T}b\n", environ={"T": ""}).tag == "ab"


def test_interpolated_value_is_still_type_checked(write: Write) -> None:
    message = yaml_error(write, "concurrency: ${N}\n", {"N": "many"})
    assert message == "forkq.yml:1:14: concurrency: expected an integer, got 'many'"


NOT_UTF8 = os.fsdecode(b"low \xff")
"""Bytes that are not UTF-8, as Python reads them from the environment or the command line
(a lone surrogate: no Redis command, payload or log line can carry it)."""


def test_text_that_is_not_utf8_is_refused_where_it_was_given(write: Write) -> None:
    refused = "expected UTF-8 text, got '\\udcff' (bytes that are not UTF-8)"
    assert error_of(lambda: load(parse(), {"FORKQ_QUEUES": NOT_UTF8})) == (
        f"env FORKQ_QUEUES: queues: {refused}")
    assert error_of(lambda: load(parse("-q", NOT_UTF8), {})) == f"flag -q: queues: {refused}"
    assert error_of(lambda: load(parse(), {"FORKQ_TAG": "a\udcffb"})) == (
        "env FORKQ_TAG: tag: expected UTF-8 text, got 'a\\udcffb' (bytes that are not UTF-8)")
    assert yaml_error(write, 'queues:\n  - critical\n  - "a\\udcffb"\n') == (
        "forkq.yml:3:5: queues: expected UTF-8 text, got 'a\\udcffb' (bytes that are not "
        "UTF-8)")
    assert yaml_error(write, "tag: ${T}\n", {"T": "\udcff"}).startswith(
        "forkq.yml:1:6: tag: expected UTF-8 text")
    periodic = 'periodic:\n  - name: "n\\udcff"\n    cron: "0 3 * * *"\n    class: Report\n'
    assert yaml_error(write, periodic).startswith(
        "forkq.yml:2:5: periodic: expected UTF-8 text, got 'n\\udcff'")


def test_paths_may_hold_any_bytes_the_system_allows(write: Write) -> None:
    """File system paths are not text that reaches Redis: a file name in Latin-1 works."""
    name = os.fsdecode(b"caf\xe9.yml")
    Path(name).write_text("concurrency: 2\n", encoding="utf-8")
    log = os.fsdecode(b"/var/log/caf\xe9.log")
    config = load(parse("-C", name, "--logfile", log), {"FORKQ_PID_FILE": log + ".pid"})
    assert (config.concurrency, config.log_file, config.pid_file) == (2, log, log + ".pid")
    assert load(parse(), {"FORKQ_EMBEDDED_DIR": log}).embedded_dir == log


def test_environment_section_overrides_top_level(write: Write) -> None:
    text = """\
        concurrency: 5
        tag: base
        production:
          concurrency: 20
          :tag: prod
        development:
          concurrency: 1
        """
    config = load_yaml(write, text, "-e", "production")
    assert (config.concurrency, config.tag, config.environment) == (20, "prod", "production")
    assert config.origin("concurrency") == "forkq.yml:4:16"
    assert load_yaml(write, text, environ={"FORKQ_ENV": "development"}).concurrency == 1
    assert load_yaml(write, text).concurrency == 5


def test_custom_environment_section(write: Write) -> None:
    config = load_yaml(write, "concurrency: 5\nqa:\n  concurrency: 2\n", "-e", "qa")
    assert config.concurrency == 2


def test_unselected_section_keys_are_checked_but_values_are_not(write: Write) -> None:
    text = "production:\n  redis_url: ${PROD_REDIS}\n"
    assert load_yaml(write, text).redis_url == Config.redis_url
    message = yaml_error(write, "production:\n  concurency: 3\n")
    assert message == "forkq.yml:2:3: concurency: unknown setting; did you mean 'concurrency'?"


def test_load_file(write: Write) -> None:
    path = write("concurrency: 3\nstaging:\n  concurrency: 4\n")
    environ = {"FORKQ_CONCURRENCY": "9", "REDIS_URL": "redis://r/1"}
    config = load_file(path, environ, environment="staging")
    assert (config.concurrency, config.redis_url) == (4, "redis://r/1")
    assert config.config_file == str(Path(path).resolve())
    assert load_file(path, environ).concurrency == 3


# --- errors ----------------------------------------------------------------------------------


def test_syntax_error(write: Write) -> None:
    message = yaml_error(write, "concurrency: 5\nqueues: [a, b\n")
    assert message.startswith("forkq.yml:3:1: (syntax): ")
    assert "expected ',' or ']'" in message


def test_syntax_error_bad_indentation(write: Write) -> None:
    message = yaml_error(write, "concurrency: 5\n  timeout: 3\n")
    assert message == "forkq.yml:2:10: (syntax): mapping values are not allowed here"


def test_control_character(write: Write) -> None:
    message = yaml_error(write, "concurrency: 5\ntag: a\x01\n")
    assert message == ("forkq.yml:2:7: (syntax): unacceptable character #x0001: "
                       "special characters are not allowed")


def test_unsupported_tag(write: Write) -> None:
    message = yaml_error(write, "tag: !!python/object:os.system x\n")
    assert message.startswith("forkq.yml:1:6: tag: could not determine a constructor for the tag")


def test_unknown_key_suggests_the_closest(write: Write) -> None:
    message = yaml_error(write, "concurrency: 5\nqueus: [a]\n")
    assert message == "forkq.yml:2:1: queus: unknown setting; did you mean 'queues'?"


def test_unknown_key_without_close_match_lists_known(write: Write) -> None:
    message = yaml_error(write, "zzz: 1\n")
    assert message.startswith("forkq.yml:1:1: zzz: unknown setting; known: concurrency, timeout")


def test_key_given_twice(write: Write) -> None:
    message = yaml_error(write, "concurrency: 5\n:concurrency: 6\n")
    assert message == "forkq.yml:2:1: concurrency: given twice in the same mapping"


def test_environment_cannot_be_set_in_the_file(write: Write) -> None:
    message = yaml_error(write, "environment: production\n")
    assert message == "forkq.yml:1:1: environment: not read from the file; use -e or FORKQ_ENV"


@pytest.mark.parametrize(("text", "expected"), [
    ("concurrency: many\n", "forkq.yml:1:14: concurrency: expected an integer, got 'many'"),
    ("concurrency: true\n", "forkq.yml:1:14: concurrency: expected an integer, got true"),
    ("concurrency: 2.5\n", "forkq.yml:1:14: concurrency: expected an integer, got 2.5"),
    ('concurrency: "5"\n', "forkq.yml:1:14: concurrency: expected an integer, got '5'"),
    ("concurrency:\n", "forkq.yml:1:13: concurrency: expected an integer, got null"),
    ("strict: maybe\n", "forkq.yml:1:9: strict: expected true or false, got 'maybe'"),
    ("strict: 1\n", "forkq.yml:1:9: strict: expected true or false, got 1"),
    ("queues: 5\n", "forkq.yml:1:9: queues: expected a list of queues, got 5"),
    ("queues: low\n", "forkq.yml:1:9: queues: expected a list of queues, got 'low'"),
    ("timeout: soon\n", "forkq.yml:1:10: timeout: expected a finite number, got 'soon'"),
    ("timeout: .inf\n", "forkq.yml:1:10: timeout: expected a finite number, got inf"),
    ("tag: [a]\n", "forkq.yml:1:6: tag: expected a string, got a list"),
    ("tag: 2024-01-05\n", "forkq.yml:1:6: tag: expected a string, got 2024-01-05"),
    ("tag: 2024-13-45\n", "forkq.yml:1:6: tag: cannot read the value: month must be in 1..12"),
    ("labels: blue\n", "forkq.yml:1:9: labels: expected a list of strings, got 'blue'"),
    ("labels: [blue, 3]\n", "forkq.yml:1:16: labels: expected a non-empty string, got 3"),
    ("require: {a: 1}\n",
     "forkq.yml:1:10: require: expected a string or a list of strings, got a mapping"),
    ("queues:\n  - {a: 1}\n",
     "forkq.yml:2:5: queues: expected name, [name, weight] or 'name,weight'; got a mapping"),
    ("queues: [[a, b, c]]\n",
     "forkq.yml:1:10: queues: expected name, [name, weight] or 'name,weight'; got a list"),
    ("queues: [[3, 1]]\n",
     "forkq.yml:1:10: queues: expected a queue name without spaces or commas, got 3"),
    ("queues: [[low, x]]\n",
     "forkq.yml:1:16: queues: queue 'low': weight must be an integer, got 'x'"),
])
def test_wrong_type(write: Write, text: str, expected: str) -> None:
    assert yaml_error(write, text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("queues:\n  - default\n  - [low, 0]\n",
     "forkq.yml:3:11: queues: queue 'low': weight must be at least 1, got 0"),
    ("queues: [[low, -2]]\n",
     "forkq.yml:1:16: queues: queue 'low': weight must be at least 1, got -2"),
    ("queues: ['low,0']\n",
     "forkq.yml:1:10: queues: queue 'low': weight must be at least 1, got 0"),
])
def test_queue_weight_below_one(write: Write, text: str, expected: str) -> None:
    assert yaml_error(write, text) == expected


def test_duplicate_queue(write: Write) -> None:
    message = yaml_error(write, "queues:\n  - a\n  - [b, 2]\n  - 'a,3'\n")
    assert message == "forkq.yml:4:5: queues: duplicate queue 'a'"


def test_empty_queue_list(write: Write) -> None:
    assert yaml_error(write, "queues: []\n") == "forkq.yml:1:9: queues: must not be empty"


@pytest.mark.parametrize(("text", "expected"), [
    ("concurrency: 0\n", "forkq.yml:1:14: concurrency: must be at least 1, got 0"),
    ("concurrency: -3\n", "forkq.yml:1:14: concurrency: must be at least 1, got -3"),
    ("timeout: -0.5\n", "forkq.yml:1:10: timeout: must be at least 0, got -0.5"),
    ("max_retries: -1\n", "forkq.yml:1:14: max_retries: must be at least 0, got -1"),
    ("embedded_dir: ''\n", "forkq.yml:1:15: embedded_dir: must not be empty"),
    ("log_level: loud\n",
     "forkq.yml:1:12: log_level: expected one of debug, info, warning, error; got 'loud'"),
    ("redis_url: http://h/0\n", f"forkq.yml:1:12: redis_url: {URL_KINDS}; got 'http://h/0'"),
])
def test_out_of_range(write: Write, text: str, expected: str) -> None:
    assert yaml_error(write, text) == expected


def test_missing_config_file(write: Write) -> None:
    message = error_of(lambda: load(parse("-C", "etc/nosuch.yml"), {}))
    assert message == "etc/nosuch.yml: config_file: cannot read: No such file or directory"


def test_config_path_is_a_directory(write: Write, tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    message = error_of(lambda: load(parse("-C", "etc"), {}))
    assert message == "etc: config_file: cannot read: Is a directory"


def test_config_file_not_utf8(write: Write, tmp_path: Path) -> None:
    (tmp_path / "bad.yml").write_bytes(b"tag: \xff\n")
    message = error_of(lambda: load(parse("-C", "bad.yml"), {}))
    assert message.startswith("bad.yml: config_file: cannot read: not UTF-8")


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "a list"), ("hello\n", "a scalar")])
def test_top_level_not_a_mapping(write: Write, text: str, kind: str) -> None:
    message = yaml_error(write, text)
    assert message == f"forkq.yml:1:1: (top level): expected a mapping of settings, got {kind}"


def test_unset_variable(write: Write) -> None:
    message = yaml_error(write, "concurrency: 5\nredis_url: ${REDIS_HOST_URL}\n")
    assert message == "forkq.yml:2:12: redis_url: environment variable REDIS_HOST_URL is not set"


def test_bad_reference(write: Write) -> None:
    message = yaml_error(write, "tag: ${not valid}\n")
    assert message.startswith("forkq.yml:1:6: tag: bad reference in '${not valid}'")


@pytest.mark.parametrize(("argv", "expected"), [
    (["-c", "abc"], "flag -c: concurrency: expected an integer, got 'abc'"),
    (["-c", "0"], "flag -c: concurrency: must be at least 1, got 0"),
    (["-q", "low,x"], "flag -q: queues: queue 'low': weight must be an integer, got 'x'"),
    (["-q", "a", "-q", "a,2"], "flag -q: queues: duplicate queue 'a'"),
    (["-t", "-1"], "flag -t: timeout: must be at least 0, got -1.0"),
    (["-L", "loud"], "flag -L: log_level: expected one of debug, info, warning, error; got 'loud'"),
    (["--redis-url", "localhost:6379"],
     f"flag --redis-url: redis_url: {URL_KINDS}; got 'localhost:6379'"),
])
def test_bad_flag(argv: list[str], expected: str) -> None:
    assert error_of(lambda: load(parse(*argv), {})) == expected


@pytest.mark.parametrize(("environ", "expected"), [
    ({"FORKQ_CONCURRENCY": "abc"},
     "env FORKQ_CONCURRENCY: concurrency: expected an integer, got 'abc'"),
    ({"FORKQ_STRICT": "maybe"}, "env FORKQ_STRICT: strict: expected true or false, got 'maybe'"),
    ({"FORKQ_QUEUES": "a,0"},
     "env FORKQ_QUEUES: queues: queue 'a': weight must be at least 1, got 0"),
    ({"FORKQ_TIMEOUT": "nan"}, "env FORKQ_TIMEOUT: timeout: expected a finite number, got 'nan'"),
    ({"REDIS_URL": "http://x"}, f"env REDIS_URL: redis_url: {URL_KINDS}; got 'http://x'"),
])
def test_bad_env(environ: dict[str, str], expected: str) -> None:
    assert error_of(lambda: load(parse(), environ)) == expected


def test_bad_flag_wins_over_file(write: Write) -> None:
    """A bad flag is reported even when the file is fine; flags are read first."""
    message = error_of(lambda: load_yaml(write, "concurrency: 3\n", "-c", "x"))
    assert message.startswith("flag -c: ")


# --- import_required -------------------------------------------------------------------------


@pytest.fixture
def clean_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo sys.path and sys.modules changes made by imports under test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.mark.usefixtures("clean_modules")
def test_import_module_name_from_cwd(write: Write) -> None:
    write("MARK = 'pkg'\n", "fqtest_pkg/jobs.py")
    write("", "fqtest_pkg/__init__.py")
    import_required(Config(require=("fqtest_pkg.jobs",)))
    assert sys.modules["fqtest_pkg.jobs"].MARK == "pkg"


@pytest.mark.usefixtures("clean_modules")
def test_import_file_relative_to_config_file(write: Write) -> None:
    write("MARK = 'file'\n", "etc/fqtest_file_jobs.py")
    path = write("require: fqtest_file_jobs.py\n", "etc/forkq.yml")
    import_required(load(parse("-C", path), {}))
    assert sys.modules["fqtest_file_jobs"].MARK == "file"


@pytest.mark.usefixtures("clean_modules")
def test_import_file_relative_to_cwd_without_config_file(write: Write) -> None:
    """A file in a package is imported under its dotted name, as other code imports it."""
    write("MARK = 'cwd'\n", "fqtest_app/fqtest_cwd_jobs.py")
    write("", "fqtest_app/__init__.py")
    import_required(Config(require=("fqtest_app/fqtest_cwd_jobs.py",)))
    assert sys.modules["fqtest_app.fqtest_cwd_jobs"].MARK == "cwd"
    assert "fqtest_cwd_jobs" not in sys.modules


@pytest.mark.usefixtures("clean_modules")
def test_import_file_outside_a_package_below_the_anchor_is_refused(write: Write) -> None:
    write("MARK = 'ns'\n", "fqtest_ns/fqtest_ns_jobs.py")
    message = error_of(lambda: import_required(Config(require=("fqtest_ns/fqtest_ns_jobs.py",))))
    assert message.startswith("default: require: cannot import 'fqtest_ns/fqtest_ns_jobs.py': ")
    assert "write require: fqtest_ns.fqtest_ns_jobs" in message
    assert "fqtest_ns_jobs" not in sys.modules


@pytest.mark.usefixtures("clean_modules")
def test_missing_module(write: Write) -> None:
    config = load_yaml(write, "concurrency: 5\ntag: x\n\n\nrequire: nosuch.module\n")
    message = error_of(lambda: import_required(config))
    assert message == (
        "forkq.yml:5:10: require: cannot import 'nosuch.module': No module named 'nosuch'")


@pytest.mark.usefixtures("clean_modules")
def test_missing_file(write: Write) -> None:
    config = load(parse("-r", "jobs/nosuch.py"), {})
    message = error_of(lambda: import_required(config))
    assert message.startswith("flag -r: require: cannot import 'jobs/nosuch.py': no such file ")
    assert message.endswith("jobs/nosuch.py")


@pytest.mark.usefixtures("clean_modules")
def test_exception_while_importing(write: Write) -> None:
    write("raise RuntimeError('boom')\n", "fqtest_boom.py")
    config = load(parse(), {"FORKQ_REQUIRE": "fqtest_boom.py"})
    message = error_of(lambda: import_required(config))
    assert message == (
        "env FORKQ_REQUIRE: require: cannot import 'fqtest_boom.py': RuntimeError: boom")
    assert "fqtest_boom" not in sys.modules


@pytest.mark.usefixtures("clean_modules")
def test_syntax_error_while_importing(write: Write) -> None:
    write("def broken(:\n", "fqtest_syntax.py")
    message = error_of(lambda: import_required(Config(require=("fqtest_syntax",))))
    assert message.startswith("default: require: cannot import 'fqtest_syntax': SyntaxError: ")


# -- one declaration per setting: the docs' table and etc/forkq.yml follow SETTINGS ------------


def _documented_settings() -> dict[str, tuple[str, str]]:
    """The settings table of docs/configuration.md: name -> (flag column, environment column)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    table = text.split("| setting | flag | environment | default | on HUP | meaning |", 1)[1]
    rows: dict[str, tuple[str, str]] = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip("|"))  # a cell may hold an escaped \|
        name, flag, env = (cell.strip() for cell in cells[:3])
        rows[name.strip("`")] = (flag, env)
    return rows


def test_the_documented_table_lists_every_setting_with_its_flag_and_variable() -> None:
    rows = _documented_settings()
    assert list(rows) == [s.name for s in SETTINGS]
    none = "\N{EN DASH}"  # the table's "not given"
    for row, (flag, env) in rows.items():
        setting = next(s for s in SETTINGS if s.name == row)
        assert env.startswith(f"`{setting.variable}`") if setting.variable else env == none, row
        assert flag.startswith(f"`{setting.flags[0]}`") if setting.flags else flag == none, row


def test_the_documented_table_is_the_one_rendered_from_settings() -> None:
    """The committed table is what docs/hooks.py renders: run it after changing a setting."""
    hooks = docs_hooks()
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert hooks.committed_table(page) == hooks.settings_table(), (
        "docs/configuration.md's settings table is stale: run .venv/bin/python docs/hooks.py")


def test_the_example_file_shows_every_file_setting() -> None:
    text = (ROOT / "etc" / "forkq.yml").read_text()
    shown = {line.lstrip("# ").split(":", 1)[0] for line in text.splitlines()
             if re.match(r"^(# )?[a-z_]+:", line)}
    assert shown == {s.name for s in SETTINGS if s.in_file}
    load_file(str(ROOT / "etc" / "forkq.yml"), {"REDIS_URL": "redis://127.0.0.1:1/0"})


def test_every_setting_declares_its_reload_and_variable() -> None:
    assert {s.reload for s in SETTINGS} == {"restart", "master", "scheduler", "children"}
    derived = [s for s in SETTINGS if s.env == ""]
    assert all(s.variable == f"FORKQ_{s.name.upper()}" for s in derived)
    assert {s.name: s.variable for s in SETTINGS if s.env != ""} == {
        "periodic": None, "durability": None, "environment": "FORKQ_ENV",
        "config_file": "FORKQ_CONFIG"}  # durability: FORKQ_DURABILITY_* (forkq.durability)
