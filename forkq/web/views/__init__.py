"""The dashboard's pages, one module per page group; each registers its views with
:func:`forkq.web.routes.route` when imported. :func:`load` imports every module of this
package (the package's own files, found on disk), so a new page is a new module."""

from __future__ import annotations

import importlib
import pkgutil


def load() -> None:
    """Import every view module of this package (once; later calls do nothing)."""
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")
