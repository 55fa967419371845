"""The operator's CLI on workflows: ``forkq batches``, ``forkq batch BID`` and what ``forkq
job JID`` adds for a job of a batch or a chain and for a job that reported its progress
(forkq/ops/workflows.py). Batches and chains are pushed with the real API; their events fire
on a real daemon. Each scenario runs in both output modes (text tables and ``--json``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import forkq
from forkq import client as clients
from forkq import keys
from forkq.embedded import EmbeddedServer
from forkq.progress import write as write_progress

from . import flows
from .conftest import Daemon, run_forkq, until, until_retried
from .test_operator_cli import MODES, Ops

DAEMON = "concurrency: 2\nrequire: flows\nlog_level: warning\n"


class FlowOps(Ops):
    """:class:`Ops` whose exit 1 (a key of another type skipped) still gives what was
    shown: the JSON object (stderr under ``stderr``), or stdout and stderr."""

    def __call__(self, *args: str, code: int = 0) -> Any:
        done = run_forkq(*args, "--redis-url", self.url, *(["--json"] if self.json else []),
                         timeout=30)
        assert done.returncode == code, (
            f"forkq {' '.join(args)}: exit {done.returncode}, wanted {code}\n"
            f"stdout: {done.stdout}\nstderr: {done.stderr}")
        if not self.json:
            return done.stdout + done.stderr
        data = json.loads(done.stdout)
        if done.stderr:
            data["stderr"] = done.stderr
        return data


@pytest.fixture(params=MODES)
def ops(request: pytest.FixtureRequest, server: EmbeddedServer) -> FlowOps:
    return FlowOps(server, request.param)


@pytest.fixture
def client(r: redis.Redis) -> Iterator[forkq.Client]:
    """The default client of the API (``perform_async``, ``forkq.batch``) on the test's
    server; the environment's again afterwards."""
    made = forkq.Client(r)
    clients.configure(made)
    yield made
    clients.configure(None)


def _row(text: str, first: str) -> list[str]:
    """The cells of the table row starting with ``first`` (split on 2+ spaces)."""
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


def _field(text: str, name: str) -> str:
    """The value of the field ``name`` of a ``forkq job`` or ``forkq batch`` text."""
    found = re.search(rf"^  {name} +(.*)$", text, re.MULTILINE)
    assert found, f"no field {name!r} in:\n{text}"
    return found.group(1)


def _import_batch(count: int, description: str) -> str:
    with forkq.batch(on_success=flows.callback.s("success"),
                     on_complete=flows.callback.s("complete"),
                     description=description) as b:
        for n in range(count):
            flows.item.perform_async(n)
    return b.bid


def _members(r: redis.Redis, bid: str) -> list[str]:
    return sorted(m.decode() for m in r.smembers(keys.batch(bid) + ":pending"))


# --- forkq batches, forkq batch BID: open batches ---------------------------------------------


def test_batches_lists_the_newest_and_batch_shows_one_with_its_members(
        ops: FlowOps, r: redis.Redis, client: forkq.Client) -> None:
    first = _import_batch(3, "import 2026-11")
    with forkq.batch(description="nested") as outer:
        flows.item.perform_async(7)
        with forkq.batch(description="child"):
            flows.item.perform_async(8)
        forkq.chain(flows.step.s(0, "a"), flows.step.s("b")).perform_async()
    listed = ops("batches")
    newest = ops("batches", "--limit", "1")
    if ops.json:
        by_bid = {b["bid"]: b for b in listed["batches"]}
        assert listed["size"] == 3 and len(by_bid) == 3 and listed["damaged"] == []
        assert by_bid[first]["state"] == "open" and by_bid[first]["total"] == 3
        assert by_bid[first]["pending"] == 3 and by_bid[first]["progress"] == 0.0
        assert by_bid[first]["description"] == "import 2026-11"
        assert sorted(by_bid[first]["callbacks"]) == ["complete", "success"]
        child = next(b for b in listed["batches"] if b["description"] == "child")
        assert child["parent"] == outer.bid and by_bid[outer.bid]["total"] == 3
        assert newest["size"] == 3 and len(newest["batches"]) == 1
    else:
        assert listed.startswith("Batches: 3\n"), listed
        assert _row(listed, first)[1:6] == ["open", "3", "3", "0", "0%"]
        assert _row(listed, first)[-1] == "import 2026-11"
        assert _row(listed, outer.bid)[2] == "3"
        assert newest.startswith("Batches: 3 (the newest 1; --limit 0 lists all)"), newest
        assert len([line for line in newest.splitlines() if " open " in line]) == 1

    shown = ops("batch", outer.bid)
    members = _members(r, outer.bid)
    child_bid = next(m for m in members if r.exists(keys.batch(m)))
    chain_id = next(m for m in members if r.exists(keys.chain(m)))
    if ops.json:
        batch = shown["batch"]
        assert (batch["bid"], batch["state"], batch["total"], batch["pending"]) == (
            outer.bid, "open", 3, 3)
        kinds = {m["member"]: m["kind"] for m in shown["members"]["pending"]}
        assert kinds[child_bid] == "batch" and kinds[chain_id] == "chain"
        assert sorted(kinds.values()) == ["batch", "chain", "job"]
        assert shown["members"]["failed"] == [] and shown["members"]["more"] is False
    else:
        assert shown.startswith(f"batch {outer.bid}: open\n"), shown
        assert _field(shown, "description") == "nested"
        assert _field(shown, "members") == (
            "3: 0 succeeded, 3 pending (0 of them failed their last run)")
        assert _field(shown, "progress") == "0% succeeded"
        assert _row(shown, child_bid) == [child_bid, "batch"]
        assert _row(shown, chain_id) == [chain_id, "chain"]
        assert _row(shown, "success") == ["success", "(none)", "not yet"]
        assert "Pending members (3)\n" in shown and "Failed members (0)\n" in shown
    child = ops("batch", child_bid)
    assert (child["batch"]["parent"] if ops.json else _field(child, "parent")) == outer.bid

    bounded = ops("batch", first, "--limit", "2")
    if ops.json:
        assert len(bounded["members"]["pending"]) == 2 and bounded["members"]["more"] is True
        everything = ops("batch", first, "--limit", "0")
        assert len(everything["members"]["pending"]) == 3
    else:
        assert "Pending members (3; the first 2 shown, --limit 0 lists all)" in bounded, bounded
        assert _row(bounded, "complete")[1] == r.hget(keys.batch(first),
                                                      "cbjid:complete").decode()


