"""The whole Redis key layout, Sidekiq's and forkq's own, in one table.

Sidekiq's keys (wire-compatible with Sidekiq 6.4-8.x; see docs/sidekiq-wire.md).
Each entry: key — type, TTL — owner and content. *Wrong type:* what happens when some
client left another type there. The rule: a key of the wrong type stops nothing but the
steps that write that key; each such step changes nothing, says so naming the key (at most
once a minute, and once when mended), and a job it would have moved stays where it was.
forkq replaces a key of its own only where that loses nothing (said below).

- ``queues`` — set, no TTL — clients ``SADD`` every queue they push to. *Wrong type:*
  pushes still enqueue (the index is best effort); pages and ``forkq status`` name it.
- ``queue:<name>`` — list, no TTL — job JSON; clients LPUSH, processors take from
  the right (FIFO); a requeue RPUSHes so the job is the next one taken. *Wrong type:* a
  push to it raises ``EnqueueError`` (not enqueued); fetches skip it and the other queues
  flow; a requeue or recovery into it leaves the job in its in-flight list, a due job
  for it stays in ``schedule`` / ``retry``.
- ``schedule`` — zset, no TTL — future jobs, score = run-at epoch seconds. *Wrong
  type:* ``perform_in`` / ``perform_at`` raise ``EnqueueError``; the leader's mover skips
  it and still moves ``retry``.
- ``retry`` — zset, no TTL — failed jobs awaiting a retry, score = when due. *Wrong
  type:* a failure to retry waits in ``forkq:unfiled`` (its processor works on); the
  mover still moves ``schedule``.
- ``dead`` — zset, trimmed on insert to 10,000 entries / 180 days — exhausted jobs,
  score = time of death. *Wrong type:* a failure to bury waits in ``forkq:unfiled``; a
  dead child's job at the poison-pill limit stays in its list (its slot waiting);
  requeues and recoveries that bury nothing go through.
- ``stat:processed``, ``stat:failed`` — string, no TTL — all-time counters
  (failures count as processed too).
- ``stat:<x>:YYYY-MM-DD`` — string, 5 years — daily counters, UTC date. *Wrong type*
  (any counter): not counted (best effort); acks and filings go on; pages show 0.
- ``processes`` — set, no TTL — identities of live daemons; the master adds its own
  every beat and removes it on a clean exit. *Wrong type:* the rest of the process
  record is still written; listings show no process; recovery goes on.
- ``<identity>`` — hash, 60 s — the master's process record: ``info`` (JSON),
  ``busy``, ``beat``, ``quiet``, ``rss``, ``rtt_us``, ``concurrency``; rewritten every beat.
  *Wrong type:* left alone and reported; the busy hashes and remote signals still work.
- ``<identity>:workers`` and ``<identity>:work`` — hash, 60 s — busy processors:
  child pid → ``{"queue", "payload" (the raw job string), "run_at" (int)}``; the
  master deletes and rewrites both every beat (6.x reads ``:workers``, 7+ ``:work``).
  *Wrong type:* deleted and rewritten at the next beat (forkq's to rebuild).
- ``j|<YYYYMMDD>|<H>:<M>`` — hash, 8 h — Sidekiq 7.x's job metrics of one UTC minute:
  ``<class>|p`` runs (failures included), ``<class>|f`` failures, ``<class>|ms``
  milliseconds of successful runs; ``j|<YYMMDD>|<H>:<MM>`` (8 h) and
  ``j|<YYMMDD>|<H>:<M/10>`` (3 days) — the same for Sidekiq 8.x, per minute and per 10
  minutes. Written by every processor child with its heartbeat (:mod:`forkq.metrics`).
  *Wrong type* (these and the histograms below): not written, never touching the beat;
  readers skip the key and count it in ``forkq_metrics_skipped_keys``.
- ``<class>-<DD>-<HH>:<M>`` (7.x) and ``h|<class>-<D>-<H>:<M>`` (8.x) — string, 8 h —
  a class's histogram of successful runs in one minute: 26 saturating u16 counters
  (``BITFIELD``) on Sidekiq's bucket edges. Names built by :mod:`forkq.metrics.layout`.
- ``<identity>-signals`` — list, 60 s — remote signals (``TSTP``, ``TERM``, ``TTIN``)
  pushed by Sidekiq's API / Web UI; the master pops one per beat. *Wrong type:* no
  remote signal is read (reported); the rest of the record is written.

forkq's own keys:

- ``forkq:inflight:<identity>:<pid>`` — list, no TTL — written by fetch.lua only:
  empty, or ``[queue key, job, ...]`` for the jobs a processor child runs or holds (a
  batch); emptied by the ack, by failure filing, or by the requeue once the child is gone.
  A child running several jobs at once (``async_concurrency``) has one such list per
  lane, ``forkq:inflight:<identity>:<pid>-<lane>``, each holding one job. *Wrong type:*
  that processor's fetch moves nothing (reported, retried); a settle or recovery of it
  leaves it for an operator.
- ``forkq:inflight`` — set, no TTL — registry of in-flight lists (a child adds its
  own at boot and fetch.lua with every job it moves in; the master's requeue and the
  leader's orphan sweep remove it), so recovery never SCANs the keyspace. *Wrong type:*
  fetches go on, unregistered (each processor reports it); the leader's next sweep
  rebuilds it with one SCAN for ``forkq:inflight:*`` lists.
- ``forkq:unfiled`` — zset, no TTL — failures that could not be filed because ``retry``
  or ``dead`` held another type: ``<retry|dead>|<job JSON>``, scored as it would have been
  there; the leader files them with its next full orphan sweep (every tenth sweep: 30 s
  with the default settings) once the set accepts them again.
  *Wrong type:* a failure whose set is of the wrong type too stays held in its
  processor's in-flight list, filed again every second.
- ``forkq:beats:<identity>`` — hash, 60 s — each child's own heartbeat: child pid →
  JSON ``{"at", "seq", "job", "loops", "start"}``, written by the child every couple of
  seconds (beat.lua)
  (the scheduler child too); the
  master reads it to fill ``:workers``, cull stale children and enforce job timeouts.
  *Wrong type:* beats are refused and the master, unable to read them, culls no child
  (reported) until it is mended; jobs run on.
- ``forkq:result:<jid>`` — list of one JSON document, the job's ``result_ttl`` — the
  result of a job that asked for one: ``{"value": …}`` or ``{"error_class", "error_message"}``
  (:mod:`forkq.results`). *Wrong type:* that result is not kept (logged); the job is
  acknowledged as usual.
- ``forkq:paused`` — set, no TTL — queue names paused across the cluster (skipped by every
  forkq processor's fetch until resumed). *Wrong type:* no queue is paused (reported);
  ``forkq queues pause`` refuses.
- ``forkq:cancels`` — zset, no TTL — jobs whose cancellation was asked while they ran:
  jid → the epoch the request stands until (1 h); written by ``forkq cancel``, watched by
  every master, removed when carried out. *Wrong type:* cancels of running jobs are not
  seen (reported); the daemon goes on.
- ``forkq:kills:<jid>`` — string, 7 days — how many processors died while running
  this job (a recovery by the leader counts too); at 3 the job goes to the dead set
  instead of back to its queue. *Wrong type:* replaced; the count restarts at 1.
- ``forkq:unique:<digest>`` — string, ``unique_for`` seconds — a unique job's lock: the jid
  of the job holding it (:data:`UNIQUE_PREFIX`). *Wrong type:* a unique push of that job
  raises ``EnqueueError``; releases leave it alone.
- ``forkq:alive:<identity>`` — string, 2/3 of ``host_failover`` — a daemon's liveness
  (:func:`alive`); ``forkq:recovered:<identity>`` — string, 7 days — the lists the leader
  took from it while it lapsed (:func:`recovered`). *Wrong type:* the processors fetch
  while the key exists, whatever it holds; renewals by PEXPIRE work on any type.
- ``forkq:leader`` — string, ``leader_lease_ttl`` — the scheduler leader's lease: its
  owner token ``<identity>:<scheduler pid>:<8 hex>``, new for every term. Taken only
  when free (``SET NX PX``), renewed and released only by its owner (lease.lua); every
  script the leader runs first checks that it still holds this token (fencing).
  *Wrong type:* replaced by the next scheduler that campaigns.
- ``dear-leader`` — string, same TTL — the leader's master identity, mirrored for
  Sidekiq's ``ProcessSet#leader`` and the Web UI's "leader" badge; left alone when
  it names a process forkq did not write (Sidekiq Enterprise's own lease). *Wrong type:*
  left alone; no leader is shown.
- ``forkq:metrics:jobs`` — hash, no TTL — all-time job counters per (queue, class) for
  Prometheus: field JSON ``[queue, class, metric]``, metric ``p`` runs, ``f`` failures,
  ``us`` microseconds of every run, ``b<i>`` runs in duration bucket i (``le`` on
  Sidekiq's edges, ``b25`` above 335 s); HINCRBY'd by each processor child with its beat.
- ``forkq:metrics:queues:<epoch minute>`` — hash, 8 h — the scheduler leader's
  once-a-minute sample: queue name → JSON ``[size, latency seconds]``. *Wrong type*
  (either metrics key): skipped and counted in ``forkq_metrics_skipped_keys``.
- ``forkq:periodic`` — hash, no TTL — periodic job name → epoch of the last tick
  handled (enqueued or skipped), so each tick is enqueued once across the cluster.
  *Wrong type:* no tick is enqueued or marked (refused, reported); it fires once mended.
- ``forkq:batch:<bid>`` — hash, 30 days from its creation, 24 h once it succeeded — a batch
  (:mod:`forkq.batches`): ``created_at``, ``description``, ``total`` members, ``committed``,
  ``parent`` (a child batch's), ``chord`` (``1``: its success callback takes the members'
  results), the callbacks ``cb:<event>`` (templates, :mod:`forkq.signature`) and
  ``cbjid:<event>``, and the moments ``<event>_at`` they fired (complete, success,
  death); with ``…:pending`` (set: the members not yet succeeded), ``…:failed`` (set: those
  whose last run failed), ``…:results`` (hash, a chord's: member → its JSON value) and
  ``…:order`` (list, a chord's: its members in order), kept as long. A member is a jid, a
  chain id or a child batch's bid. Written by the client's commit and by the scripts that
  end a job's run (workflow.lua). *Wrong type* (any of them): the batch is left alone
  (its jobs run; its callbacks do not fire).
- ``forkq:batches`` — zset, no TTL — bid → creation epoch, for the listings; an entry whose
  batch expired is dropped by the listing that finds it. ``forkq:stat:batches`` — hash, no
  TTL — counters ``created``, ``complete``, ``success``, ``death`` for Prometheus.
- ``forkq:chain:<cid>`` — hash, 30 days from its creation, 24 h once it ended — a chain
  (:mod:`forkq.canvas`): ``n`` steps, ``step`` (the one running; ``n + 1`` when done),
  ``state`` (running, succeeded, failed), ``failed_step``, ``bid`` (when it is a batch's
  member), ``s:<i>`` the template of step i > 1, ``jid:<i>``, ``class:<i>``.
- ``forkq:progress:<jid>`` — hash, 24 h — what :func:`forkq.progress` said of a running job:
  ``done``, ``total``, ``note``, ``at``.

The identity is Sidekiq's ``<hostname>:<master pid>:<12 hex>``.
"""

