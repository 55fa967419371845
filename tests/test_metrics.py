"""Job metrics: recorded by every processor child, written with its heartbeat in the key layout
of Sidekiq 7.x and 8.x metrics and in forkq's own counters (``forkq:metrics:jobs``); queue
samples by the scheduler leader; the read API (:mod:`forkq.metrics.query`) and the
Prometheus exposition (:mod:`forkq.metrics.prometheus`) of a cluster of two daemons.

The layout checks mirror what Sidekiq's own readers compute, with Ruby's ``strftime`` and
redis-rb, in ``tests/ruby/metrics_query.rb``, whose header cites the source lines.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

import forkq
from forkq import api, keys
from forkq import client as clients
from forkq.client import Client
from forkq.embedded import EmbeddedServer
from forkq.metrics import layout, prometheus, query, recorder, sampler, text_format
from forkq.metrics.recorder import Recorder, job_class, queue_writes

from . import flows
from .conftest import NEXT_BEAT, Daemon, identity_of, records, run_bench, until
from .test_sidekiq_interop import _run_ruby

RUNS = 7  # Record jobs
FAILS = 3  # Boom jobs, retry: false (dropped, counted failed)


def _push_work(r: redis.Redis, queue: str = "default", runs: int = RUNS,
               fails: int = FAILS) -> list[str]:
    client = Client(r)
    jids = [client.push({"class": "Record", "args": [n], "queue": queue}) for n in range(runs)]
    jids += [client.push({"class": "Boom", "args": ["no"], "queue": queue, "retry": False})
             for _ in range(fails)]
    return [jid for jid in jids if jid is not None]


def _forkq_counts(r: redis.Redis) -> dict[tuple[str, str, str], int]:
    found = {}
    for raw_field, value in r.hgetall(layout.JOBS).items():
        parsed = layout.parse_series_field(raw_field)
        assert parsed is not None, raw_field
        found[parsed] = int(value)
    return found


SIDEKIQ_KEYS = ("j|20[0-9][0-9][0-9][0-9][0-9][0-9]|*", "j|[0-9][0-9][0-9][0-9][0-9][0-9]|*:??",
                "j|[0-9][0-9][0-9][0-9][0-9][0-9]|*:?")
"""Patterns of Sidekiq 7's minute, Sidekiq 8's minute and Sidekiq 8's 10-minute j| hashes."""


def _sums(r: redis.Redis, pattern: str) -> Counter[str]:
    """The ``j|…`` hashes matching ``pattern`` (a test may straddle a minute), summed."""
    total: Counter[str] = Counter()
    for key in r.keys(pattern):
        total.update({k.decode(): int(v) for k, v in r.hgetall(key).items()})
    return total


def identity_beats(r: redis.Redis, d: Daemon) -> dict[bytes, int]:
    """The ``seq`` of each child's heartbeat entry of daemon ``d``."""
    key = f"forkq:beats:{identity_of(r, d)}"
    return {pid: json.loads(entry)["seq"] for pid, entry in r.hgetall(key).items()}


def until_beaten_again(r: redis.Redis, d: Daemon, beats: dict[bytes, int]) -> None:
    """Wait (:data:`NEXT_BEAT`) until each child of ``beats`` still there has beaten since."""
    until(lambda: all(seq > beats[pid] for pid, seq in identity_beats(r, d).items()
                      if pid in beats), NEXT_BEAT, lambda: d.log())


def _done(r: redis.Redis, d: Daemon, queue: str, runs: int, fails: int) -> None:
    def settled() -> bool:
        counts = _forkq_counts(r)
        return (counts.get((queue, "Record", "p")) == runs
                and counts.get((queue, "Boom", "f"), 0) == fails)
    until(settled, 20, lambda: f"{_forkq_counts(r)}\n{d.log()}")


