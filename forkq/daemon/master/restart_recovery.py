"""Restart recovery: at boot, take back the in-flight jobs of earlier incarnations on this host.

After a SIGKILL or OOM kill of a daemon's whole process group, its records live on in
Redis for up to a minute (:data:`~forkq.keys.PROCESS_TTL`), and the leader's orphan
sweep (:mod:`forkq.daemon.children.orphans`) must wait for them to expire before it may touch the
jobs. A daemon restarted on the same host needs no such wait: it can *prove* locally
that its predecessor is gone (:mod:`forkq.daemon.process_proof`).

Rule, for every process identity with registered in-flight lists whose hostname is
this host's (and that is not this daemon): its master recorded, in ``info.proof``,
its kernel run, pid namespace and start time; when they match this host and the
master's pid is free or reused (the master is gone), each in-flight list whose child
is gone too (its pid free or reused, by the start time in its heartbeat) is recovered
at once, as the sweep would (requeued, counted toward the job's poison-pill limit).
A list whose child still runs (an orphan finishing its job) is left to the sweep.
When every list was recovered, the process leaves ``processes``. A live daemon on
this host is never touched: its master's pid runs with the recorded start time.

Cost: one ``SMEMBERS forkq:inflight``, then per earlier local incarnation one
``HGET info`` and one ``HGETALL`` of its beats, plus one script per list.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import redis

from forkq import keys
from forkq.connection import raw, text
from forkq.daemon import process_proof
from forkq.daemon.children import orphans
from forkq.daemon.master.heartbeats import hostname

log = logging.getLogger(__name__)


def reclaim(client: redis.Redis, identity: str, *, now: float) -> list[orphans.Recovered]:
    """Recover the in-flight jobs of this host's gone incarnations; what was recovered.

    Raises a Redis error only when Redis does not answer; a refused item is reported
    and left (see :func:`forkq.daemon.children.orphans.refused_is_none`)."""
    here = process_proof.this_host()
    if not here.known():
        return []
    recovered: list[orphans.Recovered] = []
    for owner, lists in sorted(orphans.inflight_by_owner(client).items()):
        if owner == identity or owner.rsplit(":", 2)[0] != hostname():
            continue
        found = orphans.refused_is_none(owner, partial(_reclaim_one, client, owner, lists,
                                                       here, now))
        recovered += found or []
    return recovered


def _reclaim_one(client: redis.Redis, owner: str, lists: list[str], here: process_proof.Host,
                 now: float) -> list[orphans.Recovered]:
    info = _json(client.hget(owner, "info"))
    proof = info.get("proof")
    if not isinstance(proof, dict):
        return []  # no record to prove anything with: left to the sweep
    recorded = process_proof.Host(str(proof.get("boot_id", "")), str(proof.get("pid_ns", "")))
    master = info.get("pid")
    if not isinstance(master, int) or not process_proof.gone(master, proof.get("start"),
                                                          recorded, here):
        return []
    starts = _child_starts(client.hgetall(keys.beats(owner)))
    gone = [key for key in lists
            if process_proof.gone(_child_pid(key), starts.get(_child_pid(key)), recorded, here)]
    if gone:
        log.warning("restart recovery: %s is gone (master pid %d); taking back %d in-flight "
                    "list(s)", owner, master, len(gone))
    return orphans.recover_process(client, None, owner, gone, now=now,
                                   forget=len(gone) == len(lists))


def _child_starts(beats: dict[Any, Any]) -> dict[int, Any]:
    """Child pid → recorded start time, from a beats hash (malformed entries left out)."""
    starts = {}
    for pid, entry in beats.items():
        value = _json(entry)
        if text(pid).isdigit() and "start" in value:
            starts[int(text(pid))] = value["start"]
    return starts


def _child_pid(inflight_key: str) -> int:
    return keys.inflight_pid(inflight_key.rpartition(":")[2]) or 0


def _json(value: Any) -> dict[str, Any]:
    """A JSON object read from Redis; {} for anything else."""
    if value is None:
        return {}
    try:
        decoded = json.loads(raw(value))
    except (ValueError, RecursionError):
        return {}
    return decoded if isinstance(decoded, dict) else {}
