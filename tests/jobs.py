"""Jobs used by the process tests; the daemon imports this module with ``require: jobs``.

Each records what happened in Redis lists under ``test:`` through the child's
own client, so tests can count executions by jid.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

import forkq
from forkq import Job, job
from forkq import client as clients


def _note(key: str, **fields: Any) -> None:
    clients.default().redis.rpush(key, json.dumps(fields))


class Record(Job, name="Record"):
    """Records its start (with the queues it could see) and its completion."""

    def perform(self, *args: Any) -> None:
        queue = self.payload["queue"]
        _note("test:ran", jid=self.jid, queue=queue, args=list(args), pid=os.getpid())


class FanOut(Job, name="FanOut"):
    """Pushes ``count`` Record jobs, one by one, with the processor's own client."""

    def perform(self, count: int) -> None:
        for n in range(count):
            Record.perform_async("fanned", n)


class StrictProbe(Job, name="StrictProbe"):
    """Records how many jobs the higher-priority queues still held when it started."""

    def perform(self, seq: int) -> None:
        r = clients.default().redis
        _note("test:ran", jid=self.jid, queue=self.payload["queue"], seq=seq,
              critical=r.llen("queue:critical"), default=r.llen("queue:default"))


class Sleep(Job, name="Sleep"):
    """Records its start (with its pid), sleeps, records its completion."""

    def perform(self, seconds: float, marker: str) -> None:
        _note("test:started", marker=marker, jid=self.jid, pid=os.getpid())
        time.sleep(seconds)
        _note("test:ran", marker=marker, jid=self.jid, pid=os.getpid())


class Boom(Job, name="Boom", retry=2, backtrace=3):
    """Always fails."""

    def perform(self, message: str) -> None:
        raise ValueError(message)