def test_an_absent_batch_exits_66_naming_it_and_damaged_keys_exit_1(
        ops: FlowOps, r: redis.Redis, client: forkq.Client) -> None:
    absent = ops("batch", "nosuchbatch", code=66)
    message = "batch nosuchbatch not found (never made, or expired and dropped)"
    if ops.json:
        assert absent["error"] == message and absent["missing"] == ["nosuchbatch"]
    else:
        assert f"forkq: {message}" in absent
    r.set(keys.batch("broken"), "a string")
    damaged = ops("batch", "broken", code=1)
    message = "batch broken: key 'forkq:batch:broken' holds a string, not a hash"
    if ops.json:
        assert damaged["error"] == message and damaged["damaged"] == [keys.batch("broken")]
    assert message in (damaged["stderr"] if ops.json else damaged)

    bid = _import_batch(2, "sets")
    r.delete(keys.batch(bid) + ":failed")
    r.set(keys.batch(bid) + ":failed", "not a set")
    shown = ops("batch", bid, code=1)
    if ops.json:
        assert shown["damaged"] == [keys.batch(bid) + ":failed"]
        assert shown["batch"]["total"] == 2
    note = f"key '{keys.batch(bid)}:failed' holds another type; skipped"
    assert note in (shown["stderr"] if ops.json else shown)

    r.delete(keys.BATCHES)
    r.set(keys.BATCHES, "not a zset")
    listed = ops("batches", code=1)
    if ops.json:
        assert listed["batches"] == [] and listed["damaged"] == [keys.BATCHES]
    note = f"key '{keys.BATCHES}' holds another type; skipped"
    assert note in (listed["stderr"] if ops.json else listed)


# --- fired events on a real daemon ------------------------------------------------------------


def test_a_batch_whose_member_died_is_complete_and_one_that_succeeded_succeeded(
        ops: FlowOps, r: redis.Redis, client: forkq.Client,
        daemon: Callable[..., Daemon]) -> None:
    with forkq.batch(on_complete=flows.callback.s("complete"),
                     on_death=flows.callback.s("death"), description="doomed") as bad:
        for n in range(2):
            flows.item.perform_async(n)
        doomed = flows.doomed.perform_async(9)
    good = _import_batch(2, "fine")
    d = daemon(DAEMON)

    def fired() -> bool:
        ended, succeeded = forkq.batch_status(bad.bid), forkq.batch_status(good)
        return bool(ended and ended.complete and succeeded and succeeded.success)

    until(fired, 30, lambda: d.log())
    listed = ops("batches")
    shown = ops("batch", bad.bid)
    if ops.json:
        states = {b["bid"]: (b["state"], b["pending"], b["failures"], b["progress"])
                  for b in listed["batches"]}
        assert states == {bad.bid: ("complete", 1, 1, 2 / 3), good: ("succeeded", 0, 0, 1.0)}
        batch = shown["batch"]
        assert sorted(batch["fired"]) == ["complete", "death"]
        assert shown["members"]["failed"] == [{"member": doomed, "kind": "job"}]
        assert shown["members"]["pending"] == [{"member": doomed, "kind": "job"}]
    else:
        assert _row(listed, bad.bid)[1:6] == ["complete", "3", "1", "1", "67%"]
        assert _row(listed, good)[1:6] == ["succeeded", "2", "0", "0", "100%"]
        assert shown.startswith(f"batch {bad.bid}: complete\n")
        assert _field(shown, "members") == (
            "3: 2 succeeded, 1 pending (1 of them failed their last run)")
        callback_jid = r.hget(keys.batch(bad.bid), "cbjid:death").decode()
        assert _row(shown, "death")[1] == callback_jid
        assert re.match(r"\d{4}-\d\d-\d\d .* ago\)$", _row(shown, "death")[2])
        assert _row(shown, "success") == ["success", "(none)", "not yet"]
        assert "Failed members (1)\n" in shown and _row(shown, doomed) == [doomed, "job"]
    dead = ops("job", doomed)
    if ops.json:
        assert dead["batch"]["bid"] == bad.bid and dead["batch"]["state"] == "complete"
        assert dead["chain"] is None and dead["progress"] is None
    else:
        assert _field(dead, "batch") == (
            f"{bad.bid}: complete, 2 of 3 succeeded (67%), 1 pending, 1 failed")


