"""Throwaway Redis topologies for the Sentinel, TLS and ACL tests, on loopback ports.

:class:`Node` is one ``redis-server`` or ``redis-sentinel`` process in a directory of its
own, on a free port, stopped by its pid (TERM, then KILL). :func:`sentinel_group` starts a
master, a replica and three sentinels watching them; :func:`make_certs` writes a CA and a
server and a client certificate with ``openssl``. Nothing here looks a process up by name.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from forkq.subprocesses import terminate, wait_for

from . import debian

SERVICE = "mymaster"
PASSWORD = "m-secret"  # the master's and the replica's requirepass
SENTINEL_PASSWORD = "s-secret"  # the sentinels' requirepass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Node:
    """One server or sentinel process; the constructor only stores settings."""

    directory: Path
    args: list[str]
    port: int = field(default_factory=free_port)
    sentinel: bool = False
    certs: Certs | None = None  # TLS only (replication and sentinels' links too)
    process: subprocess.Popen[bytes] | None = None

    def start(self, ready: Any = None, timeout: float = 20) -> None:
        """Start it; wait until ``ready()`` (default: it answers PING on its port)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("redis-sentinel" if self.sentinel else "redis-server")
        if binary is None:
            debian.install("redis-sentinel")
            binary = shutil.which("redis-sentinel" if self.sentinel else "redis-server")
        assert binary, "redis-server / redis-sentinel not on PATH (apt-get install redis-sentinel)"
        command = [binary]
        if self.sentinel:  # a sentinel needs a writable config file of its own
            config = self.directory / "sentinel.conf"
            config.write_text("\n".join(self.args) + "\n")
            command += [str(config), *self._listen()]
        else:
            command += [*self._listen(), *self.args]
        command += ["--bind", "127.0.0.1", "--dir", str(self.directory), "--save", "",
                    "--daemonize", "no", "--logfile", str(self.directory / "log")]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, cwd=self.directory)
        check = ready or self.answers
        assert wait_for(lambda: self.alive() and check(), timeout), (
            f"{command} did not come up:\n{self.log()}")

    def _listen(self) -> list[str]:
        if self.certs is None:
            return ["--port", str(self.port)]
        return ["--port", "0", "--tls-port", str(self.port), "--tls-replication", "yes",
                "--tls-cert-file", str(self.certs.server_cert),
                "--tls-key-file", str(self.certs.server_key),
                "--tls-ca-cert-file", str(self.certs.ca), "--tls-auth-clients", "yes"]

    def answers(self) -> bool:
        """True when it answers PING on its plain port."""
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def client(self, **kwargs: Any) -> redis.Redis:
        """A plain client of this node (password as configured for the topology)."""
        password = SENTINEL_PASSWORD if self.sentinel else PASSWORD
        options = {"password": password, "socket_timeout": 5, "socket_connect_timeout": 2,
                   **(self.certs.client_options() if self.certs else {}), **kwargs}
        return redis.Redis("127.0.0.1", self.port, protocol=2, **options)

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL it (a crash: nothing flushed, no goodbye to replicas or clients)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        """TERM, then KILL after 10 s (by pid)."""
        if self.process is not None:
            terminate(self.process, 10)

    def log(self) -> str:
        """What the process logged."""
        path = self.directory / "log"
        return path.read_text(errors="replace") if path.exists() else "(no log)"


@dataclass
class SentinelGroup:
    """A master, its replica and three sentinels; :attr:`url` is a ``redis+sentinel://``."""

    master: Node
    replica: Node
    sentinels: list[Node]
    certs: Certs | None = None

    @property
    def url(self) -> str:
        """The Sentinel URL of the service, with both passwords (and TLS options)."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.sentinels)
        scheme, tls = ("rediss+sentinel", "&" + self.certs.url_query()) if self.certs else (
            "redis+sentinel", "")
        return (f"{scheme}://:{PASSWORD}@{hosts}/{SERVICE}/0"
                f"?sentinel_password={SENTINEL_PASSWORD}{tls}")

    def master_port(self) -> int:
        """The master's port as the first sentinel that answers sees it."""
        for node in self.sentinels:
            try:
                address = node.client().sentinel_get_master_addr_by_name(SERVICE)
            except redis.RedisError:
                continue
            if address:
                return int(address[1])
        raise AssertionError("no sentinel answers")

    def node_on(self, port: int) -> Node:
        """The data node listening on ``port``."""
        return next(node for node in (self.master, self.replica) if node.port == port)

    def all_agree(self, port: int) -> bool:
        """True when every sentinel names ``port`` as the master and knows the replica and
        the other two sentinels (so a failover can be authorised)."""
        for node in self.sentinels:
            try:
                state = node.client().sentinel_master(SERVICE)
            except redis.RedisError:
                return False
            if int(state["port"]) != port or state["num-slaves"] < 1 or (
                    state["num-other-sentinels"] < 2):
                return False
        return True


