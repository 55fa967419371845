"""Interop with the real Sidekiq 6.4.1 (Debian's ruby-sidekiq), both ways.

- Ruby's Sidekiq client enqueues, a forkq daemon runs the jobs;
- forkq's client enqueues, a real ``sidekiq`` process runs them;
- ``forkq.wirejson.dumps`` writes the same bytes as Ruby's ``JSON.generate``
  (sidekiq-wire.md §1a), checked on a few thousand varied values;
- Sidekiq's ``SortedEntry#reschedule`` moves a forkq-filed retry instead of
  duplicating it (the by-value ZINCRBY that needs byte-exact JSON);
- Sidekiq's ``ProcessSet`` / ``Workers`` list a forkq daemon with its tag, queues,
  concurrency, labels and busy job, and ``Process#quiet!`` / ``#stop!`` reach it.

Everything talks to the throwaway server of the ``server`` fixture; every Ruby
or sidekiq process is stopped by its pid. The Ruby scripts live in tests/ruby/.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import shutil
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import redis
import side_by_side

import forkq
from forkq import payload as payloads
from forkq import wirejson
from forkq.daemon.children import failures
from forkq.embedded import EmbeddedServer
from forkq.subprocesses import terminate

from . import debian
from .conftest import bench_table, measured, run_forkq, until

pytestmark = pytest.mark.ruby

RUBY_DIR = Path(__file__).parent / "ruby"
INSTALL = "apt-get install -y ruby-sidekiq"


# --- Ruby plumbing -----------------------------------------------------------------


@functools.cache
def _ruby_problem() -> str:
    """Why Ruby + Sidekiq cannot run here ("" when they can).

    When they are missing and this runs as root with apt-get (a fresh Debian machine, CI),
    Debian's ruby-sidekiq is installed once, so the README's test command works there too.
    """
    problem = _probe_ruby()
    if problem:
        debian.install("ruby-sidekiq")
        problem = _probe_ruby()
    return problem


def _probe_ruby() -> str:
    ruby = shutil.which("ruby")
    if ruby is None:
        return "`ruby` is not on PATH"
    probe = subprocess.run(
        [ruby, "-e", 'require "sidekiq"; require "sidekiq/api"; require "json"'],
        capture_output=True, text=True, timeout=60,
    )
    if probe.returncode != 0:
        return f"the sidekiq gem does not load: {probe.stderr.strip()}"
    if shutil.which("sidekiq") is None:
        return "the `sidekiq` command is not on PATH"
    return ""


def _need_ruby() -> None:
    problem = _ruby_problem()
    if problem:
        pytest.fail(f"{problem}; these tests need Debian's Sidekiq 6.4.1: {INSTALL}")


def _ruby_env(server: EmbeddedServer) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": server.url}


def _run_ruby(script: str, *args: str, server: EmbeddedServer | None = None,
              stdin: str | None = None) -> str:
    """Run tests/ruby/<script> to completion; its stdout (fails on a non-zero exit)."""
    _need_ruby()
    env = _ruby_env(server) if server is not None else dict(os.environ)
    done = subprocess.run(
        ["ruby", str(RUBY_DIR / script), *args], input=stdin, env=env,
        capture_output=True, encoding="utf-8", timeout=60,
    )
    assert done.returncode == 0, (
        f"ruby {script} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


@pytest.fixture
def sidekiq(server: EmbeddedServer, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory: ``sidekiq(*flags)`` starts a real ``sidekiq`` with echo_worker.rb loaded.

    Returns a function giving its log so far. Teardown stops it by pid: TERM, then KILL.
    """
    started: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
    log_path = tmp_path / "sidekiq.log"

    def log() -> str:
        return log_path.read_text(errors="replace")[-6000:]

    def start(*flags: str) -> Callable[[], str]:
        _need_ruby()
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in teardown
        proc = subprocess.Popen(
            ["sidekiq", "-r", str(RUBY_DIR / "echo_worker.rb"), *flags],
            env=_ruby_env(server), cwd=tmp_path, stdin=subprocess.DEVNULL,
            stdout=log_file, stderr=subprocess.STDOUT,
        )
        started.append((proc, log_file))
        return log

    yield start
    for proc, log_file in started:
        terminate(proc, 15)
        log_file.close()


