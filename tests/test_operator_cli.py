"""The operator's CLI against live daemons, every command in both output modes.

Each scenario runs twice: with human tables (the text is checked for the figures) and
with ``--json`` (the object is checked). Exit codes: 0 done, 2 usage, 66 an unknown
identity / queue / jid, 69 no Redis.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
import redis

from forkq import api, cli, wirejson
from forkq import payload as payloads
from forkq.embedded import EmbeddedServer
from forkq.ops import commands
from forkq.ops.stats import describe_damage

from .conftest import Daemon, attempts, identity_of, records, run_forkq, until

MODES = ["text", "json"]
DAEMON = """
concurrency: 2
tag: ops
queues: [default, critical]
require: jobs
timeout: 5
"""


class Ops:
    """Runs ``forkq <command>`` against the session server in one output mode."""

    def __init__(self, server: EmbeddedServer, mode: str) -> None:
        self.url = server.url
        self.mode = mode

    def __call__(self, *args: str, code: int = 0) -> Any:
        """Run it; assert the exit status; the parsed JSON (json mode) or the text."""
        extra = ["--json"] if self.mode == "json" else []
        done = run_forkq(*args, "--redis-url", self.url, *extra, timeout=30)
        assert done.returncode == code, (
            f"forkq {' '.join(args)}: exit {done.returncode}, wanted {code}\n"
            f"stdout: {done.stdout}\nstderr: {done.stderr}")
        if code not in (0, 66):
            return done.stderr
        if self.mode == "json":
            data = json.loads(done.stdout)
            if done.stderr:
                data["stderr"] = done.stderr
            return data
        return done.stdout + done.stderr

    @property
    def json(self) -> bool:
        return self.mode == "json"


@pytest.fixture(params=MODES)
def ops(request: pytest.FixtureRequest, server: EmbeddedServer) -> Ops:
    return Ops(server, request.param)


def _row(text: str, first: str) -> list[str]:
    """The cells of the table row starting with ``first`` (split on 2+ spaces)."""
    for line in text.splitlines():
        if line.startswith(first + " ") or line == first:
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no row {first!r} in:\n{text}")


def _jid(ops: Ops, result: Any) -> str:
    if ops.json:
        return str(result["jid"])
    found = re.search(r"\b([0-9a-f]{24})\b", result)
    assert found, result
    return found.group(1)


# --- enqueue, status, queues ------------------------------------------------------------------


def test_enqueue_status_and_queues(ops: Ops, r: redis.Redis,
                                   daemon: Callable[..., Daemon]) -> None:
    d = daemon(DAEMON)
    identity = identity_of(r, d)

    sleeper = _jid(ops, ops("enqueue", "Sleep", "30", "cli", "-q", "critical"))
    parked = [_jid(ops, ops("enqueue", "Record", str(n), "two", '{"a": [1]}', "-q", "parked",
                            "--retry", "0")) for n in range(3)]
    later = _jid(ops, ops("enqueue", "Record", "9", "--in", "300"))
    at = time.time() + 600
    iso = datetime.fromtimestamp(at).isoformat()
    fixed = ops("enqueue", "Record", "10", "--at", iso)
    if ops.json:
        assert fixed["at"] == pytest.approx(at, abs=1) and fixed["queue"] == "default"
    else:
        assert "to schedule (due" in fixed
    assert "invalid" in ops("enqueue", "Record", "--in", "soon", code=2)
    assert "invalid" in ops("enqueue", "Record", "--retry", "-1", code=2)

    pushed = [json.loads(m) for m in r.lrange("queue:parked", 0, -1)]
    assert [p["args"] for p in reversed(pushed)] == [[n, "two", {"a": [1]}] for n in range(3)]
    assert [p["jid"] for p in reversed(pushed)] == parked and {p["retry"] for p in pushed} == {0}
    assert {json.loads(m)["jid"] for m in r.zrange("schedule", 0, -1)} >= {later}
    until(lambda: len(records(r, "test:started")) == 1, 15, d.log())
    assert records(r, "test:started")[0]["jid"] == sleeper

    def status() -> Any:
        return ops("status")

    def settled() -> bool:  # the leader badge and the busy count follow the next heartbeat
        seen = status()
        if ops.json:
            (process,) = seen["processes"]
            return process["busy"] == 1 and process["leader"] is True
        return _row(seen, identity)[3:6] == ["1/2", "no", "yes"]

    until(settled, 15, f"status never showed the busy leader:\n{status()}\n{d.log()}")
    seen = status()
    if ops.json:
        (process,) = seen["processes"]
        assert (process["identity"], process["tag"], process["pid"], process["concurrency"],
                process["quiet"], process["queues"]) == (
            identity, "ops", d.pid, 2, False, ["default", "critical"])
        queues = {q["name"]: q for q in seen["queues"]}
        assert queues["parked"]["size"] == 3 and queues["parked"]["latency"] > 0
        assert seen["stats"]["enqueued"] == 3 and seen["stats"]["scheduled_size"] == 2
        assert seen["stats"]["workers_size"] == 1
        (busy,) = seen["busy"]
        assert (busy["identity"], busy["queue"], busy["class"], busy["jid"]) == (
            identity, "critical", "Sleep", sleeper)
    else:
        assert _row(seen.split("Busy (1)\n", 1)[1], identity)[2:5] == [
            "critical", "Sleep", sleeper]
        assert _row(seen, identity)[:3] == [identity, "ops", str(d.pid)]
        assert _row(seen, "parked")[1] == "3"
        assert _row(seen, "PROCESSED")[2:5] == ["ENQUEUED", "SCHEDULED", "RETRIES"]
        totals = seen.split("Totals\n", 1)[1].splitlines()[1].split()
        assert totals[2:4] == ["3", "2"] and totals[6] == "1/2"

    listed = ops("queues")
    if ops.json:
        assert {q["name"]: q["size"] for q in listed["queues"]} == {"critical": 0, "parked": 3}
    else:
        assert _row(listed, "parked")[1] == "3" and _row(listed, "critical")[1] == "0"

    jobs = ops("queues", "jobs", "parked", "--limit", "2")
    if ops.json:
        assert jobs["size"] == 3 and [j["jid"] for j in jobs["jobs"]] == parked[:2]
        assert jobs["jobs"][0]["args"] == [0, "two", {"a": [1]}]
    else:
        assert _row(jobs, parked[0])[1] == "Record" and parked[2] not in jobs

    assert "no queue 'nope'" in str(ops("queues", "clear", "nope", code=66))
    assert "needs a queue NAME" in ops("queues", "clear", code=2)
    cleared = ops("queues", "clear", "parked")
    assert (cleared["cleared"] == 3) if ops.json else ("3 jobs dropped" in cleared)
    assert r.llen("queue:parked") == 0 and not r.sismember("queues", "parked")


# --- retries, dead, scheduled -------------------------------------------------------------------


def _jids_in(ops: Ops, listing: Any) -> list[str]:
    if ops.json:
        return [job["jid"] for job in listing["jobs"]]
    return re.findall(r"^([0-9a-f]{24})\s", listing, re.MULTILINE)


def test_retries_dead_and_scheduled(ops: Ops, r: redis.Redis,
                                    daemon: Callable[..., Daemon]) -> None:
    d = daemon(DAEMON)
    failing = [_jid(ops, ops("enqueue", "SlowRetry", f"r{n}")) for n in range(4)]
    dying = [_jid(ops, ops("enqueue", "SlowRetry", f"d{n}", "--retry", "0")) for n in range(3)]
    later = [_jid(ops, ops("enqueue", "Record", str(n), "--in", "600")) for n in range(4)]
    until(lambda: r.zcard("retry") == 4 and r.zcard("dead") == 3, 20, d.log())

    # retries: list, retry (runs again, back in retry with the same count), kill, delete, clear
    listing = ops("retries")
    assert sorted(_jids_in(ops, listing)) == sorted(failing)
    if not ops.json:
        assert "RuntimeError: slow r0" in listing and "retries: 4 jobs" in listing
    assert ops("retries", "retry", failing[0])
    until(lambda: len(attempts(r, failing[0])) == 2, 15, d.log())
    rerun = [row for row in records(r, "test:slowretry") if row["jid"] == failing[0]][-1]
    assert rerun["retry_count"] == -1, "Sidekiq's retry lowers the count before the push"
    until(lambda: r.zcard("retry") == 4, 15, "the retried job did not fail back into retry")
    again = ops("retries", "retry", failing[0], "0" * 24, code=66)
    if ops.json:
        assert again["enqueued"] == [failing[0]] and again["missing"] == ["0" * 24]
    else:
        assert f"no job '{'0' * 24}' in retries" in again
    until(lambda: len(attempts(r, failing[0])) == 3 and r.zcard("retry") == 4, 15, d.log())

    killed = ops("retries", "kill", failing[1])
    assert (killed["killed"] == [failing[1]]) if ops.json else f"killed {failing[1]}" in killed
    deleted = ops("retries", "delete", failing[2])
    assert (deleted["deleted"] == [failing[2]]) if ops.json else f"deleted {failing[2]}" in deleted
    assert sorted(_jids_in(ops, ops("retries"))) == sorted([failing[0], failing[3]])
    assert "name one or more JID, or --all" in ops("retries", "retry", code=2)
    cleared = ops("retries", "clear")
    assert (cleared["cleared"] == 2) if ops.json else "2 jobs dropped" in cleared
    assert r.zcard("retry") == 0

    # dead: list (newest first), retry (it dies again: retry 0), delete, kill refused, clear
    assert sorted(_jids_in(ops, ops("dead"))) == sorted([*dying, failing[1]])
    assert _jids_in(ops, ops("dead", "--limit", "1")) == [failing[1]], "newest death first"
    ops("dead", "retry", dying[0])
    until(lambda: len(attempts(r, dying[0])) == 2 and r.zcard("dead") == 4, 15, d.log())
    ops("dead", "delete", dying[1], dying[2])
    assert "cannot be killed again" in ops("dead", "kill", dying[0], code=2)
    assert sorted(_jids_in(ops, ops("dead"))) == sorted([dying[0], failing[1]])
    cleared = ops("dead", "clear")
    assert (cleared["cleared"] == 2) if ops.json else "cleared dead: 2 jobs dropped" in cleared
    assert r.zcard("dead") == 0

    # scheduled: retry = run now (unchanged), kill, delete --all
    assert sorted(_jids_in(ops, ops("scheduled"))) == sorted(later)
    ops("scheduled", "retry", later[0])
    until(lambda: [row["jid"] for row in records(r)] == [later[0]], 15, d.log())
    ops("scheduled", "kill", later[1])
    assert [json.loads(m)["jid"] for m in r.zrange("dead", 0, -1)] == [later[1]]
    gone = ops("scheduled", "delete", "--all")
    assert (sorted(gone["deleted"]) == sorted(later[2:])) if ops.json else all(
        f"deleted {jid}" in gone for jid in later[2:])
    assert r.zcard("schedule") == 0
    empty = ops("scheduled", "clear")
    assert (empty["cleared"] == 0) if ops.json else "0 jobs dropped" in empty
    assert [row["jid"] for row in records(r)] == [later[0]], "nothing ran twice"


# --- quiet, stop --------------------------------------------------------------------------------


@pytest.mark.slow
def test_quiet_and_stop(ops: Ops, r: redis.Redis, daemon: Callable[..., Daemon]) -> None:
    a, b = daemon(DAEMON), daemon(DAEMON.replace("tag: ops", "tag: other"))
    ident_a, ident_b = identity_of(r, a), identity_of(r, b)

    def quiet(identity: str) -> bool:
        return r.hget(identity, "quiet") == b"true"

    short = ":".join(ident_a.split(":")[:2])  # host:pid, as a person would type it
    said = ops("quiet", short)
    assert (said["signalled"] == [ident_a]) if ops.json else f"asked {ident_a} to quiet" in said
    until(lambda: quiet(ident_a), 12, f"a never went quiet:\n{a.log()}")
    assert not quiet(ident_b) and "Received remote TSTP" in a.log()

    missing = ops("quiet", "nobody:1", short, code=66)
    assert "no live process 'nobody:1'" in str(missing)
    if ops.json:
        assert (missing["missing"], missing["signalled"]) == (["nobody:1"], [ident_a])
    assert "name one or more IDENTITY, or --all" in ops("stop", code=2)

    dumped = ops("dump", short)
    assert (dumped["signalled"] == [ident_a]) if ops.json else (
        f"asked {ident_a} to log its stacks" in dumped)
    until(lambda: "TTIN: master thread" in a.log(), 12, a.log())
    ops("reload", "--all")
    until(lambda: "reload: no changes" in a.log() and "reload: no changes" in b.log(), 12,
          f"{a.log()}\n{b.log()}")
    assert "Received remote HUP" in a.log()

    ops("stop", ident_a)
    assert a.wait(20) == 0, a.log()
    until(lambda: not r.sismember("processes", ident_a), 5)

    ops("quiet", "--all")
    until(lambda: quiet(ident_b), 12, b.log())
    stopped = ops("stop", "--all")
    assert (stopped["signalled"] == [ident_b]) if ops.json else (
        f"asked {ident_b} to stop" in stopped)
    assert b.wait(20) == 0, b.log()
    nobody = ops("stop", "--all")
    assert (nobody["signalled"] == []) if ops.json else "no live processes" in nobody


def test_no_redis_exits_69(tmp_path: Any) -> None:
    for mode in MODES:
        extra = ["--json"] if mode == "json" else []
        done = run_forkq("status", "--redis-url", f"unix://{tmp_path}/none.sock", *extra)
        assert done.returncode == 69 and "Redis did not answer" in done.stderr, done


def test_refusals_bad_input_and_json_errors(server: EmbeddedServer, r: redis.Redis) -> None:
    def run(*args: str) -> Any:
        return run_forkq(*args, "--redis-url", server.url, timeout=30)

    good = [wirejson.dumps(payloads.build("Record", [n], queue="q", now=time.time()))
            for n in range(2)]
    r.zadd("retry", {good[0]: 1e10, "garbage": 1e10 + 1, good[1]: 1e10 + 2})
    done = run("retries", "retry", "--all", "--json")
    out = json.loads(done.stdout)
    assert done.returncode == 1 and len(out["enqueued"]) == 2 and len(out["refused"]) == 1
    assert "not a job" in done.stderr and r.llen("queue:q") == 2 and r.zcard("retry") == 1

    past = run("enqueue", "Record", "1", "--at", "2000-01-01T00:00:00+00:00", "--json")
    assert past.returncode == 0 and json.loads(past.stdout)["at"] is None
    assert r.llen("queue:default") == 1 and r.zcard("schedule") == 0, "past: runs now"
    for bad in (["--in", "inf"], ["--at", "nan"], ["--at", "2024-13-99"]):
        assert run("enqueue", "Record", *bad).returncode == 2, bad
    for bad_args in (["-q", ""], ["[1,"], ["NaN"]):
        refused = run("enqueue", "Record", *bad_args)
        assert refused.returncode == 65 and "enqueue:" in refused.stderr, (bad_args, refused)
    assert run("dead", "--limit", "-1").returncode == 2

    missing = run("dead", "delete", "f" * 24, "--json")
    assert missing.returncode == 66 and json.loads(missing.stdout)["missing"] == ["f" * 24]
    r.set("queue:wrong", "not a list")
    r.sadd("queues", "wrong")
    wrong = run("queues", "--json")  # one damaged queue hides no other
    assert wrong.returncode == 1, wrong.stderr
    assert wrong.stderr == "forkq: note: key 'queue:wrong' holds a string, not a list; read as " \
                           "empty\n"
    listed = json.loads(wrong.stdout)
    assert {q["name"]: q["size"] for q in listed["queues"]} == {"q": 2, "default": 1, "wrong": 0}
    assert listed["damaged"] == ["queue:wrong"]
    for action in ("jobs", "clear"):  # the one queue: named, and nothing done
        named = run("queues", action, "wrong")
        assert (named.returncode, named.stderr) == (1, "forkq: queue 'wrong': key 'queue:wrong' "
                                                       "holds a string, not a list; nothing "
                                                       "done\n"), action
    assert r.get("queue:wrong") == b"not a list" and r.sismember("queues", "wrong")


def test_arguments_that_are_not_utf8_exit_65_naming_them(server: EmbeddedServer,
                                                         r: redis.Redis) -> None:
    """Bytes that are not UTF-8 on the command line (a lone surrogate to Python) cannot name
    a queue, job or process in Redis: one line, exit 65, nothing touched (they raised a
    UnicodeEncodeError with a traceback in ``queues pause`` and ``cancel``)."""
    name = os.fsdecode(b"a\xff")
    for args in (["queues", "pause", name], ["queues", "clear", name], ["cancel", name],
                 ["job", name], ["stop", name]):
        done = run_forkq(*args, "--redis-url", server.url, timeout=30)
        assert done.returncode == 65, (args, done.stderr)
        assert done.stderr.strip() == (f"forkq: {args[0]}: argument 'a\\udcff' is not UTF-8 "
                                       "text"), args
    assert r.dbsize() == 0
    # checked before Redis is asked anything: the same with no server there
    done = run_forkq("cancel", name, "--redis-url", "unix:///nonexistent/forkq.sock", timeout=30)
    assert done.returncode == 65, done.stderr


def test_damaged_counters_are_named_and_the_rest_is_shown(server: EmbeddedServer,
                                                           r: redis.Redis) -> None:
    """``status`` and ``queues`` read ``stat:processed``; any client may have written anything
    there (it raised ValueError with a traceback, then stopped the listing with exit 1): a
    damaged key reads as empty, is named, and the exit status is 1."""
    r.set("stat:processed", b"nan")
    r.set("stat:failed", b"x" * 100)
    r.set("forkq:paused", "not a set")
    r.lpush("queue:ok", "job")
    r.sadd("queues", "ok")
    note = ("forkq: note: key 'stat:processed' holds b'nan', not a number; read as empty\n"
            f"forkq: note: key 'stat:failed' holds {b'x' * 40!r}, not a number; read as empty\n"
            "forkq: note: key 'forkq:paused' holds a string, not a set; read as empty\n")
    for args in (["status"], ["queues"], ["status", "--json"]):
        done = run_forkq(*args, "--redis-url", server.url, timeout=30)
        assert (done.returncode, done.stderr) == (1, note), args
        assert "ok" in done.stdout, (args, done.stdout)  # the rest is shown
    shown = json.loads(run_forkq("status", "--json", "--redis-url", server.url).stdout)
    assert shown["damaged"] == ["stat:processed", "stat:failed", "forkq:paused"]
    assert (shown["stats"]["processed"], shown["stats"]["enqueued"]) == (0, 1)
    with pytest.raises(ValueError, match="stat:processed"):  # the API's documented contract
        api.Stats.read(r)


def test_every_operator_command_name_has_its_command() -> None:
    """The command line lists the names without importing the commands (its launch does not
    pay for them); each name must still reach one."""
    assert all(callable(commands.command(name)) for name in cli.OPERATOR)
    with pytest.raises(KeyError):
        commands.command("run")


def test_an_acl_refusal_is_no_damaged_key(server: EmbeddedServer, r: redis.Redis) -> None:
    """A user whose ACL denies a read ``status`` or ``queues`` needs exits 77 naming the
    refusal: it is not reported as a key of the wrong type read as empty."""
    r.lpush("queue:a", "job")
    r.sadd("queues", "a")
    r.acl_setuser("nollen", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                  commands=["+@all", "-llen"])
    try:
        for args in (["status"], ["queues"], ["queues", "--json"]):
            done = run_forkq(*args, "--redis-url", f"unix://nollen:pw@{server.socket}")
            assert done.returncode == 77, (args, done.stdout, done.stderr)
            assert "no permissions to run the 'llen' command" in done.stderr, done.stderr
            assert "note:" not in done.stderr and "damaged" not in done.stdout
    finally:
        r.acl_deluser("nollen")


def test_damage_is_described_as_found_again(r: redis.Redis) -> None:
    """What a damaged key holds is asked again when it is named: a key that changed since
    it was read says so rather than describing what it holds now as wrong."""
    r.set("queue:b", "text")
    r.set("stat:failed", "x" * 100)
    assert describe_damage(r, "queue:b") == "key 'queue:b' holds a string, not a list"
    assert describe_damage(r, "stat:failed") == f"key 'stat:failed' holds {b'x' * 40!r}, " \
                                                "not a number"
    assert describe_damage(r, "queue:gone") == ("key 'queue:gone' was not a list when it was "
                                                "read (it is gone now)")
    r.hset("host:1:abc", "busy", "1")
    assert describe_damage(r, "host:1:abc") == ("key 'host:1:abc' was not a hash when it was "
                                                "read (it is one now)")


def test_enqueue_takes_a_registered_jobs_options_from_the_app(
        server: EmbeddedServer, r: redis.Redis, tmp_path: Any) -> None:
    config = tmp_path / "forkq.yml"
    config.write_text(f"require: jobs\nredis_url: {server.url}\n")
    own = run_forkq("enqueue", "-C", str(config), "SlowRetry", "x", "--json")
    assert own.returncode == 0, own.stderr
    (pushed,) = [json.loads(m) for m in r.lrange("queue:default", 0, -1)]
    assert (pushed["class"], pushed["retry"], pushed["backtrace"]) == ("SlowRetry", 3, 5)
    foreign = run_forkq("enqueue", "-C", str(config), "RubyOnly", "1", "-q", "ruby")
    assert foreign.returncode == 65 and "'RubyOnly' is not a job of this app" in foreign.stderr
    assert r.llen("queue:ruby") == 0
    forced = run_forkq("enqueue", "-C", str(config), "RubyOnly", "1", "-q", "ruby", "--force")
    assert forced.returncode == 0 and "pushed anyway (--force)" in forced.stderr
    assert json.loads(r.lindex("queue:ruby", 0) or b"")["args"] == [1]


def test_names_and_messages_from_redis_reach_the_terminal_escaped(server: EmbeddedServer,
                                                                  r: redis.Redis) -> None:
    """Any client can write a queue name, a jid or an error message: printed raw, an escape
    sequence would act on the operator's terminal and a newline would forge a row."""
    evil = "evil\x1b[2J\x9b31m\r\nok  99  0.00s"
    r.sadd("queues", evil, b"bad\xff\x1b[2Jutf8")  # and a name that is not UTF-8
    r.lpush(f"queue:{evil}", "job")
    r.lpush(b"queue:bad\xff\x1b[2Jutf8", "job")
    entry = {"class": f"C{evil}", "args": [], "jid": f"j{evil}", "queue": "default",
             "error_class": "E", "error_message": f"m{evil}", "failed_at": time.time()}
    r.zadd("dead", {json.dumps(entry): time.time()})
    r.lpush(f"queue:{evil}", json.dumps({"class": "C", "args": [], "jid": f"q{evil}",
                                         "queue": evil}))
    for identity in (f"host:1:{evil}", "host:1:b"):  # "host" names both
        r.sadd("processes", identity)
        r.hset(identity, mapping={
            "info": json.dumps({"hostname": f"h{evil}", "pid": 1, "identity": identity,
                                "concurrency": 1, "queues": [evil], "started_at": time.time()}),
            "beat": time.time(), "busy": 0, "quiet": "false"})
    shown = "evil\\x1b[2J\\x9b31m\\r\\nok  99  0.00s"
    for args in (["queues"], ["status"], ["dead"], ["queues", "clear", "evil"],
                 ["job", f"q{evil}"], ["cancel", f"q{evil}"], ["quiet", "--all"],
                 ["quiet", "host"]):
        done = run_forkq(*args, "--redis-url", server.url, timeout=30)
        output = done.stdout + done.stderr
        assert not set("\x1b\x9b\r") & set(output), (args, output)
        assert not [line for line in output.splitlines() if line.startswith("ok ")], args
        assert shown in output, (args, output)
        if args[0] in ("queues", "status") and len(args) == 1:
            assert "bad\ufffd\\x1b[2Jutf8" in output, (args, output)
    done = run_forkq("queues", "--json", "--redis-url", server.url, timeout=30)
    assert not set("\x1b\x9b\r\n") & set(done.stdout.rstrip("\n")), done.stdout
    assert evil in [row["name"] for row in json.loads(done.stdout)["queues"]]  # exact
