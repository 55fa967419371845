"""Lua scripts for every multi-key state change; each file's header is its contract."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def source(name: str) -> str:
    """The text of ``forkq/scripts/<name>.lua``."""
    return resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