# --- 1. Ruby enqueues, forkq runs ----------------------------------------------------


def test_ruby_client_jobs_run_in_forkq(server: EmbeddedServer, r: redis.Redis,
                                       daemon: Callable[..., Any]) -> None:
    _need_ruby()
    d = daemon("concurrency: 2\nrequire: jobs\nqueues: [default]")

    out = _run_ruby("push_hardworker.rb", server=server)
    push_jid, worker_jid = out.split()

    until(lambda: r.llen("test:hardworker") == 2, 20,
          f"forkq did not run both Ruby jobs; log:\n{d.log()}")
    ran = {row["jid"]: row for row in map(json.loads, r.lrange("test:hardworker", 0, -1))}
    assert ran == {
        push_jid: {"jid": push_jid, "name": "bob", "count": 5},
        worker_jid: {"jid": worker_jid, "name": "alice", "count": 7},
    }
    until(lambda: int(r.get("stat:processed") or 0) == 2, 10,
          f"stat:processed is {r.get('stat:processed')!r}, expected 2")
    assert r.llen("queue:default") == 0
    assert r.zcard("retry") == r.zcard("dead") == 0


# --- 2. forkq enqueues, Sidekiq runs -------------------------------------------------


def test_forkq_client_jobs_run_in_sidekiq(r: redis.Redis,
                                          sidekiq: Callable[..., Any]) -> None:
    client = forkq.Client(r)
    one = client.push({"class": "RubyEcho", "args": ["hi", 3], "queue": "rubyq"})
    bulk = client.push_bulk({"class": "RubyEcho", "queue": "rubyq",
                             "args": [["a", 1], ["b", 2.5], ["c", -40]]})
    assert one is not None and len(bulk) == 3
    assert r.smembers("queues") == {b"rubyq"}

    log = sidekiq("-q", "rubyq", "-c", "2", "-t", "5")

    until(lambda: r.llen("test:rubyecho") == 4, 30,
          f"Sidekiq did not run the 4 forkq jobs; sidekiq log:\n{log()}")
    echoed = sorted(item.decode() for item in r.lrange("test:rubyecho", 0, -1))
    expected = [f"hi:3:{one}", f"a:1:{bulk[0]}", f"b:2.5:{bulk[1]}", f"c:-40:{bulk[2]}"]
    assert echoed == sorted(expected), log()
    assert r.llen("queue:rubyq") == 0
    assert r.zcard("retry") == r.zcard("dead") == 0, log()


# --- 3. byte-exact JSON ---------------------------------------------------------------


_CHARS = (
    [chr(c) for c in range(0x20)]                       # every C0 control
    + list('"\\/\'<>&') + ["\x7f", "\x80", "\x9f", "\xa0", "\xe9", "\xff"]
    + ["\u0100", "\u4e2d", "\u2028", "\u2029", "\ufeff", "\ufffd", "\uffff", "\u200d"]
    + ["\U0001f600", "\U0001f468\u200d\U0001f469", "\U0010ffff", "\\u0041", "\\n"]
)


