"""Logging in and out (only when passwords are configured: :mod:`forkq.web.security`).

``GET /login`` shows the form; ``POST /login`` checks the password (the role is the one whose
password it is), sets the signed session cookie and goes to ``next`` (a path inside the
app only: never another site); ``POST /logout`` drops the cookie. A wrong password counts
against the visitor's address (:mod:`forkq.web.throttle`)."""

from __future__ import annotations

from forkq.web import security
from forkq.web.routes import Request, Response, redirect, render, route
from forkq.web.throttle import Throttle, client_address


def _next_path(value: str) -> str:
    """A path inside the app to go to after login ("/" for anything else)."""
    return value if value.startswith("/") and not value.startswith("//") and "\\" not in value \
        else "/"


@route("GET", "/login")
def login_form(request: Request) -> Response:
    return render(request, "login.html", next_path=_next_path(request.arg("next")), problem="")


@route("POST", "/login")
def login(request: Request) -> Response:
    auth: security.Auth = request.settings["auth"]
    target = _next_path(request.field("next"))
    if not auth.enabled:
        return redirect(request, target)
    role = auth.role_for(request.field("password"))
    if role is None:
        throttle: Throttle = request.settings["throttle"]
        throttle.failed(client_address(request.environ))
        return render(request, "login.html", status=403, next_path=target,
                      problem="wrong password")
    response = redirect(request, target)
    response.headers.append(("Set-Cookie", security.cookie(
        security.SESSION_COOKIE, auth.session(role), path=request.script_name or "/",
        secure=request.environ.get("wsgi.url_scheme") == "https",
        max_age=security.SESSION_SECONDS)))
    return response


@route("POST", "/logout")
def logout(request: Request) -> Response:
    response = redirect(request, "/login")
    response.headers.append(("Set-Cookie", security.cookie(
        security.SESSION_COOKIE, "", path=request.script_name or "/",
        secure=request.environ.get("wsgi.url_scheme") == "https", max_age=0)))
    return response
