"""The dashboard's routing vocabulary: :func:`route` (the table of views), :class:`Request`,
:class:`Response`, :func:`render` and :func:`redirect`. No framework.

A view is a function ``(Request) -> Response`` registered with ``@route(METHOD, PATTERN)``.
A pattern is a path such as ``/queues``; a segment ``<name>`` matches one path segment and
``<path:name>`` the rest of the path (slashes included; a queue's name may hold one). The
captured, percent-decoded values are in ``request.params``. GET routes answer HEAD too. A
path that exists under another method answers 405 (so no action is reachable by GET).

Security is not the views' business: :mod:`forkq.web.app` checks the role and the CSRF
token before a POST view runs, and adds the security headers to every response. Templates
are Jinja2 with autoescaping on: every value a job carries is text, never markup.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from markupsafe import Markup

from forkq.wording import counted, duration

if TYPE_CHECKING:
    import redis

View = Callable[["Request"], "Response"]
TEMPLATES = Path(__file__).parent / "templates"
NAV = (("Dashboard", "/", "dashboard"), ("Busy", "/busy", "busy"),
       ("Queues", "/queues", "queues"), ("Scheduled", "/scheduled", "scheduled"),
       ("Retries", "/retries", "retries"), ("Dead", "/dead", "dead"),
       ("Periodic", "/periodic", "periodic"), ("Batches", "/batches", "batches"),
       ("Flow control", "/flow", "flow"),
       ("Metrics", "/metrics/jobs", "metrics"))
MAX_FORM_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class Route:
    method: str
    pattern: str
    regex: re.Pattern[str]
    view: View


ROUTES: list[Route] = []


def _compile(pattern: str) -> re.Pattern[str]:
    parts = []
    for piece in re.split(r"(<(?:path:)?\w+>)", pattern):
        if piece.startswith("<path:"):
            parts.append(f"(?P<{piece[6:-1]}>.+)")
        elif piece.startswith("<"):
            parts.append(f"(?P<{piece[1:-1]}>[^/]+)")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts) + r"\Z")


def route(method: str, pattern: str) -> Callable[[View], View]:
    """Register ``view`` for ``method`` (GET or POST) on ``pattern`` (see the module doc)."""
    if method not in ("GET", "POST"):
        raise ValueError(f"route method must be GET or POST, not {method!r}")

    def register(view: View) -> View:
        ROUTES.append(Route(method, pattern, _compile(pattern), view))
        return view

    return register


def match(method: str, path: str) -> tuple[Route | None, dict[str, str], list[str]]:
    """The route for ``method`` and ``path`` with its captured values, and the methods the path
    takes (for a 405's Allow header) when no route of ``method`` matches."""
    wanted = "GET" if method == "HEAD" else method
    allowed: list[str] = []
    for candidate in ROUTES:
        found = candidate.regex.match(path)
        if found is None:
            continue
        if candidate.method == wanted:
            return candidate, found.groupdict(), []
        allowed.append(candidate.method)
    return None, {}, sorted(set(allowed))


@dataclass
class Request:
    """One request as a view sees it. ``path`` is the path inside the app (after
    ``script_name``, the prefix it is mounted under), decoded as UTF-8."""

    environ: dict[str, Any]
    method: str
    path: str
    script_name: str
    query: dict[str, list[str]]
    cookies: dict[str, str]
    redis: redis.Redis
    role: str  # "admin" or "readonly"
    csrf_token: str
    params: dict[str, str] = field(default_factory=dict)
    form: dict[str, list[str]] = field(default_factory=dict)
    flash: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    damaged: list[str] = field(default_factory=list)  # wrong-typed keys: forkq.web.damage

    def arg(self, name: str, default: str = "") -> str:
        """The first query value of ``name``."""
        values = self.query.get(name)
        return values[0] if values else default

    def int_arg(self, name: str, default: int, *, low: int = 0, high: int = 10**9) -> int:
        """A query integer clamped to ``low..high``; ``default`` when absent or no integer."""
        try:
            value = int(self.arg(name, str(default)))
        except ValueError:
            return default
        return max(low, min(high, value))

    def field(self, name: str, default: str = "") -> str:
        """The first form value of ``name`` (POST)."""
        values = self.form.get(name)
        return values[0] if values else default

    def fields(self, name: str) -> list[str]:
        """Every form value of ``name`` (checkbox selections)."""
        return list(self.form.get(name, []))

    def url(self, path: str, **query: Any) -> str:
        """``path`` inside the app as a URL from the browser's side (mount prefix included)."""
        tail = "?" + urlencode({k: v for k, v in query.items() if v not in (None, "")},
                               doseq=True) if query else ""
        return self.script_name + path + (tail if tail != "?" else "")


@dataclass
class Response:
    """What a view answers: status, body and headers (the app adds the security headers)."""

    body: bytes = b""
    status: int = 200
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def status_line(self) -> str:
        return f"{self.status} {HTTPStatus(self.status).phrase}"


def decode_path(environ: dict[str, Any]) -> tuple[str, str]:
    """(SCRIPT_NAME, PATH_INFO) as text: WSGI hands them over as latin-1 of the raw bytes
    (PEP 3333); the browser sent UTF-8."""

    def text(value: str) -> str:
        return value.encode("latin-1").decode("utf-8", "replace")

    return (text(environ.get("SCRIPT_NAME", "")).rstrip("/"),
            text(environ.get("PATH_INFO", "")) or "/")


def parse_query(environ: dict[str, Any]) -> dict[str, list[str]]:
    raw = environ.get("QUERY_STRING", "").encode("latin-1").decode("utf-8", "replace")
    return parse_qs(raw, keep_blank_values=True)


def read_form(environ: dict[str, Any]) -> dict[str, list[str]]:
    """The urlencoded body of a POST (ValueError when too big or of another type)."""
    kind = environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > MAX_FORM_BYTES:
        raise ValueError(f"form larger than {MAX_FORM_BYTES} bytes")
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    if body and kind != "application/x-www-form-urlencoded":
        raise ValueError(f"form of type {kind!r}; expected application/x-www-form-urlencoded")
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)


