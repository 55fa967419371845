"""Setting value kinds: how a raw value (YAML node, flag text, environment text) becomes a typed
setting value, and the checks applied to it. Pure functions; no I/O, no Redis.

A kind's ``read`` raises :class:`InvalidError` with a problem sentence (and, for values inside
YAML sequences, the index path to the offending item); :mod:`forkq.config` turns that into a
:class:`~forkq.errors.ConfigError` naming the setting and the position.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from forkq import redis_url
from forkq.wirejson import is_utf8


class InvalidError(Exception):
    """A value is wrong. ``path`` indexes nested YAML sequences down to the offending item."""

    def __init__(self, problem: str, path: tuple[int, ...] = ()) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path = path


class Text(str):
    """Text from a flag, an environment variable or ``${VAR}``, not yet typed by YAML."""


# The stubs leave Resolver.resolve untyped; binding it here keeps the calls below type-checked.
_resolve: Callable[..., str] = Resolver().resolve


def scalar(value: object) -> object:
    """Type :class:`Text` as a plain YAML scalar would be typed; other values pass through."""
    if not isinstance(value, Text):
        return value
    text = value.strip()
    node = yaml.ScalarNode(_resolve(yaml.ScalarNode, text, (True, False)), text)
    return SafeConstructor().construct_object(node)


def check_utf8(value: object, path: tuple[int, ...] = ()) -> None:
    """InvalidError, at the item, when any text in ``value`` (through sequences, mappings and
    dataclass fields) is not UTF-8: Python reads bytes that are not UTF-8 from the
    environment and the command line as lone surrogates, which Redis commands, JSON payloads
    and logs cannot carry. A setting is checked once, as it is read."""
    if isinstance(value, str):
        if not is_utf8(value):
            raise InvalidError(f"expected UTF-8 text, got {value!r} (bytes that are not "
                               "UTF-8)", path)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_utf8(item, (*path, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            check_utf8(key, path)
            check_utf8(item, path)
    elif is_dataclass(value) and not isinstance(value, type):
        for item in fields(value):
            check_utf8(getattr(value, item.name), path)


def show(value: object) -> str:
    """A bad value as a message shows it, in YAML's words."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "a mapping"
    return repr(str(value)) if isinstance(value, str) else str(value)


def _yaml_int(value: object) -> int:
    value = scalar(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidError(f"expected an integer, got {show(value)}")
    return value


def _yaml_float(value: object) -> float:
    number = scalar(value)
    if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
        raise InvalidError(f"expected a finite number, got {show(number)}")
    return float(number)


def _yaml_bool(value: object) -> bool:
    if isinstance(value, Text) and value.strip() in ("1", "0"):  # 1/0: ints to YAML, bools in env
        return value.strip() == "1"
    value = scalar(value)
    if not isinstance(value, bool):
        raise InvalidError(f"expected true or false, got {show(value)}")
    return value


def _yaml_str(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidError(f"expected a string, got {show(value)}")
    return str(value)


def _yaml_strings(value: object, *, single: bool) -> tuple[str, ...]:
    """A list of non-empty strings; a lone string too when ``single``."""
    if single and isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        wanted = "a string or a list of strings" if single else "a list of strings"
        raise InvalidError(f"expected {wanted}, got {show(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise InvalidError(f"expected a non-empty string, got {show(item)}", (index,))
    return tuple(str(item) for item in value)


def _queue(name: object, weight: object, index: int) -> tuple[str, int]:
    """One queue: a name without spaces or commas, and a weight of at least 1."""
    if not isinstance(name, str) or not name or re.search(r"[\s,]", name):
        raise InvalidError(f"expected a queue name without spaces or commas, got {show(name)}",
                            (index,))
    try:
        number = _yaml_int(weight)
    except InvalidError:
        raise InvalidError(f"queue {name!r}: weight must be an integer, got {show(weight)}",
                            (index, 1)) from None
    if number < 1:
        raise InvalidError(f"queue {name!r}: weight must be at least 1, got {number}", (index, 1))
    return str(name), number


def _yaml_queues(value: object) -> tuple[tuple[str, int], ...]:
    """Items ``name``, ``"name,weight"``, ``[name]`` or ``[name, weight]``; weight defaults to 1."""
    if not isinstance(value, list):
        raise InvalidError(f"expected a list of queues, got {show(value)}")
    queues = []
    for index, given in enumerate(value):
        item = given
        if isinstance(given, str):
            name, comma, weight = given.partition(",")
            item = [name.strip(), Text(weight)] if comma else [given.strip()]
        if not isinstance(item, list) or len(item) not in (1, 2):
            wanted = "name, [name, weight] or 'name,weight'"
            raise InvalidError(f"expected {wanted}; got {show(item)}", (index,))
        queues.append(_queue(item[0], item[-1] if item[1:] else 1, index))
    return tuple(queues)


@dataclass(frozen=True)
class Kind:
    """How one type of value is read. ``read`` takes the parsed YAML value (flag and environment
    text arrive as :class:`Text`, lists split by ``split``) and returns the typed value."""

    doc: str
    read: Callable[[object], object]
    split: Callable[[str], list[str]] | None = None


def _commas(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


INT = Kind("integer", _yaml_int)
FLOAT = Kind("number", _yaml_float)
BOOL = Kind("true/false", _yaml_bool)
STR = Kind("string", _yaml_str)
LOWER = Kind("string", lambda value: _yaml_str(value).strip().lower())
STRINGS = Kind("list of strings", lambda value: _yaml_strings(value, single=False), _commas)
STRING_OR_LIST = Kind("string or list", lambda value: _yaml_strings(value, single=True), _commas)
QUEUES = Kind("list of name or [name, weight]", _yaml_queues,
              lambda text: [item for item in re.split(r"[\s;]+", text) if item])
LOG_LEVELS = ("debug", "info", "warning", "error")


def accept(value: Any) -> None:
    """The check of a setting whose kind already says everything."""


def at_least(low: float) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value < low:
            raise InvalidError(f"must be at least {low}, got {value}")

    return check


def between(low: float, high: float) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if not low <= value <= high:
            raise InvalidError(f"must be between {low} and {high}, got {value}")

    return check


def one_of(choices: Sequence[str]) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value not in choices:
            raise InvalidError(f"expected one of {', '.join(choices)}; got {value!r}")

    return check


def not_empty(value: Any) -> None:
    if not value:
        raise InvalidError("must not be empty")


def check_queues(queues: Any) -> None:
    not_empty(queues)
    names = [name for name, _ in queues]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise InvalidError(f"duplicate queue {name!r}", (index,))


def check_redis_url(url: Any) -> None:
    if url == "embedded":
        return
    try:
        redis_url.check(str(url))
    except ValueError as exc:
        raise InvalidError(str(exc)) from None
