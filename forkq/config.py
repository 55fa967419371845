"""Settings: declared once in :data:`SETTINGS`, read from flags, environment and YAML into a Config.

Precedence, highest first. A setting is taken whole from the first source that gives it: ``-q``
flags replace the file's queue list rather than merge into it.

1. command-line flag (``-c 10``; see :func:`add_flags`)
2. ``FORKQ_*`` environment variable (``FORKQ_CONCURRENCY=10``); an empty variable counts as unset.
   A setting given by 1 or 2 is not failed by an unset ``${VAR}`` in its file value (the file
   value is not used): ``FORKQ_REDIS_URL`` wins over ``redis_url: ${REDIS_URL}``
3. the YAML file (``-C``, else ``FORKQ_CONFIG``; none if neither), whose environment section
   (``-e`` / ``FORKQ_ENV``) overrides its top level
4. ``REDIS_URL`` environment variable, for ``redis_url`` only
5. built-in default (the field defaults of :class:`Config`); ``strict`` defaults to true exactly
   when every queue weight is 1

YAML keys may be spelled ``concurrency:`` or Sidekiq's ``:concurrency:``. String scalars may hold
``${VAR}`` or ``${VAR:-default}`` (the default is used when VAR is unset or empty). Text from
outside YAML (a flag, an environment variable, an interpolated scalar) is read as a plain YAML
scalar by a setting that wants a number or bool, so ``concurrency: ${N}`` with N=8 gives 8.

Invariants: a Config from :func:`load` or :func:`load_file` has passed every check in SETTINGS, and
its ``origins`` say where each non-default value came from. Every failure is a :class:`ConfigError`
whose one-line message is ``<where>: <setting>: <problem>``, ``<where>`` being ``file:line:col``
(1-based), ``flag -c`` or ``env FORKQ_CONCURRENCY``. No Redis keys are touched here.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml
from yaml.constructor import SafeConstructor

from forkq import durability, file_modules
from forkq.cron import Periodic, read_entries
from forkq.durability import Durability
from forkq.errors import ConfigError
from forkq.setting_values import (
    BOOL,
    FLOAT,
    INT,
    LOG_LEVELS,
    LOWER,
    QUEUES,
    STR,
    STRING_OR_LIST,
    STRINGS,
    InvalidError,
    Kind,
    Text,
    accept,
    at_least,
    between,
    check_queues,
    check_redis_url,
    check_utf8,
    not_empty,
    one_of,
)

PERIODIC = Kind("list of periodic jobs", read_entries)


def _read_durability(value: object) -> Durability:
    try:
        return durability.read(value)
    except ValueError as exc:
        raise InvalidError(str(exc)) from None


DURABILITY = Kind("durability mapping", _read_durability)
LOG_FORMATS = ("text", "json")
"""The values of ``log_format``: :mod:`forkq.daemon.logs` writes a line of text or a JSON object."""


@dataclass(frozen=True)
class Config:
    """A validated, immutable configuration, built by :func:`load`. Equality ignores origins."""

    concurrency: int = 5
    timeout: float = 25.0
    queues: tuple[tuple[str, int], ...] = (("default", 1),)
    strict: bool = True
    require: tuple[str, ...] = ()
    redis_url: str = "redis://127.0.0.1:6379/0"
    tag: str = ""
    labels: tuple[str, ...] = ()
    max_retries: int = 25
    embedded_dir: str = ".forkq"
    log_level: str = "info"
    log_format: str = "text"
    job_timeout: float = 0.0
    cancel_grace: float = 5.0
    liveness_timeout: float = 30.0
    host_failover: float = 15.0
    max_memory_mb: int = 0
    max_jobs: int = 0
    fetch_batch: int = 16
    async_concurrency: int = 1
    log_file: str = ""
    pid_file: str = ""
    opentelemetry: bool = False
    durability: Durability | None = None
    scheduler: bool = True
    leader_lease_ttl: float = 10.0
    leader_renew_interval: float = 2.0
    orphan_sweep_interval: float = 5.0
    periodic: tuple[Periodic, ...] = ()
    periodic_grace: float = 60.0
    environment: str = ""
    config_file: str | None = None
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)

    def origin(self, name: str) -> str:
        """Where ``name`` came from: ``"etc/forkq.yml:3:14"``, ``"flag -c"``, ``"default"``..."""
        return self.origins.get(name, "default")


Reload = Literal["restart", "master", "scheduler", "children"]
"""What a HUP does with a changed setting: ``restart`` keeps the running value (it needs a new
connection, new code, or a new log or pid file); ``master`` applies at once (the master alone
uses it); ``scheduler`` replaces the scheduler child; ``children`` retires every child after its
job (and replaces the scheduler too)."""


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One setting, declared once: its value kind and check, its documentation, how a reload
    treats it, its flags and its environment variable.

    The variable is ``FORKQ_<NAME>`` unless ``env`` names another (or is None: no variable).
    ``repeat`` flags may be given several times; their items accumulate. ``in_file`` is false for
    the two settings that choose the file and its section. Text must be UTF-8 (it reaches
    Redis, job payloads, process titles and logs) except in a ``path`` setting, which holds
    file system paths: any bytes the system allows. The argparse attribute is argparse's
    default ``dest`` for the long flag (``--log-level`` -> ``log_level``). The default is the
    field default of :class:`Config`.
    """

    name: str
    kind: Kind
    doc: str
    reload: Reload
    env: str | None = ""
    flags: tuple[str, ...] = ()
    check: Callable[[Any], None] = accept
    metavar: str | None = None
    repeat: bool = False
    in_file: bool = True
    path: bool = False

    @property
    def variable(self) -> str | None:
        """The environment variable that gives this setting, if any."""
        return f"FORKQ_{self.name.upper()}" if self.env == "" else self.env

    @property
    def default(self) -> object:
        """The built-in default: the field default of :class:`Config`."""
        return _DEFAULTS[self.name]

    @property
    def dest(self) -> str:
        return self.flags[-1].lstrip("-").replace("-", "_")


