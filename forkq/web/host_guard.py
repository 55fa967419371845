"""The DNS-rebinding guard of a dashboard served without a password on loopback.

Without a password, ``forkq web`` listens on loopback only, so only this machine's programs
reach it — and every web page its user's browser opens: a hostile site can make its own
name resolve to 127.0.0.1 (DNS rebinding), then read the dashboard and post its forms as
the same origin. :func:`loopback_hosts_only` wraps the app so that, in that case, a request
whose ``Host`` header names anything but a loopback address or ``localhost`` is refused
with 403 before the app sees it (as Jupyter and other local servers do). With a password
configured the guard is not needed: the session cookie is not sent to another name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from forkq.web.security import HEADERS, is_loopback

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def host_name(host: str) -> str:
    """The name part of a ``Host`` header: ``[::1]:9191`` → ``::1``, ``a:80`` → ``a``."""
    host = host.strip()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else ""  # malformed: no name
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def loopback_hosts_only(app: WsgiApp) -> WsgiApp:
    """``app``, answering 403 to a request whose ``Host`` is not a loopback name."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME", "")
        if is_loopback(host_name(host)):
            return app(environ, start_response)
        body = (f"forkq web: refused Host {host!r}: without a password the dashboard answers "
                "only to localhost / 127.0.0.1 / [::1] (a guard against DNS rebinding); set "
                "FORKQ_WEB_PASSWORD to serve it under another name\n").encode()
        start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(body))), *HEADERS])
        return [body]

    return guarded