def _string(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return "".join(rng.choice("abcxyz_ 019") for _ in range(rng.randint(0, 12)))
    return "".join(
        rng.choice(_CHARS) if rng.random() < 0.6 else chr(rng.randint(0x20, 0x7e))
        for _ in range(rng.randint(1, 16))
    )


def _float_from_bits(rng: random.Random) -> float:
    while True:
        value: float = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(value):
            return value


def _floats(rng: random.Random) -> list[float]:
    fixed = [
        0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 2.0, 10.0, 100.0, 1e-4, 1.5e-4, 1e-5, 1.5e-5, 1e-7,
        1e14, 1e15, 1.5e15, 1e16, 1.5e16, 1e17, 1e20, 1e21, 1e22, 1e100, -1e20, -1e-5,
        123456789012345.6, 1234567890123456.7, 1234567890123456.0, 9999999999999998.0,
        9007199254740993.0, 12345678901234567.0, 99999999999999999.0, 0.30000000000000004,
        5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 1795238956.99455,
        1795238956.9948127, 1795242556.9961734, 1795238991.4271178, 1795239322.3189404,
        1.5e-7, 123456789012345680.0, -1e16,
        # the edges of the band wirejson.dumps hands to Python's C encoder
        math.nextafter(1e-4, 0.0), math.nextafter(1e-4, 1.0), math.nextafter(1e15, 0.0),
        -math.nextafter(1e15, 0.0), 999999999999999.9, 0.00010000000000000002,
    ]
    now = time.time()
    out = [*fixed, now, -now]
    for _ in range(300):  # epoch seconds, with anything from 0 to 7 decimals
        out.append(round(now + rng.uniform(-3e8, 3e8), rng.randint(0, 7)))
        out.append(now + rng.uniform(0, 86400 * 365))
    for exponent in range(-25, 26):  # every magnitude around the notation switches
        for _ in range(8):
            value = rng.random() * 10.0**exponent
            out.append(value if rng.random() < 0.7 else -value)
        out.append(10.0**exponent)
        out.append(round(rng.uniform(1, 10), rng.randint(0, 3)) * 10.0**exponent)
    for _ in range(250):  # the [1e15, 1e17] band where Ruby and Python differ
        value = rng.uniform(1e15, 1e17)
        out.append(value)
        out.append(float(round(value)))
    out += [_float_from_bits(rng) for _ in range(300)]
    return out


def _ints(rng: random.Random) -> list[int]:
    out = [0, -1, 1, 2**31, 2**53, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**64),
           10**30, -(10**30), 1180591620717411303424]
    out += [rng.randint(-1000, 1000) for _ in range(60)]
    out += [rng.getrandbits(rng.randint(1, 200)) * rng.choice((1, -1)) for _ in range(120)]
    return out


def _scalar(rng: random.Random) -> Any:
    kind = rng.randrange(6)
    if kind == 0:
        return _float_from_bits(rng) if rng.random() < 0.3 else rng.uniform(-1e6, 1e6)
    if kind == 1:
        return rng.getrandbits(rng.randint(1, 90)) * rng.choice((1, -1))
    if kind == 2:
        return _string(rng)
    return (None, True, False)[kind - 3]