SETTINGS: tuple[Setting, ...] = (
    Setting(name="concurrency", kind=INT, doc="processor children", reload="master",
            flags=("-c", "--concurrency"), check=at_least(1), metavar="N"),
    Setting(name="timeout", kind=FLOAT, doc="graceful-stop deadline, seconds", reload="master",
            flags=("-t", "--timeout"), check=at_least(0), metavar="SECONDS"),
    Setting(name="queues", kind=QUEUES, reload="children",
            doc="queues and weights; weight 3 is tried 3 times as often as weight 1",
            flags=("-q", "--queue"), check=check_queues, metavar="NAME[,WEIGHT]", repeat=True),
    Setting(name="strict", kind=BOOL, reload="children",
            doc="strict priority order, never weights (default: if all weights are 1)"),
    Setting(name="require", kind=STRING_OR_LIST, reload="restart",
            doc="modules or .py files the master imports before forking",
            flags=("-r", "--require"), metavar="MODULE|FILE", repeat=True, path=True),
    Setting(name="redis_url", kind=STR, reload="restart",
            doc="redis://, rediss://, unix://, redis+sentinel:// (sentinel://) URL or "
                "'embedded'; else REDIS_URL",
            flags=("--redis-url",), check=check_redis_url, metavar="URL"),
    Setting(name="tag", kind=STR, doc="tag shown in process titles", reload="children",
            flags=("-g", "--tag"), metavar="TAG"),
    Setting(name="labels", kind=STRINGS, doc="labels shown with the process", reload="master"),
    Setting(name="max_retries", kind=INT, doc="attempts for jobs with retry: true",
            reload="children", check=at_least(0)),
    Setting(name="embedded_dir", kind=STR, reload="restart",
            doc="data directory of the embedded server (redis_url: embedded)", check=not_empty,
            path=True),
    Setting(name="log_level", kind=LOWER, doc=" | ".join(LOG_LEVELS), reload="children",
            flags=("-L", "--log-level"), check=one_of(LOG_LEVELS), metavar="LEVEL"),
    Setting(name="log_format", kind=LOWER, doc=" | ".join(LOG_FORMATS), reload="restart",
            flags=("--log-format",), check=one_of(LOG_FORMATS), metavar="FORMAT"),
    Setting(name="job_timeout", kind=FLOAT, reload="master",
            doc="hard limit on one job's run time, seconds; 0 = none", check=at_least(0)),
    Setting(name="cancel_grace", kind=FLOAT, reload="master",
            doc="seconds a cancelled running job has to stop on its own (it sees "
            "forkq.cancel_requested()) before its processor is killed; 0 = kill at once",
            flags=("--cancel-grace",), check=at_least(0), metavar="SECONDS"),
    Setting(name="liveness_timeout", kind=FLOAT, reload="master",
            doc="cull a processor whose heartbeat is older, seconds", check=at_least(10)),
    Setting(name="host_failover", kind=FLOAT, reload="children",
            doc="the jobs of a daemon whose host stopped, froze or was cut off run again "
            "elsewhere within this, seconds; a daemon silent for 2/3 of it gives up its jobs",
            check=at_least(6)),
    Setting(name="max_memory_mb", kind=INT, reload="children",
            doc="recycle a processor above this RSS after its job; 0 = none", check=at_least(0)),
    Setting(name="max_jobs", kind=INT, reload="children",
            doc="recycle a processor after this many jobs; 0 = none", check=at_least(0)),
    Setting(name="fetch_batch", kind=INT, reload="children",
            doc="jobs a processor may take in one fetch from a deep queue; 1 = one at a time",
            check=between(1, 100)),
    Setting(name="async_concurrency", kind=INT, reload="children",
            doc="jobs one processor runs at once (coroutine jobs share its event loop); "
            "1 = one at a time", check=between(1, 1000)),
    Setting(name="log_file", kind=STR, reload="restart",
            doc="append log lines to this file (reopened on USR2); default stderr",
            flags=("--logfile",), metavar="PATH", path=True),
    Setting(name="pid_file", kind=STR, doc="write the master's pid to this file",
            reload="restart", flags=("-P", "--pidfile"), metavar="PATH", path=True),
    Setting(name="opentelemetry", kind=BOOL, reload="restart",
            doc="trace every job's run with OpenTelemetry (forkq[otel]), through the tracer "
            "provider the require modules set up"),
    Setting(name="durability", kind=DURABILITY, reload="restart", env=None,
            doc="what a push with durable=True waits for: {replicas: N, fsync: BOOL, "
            "timeout: SECONDS}; default FORKQ_DURABILITY_* (1 replica, 1 s)"),
    Setting(name="scheduler", kind=BOOL, reload="scheduler",
            doc="fork a scheduler that campaigns to lead the cluster's scheduling"),
    Setting(name="leader_lease_ttl", kind=FLOAT, reload="scheduler",
            doc="the leader's lease, seconds: a dead leader is replaced within this",
            check=at_least(2)),
    Setting(name="leader_renew_interval", kind=FLOAT, reload="scheduler",
            doc="how often the leader renews its lease, seconds; at most half of "
            "leader_lease_ttl", check=at_least(0.1)),
    Setting(name="orphan_sweep_interval", kind=FLOAT, reload="scheduler",
            doc="how often the leader looks for jobs held by dead processes, seconds",
            check=at_least(0.5)),
    Setting(name="periodic", kind=PERIODIC, reload="scheduler", env=None,
            doc="periodic (cron) jobs: name, cron, class, args, queue, timezone, missed"),
    Setting(name="periodic_grace", kind=FLOAT, reload="scheduler",
            doc="a periodic tick not enqueued this many seconds after its time counts as "
            "missed; at least leader_lease_ttl", check=at_least(0)),
    Setting(name="environment", kind=STR, doc="environment section of the YAML to apply",
            reload="restart", env="FORKQ_ENV", flags=("-e", "--environment"), metavar="ENV",
            in_file=False),
    Setting(name="config_file", kind=STR, doc="YAML config file", reload="restart",
            env="FORKQ_CONFIG", flags=("-C", "--config"), metavar="PATH", in_file=False,
            path=True),
)
_BY_NAME = {setting.name: setting for setting in SETTINGS}
_DEFAULTS = {f.name: f.default for f in fields(Config)}
# Top-level YAML keys whose mapping value is an environment section rather than a setting.
ENVIRONMENT_SECTIONS = frozenset({"development", "test", "staging", "production"})
REDIS_URL_FALLBACK = "REDIS_URL"

