"""``forkq web``: the dashboard on a threading ``wsgiref`` server until SIGTERM or SIGINT.

Loopback (127.0.0.1) by default; another address only with a password configured
(:func:`forkq.web.security.check_bind`, else ConfigError: exit 78). Port 0 takes a free port;
the line printed at start names the address actually bound. The signals are blocked in every
thread and taken by ``sigwait`` in the main thread, which then shuts the server down: no
handler runs inside the serving loop.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"forkq web: {self.address_string()} {format % args}\n")


def serve(app: Callable[..., Any], *, host: str, port: int, describe: str = "") -> int:
    """Serve ``app`` on ``host``:``port`` until SIGTERM / SIGINT; returns 0."""
    server_class = _Server6 if ":" in host else _Server
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        server = make_server(host.strip("[]"), port, app, server_class=server_class,
                             handler_class=_Handler)
        bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        print(f"forkq web: serving http://{shown}:{bound_port}/ {describe}".rstrip(),
              file=sys.stderr, flush=True)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5},
                                  name="forkq-web", daemon=True)
        thread.start()
        received = signal.sigwait(STOP_SIGNALS)
        print(f"forkq web: {signal.Signals(received).name}: stopping", file=sys.stderr,
              flush=True)
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return 0
