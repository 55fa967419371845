"""docs/internals.md lists the modules a job crosses from ``perform_async`` to its
acknowledgement; this test traces the calls of forkq's functions while jobs are pushed (in
this process) and run (in a real daemon's processor) and checks that every module called
for every job is in that list."""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path
from typing import Any

import redis

from forkq import client as clients

from . import jobs
from .conftest import ROOT, TESTS, until

JOBS = 1000
PATH_TABLE = re.compile(r"^\| \d+ \| `([\w/]+\.py)` \|", re.M)


def _listed() -> set[str]:
    text = (ROOT / "docs" / "internals.md").read_text()
    section = text[text.index("## A job's path"):text.index("## Enqueueing")]
    return set(PATH_TABLE.findall(section))


def _module(filename: str) -> str | None:
    root = str(ROOT / "forkq") + "/"
    return filename[len(root):] if filename.startswith(root) else None


def test_a_jobs_path_crosses_only_the_modules_the_docs_list(r: redis.Redis, daemon: Any,
                                                           tmp_path: Path) -> None:
    listed = _listed()
    assert len(listed) <= 12, listed
    counts: collections.Counter[str] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        module = _module(frame.f_code.co_filename) if event == "call" else None
        if module:
            counts[module] += 1

    clients.configure(clients.Client(r))
    try:
        sys.setprofile(profile)
        for n in range(JOBS):
            jobs.counted.perform_async(n)
    finally:
        sys.setprofile(None)
        clients.configure(None)
    pushing = {module for module, calls in counts.items() if calls >= JOBS}
    d = daemon("concurrency: 1\nrequire: jobs\nlog_level: warning\n",
               PYTHONPATH=f"{TESTS / 'job_path'}:{TESTS}:{ROOT}",
               FORKQ_TRACE_DIR=str(tmp_path), FORKQ_TRACE_ROOT=str(ROOT))
    until(lambda: r.get("stat:processed") == str(JOBS).encode(), 60, d.log)
    d.stop()
    running: set[str] = set()
    for dump in tmp_path.glob("*.json"):
        calls = json.loads(dump.read_text())
        if calls.get("daemon/children/job_run.py", 0) >= JOBS // 2:  # the processor
            running = {module for module, n in calls.items() if n >= JOBS // 2}
    assert running, "no processor's calls were traced"
    crossed = pushing | running
    print(f"pushing: {sorted(pushing)}\nrunning: {sorted(running)}")
    assert crossed <= listed, f"on the path but not in docs/internals.md: {crossed - listed}"
