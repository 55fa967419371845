"""The Dashboard page (``GET /``): processed and failed totals, today's counts and failure
rate (failures count as processed, as in Sidekiq), the live
throughput chart (drawn by forkq.js from the totals of successive refreshes), the history by
UTC day (``stat:processed:<date>``), and the Redis server's facts (INFO).

A key of the wrong type among those the totals read (a queue that is not a list, say), or a
counter that is no number, counts as 0 and is named in the page's notice
(:mod:`forkq.web.damage`), as is a daily counter of the wrong type (read as 0); every other
figure still shows.

Bounded work: one pipelined read of the totals (:class:`~forkq.ops.stats.Stats`: two
commands per listed queue), one MGET per counter for at most 90 days, one INFO.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from forkq import keys
from forkq.ops.stats import Stats, history
from forkq.web import damage
from forkq.web.routes import Request, Response, render, route

HISTORY_DAYS = (7, 30, 90)
INFO_FIELDS = ("redis_version", "uptime_in_days", "connected_clients", "used_memory_human",
               "used_memory_peak_human", "maxmemory_human", "maxmemory_policy")


@route("GET", "/")
def dashboard(request: Request) -> Response:
    now = time.time()
    days = request.int_arg("days", 7, low=1, high=max(HISTORY_DAYS))
    days = min(HISTORY_DAYS, key=lambda choice: abs(choice - days))
    named = damage.fixed(request, keys.QUEUES, keys.PROCESSES, keys.STAT_PROCESSED,
                         keys.STAT_FAILED, keys.SCHEDULE, keys.RETRY, keys.DEAD)
    named += damage.check(request, {keys.daily(stat, keys.utc_date(now - 86400 * day)): "string"
                                    for day in range(days)
                                    for stat in (keys.STAT_PROCESSED, keys.STAT_FAILED)})
    damaged: list[str] = []
    stats = Stats.read(request.redis, now, damaged=damaged)
    rows = history(request.redis, days, now, damaged=damaged)
    for name in damaged:  # a queue's list, a process's hash, a counter that is no number
        if name not in named:
            damage.note(request, f"key {name!r} is of the wrong type or no number: "
                                 "counted as 0")
    peak = max([1, *(row["processed"] for row in rows)])
    today = rows[0]
    rate = f"{100 * today['failed'] / today['processed']:.1f} %" if today["processed"] else "-"
    return render(request, "dashboard.html", stats=stats, history=rows, peak=peak, days=days,
                  today=today, failure_rate=rate,
                  day_choices=HISTORY_DAYS, info=redis_facts(request.redis), at=now)


def redis_facts(client: redis.Redis) -> dict[str, Any]:
    """The INFO fields the page shows; a server that refuses INFO (ACL) shows none."""
    try:
        info = client.info()
    except redis.ResponseError:
        return {}
    return {name: info[name] for name in INFO_FIELDS if name in info}