def parse_cookies(environ: dict[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    for part in environ.get("HTTP_COOKIE", "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name and name not in found:
            found[name] = value.strip().strip('"')
    return found


# --- templates -------------------------------------------------------------------------


def _moment(value: Any, now: float | None = None) -> str:
    """Epoch seconds → "12s ago" / "in 3m"; "" when unknown."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return ""
    delta = (time.time() if now is None else now) - value
    text = duration(abs(delta))
    return f"{text} ago" if delta >= 0 else f"in {text}"


def _utc(value: Any) -> str:
    """Epoch seconds → ISO 8601 UTC (for a title attribute); "" when unknown."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return ""
    try:
        return datetime.fromtimestamp(value, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return ""


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _as_json(value: Any, indent: int | None = None) -> str:
    """Any value as JSON text (autoescaped where it lands)."""
    return json.dumps(value, ensure_ascii=False, indent=indent, default=repr)


def _short(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else _as_json(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters.update(moment=_moment, duration=duration, utc=_utc, number=_number,
                       counted=counted,
                       as_json=_as_json, short=_short, quote=lambda v: quote(str(v), safe=""))
    return env


ENV = _environment()


def render(request: Request, template: str, *, status: int = 200, **context: Any) -> Response:
    """``template`` rendered with ``context`` plus what every page uses: ``url``, ``role``,
    ``can_act`` (not read-only), ``csrf_field()``, ``nav``, ``flash`` and ``now``."""

    def csrf_field() -> Markup:
        return Markup('<input type="hidden" name="csrf_token" value="{}">').format(
            request.csrf_token)

    page = ENV.get_template(template).render(
        request=request, url=request.url, role=request.role, can_act=request.role == "admin",
        csrf_field=csrf_field, nav=NAV, flash=request.flash, now=time.time(),
        pages_around=pages_around,
        auth_on=bool(request.settings.get("auth_on")), **context)
    return Response(page.encode("utf-8"), status)


def redirect(request: Request, path: str, *, flash: str = "", **query: Any) -> Response:
    """303 See Other to ``path`` inside the app; ``flash`` is shown once on the next page."""
    response = Response(b"", 303, headers=[("Location", request.url(path, **query))])
    if flash:
        response.headers.append(("Set-Cookie", flash_cookie(request, flash)))
    return response


def flash_cookie(request: Request, message: str) -> str:
    """A cookie carrying ``message`` (percent-encoded, at most 300 characters) to the next page."""
    value = quote(message[:300], safe="")
    return f"forkq_flash={value}; Path={request.script_name or '/'}; HttpOnly; SameSite=Strict"


def text_response(body: str, status: int = 200) -> Response:
    return Response(body.encode("utf-8"), status, "text/plain; charset=utf-8")


def paginate(total: int, page: int, per_page: int) -> dict[str, int]:
    """Offsets for ``page`` (1-based, clamped to the last page) of ``total`` items."""
    pages = max(1, -(-total // per_page))
    page = max(1, min(page, pages))
    return {"page": page, "pages": pages, "per_page": per_page, "total": total,
            "start": (page - 1) * per_page, "stop": min(total, page * per_page)}


def pages_around(page: int, pages: int, width: int = 3) -> Iterable[int]:
    """The page numbers a pager shows: the first, the last and ``width`` either side."""
    shown = {1, pages, *range(max(1, page - width), min(pages, page + width) + 1)}
    return sorted(shown)
