"""What a ``redis_url`` may say, checked before anything connects. Pure functions; no I/O.

Plain URLs go to redis-py's ``from_url``: ``redis://[[user]:password@]host:port/db``,
``rediss://`` (TLS), ``unix:///path?db=N``, with the query options :data:`PLAIN_OPTIONS`, and,
for ``rediss://`` only, the TLS options :data:`TLS_OPTIONS`. Any other option name is refused
here (redis-py would pass it on as a keyword and fail at the first connection).

Sentinel URLs name a set of sentinels and a service; the client asks the sentinels for the
service's master (:func:`forkq.connection.connect`). Two spellings::

    redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db][?options]
    rediss+sentinel://...   (TLS to the sentinels and to the master; TLS_OPTIONS apply to both)
    sentinel://[[user]:password@]host[:port][/db];sentinel://host[:port]...?master_name=service

The second is Celery's and kombu's (``broker_url``), where the service is the
``master_name`` option. The user and password are the master's (and its replicas'); the
sentinels' own ``requirepass`` / ACL user go in the options ``sentinel_password`` and
``sentinel_username``. A port left out is 26379.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel", "sentinel")
PLAIN_SCHEMES = ("redis", "rediss", "unix")
SENTINEL_PORT = 26379

PLAIN_OPTIONS = frozenset({
    "db", "socket_timeout", "socket_connect_timeout", "socket_keepalive", "health_check_interval",
    "client_name",
})
TLS_OPTIONS = frozenset({
    "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_password",
    "ssl_cert_reqs", "ssl_check_hostname",
})
SENTINEL_OPTIONS = frozenset({"sentinel_username", "sentinel_password", "master_name"})
CERT_REQS = ("none", "optional", "required")
BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


@dataclass(frozen=True)
class SentinelTarget:
    """A parsed Sentinel URL: where the sentinels are, which service, how to log in."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    tls: bool = False  # rediss+sentinel://
    tls_options: dict[str, object] = field(default_factory=dict)  # redis-py's ssl_* keywords


_SECRETS = re.compile(r"(://[^:/@;?]*:)[^@/;?]*@|((?:sentinel_|ssl_)?password=)[^&;]*")


def redact(url: str) -> str:
    """``url`` with its passwords (userinfo, ``sentinel_password``, ``ssl_password``) shown
    as ``***``, for a message."""
    return _SECRETS.sub(lambda m: f"{m[1]}***@" if m[1] else f"{m[2]}***", url)


