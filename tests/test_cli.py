"""The command line: bad configuration exits 78 naming setting and line; demo; bench; lint."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from .conftest import ROOT, bench_table, measured, positive, run_bench, run_forkq

BAD_CONFIGS = [
    ("concurrency: [1\n", "forkq.yml:2:1: (syntax)"),
    ("concurency: 5\n", "forkq.yml:1:1: concurency: unknown setting"),
    ("concurrency: many\n", "forkq.yml:1:14: concurrency:"),
    ("strict: maybe\n", "forkq.yml:1:9: strict:"),
    ("queues:\n  - [critical, 3]\n  - [low, 0]\n", "forkq.yml:3:11: queues:"),
    ("queues:\n  - [low, -2]\n", "forkq.yml:2:11: queues:"),
    ("require: nosuch.module\n", "forkq.yml:1:10: require: cannot import 'nosuch.module'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_CONFIGS)
def test_bad_configuration_exits_78_naming_setting_and_line(tmp_path: Path, text: str,
                                                            message: str) -> None:
    (tmp_path / "forkq.yml").write_text(text)
    result = run_forkq("run", "-C", "forkq.yml", cwd=tmp_path, timeout=30)
    assert result.returncode == 78, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_queue_names_that_are_not_utf8_exit_78_naming_the_variable(tmp_path: Path) -> None:
    result = run_forkq("run", cwd=tmp_path, timeout=30,
                       env={"FORKQ_QUEUES": os.fsdecode(b"default \xff")})
    assert result.returncode == 78, result.stderr
    assert result.stderr.strip() == ("forkq: config error: env FORKQ_QUEUES: queues: expected "
                                     "UTF-8 text, got '\\udcff' (bytes that are not UTF-8)")


def test_unreadable_config_exits_78(tmp_path: Path) -> None:
    result = run_forkq("-C", "missing.yml", cwd=tmp_path, timeout=30)
    assert result.returncode == 78
    assert "missing.yml" in result.stderr and "No such file" in result.stderr


def test_bad_flag_exits_78(tmp_path: Path) -> None:
    result = run_forkq("-c", "abc", cwd=tmp_path, timeout=30)
    assert result.returncode == 78 and "concurrency" in result.stderr


def test_demo_runs_the_example_jobs_on_an_embedded_server(tmp_path: Path) -> None:
    result = run_forkq("demo", "-C", str(ROOT / "etc" / "forkq.yml"), cwd=tmp_path,
                       timeout=90, env={"REDIS_URL": ""})
    assert result.returncode == 0, result.stderr
    assert "demo: 10 of 10 example jobs processed; daemon exited with 0" in result.stderr
    assert "embedded server running at unix://" in result.stderr
    assert (tmp_path / ".forkq" / "appendonlydir").is_dir()


@pytest.mark.bench
def test_bench_prints_its_figures() -> None:
    result = run_forkq("bench", "-n", "1000", "-c", "2", "--repeat", "1",
                       "--latency-samples", "20", timeout=60)
    assert result.returncode == 0, result.stderr
    rows = bench_table(result.stdout, columns=1)
    assert all(measured(label, cells[0]) for label, cells in rows.items()), result.stdout
    assert f"forkq: python {platform.python_version()}, redis-py {redis.__version__}, " \
           "hiredis " in result.stdout, result.stdout
    assert " (used by redis-py)" in result.stdout, "hiredis is installed with forkq"


def test_bench_sidekiq_outside_a_clone_names_the_clone_command(tmp_path: Path) -> None:
    """forkq installed without its repository (here: the package copied alone) has no
    ``bench/`` beside it: ``--sidekiq`` says how to get one."""
    shutil.copytree(ROOT / "forkq", tmp_path / "forkq",
                    ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "forkq", "bench", "--sidekiq"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"this forkq (in {tmp_path / 'forkq'}) is not installed from one" in done.stderr
    assert "git clone " in done.stderr and "pip install -e ." in done.stderr, done.stderr
    assert "bench/side_by_side.py" in done.stderr and done.stdout == ""


def test_bench_flags_that_moved_to_the_clone_name_their_script() -> None:
    for flag, script in [("--web", "bench/web_pages.py"), ("--split", "bench/split.py"),
                         ("--scheduled", "bench/scheduled.py"), ("--backlog", "bench/backlog.py")]:
        done = run_forkq("bench", flag, *(["10"] if flag != "--web" else []))
        assert done.returncode == 2, done.stderr
        assert f"{flag} moved out of the package: run python {script} in a clone" in \
            done.stderr, done.stderr


@pytest.mark.bench
def test_bench_split_shows_the_body_alone_forkq_alone_and_both() -> None:
    result = run_bench("split.py", "-n", "1500", "-c", "2", timeout=90)
    assert result.returncode == 0, result.stderr
    assert "bench/split.py: 2000 jobs, 2 processes" in result.stdout, result.stdout
    rows = {line[:20].strip(): line[20:].split() for line in result.stdout.splitlines()[2:]}
    assert list(rows) == ["job body alone", "forkq, no-op body", "forkq, the body"], rows
    assert all(len(cells) == 3 and all(positive(c) for c in cells)
               for cells in rows.values()), result.stdout


@pytest.mark.bench
def test_bench_backlog_prints_the_start_delay_and_the_largest_output_buffer() -> None:
    result = run_bench("backlog.py", "-n", "2000", "-c", "2", timeout=60)
    assert result.returncode == 0, result.stderr
    found = re.search(r"after a 2000-job drain: a pushed job started in ([\d.]+) ms \(p50 of "
                      r"20; max ([\d.]+) ms\); largest client output buffer during the drain: "
                      r"([\d,.]+) KB \(client id=\d+ ", result.stdout)
    assert found, result.stdout
    assert positive(found[1]) and positive(found[2]), result.stdout
    assert float(found[3].replace(",", "")) < 1024, "an output buffer grew past 1 MB"


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return found


def test_ruff_is_clean() -> None:
    result = subprocess.run([_tool("ruff"), "check", "forkq", "tests", "bench"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