def _replica_synced(replica: Node) -> bool:
    try:
        info = replica.client().info("replication")
    except redis.RedisError:
        return False
    return info.get("master_link_status") == "up"


@contextmanager
def sentinel_group(root: Path, certs: Certs | None = None) -> Iterator[SentinelGroup]:
    """Start the five processes under ``root`` (TLS only, with ``certs``); stop them all by
    pid on exit."""
    auth = ["--requirepass", PASSWORD, "--masterauth", PASSWORD, "--appendonly", "no"]
    master = Node(root / "master", auth, certs=certs)
    replica = Node(root / "replica", list(auth), certs=certs)
    nodes: list[Node] = []
    try:
        master.start()
        nodes.append(master)
        replica.args += ["--replicaof", "127.0.0.1", str(master.port)]
        replica.start(ready=lambda: _replica_synced(replica))
        nodes.append(replica)
        sentinels = [Node(root / f"sentinel-{index}", _sentinel_config(master.port),
                          sentinel=True, certs=certs) for index in range(3)]
        for node in sentinels:
            node.start()
            nodes.append(node)
        group = SentinelGroup(master, replica, sentinels, certs)
        assert wait_for(lambda: group.all_agree(master.port), 30), "sentinels never agreed:\n" + (
            "\n".join(node.log()[-2000:] for node in sentinels))
        yield group
    finally:
        for node in reversed(nodes):
            node.stop()


def _sentinel_config(master_port: int) -> list[str]:
    return [
        f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2",
        f"sentinel auth-pass {SERVICE} {PASSWORD}",
        f"sentinel down-after-milliseconds {SERVICE} 1000",
        f"sentinel failover-timeout {SERVICE} 10000",
        f"sentinel parallel-syncs {SERVICE} 1",
        f"requirepass {SENTINEL_PASSWORD}",
    ]


def wait_new_master(group: SentinelGroup, old_port: int, timeout: float = 60) -> int:
    """Poll the sentinels until they name another master; its port."""
    found: list[int] = []

    def moved() -> bool:
        try:
            port = group.master_port()
        except AssertionError:
            return False
        found[:] = [port]
        return port != old_port

    assert wait_for(moved, timeout, interval=0.05), "no failover within the deadline"
    return found[0]


# -- TLS ---------------------------------------------------------------------------------------


@dataclass
class Certs:
    """Files written by :func:`make_certs`."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_options(self) -> dict[str, Any]:
        """redis-py keywords for a TLS client with the client certificate."""
        return {"ssl": True, "ssl_ca_certs": str(self.ca), "ssl_certfile": str(self.client_cert),
                "ssl_keyfile": str(self.client_key)}

    def url_query(self) -> str:
        """The same, as ``rediss://`` query options."""
        return (f"ssl_ca_certs={quote(str(self.ca))}&ssl_certfile={quote(str(self.client_cert))}"
                f"&ssl_keyfile={quote(str(self.client_key))}&ssl_cert_reqs=required")


def make_certs(directory: Path) -> Certs:
    """A CA, a server certificate for 127.0.0.1 / localhost, and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-days", "2",
            "-subj", "/CN=forkq test CA", "-keyout", "ca.key", "-out", "ca.crt")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, extra in (("server", ["-extfile", "san.ext"]), ("client", [])):
        openssl("req", "-new", "-nodes", "-newkey", "rsa:2048", "-subj", f"/CN=forkq {name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", *extra)
    return Certs(directory / "ca.crt", directory / "server.crt", directory / "server.key",
                 directory / "client.crt", directory / "client.key")
