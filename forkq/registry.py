"""Job definitions: wire name → callable, the ``@job`` decorator and the ``Job`` base class.

Only registered jobs run. A processor looks a payload's ``class`` up in the
registry and nowhere else: nothing is ever imported or called by a name taken
from a payload. Registration happens when the application module is imported
(in the master, before forking), so every child shares the same table.

Wire names: a function's default name is ``module.qualname``; a ``Job``
subclass's is ``module.ClassName``. Pass ``name="HardWorker"`` to run jobs that
Ruby enqueues under a class name.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, ParamSpec, overload

from forkq import client as _client
from forkq import concurrency, groups, signature, unique
from forkq import payload as payloads
from forkq.durability import Durability
from forkq.errors import UnknownJobError

P = ParamSpec("P")

RetryIn = Callable[[int, BaseException], Any]


Exceptions = tuple[type[BaseException], ...]


@dataclass(frozen=True)
class RetryRules:
    """A job's own retry rules (its registered options, never read from a payload):
    ``retry`` (true / false / int), ``retry_in(count, exc)`` (seconds to wait before the
    retry, jitter added; 0 or less: the default; or ``"kill"`` / ``"discard"``), the
    exception classes it retries (``retry_on``; None: every one; any other goes to the dead
    set at once) and those it drops (``discard_on``)."""

    retry: bool | int = True
    retry_in: RetryIn | None = None
    retry_on: Exceptions | None = None
    discard_on: Exceptions = ()


@dataclass(frozen=True)
class JobOptions:
    """Per-job options, Sidekiq's ``sidekiq_options``.

    ``retry``: True = ``max_retries`` attempts (25), an int = that many, 0 = dead at
    the first failure, False = drop. ``backtrace``: store True = all lines, N = the
    first N. ``retry_in(count, exc)`` overrides the default delay (``count**4 + 15``). ``extra``
    holds other payload keys (``tags``, ``retry_queue``, ``dead``...).
    """

    queue: str = "default"
    retry: bool | int = True
    backtrace: bool | int = False
    retry_in: RetryIn | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    retry_on: Exceptions | None = None
    discard_on: Exceptions = ()
    concurrency_key: concurrency.KeyOf | str | None = None  # a concurrency_limit's key
    group: groups.GroupOf | str | None = None  # the job's tenant (forkq.groups)

    def rules(self) -> RetryRules:
        """What a failure of the job is planned by."""
        return RetryRules(self.retry, self.retry_in, self.retry_on, self.discard_on)

    def payload_options(self) -> dict[str, Any]:
        """Options that travel in the payload, besides queue and retry."""
        options = dict(self.extra)
        if self.backtrace:
            options["backtrace"] = self.backtrace
        return options

    def merged(self, **overrides: Any) -> JobOptions:
        """A copy with ``overrides`` applied; unknown names go to ``extra``."""
        known = {k: v for k, v in overrides.items() if k in _OPTIONS}
        for name in ("retry_on", "discard_on"):
            if name in known:
                known[name] = _exceptions(name, known[name])
        if known.get("concurrency_key") is not None:
            concurrency.check_key(known["concurrency_key"])
        if known.get("group") is not None:
            groups.check_group_of(known["group"])
        extra = {k: v for k, v in overrides.items() if k not in known}
        _check_options(known)
        _check_extra({**self.extra, **extra})
        groups.check_options({**self.extra, **extra}, known.get("group", self.group))
        return replace(self, extra={**self.extra, **extra}, **known)


@dataclass(frozen=True)
class JobSpec:
    """A registered job: its wire name, what to call with the payload's args, its options."""

    name: str
    perform: Callable[..., Any]
    options: JobOptions
    job_class: type[Job] | None = None

    @functools.cached_property
    def is_coroutine(self) -> bool:
        """Whether the body is ``async def``: its call gives a coroutine, which the processor
        runs to its end on its event loop."""
        body = self.perform if self.job_class is None else self.job_class.perform
        return inspect.iscoroutinefunction(body)

    def call(self, payload: dict[str, Any]) -> Any:
        """Run the job with the payload's ``args`` and, when it has them, the keyword
        arguments of its ``kwargs`` field (a signature's, :mod:`forkq.signature`); a fresh
        instance for ``Job`` classes."""
        kwargs = payload.get(signature.KWARGS)
        perform = self.perform
        if self.job_class is not None:
            instance = self.job_class()
            instance.jid = str(payload.get("jid", ""))
            instance.payload = payload
            perform = instance.perform
        if kwargs is None:
            return perform(*payload["args"])
        if not isinstance(kwargs, dict):
            raise TypeError(f"the job's kwargs must be an object, got {kwargs!r}")
        return perform(*payload["args"], **kwargs)


