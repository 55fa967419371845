"""What a newcomer trips on: job names that drift with how the app was loaded, ``forkq
enqueue`` of a name the app does not have, ``--version``, command typos, an unset
``${REDIS_URL}`` under ``FORKQ_REDIS_URL``, the demo's Redis, ``bench/scheduled.py`` progress,
and a daemon that runs without Linux-only calls (``os.pipe2``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis

from forkq import __version__, config
from forkq.client import Client
from forkq.embedded import EmbeddedServer
from forkq.errors import ConfigError
from forkq.tools.driver import DaemonProcess
from forkq.wording import counted, duration

from .conftest import ROOT, TESTS, Daemon, records, run_bench, run_forkq, until

TASKS = """\
from forkq import job
from forkq import client as clients
import json


@job
def ping(word):
    clients.default().redis.rpush("test:ran", json.dumps({"job": "ping", "word": word}))
"""


def _package(root: Path, package: str = "myapp", *, init: bool = True) -> None:
    """``<root>/<package>/tasks.py`` holding the job ``ping``; a package when ``init``."""
    folder = root / package
    folder.mkdir()
    if init:
        (folder / "__init__.py").write_text("")
    (folder / "tasks.py").write_text(TASKS)


def _web(cwd: Path, url: str, code: str) -> str:
    """Run ``code`` as a web process would (its cwd the project, Redis from the environment);
    its stdout."""
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "FORKQ_REDIS_URL": url,
                                           "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# --- item 7: names that cannot drift --------------------------------------------------------


def test_a_required_file_in_a_package_runs_what_the_web_process_pushes(
        daemon: Callable[..., Daemon], server: EmbeddedServer, r: redis.Redis,
        tmp_path: Path) -> None:
    _package(tmp_path)
    d = daemon("require: myapp/tasks.py\nconcurrency: 1\n")
    pushed = _web(tmp_path, server.url, "from myapp.tasks import ping\n"
                  "print(ping.name, ping.perform_async('hello'))")
    assert pushed.split()[0] == "myapp.tasks.ping"
    until(lambda: records(r), 15, lambda: f"the job did not run; log:\n{d.log()}")
    assert records(r) == [{"job": "ping", "word": "hello"}]
    assert r.llen("dead") == 0 and "unknown job" not in d.log()


@pytest.mark.process
def test_a_required_file_outside_a_package_whose_import_name_differs_is_refused(
        tmp_path: Path) -> None:
    _package(tmp_path, "webjobs", init=False)
    (tmp_path / "forkq.yml").write_text("require: webjobs/tasks.py\n")
    done = run_forkq("run", "-C", "forkq.yml", cwd=tmp_path, timeout=30)
    assert done.returncode == 78, done.stderr
    assert "forkq.yml:1:10: require: cannot import 'webjobs/tasks.py'" in done.stderr
    assert "would be module 'tasks'" in done.stderr
    assert "imports it as 'webjobs.tasks'" in done.stderr
    assert "write require: webjobs.tasks" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.process
@pytest.mark.parametrize("name", ["json", "email"])  # json: forkq has imported it already
def test_a_required_file_named_like_a_standard_module_is_refused(tmp_path: Path,
                                                                  name: str) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / f"{name}.py").write_text(TASKS)
    (tmp_path / "etc" / "forkq.yml").write_text(f"require: {name}.py\n")
    done = run_forkq("run", "-C", "etc/forkq.yml", cwd=tmp_path, timeout=30)
    assert done.returncode == 78, done.stderr
    assert (f"would be module {name!r}, but that name is another module (the standard "
            "library)") in done.stderr


def test_the_module_form_of_a_namespace_package_gives_the_web_name(
        daemon: Callable[..., Daemon], server: EmbeddedServer, r: redis.Redis,
        tmp_path: Path) -> None:
    """The refusal's advice works: ``require: jobs.tasks`` names the jobs as the web does."""
    _package(tmp_path, "webjobs", init=False)
    d = daemon("require: webjobs.tasks\nconcurrency: 1\n")
    _web(tmp_path, server.url, "from webjobs.tasks import ping\nping.perform_async('ns')")
    until(lambda: records(r), 15, lambda: f"the job did not run; log:\n{d.log()}")
    assert records(r) == [{"job": "ping", "word": "ns"}]


