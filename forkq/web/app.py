"""The dashboard as one WSGI callable: :class:`WebApp`.

Per request, in this order: static files (``/static/<name>``, no login needed: they are the
package's own); for a password check (an ``Authorization`` header, ``POST /login``) from an
address refused by :mod:`forkq.web.throttle`, 429 with ``Retry-After``; the visitor's role
(:mod:`forkq.web.security`: session cookie or ``Authorization`` header; everyone is admin
when auth is off); the route
(:mod:`forkq.web.routes`; 404 / 405); for a POST the form, the CSRF token (403 when missing
or wrong) and the role (403 for read-only), all before the view runs; then the view, whose
Redis errors become a 503 page (no answer) or a 409 naming the wrong-typed keys (WRONGTYPE
from an action, or a read no view guards: :mod:`forkq.web.damage`). Every response carries
the security headers and ``Cache-Control: no-store`` (static files may be cached).

The app honours ``SCRIPT_NAME``, so it can be mounted under a prefix in another WSGI or ASGI
application; every URL it writes starts with that prefix.
"""

from __future__ import annotations

import contextlib
import mimetypes
import sys
import threading
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import redis

from forkq.connection import is_wrong_type
from forkq.errors import ForkqError
from forkq.web import damage, routes, security, views
from forkq.web.routes import Request, Response, render
from forkq.web.throttle import Throttle, client_address

STATIC = Path(__file__).parent / "static"
StartResponse = Callable[..., Any]
OPEN_PATHS = frozenset({"/login"})