class Registry:
    """Wire name → :class:`JobSpec`. Registering a name twice is an error."""

    def __init__(self) -> None:
        self._specs: dict[str, JobSpec] = {}

    def register(self, spec: JobSpec) -> None:
        """Add ``spec``; ValueError if its name is taken by another callable."""
        current = self._specs.get(spec.name)
        if current is not None and current.perform is not spec.perform:
            raise ValueError(f"job name {spec.name!r} is already registered")
        self._specs[spec.name] = spec

    def find(self, name: str) -> JobSpec | None:
        """The spec for ``name``, or None."""
        return self._specs.get(name)

    def lookup(self, name: str) -> JobSpec:
        """The spec for ``name``; :class:`UnknownJobError` if none is registered."""
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownJobError(
                f"unknown job {name!r}: no job is registered under that name"
            ) from None

    def names(self) -> Iterator[str]:
        """Registered names, sorted."""
        return iter(sorted(self._specs))


REGISTRY = Registry()
"""The default registry that ``@job`` and ``Job`` subclasses register into."""


class Enqueue:
    """``perform_async`` / ``perform_in`` / ``perform_at`` for one job and its options."""

    def __init__(self, name: str, options: JobOptions) -> None:
        self._name = name
        self._options = options

    def set(self, **overrides: Any) -> Enqueue:
        """A copy with other options for the next pushes (``queue=``, ``retry=``...)."""
        return Enqueue(self._name, self._options.merged(**overrides))

    def perform_async(self, *args: Any, durable: bool | Durability = False) -> str | None:
        """Push now; the jid, or None if a client middleware stopped the push. With
        ``durable``, only once replicas or disks confirm it (:mod:`forkq.durability`)."""
        return _client.default().push(self._item(args), durable=durable)

    def s(self, *args: Any, **kwargs: Any) -> signature.Signature:
        """The job with these arguments, not pushed (:mod:`forkq.signature`): a callback of
        a batch, a step of a chain, a member of a group."""
        return signature.signature(self, args, kwargs)

    def perform_in(self, interval: float | dt.timedelta, *args: Any,
                   durable: bool | Durability = False) -> str | None:
        """Push to run ``interval`` (seconds or timedelta) from now."""
        return _client.default().push(self._item_in(interval, args), durable=durable)

    def perform_at(self, when: float | dt.datetime, *args: Any,
                   durable: bool | Durability = False) -> str | None:
        """Push to run at ``when`` (datetime; naive means local time; or epoch seconds)."""
        return _client.default().push(self._item_at(when, args), durable=durable)

    async def perform_async_aio(self, *args: Any, durable: bool | Durability = False
                                ) -> str | None:
        """``perform_async`` through the asyncio client (:func:`forkq.aio.default`)."""
        from forkq import aio  # loaded by the first asyncio push, not by `import forkq`

        return await aio.default().push(self._item(args), durable=durable)

    async def perform_in_aio(self, interval: float | dt.timedelta, *args: Any,
                             durable: bool | Durability = False) -> str | None:
        """``perform_in`` through the asyncio client (:func:`forkq.aio.default`)."""
        from forkq import aio

        return await aio.default().push(self._item_in(interval, args), durable=durable)

    async def perform_at_aio(self, when: float | dt.datetime, *args: Any,
                             durable: bool | Durability = False) -> str | None:
        """``perform_at`` through the asyncio client (:func:`forkq.aio.default`)."""
        from forkq import aio

        return await aio.default().push(self._item_at(when, args), durable=durable)

    def _item_in(self, interval: float | dt.timedelta, args: tuple[Any, ...]) -> dict[str, Any]:
        seconds = interval.total_seconds() if isinstance(interval, dt.timedelta) else interval
        return {**self._item(args), "at": _client.at_epoch(seconds)}

    def _item_at(self, when: float | dt.datetime, args: tuple[Any, ...]) -> dict[str, Any]:
        at = when.timestamp() if isinstance(when, dt.datetime) else _client.at_epoch(when)
        return {**self._item(args), "at": at}

    def _item(self, args: tuple[Any, ...]) -> dict[str, Any]:
        item = {
            **self._options.payload_options(),
            "class": self._name,
            "args": list(args),
            "queue": self._options.queue,
            "retry": self._options.retry,
        }
        if concurrency.LIMIT in item:  # its key, from its arguments (concurrency_key)
            item[concurrency.KEY] = concurrency.key_of(self._options.concurrency_key,
                                                       list(args))
        if self._options.group is not None:  # its tenant, from its arguments
            item[groups.FIELD] = groups.group_of(self._options.group, list(args))
        return item