@pytest.mark.process
def test_enqueue_refuses_a_name_the_app_does_not_register_unless_forced(
        server: EmbeddedServer, r: redis.Redis, tmp_path: Path) -> None:
    _package(tmp_path)
    (tmp_path / "forkq.yml").write_text(f"require: myapp/tasks.py\nredis_url: {server.url}\n")
    drifted = run_forkq("enqueue", "-C", "forkq.yml", "tasks.ping", "x", cwd=tmp_path)
    assert drifted.returncode == 65, drifted.stderr
    assert "'tasks.ping' is not a job of this app (known: myapp.tasks.ping)" in drifted.stderr
    assert "did you mean 'myapp.tasks.ping'?" in drifted.stderr and "--force" in drifted.stderr
    assert r.llen("queue:default") == 0

    as_json = run_forkq("enqueue", "-C", "forkq.yml", "nothing.like.it", "--json", cwd=tmp_path)
    assert as_json.returncode == 65 and '"error": "enqueue: ' in as_json.stdout
    assert r.llen("queue:default") == 0

    forced = run_forkq("enqueue", "-C", "forkq.yml", "tasks.ping", "x", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "pushed anyway (--force)" in forced.stderr
    own = run_forkq("enqueue", "-C", "forkq.yml", "myapp.tasks.ping", "y", cwd=tmp_path)
    assert own.returncode == 0 and "note" not in own.stderr, own.stderr
    assert [row.count(b"ping") for row in r.lrange("queue:default", 0, -1)] == [1, 1]


@pytest.mark.process
def test_enqueue_without_an_app_says_nothing_was_checked(
        server: EmbeddedServer, r: redis.Redis, tmp_path: Path) -> None:
    done = run_forkq("enqueue", "--redis-url", server.url, "Anything", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no app configured (require), so nothing was checked: 'Anything'" in done.stderr
    assert r.llen("queue:default") == 1


QUEUED_TASKS = """\
from forkq import Job, job


@job(queue="critical", retry=3)
def ping(word):
    pass


class Hard(Job, name="Hard", queue="low"):
    def perform(self):
        pass
"""


@pytest.mark.process
def test_enqueue_without_a_config_puts_a_job_on_its_own_queue(
        server: EmbeddedServer, r: redis.Redis, tmp_path: Path) -> None:
    """No ``-C``: the module a function job's dotted name names is imported (from the
    current directory) for its options, ``-r`` names the app for any other name, and ``-q``
    still wins."""
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(QUEUED_TASKS)

    def enqueue(*args: str) -> subprocess.CompletedProcess[str]:
        done = run_forkq("enqueue", "--redis-url", server.url, *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done

    own = enqueue("shop.tasks.ping", "hi")
    assert "to queue critical" in own.stdout and "note" not in own.stderr, own
    by_require = enqueue("-r", "shop.tasks", "Hard")
    assert "to queue low" in by_require.stdout and "note" not in by_require.stderr
    overridden = enqueue("shop.tasks.ping", "there", "-q", "default")
    assert "to queue default" in overridden.stdout
    assert [json.loads(job)["retry"] for job in r.lrange("queue:critical", 0, -1)] == [3]
    assert r.llen("queue:low") == 1 and r.llen("queue:default") == 1
    unknown = enqueue("shop.tasks.pong")
    assert "'shop.tasks' registers no job 'shop.tasks.pong'" in unknown.stderr


# --- item 8: papercuts ----------------------------------------------------------------------


@pytest.mark.process
def test_version_flag() -> None:
    done = run_forkq("--version")
    assert (done.returncode, done.stdout) == (0, f"forkq {__version__}\n")


@pytest.mark.process
def test_a_command_typo_suggests_the_command() -> None:
    done = run_forkq("stauts")
    assert done.returncode == 2
    assert done.stderr == ("forkq: unknown command 'stauts'; did you mean status? "
                           "(forkq --help lists them)\n")
    far = run_forkq("xyzzy")
    assert far.returncode == 2 and "commands: run, demo, bench" in far.stderr


@pytest.mark.process
def test_help_metavars_read_as_words() -> None:
    for command in ("enqueue", "bench"):
        done = run_forkq(command, "--help")
        assert done.returncode == 0
        usage = done.stdout.split("\n\n")[0]
        assert not re.search(r"\b(TO_QUEUE|RETRY|LATENCY_SAMPLES|REDIS_URL|OVER|DAEMONS|REPEAT|"
                             r"JOBS)\b", usage), usage
    assert "-q QUEUE" in run_forkq("enqueue", "--help").stdout


def _load(path: Path, *argv: str, **environ: str) -> config.Config:
    parser = argparse.ArgumentParser()
    config.add_flags(parser)
    return config.load(parser.parse_args(["-C", str(path), *argv]), environ)


def test_forkq_redis_url_wins_over_an_unset_variable_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "forkq.yml"
    path.write_text("redis_url: ${REDIS_URL}\nconcurrency: ${N}\n")
    with pytest.raises(ConfigError, match=r"forkq.yml:1:12: redis_url: environment variable "
                       r"REDIS_URL is not set"):
        _load(path, "-c", "2")
    by_env = _load(path, "-c", "2", FORKQ_REDIS_URL="redis://h:1/2")
    assert (by_env.redis_url, by_env.origin("redis_url")) == ("redis://h:1/2",
                                                               "env FORKQ_REDIS_URL")
    by_flag = _load(path, "-c", "2", "--redis-url", "redis://f:1/0")
    assert by_flag.redis_url == "redis://f:1/0" and by_flag.concurrency == 2
    with pytest.raises(ConfigError, match="concurrency: environment variable N is not set"):
        _load(path, FORKQ_REDIS_URL="redis://h:1/2")  # only the overridden setting is excused
    path.write_text("redis_url: ${REDIS_URL}\nconcurrency: many\n")
    with pytest.raises(ConfigError, match=r"forkq\.yml:2:14: concurrency:"):
        _load(path, FORKQ_REDIS_URL="redis://h:1/2")


@pytest.mark.process
def test_the_demo_does_not_use_redis_url_from_the_environment(
        server: EmbeddedServer, r: redis.Redis, tmp_path: Path) -> None:
    example = str(ROOT / "etc" / "forkq.yml")
    done = run_forkq("demo", "-C", example, cwd=tmp_path, timeout=90,
                     env={"REDIS_URL": "redis://127.0.0.1:1/0", "FORKQ_REDIS_URL": ""})
    assert done.returncode == 0, done.stderr
    assert ("demo: a private embedded server in .forkq (REDIS_URL is set in the environment: "
            "not used)") in done.stderr
    assert "demo: 10 of 10 example jobs processed; daemon exited with 0" in done.stderr
    told = run_forkq("demo", "-C", example, "--redis-url", server.url, cwd=tmp_path, timeout=90,
                     env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    assert told.returncode == 0, told.stderr
    assert "demo: the Redis named by flag --redis-url" in told.stderr
    assert int(r.get("stat:processed") or 0) >= 10, "the demo's daemon used the given server"


@pytest.mark.bench
@pytest.mark.process
def test_bench_scheduled_shows_progress_on_stderr() -> None:
    done = run_bench("scheduled.py", "-n", "40", "--over", "2", "-c", "1", "--daemons", "1",
                     timeout=120)
    assert done.returncode == 0, done.stderr
    assert "forkq: ran exactly once: 40 of 40" in done.stdout
    assert "forkq: waiting for the daemons and their leader" in done.stderr
    assert re.search(r"forkq: \d+ of 40 ran, \d+ due by now", done.stderr), done.stderr


# --- portability: no os.pipe2 (macOS has none) ----------------------------------------------

WITHOUT_LINUX_CALLS = """\
import os, socket, sys
del os.pipe2, socket.SOCK_CLOEXEC   # as on macOS
from forkq.cli import main
sys.exit(main(["run", "-C", sys.argv[1]]))
"""


class _PortableDaemon(DaemonProcess):
    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", WITHOUT_LINUX_CALLS,
                                         self.config_file], env=self.env, stderr=self.stderr,
                                        stdin=subprocess.DEVNULL, cwd=self.cwd)


@pytest.fixture
def portable_daemon(tmp_path: Path) -> Iterator[_PortableDaemon]:
    """A daemon whose Python lacks ``os.pipe2`` and ``socket.SOCK_CLOEXEC``; stopped by pid."""
    log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 - closed below
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}"}
    d = _PortableDaemon(str(tmp_path / "forkq.yml"), env=env, stderr=log, cwd=str(tmp_path))
    yield d
    known: set[int] = set()
    if d.process is not None:
        with contextlib.suppress(psutil.NoSuchProcess):
            known = {p.pid for p in psutil.Process(d.pid).children(recursive=True)}
    d.stop(timeout=10)
    log.close()
    for pid in known:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.process
def test_the_daemon_runs_without_linux_only_calls(
        portable_daemon: _PortableDaemon, server: EmbeddedServer, r: redis.Redis,
        tmp_path: Path) -> None:
    (tmp_path / "forkq.yml").write_text(textwrap.dedent(f"""\
        require: jobs
        concurrency: 2
        queues: [default, other]
        redis_url: {server.url}
        """))
    portable_daemon.start()
    log = tmp_path / "daemon.log"
    _web(tmp_path, server.url, "from forkq.client import Client\nc = Client()\n"
         "for q in ('default', 'other'):\n"
         "    c.push({'class': 'Record', 'args': [q], 'queue': q})")
    until(lambda: len(records(r)) == 2, 20, lambda: f"log:\n{log.read_text()}")
    assert sorted(row["queue"] for row in records(r)) == ["default", "other"]
    portable_daemon.signal(signal.SIGTERM)
    assert portable_daemon.wait(30) == 0, log.read_text()
    assert "pipe2" not in log.read_text() and "Traceback" not in log.read_text()


# --- issue 34 item 7.4: "1 job", never "1 jobs" -------------------------------------------


def test_counted_says_one_job_and_two_processes() -> None:
    assert [counted(n, "job") for n in (0, 1, 2)] == ["0 jobs", "1 job", "2 jobs"]
    assert counted(1, "process", "processes") == "1 process"
    assert counted(3, "process", "processes") == "3 processes"


@pytest.mark.process
def test_the_cli_says_1_job(server: EmbeddedServer, r: redis.Redis) -> None:
    r.lpush("queue:solo", json.dumps({"class": "Record", "args": [], "jid": "a" * 24}))
    r.sadd("queues", "solo")
    r.zadd("retry", {json.dumps({"class": "Record", "args": [], "jid": "b" * 24,
                                 "queue": "default", "retry_count": 1}): 4102444800})
    listed = run_forkq("retries", "--redis-url", server.url)
    assert listed.returncode == 0 and listed.stdout.startswith("retries: 1 job\n"), listed
    cleared = run_forkq("queues", "clear", "solo", "--redis-url", server.url)
    assert cleared.stdout == "cleared queue solo: 1 job dropped\n", cleared


# --- issue 34 item 7.5: a sub-millisecond job is not "0 ms" -------------------------------


def test_duration_keeps_a_sub_millisecond_time_readable() -> None:
    assert [duration(s) for s in (0, 0.00001, 0.0004, 0.0032, 0.25, 12.34, 75, 7500)] == [
        "0 ms", "<0.1 ms", "0.4 ms", "3.2 ms", "250 ms", "12.3 s", "1m 15s", "2h 05m"]
    assert duration(3 * 86400 + 3600) == "3d 01h"
    assert duration(float("nan")) == "" and duration("x") == "" and duration(True) == ""


def test_a_quick_job_s_log_line_shows_its_time_with_the_formatter(
        daemon: Callable[..., Daemon], r: redis.Redis) -> None:
    d = daemon("concurrency: 1\nrequire: jobs\n")
    jid = Client(r).push({"class": "Record", "args": [1]})
    until(lambda: f"jid={jid} done: " in d.log(), 15, d.log)
    shown = d.log().split(f"jid={jid} done: ", 1)[1].splitlines()[0]
    assert shown == duration(_parse_duration(shown)) and shown != "0 ms", shown
    assert "sec" not in shown


def _parse_duration(text: str) -> float:
    """The seconds a duration like ``0.4 ms`` / ``<0.1 ms`` / ``1.2 s`` shows."""
    number, unit = text.lstrip("<").split()
    return float(number) / (1000 if unit == "ms" else 1) / (2 if text.startswith("<") else 1)


# --- issue 34 item 7.8: a failed job's traceback starts in the application -----------------


def _traceback_of(log: str, jid: str) -> list[str]:
    """The lines after ``jid``'s failure line, up to the next log line."""
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if f"jid={jid} fail:" in line)
    end = next((i for i in range(start + 1, len(lines))
                if re.match(r"\d{4}-\d\d-\d\dT", lines[i])), len(lines))
    return lines[start + 1:end]