def scheme(url: str) -> str:
    """The URL's scheme, lower case ("" when there is none)."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_sentinel(url: str) -> bool:
    """True when ``url`` names sentinels rather than a server."""
    return scheme(url) in SENTINEL_SCHEMES


def check(url: str) -> None:
    """ValueError naming what is wrong with ``url`` (a sentinel or plain URL)."""
    if is_sentinel(url):
        parse_sentinel(url)
        return
    kind = scheme(url)
    if kind not in PLAIN_SCHEMES:
        raise ValueError("expected 'embedded' or a redis://, rediss://, unix://, "
                         f"redis+sentinel://, rediss+sentinel:// or sentinel:// URL; got {url!r}")
    allowed = PLAIN_OPTIONS | (TLS_OPTIONS if kind == "rediss" else frozenset())
    options = _options([urlsplit(url).query], allowed, kind)
    tls_options(options)


def tls_options(options: dict[str, str]) -> dict[str, object]:
    """The ``ssl_*`` options among ``options``, typed as redis-py takes them; ValueError for a
    bad ``ssl_cert_reqs`` or ``ssl_check_hostname``."""
    tls: dict[str, object] = {k: v for k, v in options.items() if k in TLS_OPTIONS}
    if "ssl_cert_reqs" in tls and tls["ssl_cert_reqs"] not in CERT_REQS:
        raise ValueError(f"ssl_cert_reqs must be one of {', '.join(CERT_REQS)}; "
                         f"got {tls['ssl_cert_reqs']!r}")
    if "ssl_check_hostname" in tls:
        value = str(tls["ssl_check_hostname"]).lower()
        if value not in BOOLEANS:
            raise ValueError(f"ssl_check_hostname must be true or false; got {value!r}")
        tls["ssl_check_hostname"] = BOOLEANS[value]
    return tls


def parse_sentinel(url: str) -> SentinelTarget:
    """The :class:`SentinelTarget` of a Sentinel URL; ValueError naming what is wrong."""
    kind = scheme(url)
    if kind == "sentinel":
        return _parse_kombu(url)
    if kind not in ("redis+sentinel", "rediss+sentinel"):
        raise ValueError(f"not a Sentinel URL: {url!r}")
    rest = url.split("://", 1)[1]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    allowed = SENTINEL_OPTIONS - {"master_name"}
    if kind == "rediss+sentinel":
        allowed |= TLS_OPTIONS
    options = _options([query], allowed, kind)
    userinfo, hosts = _split_userinfo(netloc)
    words = [unquote(word) for word in path.split("/") if word]
    if not words or len(words) > 2:
        raise ValueError(f"{kind}:// URL needs /service_name[/db] after the sentinels; "
                         f"got {'/' + path!r}")
    return _target(_hosts(hosts), words[0], _db(words[1]) if len(words) == 2 else 0, userinfo,
                   options, tls=kind == "rediss+sentinel")


def _parse_kombu(url: str) -> SentinelTarget:
    """``sentinel://h1:26379;sentinel://h2:26379?master_name=svc`` (Celery / kombu)."""
    sentinels: list[tuple[str, int]] = []
    queries: list[str] = []
    userinfo, db = "", 0
    for part in (piece.strip() for piece in url.split(";")):
        if not part:
            continue
        if scheme(part) != "sentinel":
            raise ValueError(f"every ';'-separated part must be a sentinel:// URL; got {part!r}")
        rest, _, query = part.split("://", 1)[1].partition("?")
        netloc, _, path = rest.partition("/")
        queries.append(query)
        info, hosts = _split_userinfo(netloc)
        userinfo = userinfo or info
        if path.strip("/"):
            db = _db(path.strip("/"))
        sentinels += _hosts(hosts)
    options = _options(queries, SENTINEL_OPTIONS, "sentinel")
    service = options.get("master_name", "")
    if not service:
        raise ValueError("sentinel:// URL needs the service name: add ?master_name=<service>")
    return _target(sentinels, service, db, userinfo, options, tls=False)


def _options(queries: list[str], allowed: frozenset[str], kind: str) -> dict[str, str]:
    """The query options of one URL (or of every part of a kombu URL); ValueError for an
    unknown name, or for one given twice with different values."""
    options: dict[str, str] = {}
    for query in queries:
        for name, value in parse_qsl(query, keep_blank_values=True):
            if name not in allowed:
                hint = (" (TLS options need rediss:// or rediss+sentinel://)"
                        if name in TLS_OPTIONS else "")
                raise ValueError(f"unknown option {name!r} in a {kind}:// URL{hint}; "
                                 f"known: {', '.join(sorted(allowed))}")
            if options.get(name, value) != value:
                raise ValueError(f"option {name!r} given twice with different values")
            options[name] = value
    return options


def _split_userinfo(netloc: str) -> tuple[str, str]:
    userinfo, at, hosts = netloc.rpartition("@")
    return (userinfo if at else ""), hosts


def _target(sentinels: list[tuple[str, int]], service: str, db: int, userinfo: str,
            options: dict[str, str], *, tls: bool) -> SentinelTarget:
    user, colon, password = userinfo.partition(":")
    return SentinelTarget(
        sentinels=sentinels, service=service, db=db, username=unquote(user) or None,
        password=unquote(password) if colon else None,
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
        tls=tls, tls_options=tls_options(options))


def _hosts(text: str) -> list[tuple[str, int]]:
    """``host[:port],...`` (``[v6]:port`` too) as (host, port) pairs; ValueError if none."""
    found: list[tuple[str, int]] = []
    for item in (piece.strip() for piece in text.split(",")):
        if not item:
            continue
        if item.startswith("["):
            host, _, after = item[1:].partition("]")
            port_text = after[1:] if after.startswith(":") else ""
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise ValueError(f"sentinel address {item!r} has no host")
        found.append((host, _port(port_text, item)))
    if not found:
        raise ValueError("a Sentinel URL needs at least one sentinel host[:port]")
    return found


def _port(text: str, item: str) -> int:
    if not text:
        return SENTINEL_PORT
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"sentinel address {item!r}: port must be 1-65535")
    return int(text)


def _db(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"database must be a number; got {text!r}")
    return int(text)