from __future__ import annotations

import time

QUEUES = "queues"
SCHEDULE = "schedule"
RETRY = "retry"
DEAD = "dead"
STAT_PROCESSED = "stat:processed"
STAT_FAILED = "stat:failed"
INFLIGHT_REGISTRY = "forkq:inflight"
UNFILED = "forkq:unfiled"
LEADER = "forkq:leader"
LEADER_RELEASED = "forkq:leader-released"
"""The channel on which a leader that hands over says so (lease.lua): followers subscribe to
it, so they take over at once without watching every renewal of the lease."""
DEAR_LEADER = "dear-leader"
PERIODIC = "forkq:periodic"

PROCESSES = "processes"
QUEUE_PREFIX = "queue:"
KILLS_TTL = 7 * 24 * 3600
PROCESS_TTL = 60
DAILY_STAT_TTL = 157_680_000  # 5 x 365 days, as Sidekiq
DEAD_MAX_JOBS = 10_000
DEAD_TIMEOUT = 180 * 24 * 3600


def queue(name: str) -> str:
    """The list holding the jobs of queue ``name``."""
    return QUEUE_PREFIX + name


def queue_name(key: str) -> str:
    """Inverse of :func:`queue`."""
    return key[len(QUEUE_PREFIX):] if key.startswith(QUEUE_PREFIX) else key


