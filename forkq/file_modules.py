"""A ``.py`` file named in ``require``, imported under the name the rest of the app uses.

A job's wire name is ``module.qualname``, so the daemon and the web process must know the
module by the same dotted name. A file is imported as Python would import it from the top
of its package chain (pytest's rule): walking up from the file while each directory holds
an ``__init__.py``, ``myapp/tasks.py`` in package ``myapp`` becomes module ``myapp.tasks``,
imported through ``import myapp.tasks`` with the directory above ``myapp`` put first on
``sys.path``. Its jobs are then ``myapp.tasks.<name>``, what a web process that imports
``myapp.tasks`` pushes.

Two forms are refused (:class:`AmbiguousFileError`, with a hint) rather than imported
under a name other code would not use:

- a file outside any package but in a subdirectory of its anchor (the directory the
  ``require`` path is relative to: the config file's, else the current one): ``jobs/tasks.py``
  would be module ``tasks``, while code run from the anchor imports it as ``jobs.tasks`` (a
  namespace package);
- a file whose name is a standard library module or one already imported from elsewhere
  (``email.py`` next to the config would shadow the standard ``email``), or whose package is
  imported from elsewhere.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path


class AmbiguousFileError(ImportError):
    """The file would be imported under a name other than the one other code uses."""


def dotted_name(path: str) -> tuple[str, str]:
    """The directory to put on ``sys.path`` and the dotted module name of the ``.py`` file
    ``path``, from the top of its package chain (``__init__.py`` files)."""
    file = Path(path).resolve()
    parts = [] if file.stem == "__init__" else [file.stem]
    folder = file.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    return str(folder), ".".join(parts)


def import_file(path: str, anchors: Iterable[str]) -> None:
    """Import the ``.py`` file ``path`` under its :func:`dotted_name`.

    ``anchors`` are the directories code elsewhere is likely run from (the one the path is
    relative to). Raises ImportError for a missing file, :class:`AmbiguousFileError`
    for the forms the module docstring lists; whatever the module raises propagates.
    """
    if not path.endswith(".py") or not os.path.isfile(path):
        raise ImportError(f"no such file {path}" if path.endswith(".py") else "not a .py file")
    root, name = dotted_name(path)
    if "." not in name:
        _refuse_namespace(path, name, anchors)
    _refuse_taken(path, name)
    if root not in sys.path:
        sys.path.insert(0, root)
    _check_same(path, name, importlib.import_module(name))


def _refuse_namespace(path: str, name: str, anchors: Iterable[str]) -> None:
    """Refuse a package-less file that code run from an anchor imports by a longer name."""
    folder = Path(path).resolve().parent
    for anchor in {Path(a).resolve() for a in anchors}:
        if folder == anchor or not folder.is_relative_to(anchor):
            continue
        between = folder.relative_to(anchor).parts
        if all(part.isidentifier() for part in between):
            longer = ".".join((*between, name))
            raise AmbiguousFileError(
                f"{path} is in no package ({folder}/__init__.py is missing), so it would be "
                f"module {name!r} and its jobs {name}.<function>, while code run from "
                f"{anchor} imports it as {longer!r} and pushes {longer}.<function>; write "
                f"require: {longer} (or add __init__.py files to make {between[0]} a "
                "package), or give the jobs explicit names: @job(name=...)")


def _refuse_taken(path: str, name: str) -> None:
    """Refuse a standard module's name, or one already loaded from another file."""
    if name.partition(".")[0] in sys.stdlib_module_names:
        raise AmbiguousFileError(_taken(path, name, "the standard library"))
    loaded = sys.modules.get(name)
    if loaded is not None and not _same(getattr(loaded, "__file__", None), path):
        raise AmbiguousFileError(_taken(path, name, getattr(loaded, "__file__", None)))


def _check_same(path: str, name: str, module: object) -> None:
    """The import found ``path`` itself, not a module of the same name elsewhere."""
    found = getattr(module, "__file__", None)
    if not _same(found, path):
        raise AmbiguousFileError(_taken(path, name, found))


def _taken(path: str, name: str, other: str | None) -> str:
    where = other or "built into Python"
    return (f"{path} would be module {name!r}, but that name is another module ({where}); "
            "rename the file or put it in a package, or name the module itself in require")


def _same(found: str | None, path: str) -> bool:
    try:
        return found is not None and os.path.samefile(found, path)
    except OSError:
        return False