_Layer = dict[str, tuple[object, str]]  # setting name -> (value, where it came from)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for each setting that has one; all default to None, meaning 'not given'."""
    for setting in SETTINGS:
        if setting.flags:
            env = f" (env {setting.variable})" if setting.variable else ""
            parser.add_argument(*setting.flags, default=None, metavar=setting.metavar,
                                action="append" if setting.repeat else "store",
                                help=f"{setting.doc}{env}")


CONNECTION_SETTINGS = ("config_file", "environment", "redis_url")


def add_connection_flags(parser: argparse.ArgumentParser) -> None:
    """Only the flags that say where Redis is (``-C``, ``-e``, ``--redis-url``): the operator's
    commands read the same file and variables as the daemon to find it."""
    add_setting_flags(parser, CONNECTION_SETTINGS)


def add_setting_flags(parser: argparse.ArgumentParser, names: Sequence[str]) -> None:
    """The flags of the settings ``names``, as ``run`` has them."""
    for setting in SETTINGS:
        if setting.name in names:
            env = f" (env {setting.variable})" if setting.variable else ""
            parser.add_argument(*setting.flags, default=None, metavar=setting.metavar,
                                action="append" if setting.repeat else "store",
                                help=f"{setting.doc}{env}")


def load(args: argparse.Namespace, environ: Mapping[str, str]) -> Config:
    """Build a Config from flags, ``FORKQ_*`` variables, the YAML file and defaults (module doc)."""
    flags, env = _flag_layer(args), _env_layer(environ)
    path = _first("config_file", flags, env)
    environment = _first("environment", flags, env)
    given = frozenset(flags) | frozenset(env)
    file = _file_layer(str(path), environ, str(environment or ""), given) if path else {}
    return _build([flags, env, file, _fallback_layer(environ)])


