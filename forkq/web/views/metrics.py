"""The Metrics page (``GET /metrics/jobs``) and the Prometheus scrape (``GET /metrics``).

The page, over the last hour or eight hours (``minutes`` = 60 or 480): per job class its
executions, failures, total and average time (:func:`forkq.metrics.query.job_classes`); the
duration histogram of one class (``class``, default the most time-consuming;
:func:`~forkq.metrics.query.histogram`); the size and latency over time of one queue
(``queue``, default ``default``; :func:`~forkq.metrics.query.queue_series`), drawn as SVG.

``GET /metrics`` answers Prometheus's text format for the whole cluster
(:func:`forkq.metrics.prometheus.exposition`), to any logged-in role: a scraper sends
``Authorization: Bearer <password>`` (or Basic) when passwords are configured.

Bounded work: each query is one pipeline of at most ``minutes`` commands; the queue names
offered are one ``SMEMBERS queues`` cut to :data:`QUEUE_LINKS`.
"""

from __future__ import annotations

import time

from forkq import keys
from forkq.metrics import prometheus, query
from forkq.web import charts, damage
from forkq.web.routes import Request, Response, render, route

WINDOWS = (60, 480)
QUEUE_LINKS = 100


@route("GET", "/metrics/jobs")
def metrics(request: Request) -> Response:
    client = request.redis
    now = time.time()
    minutes = request.int_arg("minutes", 60)
    minutes = minutes if minutes in WINDOWS else 60
    skipped: list[str] = []
    classes = query.job_classes(client, minutes, now, damaged=skipped)
    chosen = request.arg("class") or (classes[0].name if classes else "")
    buckets = query.histogram(client, chosen, minutes, now, damaged=skipped) if chosen else []
    queue = request.arg("queue") or "default"
    series = query.queue_series(client, queue, minutes, now, damaged=skipped)
    for key in skipped:
        damage.note(request, f"metrics key {key!r} is of the wrong type: skipped")
    damage.fixed(request, keys.QUEUES)
    names = sorted(damage.members(request, keys.QUEUES))[:QUEUE_LINKS]
    return render(
        request, "metrics.html", minutes=minutes, windows=WINDOWS, classes=classes,
        chosen=chosen, buckets=buckets, bars=charts.bar_widths([n for _, n in buckets]),
        queue=queue, series=series, queue_names=names, at=now,
        size_chart=charts.line([(p.at, p.size) for p in series]),
        latency_chart=charts.line([(p.at, p.latency) for p in series]))


@route("GET", "/metrics")
def scrape(request: Request) -> Response:
    return Response(prometheus.exposition(request.redis), 200, prometheus.CONTENT_TYPE)
