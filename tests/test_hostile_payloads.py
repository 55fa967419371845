"""Hostile payloads against the real daemon: every one is buried with its bytes, nothing dies.

Issue #11, findings 1 and 7: one payload (NaN, Infinity, a lone surrogate, deep nesting)
used to kill the master and then every scheduler leader; an optional field of the wrong
type used to crash a processor. The daemon must file each to ``dead`` with its raw bytes,
keep every process alive and run the good jobs around them.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import redis

from .conftest import Daemon, push, records, until

CONFIG = """
concurrency: 2
require: jobs
log_level: info
leader_lease_ttl: 4
orphan_sweep_interval: 1
"""

DEEP = "[" * 600 + "]" * 600

HOSTILE: list[bytes] = [
    b'{"class":"Nope","args":[NaN]}',
    b'{"class":"Record","args":[Infinity],"jid":"0123456789abcdef01234567"}',
    b'{"class":"Record","args":[-Infinity]}',
    b'{"class":"Record","args":[1e400]}',
    b'{"class":"Record","args":["\\ud800"]}',
    b'{"class":"Record","args":[],"\\udfff":1}',
    ('{"class":"Record","args":' + DEEP + "}").encode(),
    ("[" * 5000 + "]" * 5000).encode(),
    b'{"class":"Record","args":["\xff\xfe not utf-8"]}',
    b'{"class":"Record","args":["\xed\xa0\x80"]}',  # a surrogate encoded as UTF-8
    b'{"class":"Record","args":[' + b"9" * 5000 + b"]}",
    b"not json at all",
    b'{"class":"Record","args":"no list"}',
    b"[1,2,3]",
    b"",
]


def _dead_entries(r: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(member) for member in r.zrange("dead", 0, -1)]


def _kept_bytes(entry: dict[str, Any]) -> bytes | None:
    """The raw bytes a stand-in dead entry kept, if it is one."""
    if "raw" in entry:
        return str(entry["raw"]).encode("utf-8")
    if "raw_base64" in entry:
        return base64.b64decode(entry["raw_base64"])
    return None



def _assert_buried(r: redis.Redis, hostile: list[bytes], d: Daemon) -> None:
    """Each hostile payload is in ``dead``: its bytes kept exactly, or (a JSON object of the
    wrong shape) the object itself, with a forkq error class."""
    entries = _dead_entries(r)
    kept = [_kept_bytes(entry) for entry in entries]
    for raw in hostile:
        as_object = _object_or_none(raw)
        found = raw in kept or (as_object is not None and any(
            {k: v for k, v in e.items() if k in as_object} == as_object for e in entries))
        assert found, f"{raw[:60]!r} not in dead; log:\n{d.log()[-3000:]}"
    assert all(str(e.get("error_class", "")).startswith("forkq.") for e in entries), entries


def _object_or_none(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) and not _deep(raw) else None


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _deep(raw: bytes) -> bool:
    return raw.count(b"[") > 100 or b"\\ud8" in raw or b"\\udf" in raw or b"e400" in raw


def test_hostile_payloads_in_a_queue_are_buried_and_good_jobs_run(r: redis.Redis,
                                                                 daemon: Any) -> None:
    d = daemon(CONFIG)
    d.wait_children(2)
    scheduler = d.scheduler()
    for raw in HOSTILE:
        r.lpush("queue:default", raw)
    good = [push(r, "Record", n) for n in range(5)]
    until(lambda: {row["jid"] for row in records(r)} >= set(good), 30, d.log())
    until(lambda: r.zcard("dead") == len(HOSTILE), 15, d.log())
    _assert_buried(r, HOSTILE, d)
    assert d.alive() and scheduler.is_running()
    assert len(d.children()) == 2
    assert "Traceback" not in d.log()


def test_hostile_entries_in_schedule_and_retry_are_buried_and_due_jobs_still_move(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon(CONFIG)
    d.wait_children(2)
    scheduler = d.scheduler()
    past = time.time() - 10
    for index, raw in enumerate(HOSTILE):
        if raw:  # an empty member is no member
            r.zadd("schedule" if index % 2 else "retry", {raw: past})
    good = [push(r, "Record", n) for n in range(2)]
    due = json.dumps({"class": "Record", "args": ["due"], "queue": "default",
                      "jid": "feedfacefeedfacefeedface", "retry": True, "created_at": past})
    r.zadd("schedule", {due: past})
    until(lambda: "feedfacefeedfacefeedface" in {row["jid"] for row in records(r)}, 30,
          d.log())
    until(lambda: r.zcard("dead") == len(HOSTILE) - 1, 15, d.log())
    _assert_buried(r, [raw for raw in HOSTILE if raw], d)
    assert {row["jid"] for row in records(r)} >= set(good)
    assert r.zcard("schedule") == r.zcard("retry") == 0
    assert d.alive() and scheduler.is_running()


def test_a_hostile_orphan_does_not_stop_the_sweep_over_other_dead_daemons(
        r: redis.Redis, daemon: Any) -> None:
    """The leader's orphan sweep meets dead processes holding NaN and a too-deep job, and
    another holding a good job: the first two are buried at once, straight from the sweep
    (they were fetched from a queue this daemon does not serve), the good one recovered,
    no leader dies."""
    good = json.dumps({"class": "Record", "args": ["orphan"], "queue": "default",
                       "jid": "0badc0de0badc0de0badc0de", "retry": True, "created_at": 1.0})
    lists = {"forkq:inflight:gone-host:1:aaaaaaaaaaaa:11": HOSTILE[0],
             "forkq:inflight:gone-host:2:bbbbbbbbbbbb:12": ("[" + DEEP + "]").encode(),
             "forkq:inflight:gone-host:3:cccccccccccc:13": good.encode()}
    for key, job in lists.items():
        r.rpush(key, "queue:default" if job == good.encode() else "queue:unserved", job)
        r.sadd("forkq:inflight", key)
    d = daemon(CONFIG)
    scheduler = d.scheduler()
    until(lambda: "0badc0de0badc0de0badc0de" in {row["jid"] for row in records(r)}, 30,
          d.log())
    until(lambda: r.zcard("dead") == 2, 15, d.log())
    _assert_buried(r, [HOSTILE[0], ("[" + DEEP + "]").encode()], d)
    assert not r.exists(*lists, "queue:unserved")
    assert not [m for m in r.smembers("forkq:inflight") if b"gone-host" in m]
    assert d.alive() and scheduler.is_running()


WRONG_TYPED_FIELDS: list[dict[str, Any]] = [
    {"backtrace": "x"}, {"backtrace": [1]}, {"backtrace": -3}, {"backtrace": 2.5},
    {"retry": "5"}, {"retry": [1]}, {"retry": {"a": 1}}, {"retry": -1}, {"retry": 1.5},
    {"retry": None},
    {"retry_count": "x"}, {"retry_count": True}, {"retry_count": -5},
    {"retry_count": 10**300, "retry": 10**301}, {"retry_count": [1]},
    {"retry_for": "x"}, {"retry_for": [1]}, {"failed_at": "x", "retry_for": 10},
    {"failed_at": 10**400, "retry_for": 1}, {"queue": 5}, {"queue": ["x"]},
    {"retry_queue": 7}, {"retry_queue": ""}, {"at": "x"}, {"created_at": "x"},
    {"enqueued_at": [1]}, {"jid": 12}, {"jid": {"a": 1}}, {"dead": "no"},
    {"timeout": "x"}, {"timeout": -1}, {"error_message": 5}, {"error_class": [1]},
    {"retried_at": "x"}, {"error_backtrace": 9},
]


def test_optional_fields_of_the_wrong_type_never_crash_a_processor(r: redis.Redis,
                                                                   daemon: Any) -> None:
    """Each failing job with one field of the wrong type is filed with its real error
    (``ValueError: boom``), into retry or dead per the documented rule (a ``retry`` that is
    null or no boolean or integer counts as absent: Boom's own ``retry=2`` applies, so
    its first failure is retried); no child dies."""
    d = daemon(CONFIG + "scheduler: false\n")
    children = {child.pid for child in d.wait_children(2)}
    for index, fields in enumerate(WRONG_TYPED_FIELDS):
        job = {"class": "Boom", "args": ["boom"], "jid": f"{index:024x}", **fields}
        job.setdefault("queue", "default")
        queue = job["queue"] if isinstance(job["queue"], str) else "default"
        r.lpush(f"queue:{queue}", json.dumps(job))
    total = len(WRONG_TYPED_FIELDS)
    until(lambda: r.zcard("retry") + r.zcard("dead") == total, 30, d.log())
    filed = [json.loads(m) for m in r.zrange("retry", 0, -1) + r.zrange("dead", 0, -1)]
    assert all(job["error_class"] == "ValueError" and job["error_message"] == "boom"
               for job in filed), filed
    retried = {str(json.loads(m).get("jid")) for m in r.zrange("retry", 0, -1)}  # any type
    for index, fields in enumerate(WRONG_TYPED_FIELDS):
        if "retry" in fields and not isinstance(fields["retry"], (bool, int)):
            assert f"{index:024x}" in retried, (fields, d.log())
    assert {child.pid for child in d.children()} == children, "no processor died"
    assert not r.keys("forkq:kills:*")


def _storm(count: int) -> list[bytes]:
    """``count`` distinct hostile payloads, each unrunnable: not JSON, not writable back, not
    an object, the wrong shape, or a class nobody registered."""
    shapes = [
        '{{"class":"Record","args":[NaN],"n":{n}}}',
        '{{"class":"Record","args":[{n},Infinity]}}',
        '{{"class":"Record","args":["\\ud800",{n}]}}',
        '{{"class":"Record","args":' + "[" * 150 + "{n}" + "]" * 150 + "}}",
        '{{"class":"os.system","args":["echo {n}"]}}',
        '{{"class":"builtins.eval","args":["{n}"]}}',
        '{{"class":{n},"args":[]}}',
        '{{"class":"Record","args":{{"n":{n}}}}}',
        '[{n}]',
        '{{"class":"Record","args":[{n}]',
    ]
    storm = [shapes[n % len(shapes)].format(n=n).encode() for n in range(count - 10)]
    return storm + [bytes([0xFF, n, 0xFE]) + b"{" for n in range(10)]


def test_a_storm_of_hostile_payloads_and_a_killed_daemon(r: redis.Redis, daemon: Any) -> None:
    """Hundreds of hostile payloads in a queue, ``schedule`` and ``retry`` among good jobs, and
    a second daemon SIGKILLed with jobs in flight: every good job runs once, every hostile one
    is in ``dead`` with its bytes, no forkq process dies, the killed daemon's jobs come back."""
    killed = daemon(CONFIG + "queues: [b-only]\n", new_session=True)
    killed.wait_children(2)
    held = [push(r, "Sleep", 120, f"held-{n}", queue="b-only") for n in range(2)]
    until(lambda: {row["jid"] for row in records(r, "test:started")} >= set(held), 15,
          killed.log())
    survivor = daemon(CONFIG)
    children = {child.pid for child in survivor.wait_children(2)}
    scheduler = survivor.scheduler()
    storm, good, past = _storm(300), [], time.time() - 5
    for index, raw in enumerate(storm):
        where = index % 3
        if where == 0:
            r.lpush("queue:default", raw)
        else:
            r.zadd("schedule" if where == 1 else "retry", {raw: past})
        if index % 3 == 0:
            good.append(push(r, "Record", index))
    victim = next(m.decode() for m in r.smembers("processes")
                  if m.decode().split(":")[1] == str(killed.pid))
    killed.sigkill(everything=True)
    r.pexpire(victim, 1)  # what 60 s of silence does: its records expire
    r.pexpire(f"forkq:beats:{victim}", 1)
    until(lambda: {json.loads(job)["jid"] for job in r.lrange("queue:b-only", 0, -1)}
          == set(held), 30, survivor.log())
    until(lambda: r.zcard("dead") == len(storm), 60, survivor.log()[-3000:])
    until(lambda: {row["jid"] for row in records(r)} >= set(good), 30, survivor.log())
    runs = [row["jid"] for row in records(r)]
    assert sorted(runs) == sorted(good), "every good job ran exactly once"
    kept = {_kept_bytes(entry) for entry in _dead_entries(r)}
    objects = [e for e in _dead_entries(r) if _kept_bytes(e) is None]
    assert all(raw in kept for raw in storm if _object_or_none(raw) is None)
    assert len(objects) == sum(_object_or_none(raw) is not None for raw in storm)
    assert survivor.alive() and scheduler.is_running()
    assert {child.pid for child in survivor.children()} == children
    assert r.zcard("schedule") == r.zcard("retry") == 0