@pytest.mark.parametrize(("level", "forkq_frames"), [("info", False), ("debug", True)])
def test_a_failed_job_s_traceback_hides_forkq_s_frames_unless_debugging(
        daemon: Callable[..., Daemon], r: redis.Redis, level: str, forkq_frames: bool) -> None:
    d = daemon(f"concurrency: 1\nrequire: jobs\nlog_level: {level}\n")
    jid = Client(r).push({"class": "Boom", "args": ["traced"], "retry": 0})
    until(lambda: f"jid={jid} fail:" in d.log() and "ValueError: traced" in d.log(), 15,
          d.log)
    trace = _traceback_of(d.log(), jid)
    frames = [line for line in trace if line.startswith('  File "')]
    own = [line for line in frames if f'"{ROOT / "forkq"}/' in line]
    assert trace[0] == "Traceback (most recent call last):" and trace[-1] == "ValueError: traced"
    assert re.search(r'tests/jobs\.py", line \d+, in perform$', frames[-1]), trace
    if forkq_frames:
        # every frame of the job's path into the body: job_run, the middleware chain, the
        # registry's call
        assert "forkq/daemon/children/job_run.py" in own[0], trace
        assert {"middleware.py", "registry.py"} <= {line.split('"')[1].rsplit("/", 1)[1]
                                                    for line in own}, trace
    else:
        assert own == [] and len(frames) == 1, trace
