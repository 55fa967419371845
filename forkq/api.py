"""The operator's Python API, after Sidekiq's ``sidekiq/api``: read and act on queues, the
scheduled / retry / dead sets, processes and totals of the server behind a client.

    from forkq import api
    r = api.connect("redis://127.0.0.1:6379/0")
    api.Queue(r, "default").size()
    entry = api.RetrySet(r).find_job(jid)
    if entry:
        api.RetrySet(r).retry(entry)
    for process in api.ProcessSet(r).live():
        print(process.identity, process.busy, process.concurrency)
    api.Stats.read(r).processed
    api.cancel(r, jid)          # removed where it waits, or asked to stop (then killed)
    for place in api.find_job(r, jid).places:   # wherever it is; [] when nowhere
        print(place.kind, place.queue, place.at)

Everything here works on forkq's data and Sidekiq's (6.4 to 8.x) alike; see each
module for its contract: :mod:`forkq.ops.queues`, :mod:`forkq.ops.sorted_sets`,
:mod:`forkq.ops.processes`, :mod:`forkq.ops.stats`, :mod:`forkq.ops.records`,
:mod:`forkq.ops.lookup`.
"""

from __future__ import annotations

from forkq.connection import connect
from forkq.ops.cancel import Cancelled, cancel
from forkq.ops.lookup import Lookup, Place, find_job
from forkq.ops.processes import Process, ProcessSet, Work
from forkq.ops.queues import Queue
from forkq.ops.records import JobRecord, SortedEntry
from forkq.ops.sorted_sets import DeadSet, JobSet, RetrySet, ScheduledSet
from forkq.ops.stats import Stats, history

__all__ = [
    "Cancelled",
    "DeadSet",
    "JobRecord",
    "JobSet",
    "Lookup",
    "Place",
    "Process",
    "ProcessSet",
    "Queue",
    "RetrySet",
    "ScheduledSet",
    "SortedEntry",
    "Stats",
    "Work",
    "cancel",
    "connect",
    "find_job",
    "history",
]
