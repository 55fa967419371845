"""A processor child's heartbeat: a thread that writes the child's state to Redis.

Contract: the thread takes a turn every :data:`INTERVAL` seconds and writes a beat,
``HSET forkq:beats:<identity> <pid> {"at": <epoch>, "seq": <n>, "job": <job or null>,
"loops": <n>, "start": <epoch>}``, when there is news: the job changed
since the last beat, job metrics wait to be written, the master is gone, or ``keepalive``
seconds (a third of ``liveness_timeout``) have passed since the last beat. So an idle child,
or one running a long job, writes one beat per ``keepalive``, and a busy one at most one per
turn (``loops``: the main loop's turn count, which the scheduler child advances at least once
a second; ``start``: when this process started, so a restart on the same host can prove it
gone, :mod:`forkq.daemon.master.restart_recovery`). The master keeps the hash's 60 s TTL
and the daemon's liveness key (:mod:`forkq.daemon.liveness`); once it is gone, each beat
renews both, which keeps the key while the child finishes its job. ``seq`` grows by one per
beat: the master culls a child whose ``seq`` stops changing for ``liveness_timeout``. The
thread keeps beating while the main thread runs a job of any length (pure-Python loops
release the GIL every few milliseconds), so a stale beat means the whole process is
stopped (SIGSTOP) or stuck in C code that holds the GIL. Redis errors are swallowed: the
main thread logs outages, and the master does not cull during one.

``job`` is set by the main thread (one attribute assignment, no lock) before
and after each job: ``{"queue", "payload" (the raw job bytes, written as a string), "run_at" (int
epoch, Sidekiq's field), "started" (float epoch), "class", "jid", "timeout"
(seconds, 0 = none)}``.

Master death: a child whose master is gone (SIGKILLed, OOM-killed) is sent
:data:`~forkq.daemon.signals.STOP_SIGNAL` by this thread (at its next turn, within
:data:`INTERVAL`): it finishes its current job and exits, as on a graceful stop; if the
job is still running ``orphan_grace`` seconds (the ``timeout`` setting) after the thread
noticed, the thread ends the process, as the master would have killed it at the stop
deadline. Its beats then stop, and 60 s later the scheduler leader recovers
its job (:mod:`forkq.daemon.children.orphans`).

Two signals are acted on here rather than in the main thread, which may be busy
in a job for a long time: their handlers only set a flag and write a byte to the
thread's wake pipe (no lock is taken in a handler). TTIN logs the main thread's
stack and job; USR2 reopens the log file. A processor's process title follows its job
on each beat (:meth:`BeatThread.follow_job_in_title`). A Python handler runs only when the
main thread returns to the interpreter, so a job stuck inside C code gets no
TTIN dump (its heartbeat stops too if it holds the GIL, and it is culled).

Job metrics ride with the beat: :attr:`BeatThread.metrics` counts the child's jobs in
memory (:class:`~forkq.metrics.recorder.Recorder`), and each beat that has counts to write
sends them in the same pipelined round trip as the beat script (one write, one read; the
beat's EVALSHA first, so a refused metrics key never touches the beat). :meth:`BeatThread.stop`
writes the last counts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis

from forkq import keys
from forkq.daemon import logs, pipes, process_proof
from forkq.daemon.signals import STOP_SIGNAL
from forkq.errors import EXIT_ORPHANED
from forkq.metrics import recorder
from forkq.printable import printable
from forkq.scripts import script
from forkq.wording import duration

log = logging.getLogger(__name__)

INTERVAL = 2.0


class BeatThread:
    """The heartbeat thread of one processor child. Start it after fork, in the child."""

    def __init__(self, client: redis.Redis, identity: str, pid: int, *, master_pid: int,
                 orphan_grace: float, alive_ttl: float = 0.0,
                 keepalive: float = INTERVAL) -> None:
        self.job: dict[str, Any] | None = None
        self.loops = 0  # turns of the main loop, for a child whose loop never blocks long
        self._title: Callable[[str], None] | None = None
        self.on_turn: Callable[[], None] | None = None  # called in this thread each turn
        self.held_jids: Callable[[], list[str]] | None = None  # for the TTIN dump
        # a child running several jobs (lanes): what each runs and its thread, for TTIN
        self.lanes: Callable[[], list[tuple[str, int]]] | None = None
        self._titled = ""
        self._master_pid = master_pid
        self._orphan_grace = orphan_grace
        self._orphaned_at: float | None = None
        self._redis = client
        self._script = script(client, "beat")  # goes through at maxmemory
        self._key = keys.beats(identity)
        # once the master is gone, each beat renews the hash's TTL and the daemon's liveness
        # key (forkq.daemon.liveness), which the master kept
        self._orphan_keys = [self._key, keys.alive(identity)] if alive_ttl else [self._key]
        self._orphan_args: list[Any] = [keys.PROCESS_TTL, int(alive_ttl * 1000)]
        self._pid = pid
        self._start = process_proof.start_time(pid)  # with the pid, names this process instance
        self._seq = 0
        self._keepalive = keepalive
        self._sent: tuple[float, Any] = (-keepalive, None)  # monotonic time, job of the last beat
        self.metrics = recorder.Recorder()  # the jobs of this child, written with each beat
        self._wake_read, self._wake_write = pipes.pipe(nonblocking=True)
        self._stopped = False
        self._dump = False
        self._reopen = False
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def follow_job_in_title(self, title: Callable[[str], None]) -> None:
        """Show ``busy <class> jid=<jid>`` or ``idle`` with ``title`` on each beat (a title
        set per job would cost the main thread two calls per job)."""
        self._title = title

    def start(self) -> None:
        """Install the TTIN / USR2 handlers and start beating (one beat at once)."""
        signal.signal(signal.SIGTTIN, self._on_signal)
        signal.signal(signal.SIGUSR2, self._on_signal)
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and remove this child's entry (best effort)."""
        self._stopped = True
        self._wake()
        self._thread.join(timeout=INTERVAL + 5)
        self._send(None)  # the last job metrics
        with contextlib.suppress(redis.RedisError):
            self._redis.hdel(self._key, str(self._pid))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Signal handler: record and wake the thread; nothing else."""
        if signum == signal.SIGTTIN:
            self._dump = True
        else:
            self._reopen = True
        self._wake()

    def wake(self) -> None:
        """Make the thread take a turn now (safe from a signal handler)."""
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes the thread
            os.write(self._wake_write, b"!")

    def _sleep(self) -> None:
        """Wait up to INTERVAL, or until woken; swallow the wake bytes."""
        readable = pipes.readable([self._wake_read], INTERVAL)
        if readable:
            with contextlib.suppress(OSError):
                os.read(self._wake_read, 512)

    def _run(self) -> None:
        while not self._stopped:
            if self._dump:
                self._dump = False
                self._dump_stack()
            if self._reopen:
                self._reopen = False
                if logs.reopen():
                    log.info("log file reopened")
            self._check_master()
            if self.on_turn is not None:
                try:
                    self.on_turn()
                except Exception:  # the beats must go on
                    log.exception("heartbeat thread: giving back held jobs failed")
            self._show_job()
            if self._news():
                self.beat()
            self._sleep()

    def _check_master(self) -> None:
        """Stop the process when its master is gone (its stop signal, as the master would
        send it); end it once it has outlived its master by ``orphan_grace`` seconds."""
        if os.getppid() == self._master_pid:
            return
        now = time.monotonic()
        if self._orphaned_at is None:
            self._orphaned_at = now
            log.warning("master (pid %d) is gone: stopping", self._master_pid)
            os.kill(os.getpid(), STOP_SIGNAL)
        elif now - self._orphaned_at > self._orphan_grace:
            log.error("master (pid %d) gone %.0fs ago and still busy: exiting; the scheduler "
                      "leader recovers the job", self._master_pid, now - self._orphaned_at)
            os._exit(EXIT_ORPHANED)

    def _show_job(self) -> None:
        job = self.job
        state = "idle" if job is None else printable(f"busy {job['class']} jid={job['jid']}")
        if self._title is not None and state != self._titled:
            self._title(state)
            self._titled = state

    def _news(self) -> bool:
        """Whether this turn writes a beat (see the module's doc)."""
        since, job = self._sent
        return (self.job is not job or self.metrics.pending()
                or self._orphaned_at is not None
                or time.monotonic() - since >= self._keepalive)

    def beat(self) -> None:
        """Write one heartbeat; a Redis error skips it."""
        self._seq += 1
        job = self.job
        self._sent = (time.monotonic(), job)
        if job is not None:
            job = {**job, "payload": job["payload"].decode("utf-8", "replace")}
        entry = json.dumps({"at": time.time(), "seq": self._seq, "job": job,
                            "loops": self.loops, "start": self._start})
        self._send(entry)

    def _send(self, entry: str | None) -> None:
        """Write the beat ``entry`` (None: none) and the job metrics counted since the last
        one, in one round trip. A connection error keeps the metrics for the next beat.

        While the master lives a beat is one ``HSET``; beat.lua (which frees before it
        writes) is used only when Redis refuses that for memory, and by an orphan, whose
        beats also renew the TTLs its master kept."""
        batch = self.metrics.drain()
        pipe: Any = self._redis.pipeline(transaction=False)
        if entry is not None:
            if self._orphaned_at is None:
                pipe.hset(self._key, str(self._pid), entry)
            else:
                pipe.execute_command("EVALSHA", self._script.sha, len(self._orphan_keys),
                                     *self._orphan_keys, self._pid, entry,
                                     *self._orphan_args)
        touched = recorder.queue_writes(pipe, batch, time.time()) if batch else []
        if not len(pipe):
            return
        try:
            replies = pipe.execute(raise_on_error=False)
        except redis.ConnectionError:
            self.metrics.restore(batch)
            return
        except redis.RedisError:  # a timeout: the writes may have landed; not sent again
            return
        if entry is not None:
            if _retry_with_script(replies[0]):
                self._beat_script(entry)  # loads the script, for the next beats too
            replies = replies[1:]
        if batch:
            recorder.check_replies(touched, replies)

    def _beat_script(self, entry: str) -> None:
        script_keys: list[str] = [self._key]
        args: list[Any] = [""]
        if self._orphaned_at is not None:
            script_keys, args = self._orphan_keys, self._orphan_args
        with contextlib.suppress(redis.RedisError):
            self._script(keys=script_keys, args=[self._pid, entry, *args])

    def _dump_stack(self) -> None:
        job = self.job
        doing = "idle" if job is None else (
            f"running {job['class']} jid={job['jid']} from queue {job['queue']} "
            f"for {duration(time.time() - job['started'])}")
        held = self.held_jids() if self.held_jids is not None else []
        if held:
            doing += f"; holding {len(held)} more, not started: {', '.join(held)}"
        frames = sys._current_frames()
        if self.lanes is not None:
            for doing, thread in self.lanes():
                log.warning("TTIN: %s\n%s", printable(doing), logs.stack(frames.get(thread)),
                            extra=logs.MULTILINE)
            return
        log.warning("TTIN: %s\n%s", printable(doing), logs.stack(frames.get(self._main or 0)),
                    extra=logs.MULTILINE)


def _retry_with_script(reply: Any) -> bool:
    """Whether a beat's reply calls for beat.lua: Redis refused the ``HSET`` for memory
    (the script frees first), or did not know the script yet."""
    return isinstance(reply, (redis.exceptions.NoScriptError,
                              redis.exceptions.OutOfMemoryError))
