"""Queue pause across the cluster: every forkq processor's fetch skips a paused queue (in
fetch.lua, no extra round trip) until it is resumed; ``forkq queues pause|resume NAME``."""

from __future__ import annotations

import json
from typing import Any

import redis

from forkq import api, keys
from forkq.client import Client
from forkq.embedded import EmbeddedServer

from .conftest import counting_fetches, records, run_forkq, until


def _queues_cli(server: EmbeddedServer, *args: str, code: int = 0) -> str:
    done = run_forkq("queues", *args, "--redis-url", server.url, timeout=30)
    assert done.returncode == code, f"{done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_a_paused_queue_is_skipped_by_every_processor_until_resumed(
        r: redis.Redis, daemon: Any, server: EmbeddedServer) -> None:
    assert "paused queue critical; no such queue yet" in _queues_cli(server, "pause",
                                                                     "critical")
    client = Client(r)
    held = [client.push({"class": "Record", "args": [n], "queue": "critical"}) for n in range(5)]
    d = daemon("concurrency: 2\nrequire: jobs\nqueues: [[critical, 3], default]\n")
    ran = [client.push({"class": "Record", "args": [n]}) for n in range(5)]
    until(lambda: sorted(row["jid"] for row in records(r)) == sorted(ran), 15, lambda: d.log())
    listed = json.loads(_queues_cli(server, "--json"))["queues"]
    assert {q["name"]: (q["size"], q["paused"]) for q in listed} == {
        "critical": (5, True), "default": (0, False)}
    assert "resumed queue critical" in _queues_cli(server, "resume", "critical")
    until(lambda: len(records(r)) == 10, 5, lambda: d.log())
    assert sorted(row["jid"] for row in records(r)[5:]) == sorted(held)


def test_an_idle_processor_blocked_on_its_one_queue_takes_nothing_once_it_is_paused(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 2\nrequire: jobs\n")
    d.wait_children(2)
    until(lambda: int(r.info("clients")["blocked_clients"]) == 2, 15, "not waiting in Redis")
    assert api.Queue(r, "default").pause()
    # woken from their blocking wait, they fetch, see the pause and do not wait on it again
    until(lambda: int(r.info("clients")["blocked_clients"]) == 0, 5, lambda: d.log())
    with counting_fetches(r) as fetches:
        jids = Client(r).push_bulk({"class": "Record", "args": [[n] for n in range(5)]})
        until(lambda: fetches() >= 4, 15, "the processors did not fetch again")
    assert r.llen("queue:default") == 5 and records(r) == []
    assert api.Queue(r, "default").resume()
    until(lambda: sorted(row["jid"] for row in records(r)) == sorted(jids), 5, lambda: d.log())


def test_processors_with_lanes_skip_a_paused_queue(r: redis.Redis, daemon: Any) -> None:
    api.Queue(r, "low").pause()
    client = Client(r)
    held = client.push({"class": "Record", "args": [0], "queue": "low"})
    d = daemon("concurrency: 1\nasync_concurrency: 4\nrequire: jobs\nqueues: [default, low]\n")
    ran = client.push({"class": "Record", "args": [1]})
    until(lambda: [row["jid"] for row in records(r)] == [ran], 15, lambda: d.log())
    assert r.lrange("queue:low", 0, -1) and records(r)[0]["jid"] != held
    api.Queue(r, "low").resume()
    until(lambda: len(records(r)) == 2, 5, lambda: d.log())


def test_a_wrong_typed_paused_key_pauses_nothing_and_is_reported(
        r: redis.Redis, daemon: Any, server: EmbeddedServer) -> None:
    r.set(keys.PAUSED, "critical")
    d = daemon("concurrency: 1\nrequire: jobs\n")
    jid = Client(r).push({"class": "Record", "args": [1]})
    until(lambda: [row["jid"] for row in records(r)] == [jid], 15, lambda: d.log())
    until(lambda: "'forkq:paused' holds a string, not a set; no queue is paused" in d.log(), 5,
          lambda: d.log())
    out = _queues_cli(server, code=1)
    assert "forkq:paused" in out and "default" in out, out  # the queues are still listed
    done = run_forkq("status", "--redis-url", server.url, timeout=30)
    assert done.returncode == 1, done.stderr  # the rest is shown; the damaged key named
    assert done.stderr == ("forkq: note: key 'forkq:paused' holds a string, not a set; read as "
                           "empty\n")