INFLIGHT_PREFIX = "forkq:inflight:"


def inflight(identity: str, pid: int) -> str:
    """The in-flight list of one processor child."""
    return f"{INFLIGHT_PREFIX}{identity}:{pid}"


def inflight_lanes(identity: str, pid: int, lanes: int) -> tuple[str, ...]:
    """The in-flight lists of a processor child running up to ``lanes`` jobs at once
    (``async_concurrency`` > 1): ``forkq:inflight:<identity>:<pid>-<lane>``, one job each."""
    return tuple(f"{inflight(identity, pid)}-{lane}" for lane in range(lanes))


def inflight_owner(key: str) -> str | None:
    """The process identity an in-flight list belongs to; None for a key of another shape."""
    if not key.startswith(INFLIGHT_PREFIX):
        return None
    identity, _, pid = key[len(INFLIGHT_PREFIX):].rpartition(":")
    return identity if identity and inflight_pid(pid) is not None else None


def inflight_pid(tail: str) -> int | None:
    """The child pid in the last part of an in-flight list's key (``<pid>`` or
    ``<pid>-<lane>``); None for another shape."""
    pid, dash, lane = tail.partition("-")
    if not pid.isdigit() or (dash and not lane.isdigit()):
        return None
    return int(pid)


def utc_date(now: float | None = None) -> str:
    """The ``YYYY-MM-DD`` UTC date used in daily stat keys."""
    return time.strftime("%Y-%m-%d", time.gmtime(time.time() if now is None else now))


