"""``forkq web``: the dashboard on a threading ``wsgiref`` server until SIGTERM or SIGINT.

Loopback (127.0.0.1) by default; another address only with a password configured
(:func:`forkq.web.security.check_bind`, else ConfigError: exit 78). Port 0 takes a free port;
the line printed at start names the address actually bound. The signals are blocked in every
thread and taken by ``sigwait`` in the main thread, which then shuts the server down: no
handler runs inside the serving loop.

Its lines (the start, each request as an access-log line, the stop) are log records, which
the ``forkq web`` command formats as the daemon formats its own (:mod:`forkq.daemon.logs`:
UTC timestamp, pid, role ``web``, level; no timestamp under journald).
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger(__name__)

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """One access-log line per request (``127.0.0.1 "GET / HTTP/1.1" 200 1234``)."""
        log.info("%s %s", self.address_string(), format % args)


def serve(app: Callable[..., Any], *, host: str, port: int, describe: str = "") -> int:
    """Serve ``app`` on ``host``:``port`` until SIGTERM / SIGINT; returns 0."""
    server_class = _Server6 if ":" in host else _Server
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        server = make_server(host.strip("[]"), port, app, server_class=server_class,
                             handler_class=_Handler)
        bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        log.info("%s", f"serving http://{shown}:{bound_port}/ {describe}".rstrip())
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                  name="forkq-web", daemon=True)
        thread.start()
        received = signal.sigwait(STOP_SIGNALS)
        log.info("%s: stopping", signal.Signals(received).name)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return 0