class WebApp:
    """The WSGI application; build it with :func:`forkq.web.make_app`."""

    def __init__(self, client_factory: Callable[[], redis.Redis], *, auth: security.Auth,
                 settings: dict[str, Any], throttle: Throttle | None = None) -> None:
        self._factory = client_factory
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()
        self.auth = auth
        self.throttle = Throttle() if throttle is None else throttle
        self.settings = {**settings, "auth_on": auth.enabled, "auth": auth,
                         "throttle": self.throttle}
        self.static = {p.name: p for p in STATIC.iterdir() if p.is_file()}
        views.load()

    def redis(self) -> redis.Redis:
        """The one client every request shares (redis-py's pool is thread-safe), made on first
        use: after a prefork server has forked."""
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        script_name, path = routes.decode_path(environ)
        if path.startswith("/static/") and method in ("GET", "HEAD"):
            response = self._static(path[len("/static/"):])
        else:
            response = self._dynamic(environ, method, script_name, path)
            response.headers.append(("Cache-Control", "no-store"))
        headers = [("Content-Type", response.content_type),
                   ("Content-Length", str(len(response.body))), *security.HEADERS,
                   *response.headers]
        start_response(response.status_line, headers)
        return [b""] if method == "HEAD" else [response.body]

    def _static(self, name: str) -> Response:
        found = self.static.get(name)
        if found is None:
            return routes.text_response("not found", 404)
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind in ("application/javascript", "image/svg+xml"):
            kind += "; charset=utf-8"
        return Response(found.read_bytes(), 200, kind,
                        headers=[("Cache-Control", "public, max-age=300")])

    def _dynamic(self, environ: dict[str, Any], method: str, script_name: str,
                 path: str) -> Response:
        cookies = routes.parse_cookies(environ)
        secure = environ.get("wsgi.url_scheme") == "https"
        csrf = cookies.get(security.CSRF_COOKIE, "")
        set_cookies: list[str] = []
        if len(csrf) < 16:
            csrf = security.new_csrf_token()
            set_cookies.append(security.cookie(security.CSRF_COOKIE, csrf,
                                               path=script_name or "/", secure=secure))
        request = Request(environ=environ, method=method, path=path, script_name=script_name,
                          query=routes.parse_query(environ), cookies=cookies, redis=None,  # type: ignore[arg-type]
                          role="", csrf_token=csrf, settings=self.settings)
        response = self._respond(request, secure)
        response.headers += [("Set-Cookie", value) for value in set_cookies]
        return response

    def _role(self, request: Request) -> str | None:
        if not self.auth.enabled:
            return security.ADMIN
        header = request.environ.get("HTTP_AUTHORIZATION", "")
        if header:
            role = self.auth.header_role(header)
            if role is None:
                self.throttle.failed(client_address(request.environ))
            return role
        session = request.cookies.get(security.SESSION_COOKIE, "")
        return self.auth.session_role(session) if session else None

    def _respond(self, request: Request, secure: bool) -> Response:
        wait = self._refused_for(request)
        if wait:
            throttled = self._error(request, 429, "too many failed logins from your address: "
                                    f"try again in {wait} s")
            throttled.headers.append(("Retry-After", str(wait)))
            return throttled
        role = self._role(request)
        if role is None and request.path not in OPEN_PATHS:
            return self._unauthenticated(request)
        request.role = role or ""  # "": not logged in, on the login form
        found, params, allowed = routes.match(request.method, request.path)
        if found is None:
            if allowed:
                return Response(b"method not allowed", 405, "text/plain; charset=utf-8",
                                headers=[("Allow", ", ".join(allowed))])
            return self._error(request, 404, f"no page {request.path}")
        request.params = params  # PATH_INFO arrives percent-decoded already
        if request.method == "POST":
            refused = self._check_post(request)
            if refused is not None:
                return refused
        else:
            self._take_flash(request)
        return self._run(found.view, request, secure)

    def _refused_for(self, request: Request) -> int:
        """Seconds this request's address must wait, when the request checks a password."""
        checks = bool(request.environ.get("HTTP_AUTHORIZATION")) or (
            request.method == "POST" and request.path == "/login")
        if not self.auth.enabled or not checks:
            return 0
        return self.throttle.retry_after(client_address(request.environ))

    def _unauthenticated(self, request: Request) -> Response:
        """Programs (a header sent, or not asking for HTML, or /metrics) get 401 with a Basic
        challenge; browsers are sent to the login form."""
        accept = request.environ.get("HTTP_ACCEPT", "")
        if (request.environ.get("HTTP_AUTHORIZATION") or "text/html" not in accept
                or request.method != "GET" or request.path == "/metrics"):
            return Response(b"authentication required", 401, "text/plain; charset=utf-8",
                            headers=[("WWW-Authenticate", 'Basic realm="forkq"')])
        return routes.redirect(request, "/login", next=request.path)

    def _check_post(self, request: Request) -> Response | None:
        try:
            request.form = routes.read_form(request.environ)
        except ValueError as exc:
            return self._error(request, 400, str(exc))
        if not security.csrf_ok(request.cookies.get(security.CSRF_COOKIE, ""),
                                request.field("csrf_token")):
            return self._error(request, 403, "the form's CSRF token is missing or wrong: "
                               "reload the page and try again")
        if request.role == security.READONLY and request.path != "/logout":
            return self._error(request, 403, "read-only: this login cannot change anything")
        return None

    def _take_flash(self, request: Request) -> None:
        message = request.cookies.get("forkq_flash")
        if message:
            request.flash = unquote(message)

    def _run(self, view: routes.View, request: Request, secure: bool) -> Response:
        try:
            request.redis = self.redis()
            response = view(request)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            return self._error(request, 503, f"Redis did not answer: {exc}")
        except redis.ResponseError as exc:
            if is_wrong_type(exc):
                return self._wrong_type(request, exc)
            return self._error(request, 500, f"{type(exc).__name__}: {exc}")
        except (redis.RedisError, ForkqError) as exc:
            return self._error(request, 500, f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - the one process boundary: a view bug must not kill the server
            traceback.print_exc(file=request.environ.get("wsgi.errors", sys.stderr))
            return self._error(request, 500, "internal error (logged by the server)")
        if request.flash and request.method == "GET":
            response.headers.append(("Set-Cookie", security.cookie(
                "forkq_flash", "", path=request.script_name or "/", secure=secure, max_age=0)))
        return response

    def _wrong_type(self, request: Request, exc: Exception) -> Response:
        """409, the fixed keys of the wrong type named in the page's notice."""
        with contextlib.suppress(redis.RedisError):  # the message still says what was refused
            damage.check(request, damage.TYPES)
        return self._error(request, 409, f"Redis refused: {exc} (a key this uses has the "
                           "wrong type; other items are not affected)")

    def _error(self, request: Request, status: int, message: str) -> Response:
        try:
            return render(request, "error.html", status=status, status_code=status,
                          message=message)
        except Exception:  # noqa: BLE001 - a template bug must still answer
            return routes.text_response(message, status)
