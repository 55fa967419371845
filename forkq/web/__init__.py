"""The dashboard: a WSGI application over the same Redis as the daemons.

``forkq web`` serves it (:mod:`forkq.web.server`); :func:`make_app` builds it for mounting
inside another application (Django, Flask, FastAPI: see docs/dashboard.md).
Pages live in :mod:`forkq.web.views`, one module per page group; the request plumbing in
:mod:`forkq.web.routes` and :mod:`forkq.web.app`; who may do what in
:mod:`forkq.web.security` (failed logins: :mod:`forkq.web.throttle`); wrong-typed keys on a
page in :mod:`forkq.web.damage`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import redis

from forkq.errors import ConfigError
from forkq.web.security import Auth
from forkq.web.throttle import Throttle

__all__ = ["Auth", "Throttle", "make_app"]


def make_app(source: str | redis.Redis | Callable[[], redis.Redis], *, auth: Auth | None = None,
             allow_anonymous: bool = False, refresh_seconds: float = 5.0,
             periodic: tuple[Any, ...] = (), registry: Any = None,
             throttle: Throttle | None = None) -> Callable[..., Any]:
    """The dashboard as a WSGI callable.

    ``source`` is a Redis URL (as the daemon's ``redis_url``), a client, or a function making
    one (called once, at the first request). ``auth`` defaults to
    :meth:`Auth.from_environ` (``FORKQ_WEB_PASSWORD`` and friends). Without any password the
    app refuses to be built (ConfigError) unless ``allow_anonymous``: say so only when something
    in front of it authenticates, or it listens on loopback (``forkq web`` decides that).
    ``periodic`` lists the configured cron entries (:attr:`forkq.config.Config.periodic`) for
    the Periodic page; ``registry`` (the app's :class:`~forkq.registry.Registry`) gives their
    jobs' options to "enqueue now". ``throttle`` limits failed logins per client address
    (default :class:`Throttle`: 5 a minute; see :mod:`forkq.web.throttle`)."""
    from forkq.connection import connect
    from forkq.web.app import WebApp

    auth = Auth.from_environ(os.environ) if auth is None else auth
    if not auth.enabled and not allow_anonymous:
        raise ConfigError("web: no password configured (FORKQ_WEB_PASSWORD or "
                          "FORKQ_WEB_PASSWORD_FILE); pass allow_anonymous=True only when "
                          "something in front of the dashboard authenticates")
    factory: Callable[[], redis.Redis]
    if isinstance(source, str):
        url = source

        def factory() -> redis.Redis:
            return connect(url, socket_timeout=10)
    elif isinstance(source, redis.Redis):
        client = source

        def factory() -> redis.Redis:
            return client
    else:
        factory = source
    return WebApp(factory, auth=auth, settings={
        "refresh_ms": int(refresh_seconds * 1000), "periodic": tuple(periodic),
        "registry": registry}, throttle=throttle)