# --- forkq job JID: batch, chain, progress ----------------------------------------------------


def test_job_shows_its_batch_its_chain_and_its_progress(
        ops: FlowOps, r: redis.Redis, client: forkq.Client) -> None:
    with forkq.batch(description="with a chain") as b:
        member = flows.item.perform_async(1)
        cid = forkq.chain(flows.step.s(0, "a"), flows.step.s("b"),
                          flows.step.s("c")).perform_async()
    chain = forkq.chain_status(cid)
    assert chain is not None
    first_step = chain.steps[0][1]
    write_progress(client, member, {"done": 40, "total": 80, "note": "row 40",
                                           "at": 1e9})
    shown = ops("job", member)
    if ops.json:
        assert shown["batch"]["bid"] == b.bid and shown["batch"]["state"] == "open"
        assert shown["batch"]["total"] == 2 and shown["chain"] is None
        assert shown["progress"] == {"done": 40.0, "total": 80.0, "note": "row 40", "at": 1e9}
    else:
        assert _field(shown, "batch") == (
            f"{b.bid}: open, 0 of 2 succeeded (0%), 2 pending, 0 failed")
        assert _field(shown, "progress").startswith("40/80 (50%): row 40, ")
    step = ops("job", first_step)
    if ops.json:
        assert step["chain"]["cid"] == cid and step["chain"]["state"] == "running"
        assert step["chain"]["step"] == 1 and step["chain"]["this_step"] == 1
        assert [s["class"] for s in step["chain"]["steps"]] == ["wf_step"] * 3
        assert step["batch"]["bid"] == b.bid  # through its chain
        assert step["progress"] is None
    else:
        assert _field(step, "chain") == f"{cid}: running, at step 1 of 3; this job is step 1"
        assert [_row(step, str(i))[-1] for i in (1, 2, 3)] == ["current", "waiting", "waiting"]
        assert _row(step, "1")[2] == first_step
        assert _field(step, "batch").startswith(f"{b.bid}: open, ")
        assert _field(step, "batch").endswith("(its chain's batch)")

    alone = forkq.chain(flows.step.s(0, "x")).perform_async()
    lone_step = forkq.chain_status(alone).steps[0][1]  # type: ignore[union-attr]
    r.delete(keys.chain(alone))
    gone = ops("job", lone_step)
    if ops.json:
        assert gone["chain"] == {"cid": alone, "state": None, "this_step": 1}
        assert gone["batch"] is None
    else:
        assert _field(gone, "chain") == f"{alone} (no longer in Redis)"
        assert "  batch " not in gone
    r.set(keys.chain(alone), "a string")
    damaged = ops("job", lone_step)  # the job is still shown: exit 0, the key noted
    note = f"note: key '{keys.chain(alone)}' holds a string, not a hash; skipped"
    assert note in (damaged["stderr"] if ops.json else damaged)
    if ops.json:
        assert damaged["chain"]["state"] is None
    else:
        assert _field(damaged, "chain") == f"{alone} (its record holds a string)"


def test_job_shows_a_chain_that_failed_at_a_step(
        ops: FlowOps, r: redis.Redis, client: forkq.Client,
        daemon: Callable[..., Daemon]) -> None:
    cid = forkq.chain(flows.step.s(0, "a"), flows.broken_step.s(),
                      flows.step.s("c")).perform_async()
    d = daemon(DAEMON)
    until_retried(r, lambda: forkq.chain_status(cid).state == "failed",  # type: ignore[union-attr]
                  40, lambda: d.log())
    broken = forkq.chain_status(cid).steps[1][1]  # type: ignore[union-attr]
    shown = ops("job", broken)
    if ops.json:
        assert shown["places"][0]["place"] == "dead"
        assert (shown["chain"]["state"], shown["chain"]["failed_step"]) == ("failed", 2)
        assert shown["chain"]["this_step"] == 2 and shown["batch"] is None
    else:
        assert _field(shown, "chain") == f"{cid}: failed, failed at step 2 of 3; this job is step 2"
        assert [_row(shown, str(i))[-1] for i in (1, 2, 3)] == ["succeeded", "failed", "not run"]

