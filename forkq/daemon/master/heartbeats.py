"""The master's side of heartbeats: Sidekiq's process record, and reading the children's beats.

:func:`beat` writes, in one script (``record.lua``, docs/sidekiq-wire.md §5):
``SADD processes``, the process hash (``info`` JSON, ``busy``, ``beat``, ``quiet``, ``rss``,
``rtt_us``, ``concurrency``) with a 60 s TTL, the busy hashes ``<id>:workers``
and ``<id>:work`` rebuilt from scratch, and ``RPOP <id>-signals``, whose
result it returns. So Sidekiq's ``ProcessSet``, ``Workers`` and Web UI list the
process and what each child runs, and their Quiet / Stop buttons reach it.

:func:`read_children` reads ``forkq:beats:<id>`` (see :mod:`forkq.daemon.children.beat_thread`).
:func:`clear` is the clean exit: ``SREM processes`` and unlink the busy and
beat hashes and the liveness key; the process hash is left to expire with ``quiet "true"``,
as Sidekiq. The record's ``failover`` field (the liveness key's TTL) tells the leader that
this daemon keeps a liveness key (:mod:`forkq.daemon.liveness`).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import redis

from forkq import __version__, keys, wirejson
from forkq.config import Config
from forkq.connection import text
from forkq.daemon import process_proof
from forkq.scripts import script


def hostname() -> str:
    """Sidekiq's hostname: ``$DYNO`` (Heroku) or the host name."""
    return os.environ.get("DYNO") or socket.gethostname()


@dataclass(frozen=True)
class LastBeat:
    """One child's last heartbeat as read from Redis."""

    seq: int
    at: float
    job: dict[str, Any] | None
    loops: int = 0


def process_info(config: Config, identity: str, pid: int, started_at: float, *,
                 leader: bool = False) -> str:
    """The ``info`` JSON: Sidekiq's fields (identity = the hash key) plus version, weights,
    whether this daemon's scheduler leads the cluster, ``forkq`` (its version: what tells
    the operator's tools a forkq daemon from a Sidekiq process) and ``proof`` (kernel run,
    pid namespace and start time: what lets a restart on this host prove it gone,
    :mod:`forkq.daemon.master.restart_recovery`)."""
    return wirejson.dumps({
        "hostname": hostname(),
        "started_at": started_at,
        "pid": pid,
        "tag": config.tag,
        "concurrency": config.concurrency,
        "queues": list(dict.fromkeys(name for name, _ in config.queues)),
        "weights": [{name: weight for name, weight in config.queues}],
        "labels": list(config.labels),
        "identity": identity,
        "version": __version__,
        "embedded": False,
        "leader": leader,
        "forkq": __version__,
        "proof": process_proof.facts(pid),
    })


def busy_entry(job: dict[str, Any]) -> str:
    """A ``:workers`` value: ``{"queue", "payload" (raw job string), "run_at" (int)}``."""
    return wirejson.dumps({"queue": job["queue"], "payload": job["payload"],
                           "run_at": int(job["run_at"])})


@dataclass(frozen=True)
class Beat:
    """What one write of the process record did: the remote ``signal`` popped (or None), and
    the keys Redis refused, each with its error (the rest of the record was written)."""

    signal: str | None
    refused: list[tuple[str, str]]
    rtt_us: int = 0  # how long the write's round trip took (the next record's ``rtt_us``)


def beat(
    client: redis.Redis,
    identity: str,
    *,
    info: str,
    busy: dict[str, str],
    quiet: bool,
    rss_kb: int,
    concurrency: int,
    failover: float = 0.0,
    rtt_us: int = 0,
) -> Beat:
    """Write the process record and busy hashes; pop one remote signal (``record.lua``).

    Written at maxmemory too (the script frees before it writes). A key Redis or the script
    refuses (of the wrong type) does not stop the others, so ``processes`` made a hash by
    someone still leaves the process hash, the busy hashes and remote signals working; the
    refusals are returned by key."""
    record: dict[str, Any] = {
        "info": info, "busy": len(busy), "beat": repr(time.time()),
        "quiet": "true" if quiet else "false", "rss": rss_kb, "rtt_us": rtt_us,
        "concurrency": concurrency,
    }
    if failover:
        record[keys.FAILOVER_FIELD] = repr(failover)
    args = [keys.PROCESS_TTL, 2 * len(record), *_pairs(record), *_pairs(busy)]
    started = time.perf_counter()
    reply = script(client, "record")(
        keys=[keys.PROCESSES, identity, *keys.workers(identity), keys.signals(identity),
              keys.beats(identity)],
        args=args)
    took_us = int((time.perf_counter() - started) * 1e6)
    popped, refused = reply[0], reply[1:]
    return Beat(popped.decode("utf-8", "replace") if isinstance(popped, bytes) else None,
                [(text(key), text(error)) for key, error in zip(refused[::2], refused[1::2],
                                                                 strict=True)], took_us)


def _pairs(mapping: dict[str, Any]) -> list[Any]:
    return [item for pair in mapping.items() for item in pair]


def read_children(client: redis.Redis, identity: str) -> dict[int, LastBeat]:
    """Every child beat of ``identity`` by pid; malformed entries are left out (any client can
    write anything into the hash: nothing read from it may stop the master)."""
    found: dict[int, LastBeat] = {}
    for pid, raw in client.hgetall(keys.beats(identity)).items():
        beat = _child_beat(raw)
        if beat is not None and text(pid).isdigit():
            found[int(pid)] = beat
    return found


def _child_beat(raw: bytes | str) -> LastBeat | None:
    try:
        entry = wirejson.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    seq, at, loops = entry.get("seq"), entry.get("at"), entry.get("loops", 0)
    if not isinstance(seq, int) or not isinstance(loops, int) or not isinstance(at, float):
        return None  # a child writes time.time(): always a float
    return LastBeat(seq, at, _job(entry.get("job")), loops)


_JOB_FIELDS: dict[str, type | tuple[type, ...]] = {
    "queue": str, "payload": str, "class": str, "jid": str, "run_at": int, "started": float,
    "timeout": (int, float)}


def _job(value: Any) -> dict[str, Any] | None:
    """A beat's ``job`` if it has every field the master reads, of the right type; else None."""
    if not isinstance(value, dict):
        return None
    for name, kind in _JOB_FIELDS.items():
        if isinstance(value.get(name), bool) or not isinstance(value.get(name), kind):
            return None
    return value


def forget_children(client: redis.Redis, identity: str, pids: list[int]) -> None:
    """Drop the beats of children that are gone."""
    client.hdel(keys.beats(identity), *map(str, pids))


def clear(client: redis.Redis, identity: str) -> None:
    """Clean exit: leave ``processes``, drop the busy and beat hashes, mark the record quiet."""
    with client.pipeline(transaction=True) as pipe:
        pipe.srem(keys.PROCESSES, identity)
        pipe.unlink(*keys.workers(identity), keys.beats(identity), keys.alive(identity))
        pipe.hset(identity, "quiet", "true")
        pipe.expire(identity, keys.PROCESS_TTL)
        pipe.execute()
