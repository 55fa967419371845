"""Lifecycle hooks the application registers at import time.

``on_child_boot(fn)``: called in each processor child after its setup, before
its first fetch; an exception in one is a boot failure (the child exits, the
master respawns it with backoff and gives up after repeated failures).

``on_child_exit(fn)``: called in a child that stops normally (quiet stop,
recycling), after its last job; not after a SIGKILL. An exception in one is
logged and does not stop the others. Hooks take no arguments.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Hook = Callable[[], None]

_hooks: dict[str, list[Hook]] = {"child_boot": [], "child_exit": []}


def on_child_boot(fn: Hook) -> Hook:
    """Register ``fn`` to run in every child after fork (usable as a decorator)."""
    _hooks["child_boot"].append(fn)
    return fn


def on_child_exit(fn: Hook) -> Hook:
    """Register ``fn`` to run in every child that stops normally (usable as a decorator)."""
    _hooks["child_exit"].append(fn)
    return fn


def run(event: str, *, strict: bool = False) -> None:
    """Run the hooks of ``event`` in registration order; ``strict``: the first exception stops."""
    for fn in _hooks[event]:
        try:
            fn()
        except Exception:
            if strict:
                raise
            log.exception("%s hook %r failed", event, fn)