def test_a_daemon_writes_the_sidekiq_7_and_8_keys_and_forkq_counters(
        r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 2\nrequire: jobs\n")
    _push_work(r)
    until(lambda: len(records(r)) == RUNS, 15, lambda: d.log())
    _done(r, d, "default", RUNS, FAILS)
    d.stop(timeout=10)  # the last counts are written on the way out: nothing more may come
    counts = _forkq_counts(r)
    assert counts[("default", "Record", "p")] == RUNS
    assert ("default", "Record", "f") not in counts
    assert counts[("default", "Boom", "p")] == FAILS == counts[("default", "Boom", "f")]
    for klass, runs in (("Record", RUNS), ("Boom", FAILS)):
        buckets = sum(v for (q, k, m), v in counts.items() if k == klass and m.startswith("b"))
        assert buckets == runs
        assert counts[("default", klass, "us")] >= 0
    for pattern in SIDEKIQ_KEYS:
        sums = _sums(r, pattern)
        assert sums["Record|p"] == RUNS and sums["Record|f"] == 0, (pattern, sums)
        assert sums["Boom|p"] == FAILS == sums["Boom|f"], (pattern, sums)
        assert "Boom|ms" not in sums and "Record|ms" in sums
    ttls = {key.decode(): r.ttl(key) for key in r.keys("j|*")}
    for key, ttl in ttls.items():
        short = len(key.split("|")[1]) == 8 or len(key.rsplit(":", 1)[1]) == 2
        assert (0 < ttl <= layout.SHORT_TERM) if short else (layout.SHORT_TERM < ttl
                                                             <= layout.MID_TERM), (key, ttl)
    hist = query.histogram(r, "Record", 5)
    assert sum(count for _, count in hist) == RUNS and hist[0][0] == "<= 20 ms"
    assert query.histogram(r, "Boom", 5) == [(label, 0) for label in query.bucket_labels()]
    rows = {row.name: row for row in query.job_classes(r, 60)}
    assert (rows["Record"].executions, rows["Record"].failures) == (RUNS, 0)
    assert (rows["Boom"].executions, rows["Boom"].failures) == (FAILS, FAILS)
    assert rows["Boom"].total_seconds == 0 and rows["Boom"].avg_ms == 0


# 2025-02-05 08:03:30 UTC (day, hour and minute below 10: padded or not per format),
# 2026-11-25 23:47:10 UTC (two-digit everything), and now
FIXED_TIMES = (1738742610.0, 1795650430.0)


@pytest.mark.parametrize("at", [*FIXED_TIMES, None])
@pytest.mark.ruby
def test_sidekiqs_readers_find_what_forkq_wrote(r: redis.Redis, server: EmbeddedServer,
                                                at: float | None) -> None:
    """One beat's writes, read back as Sidekiq 7.3 and 8.1 read them (their key formats fed
    to Ruby's strftime, redis-rb: tests/ruby/metrics_query.rb cites the source lines): the
    same key names, totals and histogram for both versions."""
    now = time.time() if at is None else at
    recorder = Recorder()
    for seconds in (0.001, 0.019, 0.020, 0.250, 4.0, 400.0):
        recorder.record("default", "App::HardJob", seconds, failed=False)
    recorder.record("low", "App::HardJob", 0.5, failed=True)
    pipe = r.pipeline(transaction=False)
    queue_writes(pipe, recorder.drain(), now)
    assert not [reply for reply in pipe.execute() if isinstance(reply, Exception)]
    read = json.loads(_run_ruby("metrics_query.rb", repr(now), "App::HardJob", server=server))
    assert read["keys"] == [layout.jobs7(now), layout.jobs8(now), layout.jobs8_ten(now),
                            layout.histogram7("App::HardJob", now),
                            layout.histogram8("App::HardJob", now)]
    # Sidekiq's Histogram#record_time: bucket i counts runs of fewer than EDGES_MS[i] ms
    expected_hist = [0] * layout.BUCKETS
    for index in (0, 0, 1, 7, 14, 25):
        expected_hist[index] += 1
    wanted = {"p": 7, "f": 1, "ms": 1 + 19 + 20 + 250 + 4000 + 400000}
    for version in ("7", "8"):
        assert read[version]["for_job"] == read[version]["top_jobs"] == wanted, (version, read)
        assert read[version]["hist"] == expected_hist, (version, read)
    assert read["8"]["ten_minutes"] == wanted, read
    ours = query.histogram(r, "App::HardJob", 1, now)
    assert [count for _, count in ours] == expected_hist
    (row,) = query.job_classes(r, 1, now)
    assert row == query.ClassMetrics("App::HardJob", 7, 1, wanted["ms"] / 1000,
                                     wanted["ms"] / 6)
    for key in read["keys"]:
        assert 0 < r.ttl(key) <= (layout.MID_TERM if key == layout.jobs8_ten(now)
                                  else layout.SHORT_TERM), key


def test_the_key_names_of_a_fixed_minute() -> None:
    at = FIXED_TIMES[0]
    assert (layout.jobs7(at), layout.jobs8(at), layout.jobs8_ten(at)) == (
        "j|20250205|8:3", "j|250205|8:03", "j|250205|8:0")
    assert (layout.histogram7("K", at), layout.histogram8("K", at)) == ("K-05-08:3",
                                                                        "h|K-5-8:3")
    at = FIXED_TIMES[1]
    assert (layout.jobs7(at), layout.jobs8(at), layout.jobs8_ten(at)) == (
        "j|20261125|23:47", "j|261125|23:47", "j|261125|23:4")
    assert (layout.histogram7("K", at), layout.histogram8("K", at)) == ("K-25-23:47",
                                                                        "h|K-25-23:47")
    assert [_buckets(s, "sidekiq_buckets") for s in (0, 0.0199, 0.02, 334.999, 335.0)] == [
        0, 0, 1, 24, 25]
    assert [_buckets(s, "le_buckets") for s in (0.02, 0.0201, 335.0, 335.1)] == [0, 1, 24, 25]


def _buckets(seconds: float, kind: str) -> int:
    """The one bucket of ``kind`` a successful run of ``seconds`` is counted in."""
    counts = recorder.Recorder()
    counts.record("q", "K", seconds, failed=False)
    [(bucket, runs)] = getattr(counts.drain()[("q", "K")], kind).items()
    assert runs == 1
    return int(bucket)


def test_coroutine_jobs_run_in_lanes_are_counted(r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 1\nasync_concurrency: 3\nrequire: jobs\n")
    client = Client(r)
    for n in range(4):
        client.push({"class": "answer_async", "args": [n]})
    for _ in range(2):
        client.push({"class": "async_boom", "args": ["no"]})

    def counted() -> dict[tuple[str, str, str], int]:
        return {k: v for k, v in _forkq_counts(r).items() if k[2] in ("p", "f")}
    until(lambda: counted() == {("default", "answer_async", "p"): 4,
                                ("default", "async_boom", "p"): 2,
                                ("default", "async_boom", "f"): 2}, 20,
          lambda: f"{counted()}\n{d.log()}")


def test_cancelled_jobs_count_per_class_as_they_count_in_forkq_failed_total(
        r: redis.Redis, daemon: Any) -> None:
    """One job killed after its cancel grace, one that stops itself on seeing the
    request: each is one failed run of its class in Sidekiq's j| metrics, in forkq's per
    queue and class counters and in the exposition, as in ``stat:failed``, and once only."""
    client = Client(r)
    killed = str(client.push({"class": "Patient", "args": [60]}))
    stopped = str(client.push({"class": "Cooperative", "args": ["return"]}))
    d = daemon("concurrency: 2\nrequire: jobs\ncancel_grace: 1\n")
    until(lambda: len(records(r, "test:started")) == 2, 15, d.log)
    api.cancel(r, stopped)
    api.cancel(r, killed)
    until(lambda: r.zcard("dead") == 2, 15, d.log)
    until(lambda: _forkq_counts(r).get(("default", "Cooperative", "f")) == 1, 15, d.log)
    counts = _forkq_counts(r)
    for klass in ("Patient", "Cooperative"):
        assert (counts.get(("default", klass, "p")), counts.get(("default", klass, "f"))) == (
            1, 1), (klass, counts)
        assert sum(v for (_, k, m), v in counts.items() if k == klass and m.startswith("b")) == 1
    for pattern in SIDEKIQ_KEYS:  # 7's minute, 8's minute, 8's ten minutes
        sidekiq = _sums(r, pattern)
        assert (sidekiq["Patient|p"], sidekiq["Patient|f"]) == (1, 1), (pattern, sidekiq)
        assert (sidekiq["Cooperative|p"], sidekiq["Cooperative|f"]) == (1, 1), (pattern, sidekiq)
    assert int(r.get("stat:failed") or 0) == 2
    families = {f.name: f for f in text_string_to_metric_families(
        prometheus.exposition(r).decode())}
    failed = {sample.labels["job_class"]: sample.value
              for sample in families["forkq_jobs_failed"].samples}
    assert failed == {"Patient": 1.0, "Cooperative": 1.0}, failed
    assert [sample.value for sample in families["forkq_failed"].samples] == [2.0]


def test_hostile_metrics_keys_do_not_stop_the_beat_the_readers_or_the_exposition(
        r: redis.Redis, daemon: Any) -> None:
    now = time.time()
    r.set(layout.jobs8(now), "not a hash")
    r.set(layout.jobs8(now + 60), "not a hash")
    r.set(layout.JOBS, "not a hash")
    r.lpush(layout.queue_samples(layout.minute_of(now)), "not a hash")
    r.hset(layout.jobs7(now), mapping={"nopipe": "1", "X|p": "many"})
    r.set("queue:weird", "a string")
    r.sadd("queues", "weird")
    d = daemon("concurrency: 1\nrequire: jobs\n")
    _push_work(r, runs=2, fails=0)
    until(lambda: len(records(r)) == 2, 15, lambda: d.log())
    # the beats go on (its entry refreshed), and the 7.x key took its counts
    def written() -> int:
        return sum(int(r.hget(key, "Record|p") or 0) for key in r.keys("j|20*"))
    until(lambda: written() == 2, 10, lambda: d.log())
    until(lambda: "job metrics not written" in d.log(), 10, lambda: d.log())
    # the children's beats go on after the refused writes
    beats = identity_beats(r, d)
    assert beats, d.log()
    until_beaten_again(r, d, beats)
    assert query.job_classes(r, 1, now) == []  # the minute whose keys are hostile
    assert query.queue_series(r, "default", 1, now) == []
    assert sampler.sample(r, time.time()) in (0, 1)
    text = prometheus.exposition(r).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["forkq_metrics_skipped_keys"].samples[0].value >= 2
    assert "weird" not in {s.labels.get("queue") for s in families["forkq_queue_size"].samples}
    assert d.alive()


def test_the_leader_samples_each_queue_once_a_minute(r: redis.Redis, daemon: Any) -> None:
    Client(r).push({"class": "Record", "args": [1], "queue": "waiting"})
    d = daemon("concurrency: 1\nrequire: jobs\n")
    until(lambda: query.queue_series(r, "waiting", 2), 15, lambda: d.log())
    points = query.queue_series(r, "waiting", 2)  # one, or two across a minute's end
    assert len(points) in (1, 2) and len({point.at for point in points}) == len(points)
    for point in points:
        assert point.size == 1 and 0 <= point.latency < 30
        assert point.at == layout.minute_of(point.at) and abs(point.at - time.time()) < 120
        assert 0 < r.ttl(layout.queue_samples(point.at)) <= layout.QUEUE_SAMPLES_TTL


def test_the_exposition_of_two_daemons_counts_the_work_of_both(
        r: redis.Redis, daemon: Any) -> None:
    one = daemon("concurrency: 2\nrequire: jobs\ntag: east\nqueues: [east]\n")
    two = daemon("concurrency: 3\nrequire: jobs\ntag: west\nqueues: [west]\n")
    east = _push_work(r, "east", runs=4, fails=1)
    west = _push_work(r, "west", runs=5, fails=2)
    Client(r).push({"class": "Record", "args": [0], "queue": "idle"})
    until(lambda: len(records(r)) == 9, 20, lambda: one.log() + two.log())
    ran = Counter(row["queue"] for row in records(r))
    assert ran == {"east": 4, "west": 5}
    _done(r, one, "east", 4, 1)
    _done(r, two, "west", 5, 2)
    text = prometheus.exposition(r).decode()
    assert prometheus.CONTENT_TYPE.startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    for queue, runs, fails in (("east", 4, 1), ("west", 5, 2)):
        assert value("forkq_jobs_processed_total", queue=queue, job_class="Record") == runs
        assert value("forkq_jobs_processed_total", queue=queue, job_class="Boom") == fails
        assert value("forkq_jobs_failed_total", queue=queue, job_class="Boom") == fails
        assert value("forkq_jobs_failed_total", queue=queue, job_class="Record") == 0
        assert value("forkq_job_runtime_seconds_count", queue=queue, job_class="Record") == runs
        assert value("forkq_job_runtime_seconds_bucket", queue=queue, job_class="Record",
                     le="+Inf") == runs
        assert value("forkq_queue_size", queue=queue) == 0
    assert value("forkq_queue_size", queue="idle") == 1
    assert value("forkq_queue_latency_seconds", queue="idle") > 0
    assert value("forkq_processes") == 2 and value("forkq_processors") == 5
    assert value("forkq_processed_total") == 12 and value("forkq_failed_total") == 3
    assert value("forkq_dead_jobs") == 0 and value("forkq_retry_jobs") == 0
    tags = {dict(labels)["tag"]: v for (name, labels), v in samples.items()
            if name == "forkq_process_concurrency"}
    assert tags == {"east": 2, "west": 3}
    until(lambda: b"forkq_leader 1.0" in prometheus.exposition(r), 15)
    leaders = [v for (name, _), v in samples.items() if name == "forkq_process_leader"]
    assert sorted(leaders) in ([0, 0], [0, 1])
    assert east and west


def _batch_samples(r: redis.Redis) -> tuple[dict[str, float], float, float]:
    """``forkq_batches_total`` by event, ``forkq_batches_open`` and the skipped keys of a
    scrape now."""
    families = {f.name: f for f in text_string_to_metric_families(
        prometheus.exposition(r).decode())}
    events = {s.labels["event"]: s.value for s in families["forkq_batches"].samples
              if s.name == "forkq_batches_total"}
    assert families["forkq_batches"].type == "counter"
    assert families["forkq_batches_open"].type == "gauge"
    return (events, families["forkq_batches_open"].samples[0].value,
            families["forkq_metrics_skipped_keys"].samples[0].value)


def test_the_batch_counters_count_batches_and_the_events_fired(
        r: redis.Redis, daemon: Any) -> None:
    client = Client(r)
    clients.configure(client)
    try:
        assert _batch_samples(r) == ({"created": 0, "complete": 0, "success": 0, "death": 0},
                                     0, 0)
        with forkq.batch(on_death=flows.callback.s("death")) as bad:
            flows.item.perform_async(1)
            flows.doomed.perform_async(2)
        with forkq.batch():
            flows.item.perform_async(3)
            with forkq.batch():  # a child batch counts as a batch of its own
                flows.item.perform_async(4)
        assert _batch_samples(r) == ({"created": 3, "complete": 0, "success": 0, "death": 0},
                                     3, 0)
        d = daemon("concurrency: 2\nrequire: flows\n")
        until(lambda: r.hget(keys.BATCH_STATS, "success") == b"2"
              and forkq.batch_status(bad.bid).complete,  # type: ignore[union-attr]
              30, lambda: d.log())
        assert _batch_samples(r) == ({"created": 3, "complete": 3, "success": 2, "death": 1},
                                     1, 0)
    finally:
        clients.configure(None)


def test_a_batch_counters_key_of_another_type_or_a_field_that_is_no_number_is_skipped(
        r: redis.Redis) -> None:
    r.set(keys.BATCH_STATS, "not a hash")
    assert _batch_samples(r) == ({"created": 0, "complete": 0, "success": 0, "death": 0},
                                 0, 1)
    r.delete(keys.BATCH_STATS)
    r.hset(keys.BATCH_STATS, mapping={"created": 5, "success": "many", "complete": 2})
    assert _batch_samples(r) == ({"created": 5, "complete": 2, "success": 0, "death": 0},
                                 5, 1)
    r.hset(keys.BATCH_STATS, mapping={"created": 1, "success": 4})  # hand-edited counters
    assert _batch_samples(r)[1] == 0


def test_counts_given_back_after_a_failed_beat_go_with_the_next() -> None:
    recorder = Recorder()
    recorder.record("q", "A", 0.01, failed=False)
    lost = recorder.drain()
    recorder.record("q", "A", 0.5, failed=True)
    recorder.restore(lost)
    (counts,) = recorder.drain().values()
    assert (counts.runs, counts.failures, counts.success_ms) == (2, 1, 10)
    assert dict(counts.sidekiq_buckets) == {0: 1} and sum(counts.le_buckets.values()) == 2
    assert recorder.drain() == {}


def test_a_wrapped_job_counts_under_its_wrapped_class() -> None:
    assert job_class({"class": "ActiveJob::Wrapper", "wrapped": "SendMail"}) == "SendMail"
    assert job_class({"class": "Plain", "wrapped": 3}) == "Plain"


def test_beats_and_metrics_survive_a_script_flush(r: redis.Redis, daemon: Any) -> None:
    d = daemon("concurrency: 1\nrequire: jobs\n")
    _push_work(r, runs=1, fails=0)
    _done(r, d, "default", 1, 0)
    r.script_flush()  # beat.lua (a beat refused for memory, an orphan's) is loaded again
    beats = identity_beats(r, d)
    assert beats, d.log()
    _push_work(r, runs=2, fails=0)
    _done(r, d, "default", 3, 0)  # the counts of the jobs after the flush were written
    until_beaten_again(r, d, beats)


@pytest.mark.bench
@pytest.mark.process
def test_bench_metrics_prints_its_figures_and_a_two_daemon_exposition(tmp_path: Any) -> None:
    done = run_bench("job_metrics.py", "--sample", timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    assert re.search(r"counting one job in a child: [\d.]+ us", done.stdout), done.stdout
    assert len(re.findall(r"one beat with the metrics of \d+ job classes: \d+ commands",
                          done.stdout)) == 3
    families = {f.name: f for f in text_string_to_metric_families(
        done.stdout[done.stdout.index("# HELP"):])}
    processed = {s.labels["job_class"]: s.value for s in families["forkq_jobs_processed"].samples
                 if s.name == "forkq_jobs_processed_total"}
    assert processed == {"forkq.examples.send_welcome": 20, "HardWorker": 21}
    assert families["forkq_processes"].samples[0].value == 2


def test_the_exposition_text_is_what_prometheus_client_writes_for_the_same_series() -> None:
    """forkq writes the text itself (the library took ~250 ms for 1,000 series); read back
    with the library's parser and written again by its ``generate_latest``, it is the same
    bytes — hostile label values (quotes, backslashes, newlines, markup) included."""
    from prometheus_client import CollectorRegistry, generate_latest

    from forkq.ops.processes import Process

    snap = prometheus.Snapshot()
    for index, (queue, klass) in enumerate([("default", "Record"), ('q"1\\\n', "<b>x</b>"),
                                            ("ünï", "A::B")]):
        counts = snap.jobs[(queue, klass)]
        counts.update({"p": 10 * index + 3, "f": index, "us": 1234567 * index})
        counts.update({f"b{bucket}": bucket % 3 for bucket in range(layout.BUCKETS)})
        snap.queues[queue] = (index, 0.25 * index)
    snap.paused = {"default"}
    snap.processes = [Process.from_hash("host:1:abc", [b'{"hostname":"h","tag":"t\\"x"}', b"2",
                                                       b"1.5", None, b"100", None, b"5"],
                                        leader="host:1:abc")]
    snap.stats = {"processed": 12345678901, "failed": 2, "scheduled": 0, "retry": 1, "dead": 3}
    snap.batches = {"created": 7, "complete": 5, "success": 4, "death": 1}
    snap.skipped = 1
    ours = text_format.render(prometheus.families(snap))

    class Parsed:
        def collect(self) -> Any:
            return text_string_to_metric_families(ours.decode())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Parsed())  # type: ignore[arg-type]
    assert ours == generate_latest(registry)
