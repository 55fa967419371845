"""Lua scripts for every multi-key state change; each file's header is its contract.

Every script is served with ``guard.lua`` in front: the helpers with which a script checks
the type of each key it will write before its first write (Redis keeps a failed script's
earlier writes), so a key of the wrong type makes it refuse, naming the key, and change
nothing. ``workflow.lua`` follows it: the bookkeeping of batches and chains that the
scripts ending a job's run do in the same step.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis
from redis.commands.core import Script


@cache
def source(name: str) -> str:
    """The text of ``forkq/scripts/<name>.lua``, after ``guard.lua`` and ``workflow.lua``."""
    return "".join(_read(part) for part in (*_LIBRARIES, name))


def preload() -> None:
    """Read every script's text into :func:`source`'s cache: the master does it before it
    forks, so its children find the texts in memory instead of each reading the files."""
    for entry in resources.files(__name__).iterdir():
        name, dot, extension = entry.name.rpartition(".")
        if dot and extension == "lua" and name not in _LIBRARIES:
            source(name)


_LIBRARIES = ("guard", "workflow")


@cache
def _read(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.lua").read_text(encoding="utf-8")


def script(client: redis.Redis, name: str) -> Script:
    """The script ``name`` registered with ``client``: once per client, not on every call
    (kept on the client object, so it lives and goes with it)."""
    registered: dict[str, Script] = vars(client).setdefault("_forkq_scripts", {})
    found = registered.get(name)
    if found is None:
        found = registered[name] = client.register_script(source(name))
    return found