class JobFunction(Enqueue, Generic[P]):
    """What ``@job`` returns: the function, callable as before, plus the enqueue methods."""

    def __init__(self, func: Callable[P, Any], name: str, options: JobOptions) -> None:
        super().__init__(name, options)
        self.func = func
        self.name = name
        self.options = options
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        return self.func(*args, **kwargs)


@overload
def job(func: Callable[P, Any]) -> JobFunction[P]: ...


@overload
def job(
    func: None = None,
    *,
    name: str | None = None,
    queue: str = "default",
    retry: bool | int = True,
    backtrace: bool | int = False,
    retry_in: RetryIn | None = None,
    retry_on: type[BaseException] | Exceptions | None = None,
    discard_on: type[BaseException] | Exceptions = (),
    concurrency_key: concurrency.KeyOf | str | None = None,
    group: groups.GroupOf | str | None = None,
    registry: Registry = REGISTRY,
    **extra: Any,
) -> Callable[[Callable[P, Any]], JobFunction[P]]: ...


def job(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    queue: str = "default",
    retry: bool | int = True,
    backtrace: bool | int = False,
    retry_in: RetryIn | None = None,
    retry_on: type[BaseException] | Exceptions | None = None,
    discard_on: type[BaseException] | Exceptions = (),
    concurrency_key: concurrency.KeyOf | str | None = None,
    group: groups.GroupOf | str | None = None,
    registry: Registry = REGISTRY,
    **extra: Any,
) -> Any:
    """Register a function as a job: ``@job`` or ``@job(queue="critical", retry=5)``.
    ``retry_on`` / ``discard_on``: an exception class or a tuple of them (see
    :class:`RetryRules`). ``group``: the job's tenant, a function of its arguments or a
    string (:mod:`forkq.groups`).

    The function stays callable as before and gains ``perform_async`` and friends.
    Only JSON-native arguments can be enqueued.
    """

    def register(target: Callable[..., Any]) -> JobFunction[Any]:
        _check_options({"queue": queue, "retry": retry, "backtrace": backtrace,
                        "retry_in": retry_in})
        _check_extra(extra)
        if concurrency_key is not None:
            concurrency.check_key(concurrency_key)
        if group is not None:
            groups.check_group_of(group)
        groups.check_options(extra, group)
        options = JobOptions(queue, retry, backtrace, retry_in, dict(extra),
                             None if retry_on is None else _exceptions("retry_on", retry_on),
                             _exceptions("discard_on", discard_on), concurrency_key, group)
        wire_name = name or f"{target.__module__}.{target.__qualname__}"
        registry.register(JobSpec(wire_name, target, options))
        return JobFunction(target, wire_name, options)

    return register(func) if func is not None else register