def load_file(path: str, environ: Mapping[str, str], *, environment: str = "") -> Config:
    """Build a Config from one YAML file, ``REDIS_URL`` and defaults; ``FORKQ_*`` are not read."""
    given: _Layer = {"config_file": (path, "caller")}
    if environment:
        given["environment"] = (environment, "caller")
    return _build([given, _file_layer(path, environ, environment), _fallback_layer(environ)])


def _first(name: str, *layers: _Layer) -> object:
    return next((layer[name][0] for layer in layers if name in layer), None)


def _build(layers: Sequence[_Layer]) -> Config:
    """Take each setting from the first layer having it; derive ``strict``; absolutize the path."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for setting in SETTINGS:
        found = next((layer[setting.name] for layer in layers if setting.name in layer), None)
        if found is not None:
            values[setting.name], origins[setting.name] = found
    if "strict" not in values:
        values["strict"] = all(weight == 1 for _, weight in values.get("queues", Config.queues))
    if values.get("config_file"):
        values["config_file"] = os.path.abspath(values["config_file"])
    built = Config(**values, origins=MappingProxyType(origins))
    _check_together(built)
    return built


def _check_together(config: Config) -> None:
    """Checks across settings (a leader hand-off must not count as a missed periodic tick)."""
    if config.leader_renew_interval * 2 > config.leader_lease_ttl:
        _conflict(config, "leader_renew_interval", "must be at most half of", "leader_lease_ttl")
    if config.periodic_grace < config.leader_lease_ttl:
        _conflict(config, "periodic_grace", "must be at least", "leader_lease_ttl")


def _conflict(config: Config, name: str, relation: str, other: str) -> None:
    """Raise for two settings that disagree, at the position of the one that was given."""
    blamed = name if config.origin(name) != "default" else other
    raise ConfigError(f"{config.origin(blamed)}: {blamed}: {name} ({getattr(config, name):g}s) "
                      f"{relation} {other} ({getattr(config, other):g}s)")


def _from_texts(setting: Setting, texts: list[str], where: str) -> object:
    split = setting.kind.split
    raw = [Text(item) for text in texts for item in split(text)] if split else Text(texts[0])
    try:
        value = setting.kind.read(raw)
        if not setting.path:
            check_utf8(value)
        setting.check(value)
    except InvalidError as exc:
        raise ConfigError(f"{where}: {setting.name}: {exc.problem}") from None
    return value


def _flag_layer(args: argparse.Namespace) -> _Layer:
    layer: _Layer = {}
    for setting in SETTINGS:
        raw = getattr(args, setting.dest, None) if setting.flags else None
        if raw is not None:
            where = f"flag {setting.flags[0]}"
            texts = list(raw) if setting.repeat else [raw]
            layer[setting.name] = (_from_texts(setting, texts, where), where)
    return layer


def _env_layer(environ: Mapping[str, str], variables: Mapping[str, str | None] | None = None,
               ) -> _Layer:
    """Settings from ``variables`` (setting -> variable; by default each setting's ``env``)."""
    layer: _Layer = {}
    for name, var in (variables or {s.name: s.variable for s in SETTINGS}).items():
        text = environ.get(var) if var else None
        if text:
            where = f"env {var}"
            layer[name] = (_from_texts(_BY_NAME[name], [text], where), where)
    return layer


def _fallback_layer(environ: Mapping[str, str]) -> _Layer:
    return _env_layer(environ, {"redis_url": REDIS_URL_FALLBACK})


@dataclass(frozen=True)
class _File:
    """A YAML file being read: its path as the user gave it, and the environment to interpolate."""

    path: str
    environ: Mapping[str, str]
    overridden: frozenset[str] = frozenset()  # settings a flag or FORKQ_* variable gives
    constructor: SafeConstructor = field(default_factory=SafeConstructor)

    def where(self, node: yaml.Node) -> str:
        return f"{self.path}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def error(self, node: yaml.Node, setting: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.where(node)}: {setting}: {problem}")