def daily(stat: str, date: str) -> str:
    """``stat:processed:2026-11-21`` from ``stat:processed`` and a date."""
    return f"{stat}:{date}"


def workers(identity: str) -> tuple[str, str]:
    """The busy-processor hashes of a process: Sidekiq 6's ``:workers`` and 7+'s ``:work``."""
    return f"{identity}:workers", f"{identity}:work"


def signals(identity: str) -> str:
    """The remote-signal list of a process."""
    return f"{identity}-signals"


def beats(identity: str) -> str:
    """The hash where the children of a process write their heartbeats."""
    return f"forkq:beats:{identity}"


def alive(identity: str) -> str:
    """string, TTL 2/3 of ``host_failover``: a daemon's liveness: set by its master, kept by
    its master and children, never set again by anyone else while it lapsed
    (:mod:`forkq.daemon.liveness`). Its processors fetch only while it exists; the
    leader recovers the jobs of a forkq daemon whose key has lapsed."""
    return f"forkq:alive:{identity}"


def recovered(identity: str) -> str:
    """string (a count), TTL :data:`RECOVERED_TTL` — set when the leader recovered jobs of
    ``identity`` whose liveness had lapsed: that daemon, if it comes back, holds none of
    them any more."""
    return f"forkq:recovered:{identity}"


RECOVERED_TTL = 7 * 24 * 3600
FAILOVER_FIELD = "failover"
"""The process-hash field by which a forkq daemon says it keeps :func:`alive` (its value:
the key's TTL in seconds); Sidekiq's readers ignore it."""


WAITER_PREFIX = "forkq-wait:"
"""Client names of processors' connections blocked waiting for a job (a BLMOVE): followed by
the in-flight list they move into."""

PAUSED = "forkq:paused"
"""set, no TTL — names of the queues paused across the cluster: every forkq processor's fetch
skips them (fetch.lua) until they are resumed (``forkq queues pause|resume NAME``)."""


TYPES = {QUEUES: "set", PROCESSES: "set", PAUSED: "set", STAT_PROCESSED: "string",
         STAT_FAILED: "string", SCHEDULE: "zset", RETRY: "zset", DEAD: "zset", PERIODIC: "hash",
         DEAR_LEADER: "string"}
"""The Redis type of each fixed key that readers check (the counters are strings holding
numbers)."""


def result(jid: str) -> str:
    """Where the result of job ``jid`` is kept (a job with ``result_ttl``)."""
    return f"forkq:result:{jid}"


CANCELS = "forkq:cancels"
"""zset, no TTL — jobs whose cancellation was asked while they were running: jid → the epoch
until which the request stands (:data:`CANCEL_TTL`); masters stop such a job and remove it."""
CANCEL_TTL = 3600


UNIQUE_PREFIX = "forkq:unique:"
"""Prefix of a unique job's lock (:mod:`forkq.unique`): taken with the push, released by the
step that settles the job (success, dead, drop, cancel, burial, or its start)."""


BATCHES = "forkq:batches"
BATCH_STATS = "forkq:stat:batches"
WORKFLOW_TTL = 30 * 24 * 3600
"""Seconds a batch or chain is kept from its creation (workflow.lua keeps it 24 h more once
it has succeeded or failed)."""
PROGRESS_TTL = 24 * 3600


def batch(bid: str) -> str:
    """The record of batch ``bid`` (its sets are this plus ``:pending``, ``:failed``...)."""
    return f"forkq:batch:{bid}"


def chain(cid: str) -> str:
    """The record of chain ``cid``."""
    return f"forkq:chain:{cid}"


def progress(jid: str) -> str:
    """The progress job ``jid`` reported (:func:`forkq.progress`)."""
    return f"forkq:progress:{jid}"


def kills(jid: str) -> str:
    """How many processors died running job ``jid``."""
    return f"forkq:kills:{jid}"
