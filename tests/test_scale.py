"""Scale: what an idle daemon sends Redis, and the benchmarks that measure it (``bench/idle.py``
beside Sidekiq, ``bench/fleet.py`` with simulated daemons), run small."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import redis
import redis_meter

from forkq import keys
from forkq.daemon.children import orphans

from .conftest import run_bench, until


def test_a_meter_reads_rates_between_two_readings_without_its_own_calls() -> None:
    first = redis_meter.Reading(10.0, 100, {"info": 3, "hset": 5}, 1.0, 400)
    second = redis_meter.Reading(12.0, 123, {"info": 6, "hset": 25, "blmove": 2}, 1.01, 600)
    usage = redis_meter.between(first, second)
    assert usage.sent_per_second == 10.0  # 23 sent, 3 of them the meter's INFO
    assert usage.per_command == {"hset": 10.0, "blmove": 1.0}
    assert usage.run_per_second == 11.0
    assert usage.cpu_percent == pytest.approx(0.5)
    assert usage.command_percent == pytest.approx(0.01)
    assert redis_meter.breakdown(usage) == "HSET 10.00, BLMOVE 1.00"


def _calls(r: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(fields["calls"])
            for name, fields in r.info("commandstats").items()}


def test_an_idle_processor_waits_in_redis_and_fetches_only_after_a_change(
        r: redis.Redis, daemon: Any) -> None:
    """Idle, nothing but the blocking waits, beats, record and leader's renewals reach Redis:
    no fetch script runs again until a job comes (the waits last 30 s, then are sent again)."""
    start = _calls(r).get("blmove", 0)  # the server may have served other tests before
    d = daemon("concurrency: 2\nrequire: jobs\n")
    d.wait_children(2)
    until(lambda: _calls(r).get("blmove", 0) - start >= 2, 15, d.log)  # both processors wait
    before = _calls(r)
    time.sleep(4)  # the window in which the old design fetched twice per processor
    after = _calls(r)
    fetched = after.get("evalsha", 0) - before.get("evalsha", 0)
    # evalsha here: the master's record (every 5 s) and the leader's lease (every 2 s)
    assert fetched <= 4, (before, after)
    assert after.get("blmove", 0) == before.get("blmove", 0)  # still waiting: no re-send
    assert after.get("lrange", 0) == before.get("lrange", 0)  # no fetch.lua turn


def test_the_sweep_asks_one_mget_for_the_whole_fleet(r: redis.Redis) -> None:
    """A sweep's command count does not grow with the number of live daemons."""
    for n in range(50):
        identity = f"host:{n}:abc"
        r.set(keys.alive(identity), "1", px=60_000)
        r.sadd(keys.INFLIGHT_REGISTRY, keys.inflight(identity, 1000 + n))
        r.rpush(keys.inflight(identity, 1000 + n), "queue:default")
    before = _calls(r)
    assert orphans.sweep(r, "not-the-leader", now=time.time(), full=False) == []
    after = _calls(r)
    sent = {name: after[name] - before.get(name, 0) for name in after
            if after[name] != before.get(name, 0)}
    assert sent == {"smembers": 1, "mget": 1, "info": 1}, sent


@pytest.mark.bench
@pytest.mark.process
def test_bench_idle_prints_a_daemon_s_idle_cost(tmp_path: Any) -> None:
    done = run_bench("idle.py", "--only", "forkq", "--seconds", "3", "--settle", "1",
                     "--rounds", "1", timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    pattern = r"round 1 forkq -c8: sent [\d.]+/s, run [\d.]+/s, Redis CPU [\d.]+ % \(running"
    assert re.search(pattern, done.stdout), done.stdout
    assert re.search(r"^\| forkq \| [\d.]+ \| [\d.]+ \| [\d.]+ % \| [\d.]+ % \|$", done.stdout,
                     re.MULTILINE), done.stdout


@pytest.mark.bench
@pytest.mark.process
def test_bench_fleet_prints_every_figure_with_real_and_simulated_daemons(tmp_path: Any) -> None:
    done = run_bench("fleet.py", "--real", "2", "--simulated", "5", "--window", "3",
                     "--settle", "2", "--samples", "10", "--rate", "100", timeout=240,
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    assert "fleet_sim:" not in done.stderr, done.stderr  # no simulated process failed
    for pattern in (r"2 real daemons \(-c 2, with their schedulers\) \+ 5 simulated",
                    r"lone daemon, idle job latency: p50 [\d.]+ ms",
                    r"idle, 3 s: Redis [\d,]+ commands/s sent",
                    r"CPU of the real daemons [\d.]+ %, of the simulator [\d.]+ %",
                    r"Redis memory per daemon: [\d.]+ KiB",
                    r"leader's sweep \(full, 1 in 10\): [\d.]+ ms, 0 dead found",
                    r"forkq status: [\d.]+ ms \(7 processes\)",
                    r"dashboard busy \(/busy\): [\d.]+ ms",
                    r"dashboard metrics \(/metrics\): [\d.]+ ms, \d+ KiB",
                    r"fleet, idle job latency: p50 [\d.]+ ms \([\d.]+ x the lone",
                    r"idle job latency on the fleet's queue \(2 processors wait on it\): "
                    r"p50 [\d.]+ ms",
                    r"steady load 100 jobs/s, 3 s: Redis [\d,]+ commands/s",
                    r"jobs ran; latency p50 [\d.]+ ms, p99 [\d.]+ ms"):
        assert re.search(pattern, done.stdout), (pattern, done.stdout)