def test_hostile_entries_in_the_beats_hash_do_not_stop_the_master(r: redis.Redis,
                                                                  daemon: Any) -> None:
    """The master reads its children's beats from ``forkq:beats:<identity>``, which any client
    can write: entries that are not beats are left out, and the master goes on."""
    d = daemon(CONFIG + "scheduler: false\n")
    children = {child.pid for child in d.wait_children(2)}
    until(lambda: r.scard("processes") == 1, 15)
    identity = next(iter(r.smembers("processes"))).decode()
    junk = {"1": "[" * 3000 + "]" * 3000, "2": '{"seq":1,"at":Infinity}',
            "3": '{"seq":1e400,"at":1.5}', "4": '{"seq":1,"at":1.5,"job":[1]}',
            "5": '{"seq":1,"at":1.5,"job":{"queue":1}}', "x": "{}", "6": "\xff"}
    for child in children:  # the real children's own entries too, until they beat again
        junk[str(child)] = '{"seq":2,"at":1.5,"loops":1,"job":{"started":"x","class":[]}}'
    r.hset(f"forkq:beats:{identity}", mapping=junk)
    beat = float(r.hget(identity, "beat") or 0)
    # one process-record beat (5 s) later, the master has read the hash several times
    until(lambda: float(r.hget(identity, "beat") or 0) > beat + 5, 15, d.log())
    good = [push(r, "Record", n) for n in range(3)]
    until(lambda: {row["jid"] for row in records(r)} >= set(good), 15, d.log())
    assert d.alive() and {child.pid for child in d.children()} == children
    assert "Traceback" not in d.log()