class Job:
    """Base class for class-based jobs, Sidekiq style.

    ``class HardWorker(Job, name="HardWorker", queue="critical"): def perform(self, name, count)``.
    A fresh instance runs each job; ``self.jid`` and ``self.payload`` are set before ``perform``.
    """

    job_name: ClassVar[str]
    job_options: ClassVar[JobOptions] = JobOptions()
    jid: str = ""
    payload: dict[str, Any]

    def __init_subclass__(
        cls,
        *,
        name: str | None = None,
        abstract: bool = False,
        registry: Registry = REGISTRY,
        **options: Any,
    ) -> None:
        super().__init_subclass__()
        cls.job_options = cls.job_options.merged(**options)
        if abstract:
            return
        cls.job_name = name or f"{cls.__module__}.{cls.__qualname__}"
        registry.register(JobSpec(cls.job_name, cls.perform, cls.job_options, cls))

    def perform(self, *args: Any) -> Any:
        """The job's work; override it."""
        raise NotImplementedError(f"{type(self).__name__}.perform is not defined")

    @classmethod
    def set(cls, **overrides: Any) -> Enqueue:
        """Enqueue with other options: ``HardWorker.set(queue="low").perform_async(...)``."""
        return Enqueue(cls.job_name, cls.job_options).set(**overrides)

    @classmethod
    def perform_async(cls, *args: Any, durable: bool | Durability = False) -> str | None:
        """Push now; the jid (``durable``: :mod:`forkq.durability`)."""
        return cls.set().perform_async(*args, durable=durable)

    @classmethod
    def s(cls, *args: Any, **kwargs: Any) -> signature.Signature:
        """The job with these arguments, not pushed (:mod:`forkq.signature`)."""
        return cls.set().s(*args, **kwargs)

    @classmethod
    def perform_in(cls, interval: float | dt.timedelta, *args: Any,
                   durable: bool | Durability = False) -> str | None:
        """Push to run ``interval`` from now."""
        return cls.set().perform_in(interval, *args, durable=durable)

    @classmethod
    def perform_at(cls, when: float | dt.datetime, *args: Any,
                   durable: bool | Durability = False) -> str | None:
        """Push to run at ``when``."""
        return cls.set().perform_at(when, *args, durable=durable)

    @classmethod
    async def perform_async_aio(cls, *args: Any, durable: bool | Durability = False
                                ) -> str | None:
        """Push now through the asyncio client; the jid."""
        return await cls.set().perform_async_aio(*args, durable=durable)

    @classmethod
    async def perform_in_aio(cls, interval: float | dt.timedelta, *args: Any,
                             durable: bool | Durability = False) -> str | None:
        """Push through the asyncio client to run ``interval`` from now."""
        return await cls.set().perform_in_aio(interval, *args, durable=durable)

    @classmethod
    async def perform_at_aio(cls, when: float | dt.datetime, *args: Any,
                             durable: bool | Durability = False) -> str | None:
        """Push through the asyncio client to run at ``when``."""
        return await cls.set().perform_at_aio(when, *args, durable=durable)


def _check_extra(extra: dict[str, Any]) -> None:
    """The options forkq reads among those that only travel in the payload."""
    ttl = extra.get("result_ttl")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))
                            or not 0 < ttl < float("inf")):
        raise ValueError(f"job option result_ttl must be a positive number of seconds, "
                         f"got {ttl!r}")
    unique.check(extra)
    if concurrency.LIMIT in extra:
        concurrency.check_limit(extra[concurrency.LIMIT])
    if "expires_in" in extra:
        payloads.check_expires_in(extra["expires_in"])


_OPTIONS = frozenset({"queue", "retry", "backtrace", "retry_in", "retry_on", "discard_on",
                      "concurrency_key", "group"})
"""The options that stay in the job's registration (the others travel in the payload)."""


def _exceptions(name: str, value: Any) -> Exceptions:
    """``value`` (an exception class or a tuple of them) as a tuple; TypeError naming the
    option otherwise."""
    found = value if isinstance(value, tuple) else (value,)
    if not all(isinstance(item, type) and issubclass(item, BaseException) for item in found):
        raise TypeError(f"job option {name} must be an exception class or a tuple of them, "
                        f"got {value!r}")
    return found


def _check_options(options: dict[str, Any]) -> None:
    queue = options.get("queue", "default")
    if not isinstance(queue, str) or not queue:
        raise ValueError(f"job option queue must be a non-empty string, got {queue!r}")
    retry = options.get("retry", True)
    if not isinstance(retry, (bool, int)) or (not isinstance(retry, bool) and retry < 0):
        raise ValueError(f"job option retry must be true, false or an int >= 0, got {retry!r}")
    backtrace = options.get("backtrace", False)
    if not isinstance(backtrace, (bool, int)) or backtrace < 0:
        raise ValueError(f"job option backtrace must be a bool or an int >= 0, got {backtrace!r}")
    retry_in = options.get("retry_in")
    if retry_in is not None and not callable(retry_in):
        raise ValueError(f"job option retry_in must be a function (count, exc), got {retry_in!r}")
