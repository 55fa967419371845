"""The package's layers: imports point down, and the public paths stay where they were.

Each check imports in a fresh interpreter, so what one test imported cannot hide what
another module pulls in.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

DAEMON_ONLY = ("psutil", "setproctitle", "yaml", "croniter")


def _loaded_after(statement: str) -> set[str]:
    """The modules ``statement`` loads in a fresh interpreter."""
    code = f"import sys, json; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return set(json.loads(out))


CLIENT_SIDE = {f"forkq{name}" for name in (
    "", ".client", ".connection", ".errors", ".hooks", ".keys", ".middleware", ".payload",
    ".concurrency", ".groups", ".limiter", ".redis_url", ".registry", ".scripts", ".unique",
    ".wirejson", ".batches", ".canvas", ".progress", ".signature", ".durability")}


def _forkq(modules: set[str]) -> set[str]:
    return {m for m in modules if m == "forkq" or m.startswith("forkq.")}


def test_import_forkq_loads_only_the_client_side() -> None:
    loaded = _loaded_after("import forkq")
    inside = _forkq(loaded)
    assert not {m for m in inside if m.startswith(("forkq.daemon", "forkq.ops", "forkq.tools"))}
    assert not inside & {"forkq.config", "forkq.cron", "forkq.cli", "forkq.embedded"}
    # what redis-py loads on its own is not forkq's doing (redis-py 8 loads the OpenTelemetry
    # SDK's metrics when it is installed, and they load psutil)
    ours = loaded - _loaded_after("import redis")
    assert not ours & set(DAEMON_ONLY), "a web process must not load the daemon's libraries"
    # an explicit list rather than a count: a new module here is a decision (redis_url.py:
    # the client must read Sentinel and TLS URLs too; unique.py: a push takes a unique job's
    # lock; groups.py: a push names the job's group; batches, canvas, signature, progress:
    # workflows are built and pushed by the client; durability: a push may wait for replicas)
    assert inside <= CLIENT_SIDE, sorted(inside - CLIENT_SIDE)


@pytest.mark.parametrize(("statement", "forbidden"), [
    ("import forkq.config", ("forkq.daemon", "forkq.ops", "forkq.tools")),
    ("import forkq.embedded", ("forkq.daemon", "forkq.ops", "forkq.tools")),
    ("import forkq.api", ("forkq.daemon", "forkq.tools", "forkq.config")),
    ("import forkq.daemon.children.processor", ("forkq.daemon.master", "forkq.tools")),
    ("import forkq.daemon.children.scheduler", ("forkq.daemon.master", "forkq.tools")),
])
def test_imports_point_down(statement: str, forbidden: tuple[str, ...]) -> None:
    loaded = _forkq(_loaded_after(statement))
    assert not {m for m in loaded if m.startswith(forbidden)}, statement


def test_the_public_paths_still_import() -> None:
    names = ["Client", "EnqueueError", "Job", "JobCancelledError", "JobKilledError",
             "JobTimeoutError", "__version__", "cancel_requested", "client_middleware",
             "current_job", "job", "on_child_boot", "on_child_exit", "server_middleware"]
    code = ("import forkq, forkq.api, forkq.examples; from forkq.cli import main; "
            f"print(json.dumps([hasattr(forkq, n) for n in {names!r}]))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert json.loads(out) == [True] * len(names)
