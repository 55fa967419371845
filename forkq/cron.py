"""Periodic (cron) jobs as configured: the YAML entries and which ticks are due. Pure; no I/O.

An entry (``periodic:`` in the YAML) names a registered job and a cron expression
(five fields, or six with seconds last; croniter's syntax), with optional
``args``, ``queue`` (default: the job's own queue), ``timezone`` (IANA name,
default UTC) and ``missed`` (``latest`` or ``skip``, default ``latest``)::

    periodic:
      - name: nightly-report
        cron: "0 3 * * *"
        class: NightlyReport
        args: [eu]
        timezone: Europe/Berlin

Ticks and the missed policy (:func:`due_ticks`, pure): the leader enqueues each
tick when it comes due. Every tick found at most ``periodic_grace`` seconds late
(a leader hand-off, a short outage) is still enqueued, each once. Ticks found
later than that were missed (no leader, or Redis down, for longer): ``latest``
enqueues the most recent of them once, ``skip`` enqueues none and waits for the
next tick. An entry seen for the first time starts counting from that moment.

Each tick is enqueued exactly once by the leader: :mod:`forkq.daemon.children.periodic`.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from forkq import payload as payloads
from forkq import wirejson
from forkq.errors import ConfigError
from forkq.registry import Registry
from forkq.setting_values import InvalidError, show

if TYPE_CHECKING:
    from croniter import croniter

MISSED_POLICIES = ("latest", "skip")
MAX_TICKS = 100  # ticks fired in one go at most (a seconds-cron after a long grace)
BOUNDARY = 0.001  # a tick exactly ``grace`` seconds old is still on time
_FIELDS = frozenset({"name", "cron", "class", "args", "queue", "timezone", "missed"})


@dataclass(frozen=True)
class Periodic:
    """One periodic job entry, validated."""

    name: str
    cron: str
    job: str
    args: tuple[Any, ...] = ()
    queue: str | None = None
    timezone: str = "UTC"
    missed: str = "latest"


# -- reading the YAML -------------------------------------------------------------------------


def read_entries(value: object) -> tuple[Periodic, ...]:
    """The ``periodic`` setting: a list of mappings → entries; raises InvalidError naming the
    entry (by index) and the problem."""
    if not isinstance(value, list):
        raise InvalidError(f"expected a list of periodic jobs, got {show(value)}")
    entries = tuple(_entry(item, index) for index, item in enumerate(value))
    names = [entry.name for entry in entries]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise InvalidError(f"two periodic jobs are named {name!r}; give one a 'name'",
                               (index,))
    return entries


def _entry(item: object, index: int) -> Periodic:
    def problem(text: str) -> InvalidError:
        return InvalidError(f"entry {index + 1}: {text}", (index,))

    if not isinstance(item, dict):
        raise problem(f"expected a mapping with cron and class, got {show(item)}")
    unknown = sorted(set(item) - _FIELDS)
    if unknown:
        raise problem(f"unknown key {unknown[0]!r}; known: {', '.join(sorted(_FIELDS))}")
    cron, job = item.get("cron"), item.get("class")
    from croniter import croniter  # imported when a periodic entry is read: it takes ~10 ms

    if not isinstance(cron, str) or not croniter.is_valid(cron):
        raise problem(f"cron: expected a cron expression such as '*/5 * * * *', got {show(cron)}")
    timezone = _timezone(item, problem)
    try:
        check_schedule(cron, timezone)
    except ValueError as exc:
        raise problem(f"cron: {cron!r}: {exc}") from None
    if not isinstance(job, str) or not job:
        raise problem(f"class: expected the name of a registered job, got {show(job)}")
    args = item.get("args", [])
    if not isinstance(args, list):
        raise problem(f"args: expected a list, got {show(args)}")
    try:
        wirejson.dumps(args)
    except (TypeError, ValueError) as exc:
        raise problem(f"args: not JSON ({exc})") from None
    return Periodic(name=_text(item, "name", f"{job} {cron}", problem), cron=cron, job=job,
                    args=tuple(args), queue=_queue(item, problem),
                    timezone=timezone, missed=_missed(item, problem))


def _text(item: dict[str, Any], key: str, default: str, problem: Any) -> str:
    value = item.get(key, default)
    if not isinstance(value, str) or not value:
        raise problem(f"{key}: expected a non-empty string, got {show(value)}")
    return value


def _queue(item: dict[str, Any], problem: Any) -> str | None:
    return _text(item, "queue", "", problem) if "queue" in item else None


def _timezone(item: dict[str, Any], problem: Any) -> str:
    name = _text(item, "timezone", "UTC", problem)
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise problem(f"timezone: unknown time zone {name!r}; use an IANA name such as "
                      "'Europe/Berlin'") from None
    return name


def _missed(item: dict[str, Any], problem: Any) -> str:
    value = item.get("missed", "latest")
    if value not in MISSED_POLICIES:
        raise problem(f"missed: expected latest or skip, got {show(value)}")
    return str(value)


def check_jobs(config: Any, registry: Registry) -> None:
    """After the app is imported: every entry names a registered job (else ConfigError)."""
    for index, entry in enumerate(config.periodic):
        if registry.find(entry.job) is None:
            known = ", ".join(sorted(registry.names())) or "none"
            raise ConfigError(f"{config.origin('periodic')}: periodic: entry {index + 1} "
                              f"({entry.name}): no registered job {entry.job!r}; known: {known}")


# -- ticks (pure) -----------------------------------------------------------------------------


def _cron(entry: Periodic, start: float) -> croniter:
    from croniter import croniter

    return croniter(entry.cron, dt.datetime.fromtimestamp(start, ZoneInfo(entry.timezone)))


def _wall(entry: Periodic, tick: float) -> dt.datetime:
    """A tick's local wall-clock time, without the zone (equal across a DST fall-back)."""
    return dt.datetime.fromtimestamp(tick, ZoneInfo(entry.timezone)).replace(tzinfo=None)