class Suicide(Job, name="Suicide"):
    """Kills its own process."""

    def perform(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


class HardWorker(Job, name="HardWorker"):
    """The Sidekiq README job, as a Ruby app enqueues it."""

    def perform(self, name: str, count: int) -> None:
        _note("test:hardworker", jid=self.jid, name=name, count=count)


class Tick(Job, name="Tick"):
    """Records its queue, pid and start time; sleeps ``pause`` seconds."""

    def perform(self, seq: int, pause: float = 0.0) -> None:
        _note("test:ticks", seq=seq, queue=self.payload["queue"], pid=os.getpid(), t=time.time())
        if pause:
            time.sleep(pause)


class Spin(Job, name="Spin"):
    """Burns CPU in pure Python for ``seconds``, then records its completion."""

    def perform(self, seconds: float, marker: str) -> None:
        _note("test:started", marker=marker, jid=self.jid, pid=os.getpid())
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            n += sum(i * i for i in range(1000))
        _note("test:ran", marker=marker, jid=self.jid, pid=os.getpid())


_HOARD: list[bytes] = []


class Hog(Job, name="Hog"):
    """Allocates ``mb`` megabytes (kept for the child's life when ``keep``), then sleeps."""

    def perform(self, mb: int, seconds: float, keep: bool) -> None:
        block = b"x" * (mb * 2**20)
        if keep:
            _HOARD.append(block)
        _note("test:started", marker="hog", jid=self.jid, pid=os.getpid())
        time.sleep(seconds)
        _note("test:ran", marker="hog", jid=self.jid, pid=os.getpid())


class Silent(Job, name="Silent"):
    """Does nothing and writes nothing (for a Redis that refuses writes)."""

    def perform(self, *args: Any) -> None:
        """Nothing."""


class Stamp(Job, name="Stamp"):
    """Records when it started, with the time it was scheduled for."""

    def perform(self, due: float) -> None:
        _note("test:stamps", jid=self.jid, due=due, at=time.time(), pid=os.getpid())


class Flaky(Job, name="Flaky", retry=2, retry_in=lambda count, exc: 1):
    """Always fails, recording each attempt; retries after 1 s plus Sidekiq's jitter."""

    def perform(self, marker: str) -> None:
        _note("test:attempts", jid=self.jid, at=time.time(),
              retry_count=self.payload.get("retry_count"))
        raise RuntimeError(f"flaky {marker}")


class SlowRetry(Job, name="SlowRetry", retry=3, backtrace=5, retry_in=lambda count, exc: 3600):
    """Records each attempt (with the payload's retry_count), then fails; its retries wait an
    hour, so forkq's retry entries stay put for Sidekiq's API and Web UI to act on."""

    def perform(self, marker: str, *extra: Any) -> None:
        _note("test:slowretry", jid=self.jid, marker=marker, queue=self.payload["queue"],
              retry_count=self.payload.get("retry_count"))
        raise RuntimeError(f"slow {marker}")


class BadMessage(Job, name="BadMessage"):
    """Records its attempt, then fails with a message that is not valid UTF-8: a lone
    surrogate, as ``os.fsdecode`` makes of a file name that is not UTF-8."""

    def perform(self, marker: str) -> None:
        _note("test:slowretry", jid=self.jid, marker=marker, queue=self.payload["queue"],
              retry_count=self.payload.get("retry_count"))
        raise RuntimeError(f"bad {marker} " + b"\xff".decode("utf-8", "surrogateescape"))


class Lag(Job, name="Lag"):
    """Records how long after its push (``enqueued_at``, set by any client) it started."""

    def perform(self, *args: Any) -> None:
        _note("test:lag", jid=self.jid, lag=time.time() - float(self.payload["enqueued_at"]),
              pid=os.getpid())


class SlowLag(Job, name="SlowLag"):
    """Records, as :class:`Lag` does, how long after its push it started, then sleeps."""

    def perform(self, seconds: float) -> None:
        _note("test:lag", jid=self.jid, lag=time.time() - float(self.payload["enqueued_at"]),
              pid=os.getpid())
        time.sleep(seconds)


class Hold(Job, name="Hold"):
    """Sleeps ``seconds`` the first time it runs (per ``marker``), at once after that;
    records each start and completion in ``test:ran`` order."""

    def perform(self, marker: str, seconds: float) -> None:
        r = clients.default().redis
        first = r.set(f"test:hold:{marker}", 1, nx=True)
        _note("test:started", marker=marker, jid=self.jid, pid=os.getpid())
        if first:
            time.sleep(seconds)
        _note("test:ran", marker=marker, jid=self.jid, pid=os.getpid(), args=[marker])


class Nap(Job, name="Nap"):
    """A coroutine job: awaits ``seconds``, then appends to the file ``path`` its jid, pid,
    and the epoch times it began and ended."""

    async def perform(self, seconds: float, path: str) -> None:  # type: ignore[override]
        began = time.time()
        await asyncio.sleep(seconds)
        with open(path, "a") as out:
            out.write(f"{self.jid} {os.getpid()} {began!r} {time.time()!r}\n")


@job(name="async_boom", retry=False)
async def async_boom(message: str) -> None:
    """A coroutine job that fails after an await."""
    await asyncio.sleep(0)
    raise ValueError(message)


@job(name="async_stuck")
async def async_stuck(marker: str) -> None:
    """A coroutine job that awaits forever (its timeout cancels it)."""
    _note("test:started", marker=marker, pid=os.getpid())
    await asyncio.sleep(3600)


class Patient(Job, name="Patient"):
    """Records at its start what it sees of itself (``current_job``) and whether its
    cancellation was asked, then sleeps ``seconds``."""

    def perform(self, seconds: float) -> None:
        current = forkq.current_job()
        _note("test:started", jid=self.jid, pid=os.getpid(), asked=forkq.cancel_requested(),
              current=current.jid if current else None)
        time.sleep(seconds)
        _note("test:ran", jid=self.jid, pid=os.getpid())


class Cooperative(Job, name="Cooperative"):
    """Records its start, then looks at ``forkq.cancel_requested()`` every 20 ms (for at
    most ``seconds``); once asked, records its clean-up under ``test:cleanup`` and ends as
    ``how`` says: ``return`` or ``raise`` (a ValueError)."""

    def perform(self, how: str, seconds: float = 60) -> None:
        _note("test:started", jid=self.jid, pid=os.getpid())
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if forkq.cancel_requested():
                _note("test:cleanup", jid=self.jid, pid=os.getpid())
                if how == "raise":
                    raise ValueError("stopped half-way")
                return
            time.sleep(0.02)
        _note("test:ran", jid=self.jid, pid=os.getpid())


class Gate(Job, name="Gate"):
    """Records its start, then blocks until a test pushes to ``test:gate:<marker>`` (at most
    ``timeout`` seconds), then records its completion."""

    def perform(self, marker: str, timeout: float = 60) -> None:
        r = clients.default().redis
        _note("test:started", marker=marker, jid=self.jid, pid=os.getpid())
        r.blpop([f"test:gate:{marker}"], timeout=timeout)
        _note("test:ran", marker=marker, jid=self.jid, pid=os.getpid())


@job(name="answer", result_ttl=60)
def answer(number: int) -> dict[str, int]:
    """Returns a JSON value, kept as its result for a minute."""
    return {"double": 2 * number}


@job(name="answer_async", result_ttl=60)
async def answer_async(number: int) -> list[int]:
    """A coroutine job with a result."""
    await asyncio.sleep(0)
    return [number, number]


@job(name="answer_fails", result_ttl=60, retry=False)
def answer_fails(message: str) -> None:
    """Fails for good: its result is the failure."""
    raise ValueError(message)


@job(name="answer_set", result_ttl=60)
def answer_set() -> set[int]:
    """Returns what JSON cannot carry."""
    return {1, 2}


class Mark(Job, name="Mark"):
    """Adds its jid to the set ``test:done`` (counting runs by jid, duplicates collapse)."""

    def perform(self, *args: Any) -> None:
        clients.default().redis.sadd("test:done", self.jid)


HELD_FILES: list[int] = []


@job(name="hold_files", retry=False)
def hold_files(count: int) -> None:
    """Opens ``count`` files and keeps them open (a job that leaks file descriptors), then
    records that it ran."""
    HELD_FILES.extend(os.open(os.devnull, os.O_RDONLY) for _ in range(count))
    _note("test:ran", jid="hold_files", top_fd=max(HELD_FILES), pid=os.getpid())


@job(name="close_stderr", retry=False)
def close_stderr() -> None:
    """Closes ``sys.stderr`` (a job that tidies up what is not its own), then records that
    it ran."""
    sys.stderr.close()
    _note("test:ran", jid="close_stderr", pid=os.getpid())


@job(name="picky", retry_on=TimeoutError, discard_on=KeyError)
def picky(kind: str) -> None:
    """Raises what ``kind`` names: retried (TimeoutError), dropped (KeyError), dead (else)."""
    raise {"timeout": TimeoutError, "key": KeyError}.get(kind, ValueError)(kind)


@job(name="rated")
def rated(n: int, limit: int) -> None:
    """Enters the window limiter ``api`` (``limit`` per sliding second) and records when it
    was admitted (the server's clock, as the limiter keeps it)."""
    with forkq.limiter.window("api", limit, 1.0, wait_timeout=120) as api:
        clients.default().redis.rpush("test:admitted", repr(api.admitted_at))


HELD = forkq.limiter.concurrent("held", 1, lock_timeout=600, wait_timeout=0)


@job(name="holding")
def holding(marker: str) -> None:
    """Holds the concurrent limiter ``held`` until a test pushes to ``test:gate:<marker>``."""
    with HELD:
        _note("test:started", marker=marker, pid=os.getpid())
        clients.default().redis.blpop([f"test:gate:{marker}"], timeout=60)


@job(name="over")
def over() -> None:
    """Enters a full concurrent limiter without waiting: OverLimit escapes."""
    with forkq.limiter.concurrent("full", 1, wait_timeout=0):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@job(name="limited", concurrency_limit=2, concurrency_key=lambda key, *rest: key)
def limited(key: str, marker: str, seconds: float = 0.0, gate: bool = False) -> None:
    """At most 2 run at once per ``key``: records how many of its key run as it starts
    (members of ``test:running:<key>`` whose process is alive), then sleeps ``seconds`` or
    waits for ``test:gate:<marker>``, then records its completion."""
    r = clients.default().redis
    me = f"{os.getpid()}:{marker}"
    r.sadd(f"test:running:{key}", me)
    live = [m for m in r.smembers(f"test:running:{key}") if _alive(int(m.split(b":")[0]))]
    _note("test:started", marker=marker, limit_key=key, running=len(live), pid=os.getpid())
    if gate:
        r.blpop([f"test:gate:{marker}"], timeout=60)
    time.sleep(seconds)
    r.srem(f"test:running:{key}", me)
    _note("test:ran", marker=marker, limit_key=key)


@job(name="counted")
def counted(n: int) -> None:
    """Does nothing (the job's path, not its body, is what a test looks at)."""


@job(name="tenant", queue="tenants", group=lambda customer, *rest: customer)
def tenant(customer: str, n: int, seconds: float = 0.0) -> None:
    """A tenant's job: sleeps ``seconds``, then appends ``<customer>:<n>`` to
    ``test:order`` (the order in which the jobs finished)."""
    time.sleep(seconds)
    clients.default().redis.rpush("test:order", f"{customer}:{n}")


@job(name="tenant_limited", queue="tenants", group=lambda customer, *rest: customer,
     group_limit=1)
def tenant_limited(customer: str, marker: str, seconds: float) -> None:
    """At most 1 runs at once per customer: records how many of its customer run as it
    starts (as :func:`limited` does), then sleeps ``seconds``."""
    r = clients.default().redis
    me = f"{os.getpid()}:{marker}"
    r.sadd(f"test:running:{customer}", me)
    live = [m for m in r.smembers(f"test:running:{customer}") if _alive(int(m.split(b":")[0]))]
    _note("test:started", marker=marker, customer=customer, running=len(live))
    time.sleep(seconds)
    r.srem(f"test:running:{customer}", me)
    _note("test:ran", marker=marker, customer=customer)