def _file_layer(path: str, environ: Mapping[str, str], environment: str,
                overridden: frozenset[str] = frozenset()) -> _Layer:
    """The settings a YAML file gives, its ``environment`` section applied over its top level.

    A setting in ``overridden`` (given by a flag or a ``FORKQ_*`` variable) whose value names an
    unset ``${VAR}`` is left out instead of failing: ``FORKQ_REDIS_URL`` wins over
    ``redis_url: ${REDIS_URL}`` with REDIS_URL unset. Every other problem is still an error.
    """
    file = _File(path, environ, overridden)
    root = _compose(path)
    if root is None or root.tag == "tag:yaml.org,2002:null":
        return {}
    if not isinstance(root, yaml.MappingNode):
        kind = "a list" if isinstance(root, yaml.SequenceNode) else "a scalar"
        raise file.error(root, "(top level)", f"expected a mapping of settings, got {kind}")
    entries, sections = _entries(file, root, environment)
    for name, section in sections.items():
        nested, _ = _entries(file, section, None)  # every section's keys are checked, one applied
        if name == environment:
            entries.update(nested)
    layer: _Layer = {}
    for name, node in entries.items():
        try:
            layer[name] = (_file_value(file, name, node), file.where(node))
        except _UnsetVariableError:  # raised only for an overridden setting
            continue
    return layer