def test_hostile_jids_classes_and_messages_cannot_forge_a_log_line_or_a_title(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon(CONFIG)
    d.wait_children(2)
    forged = "\n2026-11-26T00:00:00.000Z pid=1 master ERROR: forged\x1b[2J\r"
    for job, args in (("Record", []), ("Boom", [f"message{forged}"]), (f"Nope{forged}", []),
                      ("Sleep", [5, "m"])):
        r.lpush("queue:default", json.dumps({"class": job, "args": args, "jid": f"j{forged}",
                                             "queue": "default", "retry": False}))
    until(lambda: r.zcard("dead") == 1 and len(records(r)) >= 1
          and "fail" in d.log() and "unknown job" in d.log(), 15, d.log())
    # a running job's class and jid are in its process title, beat after beat (2 s)
    titled = "busy Sleep jid=j\\n2026-11-26T00:00:00.000Z pid=1 master ERROR: forged\\x1b[2J\\r"
    until(lambda: any(titled in " ".join(kid.cmdline()) for kid in d.children()), 10,
          lambda: str([kid.cmdline() for kid in d.children()]))
    log = d.log()
    assert "\x1b" not in log and "\r" not in log
    assert not [line for line in log.splitlines() if line.startswith("2026-11-26T00:00:00")]
    assert log.count("\\n2026-11-26T00:00:00.000Z pid=1 master ERROR: forged\\x1b[2J\\r") >= 4
    assert d.alive() and len(d.children()) == 2
