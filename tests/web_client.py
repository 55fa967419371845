"""HTTP-level helpers for the dashboard's tests: the app served in-thread on a free port
(:func:`serve`), and :class:`Browser`, a cookie-keeping client that does not follow redirects
and puts the CSRF token in every POST unless told otherwise. Also ``forkq web`` as a
subprocess (:func:`start_cli`), stopped by its pid."""

from __future__ import annotations

import contextlib
import http.client
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit
from wsgiref.simple_server import WSGIRequestHandler, make_server

from forkq.web.server import _Server


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(app: Callable[..., Any]) -> Iterator[str]:
    """``app`` on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    server = make_server("127.0.0.1", 0, app, server_class=_Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class Page:
    status: int
    headers: list[tuple[str, str]]
    body: str

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k.lower() == name.lower()), "")

    def main(self) -> str:
        """The page's <main> element."""
        found = re.search(r"<main id=\"[^\"]*\">.*</main>", self.body, re.S)
        assert found, self.body[:2000]
        return found.group(0)

    def row(self, attribute: str, value: str) -> str:
        """The table row ``<tr ... attribute="value">`` (its HTML), asserting it is there."""
        quoted = re.escape(_attr(value))
        found = re.search(rf"<tr[^>]*\b{attribute}=\"{quoted}\"[^>]*>.*?</tr>", self.body, re.S)
        assert found, f"no row {attribute}={value!r} in:\n{self.main()[:3000]}"
        return found.group(0)

    def has_row(self, attribute: str, value: str) -> bool:
        return f'{attribute}="{_attr(value)}"' in self.body

    def text(self) -> str:
        """The visible text of <main>, tags dropped, entities decoded, spaces collapsed."""
        return " ".join(unescape(re.sub(r"<[^>]+>", " ", self.main())).split())


def _attr(value: str) -> str:
    return (value.replace("&", "&amp;").replace('"', "&#34;").replace("<", "&lt;")
            .replace(">", "&gt;").replace("'", "&#39;"))


@dataclass
class Browser:
    """A client for one visitor of the app at ``base``."""

    base: str
    cookies: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Page:
        url = urlsplit(self.base)
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
        sent = {"Accept": "text/html", **self.headers, **(headers or {})}
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        try:
            conn.request(method, url.path.rstrip("/") + path, body=body, headers=sent)
            reply = conn.getresponse()
            page = Page(reply.status, reply.getheaders(), reply.read().decode("utf-8", "replace"))
        finally:
            conn.close()
        for name, value in page.headers:
            if name.lower() == "set-cookie":
                key, _, rest = value.partition("=")
                content = rest.split(";")[0]
                if "Max-Age=0" in value:
                    self.cookies.pop(key, None)
                else:
                    self.cookies[key] = content
        return page

    def get(self, path: str, **headers: str) -> Page:
        return self.request("GET", path, headers=headers)

    def csrf(self) -> str:
        """The visitor's CSRF token (a GET first gives one)."""
        if "forkq_csrf" not in self.cookies:
            self.get("/login")
        return self.cookies["forkq_csrf"]

    def post(self, path: str, fields: dict[str, Any] | list[tuple[str, Any]] | None = None,
             *, csrf: str | None = None, headers: dict[str, str] | None = None) -> Page:
        """POST ``fields`` urlencoded, with ``csrf_token`` = the visitor's token unless
        ``csrf`` is given ("" sends none)."""
        items = list(fields.items()) if isinstance(fields, dict) else list(fields or [])
        token = self.csrf() if csrf is None else csrf
        if token:
            items.append(("csrf_token", token))
        return self.request("POST", path, urlencode(items, doseq=True).encode(),
                            {"Content-Type": "application/x-www-form-urlencoded",
                             **(headers or {})})

    def login(self, password: str) -> Page:
        return self.post("/login", {"password": password, "next": "/"})


@dataclass
class CliWeb:
    process: subprocess.Popen[bytes]
    base: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)


def start_cli(*args: str, log_path: Path, env: dict[str, str], timeout: float = 20) -> CliWeb:
    """``python -m forkq web ARGS`` (add ``--port 0``); waits for its "serving" line, or for it
    to exit (then ``base`` is "")."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "forkq", "web", *args], env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    web = CliWeb(process, "", log_path)
    while time.monotonic() < deadline:
        found = re.search(r"serving (http://\S+)/", web.log())
        if found:
            web.base = found.group(1)
            return web
        if process.poll() is not None:
            return web
        time.sleep(0.05)
    web.stop()
    raise AssertionError(f"forkq web did not start:\n{web.log()}")