def _nested(rng: random.Random, depth: int = 0) -> Any:
    if depth > 3 or rng.random() < 0.35:
        return _scalar(rng)
    if rng.random() < 0.5:
        return [_nested(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return {_string(rng): _nested(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def _values() -> list[Any]:
    rng = random.Random(20261121)
    values: list[Any] = [None, True, False, "", [], {}, [[]], {"": {}}]
    values += _floats(rng)
    values += _ints(rng)
    values += [_string(rng) for _ in range(500)]
    values += [_nested(rng) for _ in range(500)]
    job = payloads.build("HardWorker", ["bob", 1e-05, 1e20, "a/b\u2028"], queue="default",
                         options={"tags": ["x"]}, now=time.time())
    job["enqueued_at"] = time.time()
    failures.record_error(job, "ValueError", 'bad "x"\n\tat line 1', time.time())
    values.append(job)
    values.append({"args": ["a/b", "\u2028\u2029", "\U0001f600", "\x00\x1f\x7f", "</script>"],
                   "at": [0.1, 1e20, 1.5e-7, -0.0, 1e16, 123456789012345680.0, 1e-4, 1e15]})
    return values


def test_wirejson_matches_ruby_json_generate() -> None:
    values = _values()
    assert len(values) > 3000
    # Any valid JSON goes in: half the lines \u-escaped, half raw UTF-8.
    text = "".join(json.dumps(v, ensure_ascii=i % 2 == 0) + "\n" for i, v in enumerate(values))

    ruby_lines = _run_ruby("json_roundtrip.rb", stdin=text).split("\n")
    assert ruby_lines.pop() == "", "Ruby's output does not end with a newline"
    assert len(ruby_lines) == len(values)

    mismatches = [
        (value, ours, theirs)
        for value, theirs in zip(values, ruby_lines, strict=True)
        if (ours := wirejson.dumps(value)) != theirs or wirejson.dumps_exact(value) != theirs
    ]
    report = "\n".join(f"value {v!r}\n  forkq {o!r}\n  ruby  {t!r}" for v, o, t in mismatches[:20])
    assert not mismatches, f"{len(mismatches)} of {len(values)} differ:\n{report}"


# --- 4. Sidekiq's reschedule moves a forkq-filed retry ----------------------------------


def test_sidekiq_reschedule_moves_forkq_retry(server: EmbeddedServer,
                                              r: redis.Redis) -> None:
    now = time.time()
    payload = payloads.build(
        "Boom", ["x", 1e-05, 1e20, 1234567890123456.7, -0.0, 2**70, 'a/b\u2028"\xe9\U0001f600\x01'],
        queue="default", retry=3, options={"backtrace": 3, "tags": ["t"]}, now=now)
    payload["enqueued_at"] = now + 0.25
    failures.record_error(payload, "ValueError", 'bad "x"\nsecond line', now + 0.5)
    payload["error_backtrace"] = failures.compress_backtrace(["jobs.py:1:in `perform'"])
    member = payloads.encode(payload)
    r.zadd("retry", {member: now + 3600})

    target = time.time() + 60
    out = _run_ruby("reschedule_retry.rb", repr(target), server=server)
    assert out.strip() == payload["jid"]

    entries = r.zrange("retry", 0, -1, withscores=True)
    assert len(entries) == 1, (
        f"reschedule added a member instead of moving it (JSON bytes differ): {entries!r}")
    raw, score = entries[0]
    assert raw.decode() == member
    assert abs(score - target) < 0.01, f"score {score!r}, expected about {target!r}"


@pytest.mark.process
@pytest.mark.bench
def test_bench_runs_side_by_side_with_sidekiq() -> None:
    _need_ruby()
    result = run_forkq("bench", "-n", "1000", "-c", "2", "--repeat", "1",
                       "--latency-samples", "20", "--sidekiq", timeout=90)
    assert result.returncode == 0, result.stderr
    assert "figure  " in result.stdout and "sidekiq 2x10  forkq/sidekiq" in result.stdout
    assert "; sidekiq side: ruby " in result.stdout and ", sidekiq 6.4.1, redis-rb " \
        in result.stdout, result.stdout
    # forkq -c2, sidekiq 1x10, 2x10, the ratio
    rows = bench_table(result.stdout, columns=4, rows_of=side_by_side.TABLE_ROWS)
    for label, cells in rows.items():
        # one client per side; a ratio of differences only where Sidekiq's is above zero
        filled = cells[:2] if label.startswith("enqueue") else \
            cells[:3] if label == "p50 over floor ms" else cells
        assert all(measured(label, cell) for cell in filled), (label, result.stdout)


# --- 5. Sidekiq's ProcessSet / Workers list forkq; quiet! and stop! reach it ----------------


API_DAEMON = """
concurrency: 3
tag: interop
labels: [blue]
queues:
  - [critical, 2]
  - default
require: jobs
timeout: 5
"""


def _api_view(server: EmbeddedServer) -> dict[str, Any]:
    """What Sidekiq's Ruby API sees (tests/ruby/process_api.rb)."""
    view: dict[str, Any] = json.loads(_run_ruby("process_api.rb", server=server))
    return view


def _forkq_in(view: dict[str, Any], pid: int) -> dict[str, Any] | None:
    """The ProcessSet entry of the forkq master ``pid`` in ``view``, if listed."""
    return next((p for p in view["processes"] if p["pid"] == pid), None)


@pytest.mark.slow
def test_sidekiq_api_lists_forkq_and_its_quiet_and_stop_reach_it(
        server: EmbeddedServer, r: redis.Redis, daemon: Callable[..., Any]) -> None:
    _need_ruby()
    d = daemon(API_DAEMON)
    d.wait_children(3)
    jid = forkq.Client(r).push({"class": "Sleep", "args": [60, "api"], "queue": "critical"})
    assert jid is not None
    until(lambda: r.llen("test:started") == 1, 15, f"the Sleep job did not start:\n{d.log()}")
    started = r.lindex("test:started", 0)
    assert started is not None
    busy_pid = json.loads(started)["pid"]

    # 1. ProcessSet lists forkq with its tag, queues, concurrency, labels; Workers its job.
    seen: dict[str, Any] = {}

    def listed() -> bool:
        seen.update(_api_view(server))
        process = _forkq_in(seen, d.pid)
        return (process is not None and process["busy"] == 1 and len(seen["workers"]) == 1)

    until(listed, 20, f"Sidekiq's API never showed forkq busy: {seen}\nlog:\n{d.log()}")
    process = _forkq_in(seen, d.pid)
    assert process is not None
    identity = process["identity"]
    assert identity.split(":")[1] == str(d.pid) and r.sismember("processes", identity)
    assert {k: process[k] for k in ("tag", "queues", "concurrency", "labels", "stopping")} == {
        "tag": "interop", "queues": ["critical", "default"], "concurrency": 3,
        "labels": ["blue"], "stopping": False}
    assert seen["total_concurrency"] == 3 and seen["workers_size"] == 1
    until(lambda: _api_view(server)["leader"] == identity, 10, "ProcessSet#leader is not forkq")
    (work,) = seen["workers"]
    assert work["process"] == identity and work["thread"] == str(busy_pid)
    assert work["queue"] == "critical" and isinstance(work["run_at"], int)
    assert (work["payload_type"], work["class"], work["jid"], work["queue_in_payload"]) == (
        "Hash", "Sleep", jid, "critical")
    raw_workers = r.hgetall(f"{identity}:workers")
    assert raw_workers == r.hgetall(f"{identity}:work"), "6.4.2+ reads :work"
    fetched = json.loads(raw_workers[str(busy_pid).encode()])["payload"]  # the raw job string

    # 2. quiet!: forkq goes quiet, its idle children exit, the busy one keeps its job.
    signalled = time.time()
    assert json.loads(_run_ruby("process_api.rb", "quiet", identity, server=server)) == {
        "signalled": identity}

    def stopping() -> bool:
        seen.update(_api_view(server))
        process = _forkq_in(seen, d.pid)
        return process is not None and process["stopping"] is True

    until(stopping, 12, f"ProcessSet never showed stopping?: {seen}\nlog:\n{d.log()}")
    quiet_after = d.logged_at("Received remote TSTP") - signalled  # the daemon's own line
    assert "Received TSTP" in d.log(), d.log()
    until(lambda: [c.pid for c in d.children()] == [busy_pid], 10,
          f"the idle children did not exit: {d.children()}\nlog:\n{d.log()}")
    process = _forkq_in(seen, d.pid)
    assert process is not None and process["identity"] == identity and process["busy"] == 1
    assert [w["jid"] for w in seen["workers"]] == [jid]
    assert r.llen("test:ran") == 0 and r.llen("queue:critical") == 0

    # 3. stop!: forkq stops within a beat + its 5 s timeout, requeues the job, unregisters.
    signalled = time.time()
    assert json.loads(_run_ruby("process_api.rb", "stop", identity, server=server)) == {
        "signalled": identity}
    try:
        code = d.wait(5 + 5 + 8)
    except subprocess.TimeoutExpired:
        pytest.fail(f"stop! did not stop forkq; log:\n{d.log()}")
    stop_after = d.logged_at("Bye!") - signalled
    log = d.log()
    assert code == 0, log
    for line in ("Received remote TERM", "Shutting down", "Bye!"):
        assert line in log, f"{line!r} missing from the log:\n{log}"
    assert r.lindex("queue:critical", -1) == fetched.encode(), "back, unchanged, at the tail"
    assert r.llen("queue:critical") == 1 and r.llen("test:ran") == 0
    assert not r.sismember("processes", identity)
    assert not r.exists(f"{identity}:workers", f"{identity}:work")
    view = _api_view(server)
    assert _forkq_in(view, d.pid) is None and view["workers"] == [], view
    assert quiet_after < 12 and stop_after < 18, (quiet_after, stop_after)
