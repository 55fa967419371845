"""A tiny in-process HTTP client for the dashboard's WSGI app: requests go straight to the
callable (no server, no socket), cookies are kept between requests like a browser's, and
:meth:`WsgiClient.csrf` reads the token a form would carry."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), "")


@dataclass
class WsgiClient:
    app: Callable[..., Any]
    cookies: dict[str, str] = field(default_factory=dict)
    script_name: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def request(self, method: str, path: str, *, form: dict[str, Any] | list[tuple[str, str]]
                | None = None, headers: dict[str, str] | None = None) -> Answer:
        path, _, query = path.partition("?")
        body = urlencode(form, doseq=True).encode() if form is not None else b""
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method, "SCRIPT_NAME": self.script_name,
            "PATH_INFO": path.encode("utf-8").decode("latin-1"), "QUERY_STRING": query,
            "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "9191", "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
            "wsgi.errors": io.StringIO(), "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/x-www-form-urlencoded" if form is not None else "",
            "HTTP_ACCEPT": "text/html",
            "HTTP_COOKIE": "; ".join(f"{k}={v}" for k, v in self.cookies.items()),
        }
        for name, value in {**self.headers, **(headers or {})}.items():
            environ["HTTP_" + name.upper().replace("-", "_")] = value
        captured: dict[str, Any] = {}

        def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
            captured["status"], captured["headers"] = int(status.split()[0]), response_headers

        out = b"".join(self.app(environ, start_response))
        for name, value in captured["headers"]:
            if name.lower() == "set-cookie":
                pair = value.split(";", 1)[0]
                key, _, val = pair.partition("=")
                if "Max-Age=0" in value:
                    self.cookies.pop(key, None)
                else:
                    self.cookies[key] = val
        return Answer(captured["status"], captured["headers"], out)

    def get(self, path: str, **kwargs: Any) -> Answer:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, form: dict[str, Any] | list[tuple[str, str]], *,
             csrf: bool = True) -> Answer:
        """POST a form, with the CSRF token the pages' forms carry (unless ``csrf`` is off)."""
        if csrf:
            token = self.csrf()
            form = [*(form.items() if isinstance(form, dict) else form), ("csrf_token", token)]
        return self.request("POST", path, form=form)

    def csrf(self) -> str:
        if "forkq_csrf" not in self.cookies:
            self.get("/")
        return self.cookies["forkq_csrf"]

    def flash(self) -> str:
        """The message the last action left for the next page."""
        from urllib.parse import unquote
        return unquote(self.cookies.get("forkq_flash", ""))


def rows(html: str, attribute: str = "data-jid") -> list[str]:
    """The values of ``attribute`` on the page's table rows, in order."""
    return re.findall(rf'<tr {attribute}="([^"]*)"', html)
