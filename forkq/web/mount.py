"""Serving the dashboard under a path prefix of another WSGI application (a Django project's
``wsgi.py``, or any WSGI app without a dispatcher of its own): :func:`mount`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def mount(prefix: str, dashboard: WSGIApp, app: WSGIApp) -> WSGIApp:
    """A WSGI app sending ``prefix`` and the paths under it to ``dashboard`` (with the prefix
    moved from ``PATH_INFO`` to ``SCRIPT_NAME``, as WSGI mounting does) and every other path
    to ``app``. ``prefix`` is a path such as ``/forkq`` (no trailing slash)."""
    prefix = "/" + prefix.strip("/")

    def dispatch(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path != prefix and not path.startswith(prefix + "/"):
            return app(environ, start_response)
        environ = {**environ, "SCRIPT_NAME": environ.get("SCRIPT_NAME", "") + prefix,
                   "PATH_INFO": path[len(prefix):]}
        return dashboard(environ, start_response)

    return dispatch
