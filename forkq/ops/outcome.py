"""What an operator command hands back to :mod:`forkq.cli`: an :class:`Outcome` (the data
printed with ``--json``, the text printed otherwise, the messages for stderr and the exit
status). Shared by :mod:`forkq.ops.commands` and :mod:`forkq.ops.workflows`; no I/O."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from forkq.errors import EXIT_FAILURE, EXIT_OK
from forkq.printable import printable


@dataclass
class Outcome:
    """What a command prints and how it exits."""

    data: dict[str, Any]
    text: str
    code: int = EXIT_OK
    errors: list[str] = field(default_factory=list)


Command = Callable[[redis.Redis, argparse.Namespace], Outcome]


def failed(code: int, message: str, **data: Any) -> Outcome:
    """An outcome that only reports ``message`` (on stderr; under ``error`` with --json)."""
    return Outcome({"error": message, **data}, "", code, [message])


def damaged(names: list[str]) -> tuple[int, list[str]]:
    """The exit status and stderr notes of a reading that skipped ``names`` (another type):
    1 when there is any (what is shown is right, but incomplete)."""
    notes = [f"key {printable(name)!r} holds another type; skipped" for name in names]
    return (EXIT_FAILURE if names else EXIT_OK), notes
