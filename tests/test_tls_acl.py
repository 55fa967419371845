"""TLS (``rediss://`` with a CA and a client certificate) and a least-privilege ACL user:
the daemon, the client and the CLI against a throwaway ``redis-server`` of each kind.

The ACL is the one the documentation gives (its ``ACL SETUSER forkq`` line is read from
docs/redis.md, the only page that may hold one, so the two cannot drift); the test passes when
jobs run, retry, die and recover with it and the server's ``ACL LOG`` records no denial at all.
"""

from __future__ import annotations

import json
import shlex
import socket
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import redis

import forkq
from forkq.client import Client, result

from . import jobs
from .conftest import ROOT, Daemon, named, run_forkq, until
from .topology import PASSWORD, Node, free_port, make_certs

DAEMON = "concurrency: 2\nqueues: [default]\nrequire: jobs\ntimeout: 5\n"


def test_tls_with_a_client_certificate_serves_the_daemon_the_client_and_the_cli(
        daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    port = free_port()
    node = Node(tmp_path / "tls", ["--port", "0", "--tls-port", str(port),
                                   "--tls-cert-file", str(certs.server_cert),
                                   "--tls-key-file", str(certs.server_key),
                                   "--tls-ca-cert-file", str(certs.ca),
                                   "--tls-auth-clients", "yes", "--requirepass", PASSWORD],
                port=port)
    tls = {"ssl": True, "ssl_ca_certs": str(certs.ca), "ssl_certfile": str(certs.client_cert),
           "ssl_keyfile": str(certs.client_key)}
    node.start(ready=lambda: _answers(node.client(**tls)))
    try:
        url = (f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={quote(str(certs.ca))}"
               f"&ssl_certfile={quote(str(certs.client_cert))}"
               f"&ssl_keyfile={quote(str(certs.client_key))}&ssl_cert_reqs=required")
        d = daemon(DAEMON, redis_url=url)
        d.wait_children(2, timeout=30)
        server = node.client(**tls)
        pusher = Client(url=url + "&client_name=tls-pusher")
        jid = pusher.push({"class": "Mark", "args": []})
        first = named(server, "tls-pusher")
        for n in range(20):  # its one TLS connection is kept, never taken for a closed one
            pusher.push({"class": "Mark", "args": [n]})
        assert named(server, "tls-pusher") == first and len(first) == 1
        pusher.redis.close()
        until(lambda: server.sismember("test:done", jid or ""), 30, lambda: d.log())
        enqueued = run_forkq("enqueue", "Mark", "--redis-url", url)
        assert enqueued.returncode == 0, enqueued.stderr
        until(lambda: server.scard("test:done") == 22, 30, lambda: d.log())
        status = run_forkq("status", "--json", "--redis-url", url)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["processes"][0]["concurrency"] == 2
        # without the client certificate the server refuses the handshake
        bare = url.split("&ssl_certfile")[0]
        refused = run_forkq("status", "--redis-url", bare)
        assert refused.returncode == 69, (refused.returncode, refused.stderr)
    finally:
        node.stop()


def documented_acl(password: str) -> list[str]:
    """The ``ACL SETUSER forkq ...`` command of docs/redis.md, for this host, as words."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    lines = {page.name: [line for line in page.read_text().splitlines()
                         if line.startswith("ACL SETUSER forkq ")] for page in pages}
    assert {name: len(found) for name, found in lines.items() if found} == {"redis.md": 1}, (
        "docs/redis.md, and no other page, must give exactly one 'ACL SETUSER forkq' line")
    line = lines["redis.md"][0]
    words = shlex.split(line.replace(">secret", f">{password}"))
    host = socket.gethostname()
    return [f"~{host}:*" if word == "~myhost:*" else word for word in words]


def test_a_least_privilege_acl_user_runs_the_daemon_the_client_and_the_cli(
        daemon: Callable[..., Daemon], tmp_path: Path) -> None:
    node = Node(tmp_path / "acl", ["--requirepass", PASSWORD])
    node.start()
    try:
        admin = node.client()
        admin.execute_command(*documented_acl("acl-secret"), "~test:*")  # the jobs' own keys
        url = f"redis://forkq:acl-secret@127.0.0.1:{node.port}/0"
        d = daemon(DAEMON, redis_url=url)
        d.wait_children(2, timeout=30)
        client = Client(url=url)
        marks = client.push_bulk({"class": "Mark", "args": [[] for _ in range(20)]})
        later = client.push({"class": "Mark", "args": [], "at": time.time() + 1})
        marks += [client.push({"class": "Mark", "args": [], "group": f"g{n % 2}",
                               "concurrency_limit": 1}) for n in range(4)]  # fair, limited
        with forkq.batch(on_success=jobs.Mark.s(), client=client) as b:  # workflows
            marks += [jobs.Mark.perform_async(n) for n in range(3)]
        chained = forkq.chain(jobs.Mark.s(), jobs.Mark.s()).perform_async(client=client)
        boom = client.push({"class": "Boom", "args": ["no"]})
        suicide = client.push({"class": "Suicide", "args": []})
        done = lambda: {m.decode() for m in admin.smembers("test:done")}  # noqa: E731
        until(lambda: set(marks) | {later} <= done(), 60, lambda: d.log())
        until(lambda: admin.zcard("retry") == 1, 60, lambda: d.log())
        until(lambda: any(suicide in e.decode() for e in admin.zrange("dead", 0, -1)), 90,
              lambda: d.log())
        assert boom and boom in admin.zrange("retry", 0, -1)[0].decode()
        answered = client.push({"class": "answer", "args": [20], "result_ttl": 60})
        assert answered and result(answered, timeout=30, client=client) == {"double": 40}
        far = client.push({"class": "Mark", "args": [], "at": time.time() + 3600})
        locked = client.push({"class": "Mark", "args": ["u"], "at": time.time() + 3600,
                              "unique_for": 60})
        for command in (["status"], ["queues"], ["retries", "list"], ["dead", "list"],
                        ["scheduled", "list"], ["enqueue", "Mark"], ["job", str(boom)],
                        ["cancel", str(far)], ["limits"], ["uniques"], ["job", str(locked)],
                        ["batches"], ["batch", b.bid]):
            ran = run_forkq(*command, "--redis-url", url)
            assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
            assert "NOPERM" not in ran.stdout + ran.stderr
        until(lambda: len(done()) == 32, 30, lambda: d.log())  # + the callback, 2 steps
        assert forkq.chain_status(chained, client=client).state == "succeeded"  # type: ignore[union-attr]
        log = d.log()
        assert "NOPERM" not in log and "refused" not in log.lower(), log
        denied = admin.acl_log()
        assert denied == [], json.dumps(denied, default=str, indent=1)
    finally:
        node.stop()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