def _repeats(entry: Periodic, tick: float) -> bool:
    """Whether ``tick`` is a second run of the previous tick's wall-clock time: the hour that
    repeats when DST ends (02:30 of a daily job happens twice in Europe/Berlin)."""
    before = float(_cron(entry, tick).get_prev(float))
    return _wall(entry, before) == _wall(entry, tick)


def next_tick(entry: Periodic, after: float) -> float:
    """The first tick strictly after ``after`` (a wall-clock time repeated by DST runs once)."""
    it = _cron(entry, after)
    tick = float(it.get_next(float))
    while _repeats(entry, tick):
        tick = float(it.get_next(float))
    return tick


def latest_tick(entry: Periodic, now: float) -> float:
    """The last tick at or before ``now`` (never one after it)."""
    it = _cron(entry, now)
    tick = float(it.get_prev(float))  # strictly before now, or at it with a fraction
    following = next_tick(entry, tick)
    if following <= now:
        tick = following  # now is exactly on a tick
    while _repeats(entry, tick):
        tick = float(it.get_prev(float))
    return tick


def check_schedule(cron: str, timezone: str) -> None:
    """Raise ValueError when ``cron`` is not 5 or 6 fields or can never match (``0 0 30 2 *``)."""
    if len(cron.split()) not in (5, 6):
        raise ValueError("expected 5 fields, or 6 with seconds last")
    from croniter import CroniterError

    probe = Periodic(name="", cron=cron, job="", timezone=timezone)
    now = time.time()
    try:
        next_tick(probe, now)
        latest_tick(probe, now)
    except CroniterError as exc:  # CroniterBadDateError: a date that never comes
        raise ValueError(f"it never matches a date ({exc})") from None


def due_ticks(entry: Periodic, last: float | None, now: float, *, grace: float
              ) -> tuple[list[float], float]:
    """The ticks to enqueue now, oldest first, and the new last-handled mark (module doc).

    ``last`` is the last tick handled (None: never seen, so nothing is due yet). On time
    means ``now - grace <= tick <= now``; older ticks were missed.
    """
    if last is None:
        return [], now
    latest = latest_tick(entry, now)
    if latest <= last:
        return [], last
    recent: list[float] = []
    moment = max(last, now - grace - BOUNDARY)
    while len(recent) < MAX_TICKS:
        moment = next_tick(entry, moment)
        if moment > now:
            break
        recent.append(moment)
    if recent:
        return recent, latest
    return ([latest] if entry.missed == "latest" else []), latest


# -- the job a tick enqueues -----------------------------------------------------------------


def payload_for(entry: Periodic, registry: Registry, tick: float, now: float) -> payloads.Payload:
    """The job a tick enqueues: the registered job's options, the entry's args and queue."""
    spec = registry.lookup(entry.job)
    options = {**spec.options.payload_options(), "periodic": entry.name, "periodic_at": tick}
    payload = payloads.build(entry.job, list(entry.args), queue=entry.queue or spec.options.queue,
                             retry=spec.options.retry, options=options, now=now)
    payload["enqueued_at"] = now
    return payload


def describe(tick: float) -> str:
    """A tick as UTC text for logs."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(tick))