def _compose(path: str) -> yaml.Node | None:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: config_file: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: config_file: cannot read: not UTF-8 ({exc.reason})") from None
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        raise ConfigError(f"{where}: (syntax): {exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:  # a control character; it has an offset, not a mark
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        problem = str(exc).split("\n")[0]
        raise ConfigError(f"{path}:{line}:{column}: (syntax): {problem}") from None


def _entries(
    file: _File, mapping: yaml.MappingNode, environment: str | None
) -> tuple[dict[str, yaml.Node], dict[str, yaml.MappingNode]]:
    """Split a mapping into setting -> value node and, at top level, section name -> mapping.

    ``environment`` is None inside a section: sections do not nest. Raises on unknown or repeated
    keys.
    """
    entries: dict[str, yaml.Node] = {}
    sections: dict[str, yaml.MappingNode] = {}
    for key_node, value in mapping.value:
        scalar = isinstance(key_node, yaml.ScalarNode)
        key = str(key_node.value).removeprefix(":") if scalar else "?"
        if key in entries or key in sections:
            raise file.error(key_node, key, "given twice in the same mapping")
        if environment is not None and isinstance(value, yaml.MappingNode) and (
                key in ENVIRONMENT_SECTIONS or key == environment):
            sections[key] = value
        else:
            _check_key(file, key_node, key)
            entries[key] = value
    return entries, sections


def _check_key(file: _File, key_node: yaml.Node, key: str) -> None:
    setting = _BY_NAME.get(key)
    if setting is not None and not setting.in_file:
        raise file.error(key_node, key, f"not read from the file; use {setting.flags[0]} or "
                         f"{setting.variable}")
    if setting is None:
        known = [s.name for s in SETTINGS if s.in_file]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
        raise file.error(key_node, key, f"unknown setting; {hint}")


def _file_value(file: _File, name: str, node: yaml.Node) -> object:
    setting = _BY_NAME[name]
    try:
        value = setting.kind.read(_construct(file, name, node))
        if not setting.path:
            check_utf8(value)
        setting.check(value)
    except _UnsetVariableError:
        raise
    except InvalidError as exc:
        raise file.error(_locate(node, exc.path), name, exc.problem) from None
    return value


def _construct(file: _File, name: str, node: yaml.Node) -> object:
    """The Python value of ``node``, with ``${VAR}`` interpolated in string scalars."""
    if isinstance(node, yaml.SequenceNode):
        return [_construct(file, name, item) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        return {str(key.value): _construct(file, name, value) for key, value in node.value}
    try:
        value = file.constructor.construct_object(node)
        if isinstance(value, str) and "${" in value:
            return Text(_interpolate(value, file.environ))
    except yaml.MarkedYAMLError as exc:  # an explicit tag such as !!binary that does not fit
        raise file.error(node, name, str(exc.problem)) from None
    except ValueError as exc:  # a timestamp-looking scalar that is no date, e.g. 2024-13-45
        raise file.error(node, name, f"cannot read the value: {exc}") from None
    except _UnsetVariableError as exc:
        if name in file.overridden:
            raise
        raise file.error(node, name, exc.problem) from None
    except InvalidError as exc:
        raise file.error(node, name, exc.problem) from None
    return value


class _UnsetVariableError(InvalidError):
    """``${VAR}`` names an unset variable and gives no default."""


_REFERENCE = re.compile(r"\$\{(?:([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\})?")


def _interpolate(text: str, environ: Mapping[str, str]) -> str:
    """Replace ``${VAR}`` and ``${VAR:-default}`` (the default when VAR is unset or empty)."""

    def replace(match: re.Match[str]) -> str:
        var, default = match.group(1), match.group(2)
        if var is None:
            raise InvalidError(f"bad reference in {text!r}; write ${{VAR}} or ${{VAR:-default}}")
        if environ.get(var) or (var in environ and default is None):
            return environ[var]
        if default is None:
            raise _UnsetVariableError(f"environment variable {var} is not set")
        return default[2:]

    return _REFERENCE.sub(replace, text)


def _locate(node: yaml.Node, path: tuple[int, ...]) -> yaml.Node:
    """The node ``path`` indexes into through nested sequences, as far as it goes."""
    for index in path:
        if not isinstance(node, yaml.SequenceNode) or index >= len(node.value):
            break
        node = node.value[index]
    return node


def import_required(config: Config) -> None:
    """Import every ``require`` entry, in order, into this process.

    A path (ending in ``.py`` or containing ``/``) is relative to the config file's directory,
    else the current one, and is imported under the dotted name other code imports it by
    (``myapp/tasks.py`` in package ``myapp`` is module ``myapp.tasks``; a form whose name is
    ambiguous is refused with a hint: :mod:`forkq.file_modules`), so job names do not depend
    on how the module was named. Anything else is a module name, imported with the current
    directory on ``sys.path`` (as under ``python -m``). Raises ConfigError naming the entry
    and where ``require`` was set.
    """
    base = os.path.dirname(config.config_file) if config.config_file else os.getcwd()
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for entry in config.require:
        try:
            if entry.endswith(".py") or "/" in entry:
                file_modules.import_file(os.path.join(base, entry), (base,))
            else:
                importlib.import_module(entry)
        # The boundary with user code: whatever its import raises is a configuration failure.
        except (Exception, SystemExit) as exc:
            why = str(exc) if isinstance(exc, ImportError) else f"{type(exc).__name__}: {exc}"
            raise ConfigError(f"{config.origin('require')}: require: cannot import {entry!r}: "
                              f"{' '.join(why.split())}") from exc
