"""HUP: what a new configuration changes, and what can change without a restart.

Pure functions over two :class:`~forkq.config.Config` values; the supervisor
acts on the result. Each setting declares what a reload does with it
(:attr:`forkq.config.Setting.reload`): a reload takes every setting from the new
file except ``restart`` ones, which keep their running value (with a warning),
because changing them means a new Redis connection, new code, or a new log or
pid file. ``master`` settings apply at once; a change to a ``scheduler`` setting
replaces the scheduler child only; a change to a ``children`` setting retires
every child after its current job, and its replacement starts with the new
configuration.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from forkq.config import SETTINGS, Config, Reload


def _declared(kind: Reload) -> frozenset[str]:
    return frozenset(setting.name for setting in SETTINGS if setting.reload == kind)


RESTART_ONLY = _declared("restart")
MASTER_ONLY = _declared("master")
SCHEDULER_ONLY = _declared("scheduler")


def changes(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """Setting name → (old value, new value) for every setting that differs."""
    found = {}
    for f in fields(Config):
        if f.name != "origins" and getattr(old, f.name) != getattr(new, f.name):
            found[f.name] = (getattr(old, f.name), getattr(new, f.name))
    return found


def merge(old: Config, new: Config) -> tuple[Config, list[str]]:
    """The configuration to run after a reload, and the restart-only changes it ignored."""
    ignored = sorted(name for name in changes(old, new) if name in RESTART_ONLY)
    kept = {name: getattr(old, name) for name in ignored}
    return replace(new, **kept), ignored


def needs_new_children(diff: dict[str, tuple[Any, Any]]) -> bool:
    """Whether the running children must be replaced for ``diff`` to take effect."""
    return any(name not in MASTER_ONLY | SCHEDULER_ONLY for name in diff)


def needs_new_scheduler(diff: dict[str, tuple[Any, Any]]) -> bool:
    """Whether the scheduler child must be replaced (it hands over and a new one campaigns)."""
    return any(name not in MASTER_ONLY for name in diff)


def describe(diff: dict[str, tuple[Any, Any]]) -> str:
    """``queues: critical:3, low:1 -> critical:1, low:3; concurrency: 2 -> 5``."""
    return "; ".join(f"{name}: {_show(name, old)} -> {_show(name, new)}"
                     for name, (old, new) in diff.items())


def _show(name: str, value: Any) -> str:
    if name == "queues":
        return ", ".join(f"{queue}:{weight}" for queue, weight in value)
    if name == "periodic":
        return "[" + ", ".join(f"{entry.name} ({entry.cron})" for entry in value) + "]"
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)
