"""Host failover (issue #37 c), by ``bench/failover.py`` with a short ``host_failover``: real
daemons on a private server, a whole process group SIGSTOPped for good, one frozen for twice
``host_failover`` and thawed, one cut off from Redis by a TCP proxy while it runs jobs longer
than the cut. Every job ends, none runs twice at once inside one daemon, and a thawed daemon
starts none of the jobs the leader took from it. The figures with the default 15 s are in
docs/benchmarks.md ("Host failover")."""

from __future__ import annotations

import pytest

from .conftest import run_bench


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.timeout(900)
def test_a_stopped_frozen_or_cut_off_daemon_loses_no_job_and_never_runs_one_twice_itself(
        ) -> None:
    result = run_bench("failover.py", "--trials", "2", "--failover", "6", "--concurrency", "2",
                       "--long", "20", "--cut", "14", timeout=800)
    out = result.stdout
    print(out, result.stderr[-3000:])
    assert result.returncode == 0, out + result.stderr[-5000:]
    assert "2 trials: p50" in out and "lost 0" in out
    assert "the thawed one logged the lapse: yes; started one again: 0; lost: 0" in out
    assert "copies running at once inside one daemon: 0; lost: 0" in out
