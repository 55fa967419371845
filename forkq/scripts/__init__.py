"""Lua scripts for every multi-key state change; each file's header is its contract.

Every script is served with the helpers of ``guard.lua`` in front: those with which a script
checks the type of each key it will write before its first write (Redis keeps a failed
script's earlier writes), so a key of the wrong type makes it refuse, naming the key, and
change nothing. The helpers of ``workflow.lua`` follow them: the bookkeeping of batches and
chains that the scripts ending a job's run do in the same step.

A script is served with only the helpers it reaches (:func:`source`): Redis runs a script's
whole text at every call, and each ``local function`` it runs builds a closure, so the 44
top-level statements of both libraries cost ~2.5-4 µs of server CPU per call, three to five
times a trivial script's whole cost; a lease's or a push's script reaches a few of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import redis
from redis.commands.core import Script


@cache
def source(name: str) -> str:
    """The text of ``forkq/scripts/<name>.lua`` after the statements of ``guard.lua`` and
    ``workflow.lua`` it reaches (:func:`reached`), in their order."""
    body = _read(name)
    return "".join([statement.text for statement in reached(body)]) + body


@dataclass(frozen=True)
class Statement:
    """One top-level statement of a library: the names it defines and the names it reads."""

    text: str
    defines: frozenset[str]
    reads: frozenset[str]


def reached(body: str) -> list[Statement]:
    """The library statements a script ``body`` reaches: those defining a name it reads, then
    those defining a name they read, and so on (a name counts as read wherever it appears as
    a word outside comment lines: a stray match serves a helper too many, never one too few)."""
    statements = _statements()
    wanted = _words(body)
    chosen: set[int] = set()
    grew = True
    while grew:  # a forward-declared helper is read before the statement that defines it
        grew = False
        for index, statement in enumerate(statements):
            if index not in chosen and statement.defines & wanted:
                chosen.add(index)
                wanted |= statement.reads
                grew = True
    return [statements[index] for index in sorted(chosen)]


def preload() -> None:
    """Read every script's text into :func:`source`'s cache: the master does it before it
    forks, so its children find the texts in memory instead of each reading the files."""
    for entry in resources.files(__name__).iterdir():
        name, dot, extension = entry.name.rpartition(".")
        if dot and extension == "lua" and name not in _LIBRARIES:
            source(name)


_LIBRARIES = ("guard", "workflow")
_STARTS = re.compile(r"^(?=local\b|[A-Za-z_]\w*\s*=)", re.M)  # a statement at column 0
_DEFINES = re.compile(r"^(?:local\s+function\s+(\w+)|local\s+([\w\s,]+?)\s*(?:=|--|\n)|(\w+)\s*=)")
_COMMENT_LINE = re.compile(r"^[ \t]*--.*\n?", re.M)
_WORD = re.compile(r"[A-Za-z_]\w*")


@cache
def _statements() -> list[Statement]:
    """The top-level statements of the libraries, in order (a comment above a statement
    goes with the one before it; the files' header comments are dropped)."""
    found: list[Statement] = []
    for library in _LIBRARIES:
        for text in _STARTS.split(_read(library))[1:]:
            match = _DEFINES.match(text)
            assert match, f"{library}.lua: a top-level statement forkq cannot name: {text[:40]!r}"
            names = match.group(1) or match.group(2) or match.group(3)
            found.append(Statement(text, frozenset(map(str.strip, names.split(","))),
                                   _words(text[match.end():])))
    return found


def _words(lua: str) -> frozenset[str]:
    """The words of Lua text but its comment lines (a word in a string or in a comment after
    code is a stray match, harmless)."""
    return frozenset(_WORD.findall(_COMMENT_LINE.sub("", lua)))


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
