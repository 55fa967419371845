"""Driving the dashboard in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``) against a live daemon: the pieces the browser tests and the screenshot
tool share.

- :func:`chromium` starts a WebDriver on ``/usr/bin/chromium`` through ``/usr/bin/chromedriver``
  (never Selenium Manager, which would download a browser); without them it raises
  :class:`BrowserMissingError`, a failure that says what to install.
- :class:`WebServer` runs ``forkq web`` as a subprocess on a free loopback port and stops it
  by its pid.
- :func:`running_daemon` runs ``forkq run`` for a whole module and stops it, and every child
  it had, by pid.
- :func:`wait_until` polls a condition with a deadline (WebDriverWait); :func:`login` signs in.
- :class:`Http` talks to the app without a browser (a tampered or token-less POST).
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
from selenium import webdriver
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from forkq.subprocesses import terminate, wait_for
from forkq.tools.driver import DaemonProcess

from .. import debian

TESTS = Path(__file__).parent.parent
ROOT = TESTS.parent
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 900)
T = TypeVar("T")


class BrowserMissingError(AssertionError):
    """Chromium or its driver is not installed: the test fails, saying what to install."""


def chromium(width: int = WINDOW[0], height: int = WINDOW[1]) -> WebDriver:
    """A headless Chromium at a fixed window size; the caller quits it."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        debian.install("chromium", "chromium-driver")
        missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        raise BrowserMissingError(
            f"{' and '.join(missing)} not found: the browser tests need Debian's chromium and "
            "chromium-driver (apt-get install chromium chromium-driver; .ci/run does it)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", f"--window-size={width},{height}",
                     "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                     "--disable-extensions", "--force-device-scale-factor=1", "--lang=en-US"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # Chromium refuses to sandbox as root
    service = Service(executable_path=CHROMEDRIVER)  # a path given: no Selenium Manager
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    return driver


def wait_until(driver: WebDriver, condition: Callable[[WebDriver], T], timeout: float = 10,
               message: str | Callable[[], str] = "") -> T:
    """The first truthy value of ``condition(driver)`` within ``timeout`` seconds; fails with
    ``message`` (a function is called only then) and the page's URL otherwise."""
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)
    except TimeoutException:
        text = message() if callable(message) else message
        raise AssertionError(f"{text or 'timed out'} (page {driver.current_url})") from None


def settled(read: Callable[[], T]) -> T:
    """``read()`` again while a live refresh replaced what it was reading (the page swaps
    its ``<main>`` every second)."""
    for _ in range(20):
        try:
            return read()
        except StaleElementReferenceException:
            continue
    raise AssertionError("the page kept changing while read")


def text_of(driver: WebDriver, css: str) -> str:
    """The visible text of the first element matching ``css`` ("" when there is none)."""

    def read() -> str:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return str(found[0].text) if found else ""

    return settled(read)


def attribute_of(driver: WebDriver, css: str, name: str) -> str:
    """Attribute ``name`` of the first element matching ``css`` ("" when none has it)."""

    def read() -> str:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return (found[0].get_attribute(name) or "") if found else ""

    return settled(read)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class WebServer:
    """``forkq web`` on a free loopback port, started and stopped by pid."""

    def __init__(self, redis_url: str, log_path: Path, *, env: Mapping[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.command = [sys.executable, "-m", "forkq", "web", "--bind", "127.0.0.1",
                        "--port", str(self.port), "--redis-url", redis_url, *args]
        self.env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}", **(env or {})}

    def start(self, timeout: float = 20) -> None:
        """Start it and wait until it answers HTTP (fails with its log otherwise)."""
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=log,
                                            stdin=subprocess.DEVNULL)
        if not wait_for(self._answers, timeout, interval=0.05):
            raise AssertionError(f"forkq web never answered on {self.url}; log:\n{self.log()}")

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"forkq web exited {self.process.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(self.url + "/", timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # it answers (a login page, a 403): it is up
        except OSError:
            return False

    def log(self) -> str:
        """Everything it printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        """TERM by pid, KILL after 10 s."""
        if self.process is not None:
            terminate(self.process, 10)


@contextlib.contextmanager
def serving(redis_url: str, log_path: Path, **kwargs: Any) -> Iterator[WebServer]:
    """A :class:`WebServer` for the ``with`` block, stopped after it even when it fails."""
    web = WebServer(redis_url, log_path, **kwargs)
    try:
        web.start()
        yield web
    finally:
        web.stop()


class LiveDaemon(DaemonProcess):
    """A ``forkq run`` subprocess with its log file."""

    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def running_daemon(redis_url: str, folder: Path, config: str) -> Iterator[LiveDaemon]:
    """``forkq run`` on ``redis_url`` with the YAML ``config`` (tests/jobs.py importable) for
    the ``with`` block; afterwards the master is stopped by pid, and any child it left
    behind is killed by pid too."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "forkq.yml"
    path.write_text(textwrap.dedent(config) + f"\nredis_url: {redis_url}\n")
    environ = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{ROOT}"}
    daemon = LiveDaemon(str(path), env=environ, cwd=str(folder))
    daemon.log_path = folder / "daemon.log"
    with open(daemon.log_path, "wb") as log:
        daemon.stderr = log
        daemon.start()
    known: set[int] = set()
    try:
        yield daemon
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            known.update(p.pid for p in psutil.Process(daemon.pid).children(recursive=True))
        daemon.stop(timeout=10)
        for pid in known:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def login(driver: WebDriver, base_url: str, password: str) -> None:
    """Sign in through the login form (the dashboard sends a visitor without a session to
    it), and wait to land on a page of the dashboard."""
    driver.get(base_url + "/login")
    field = wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR,
                                                         "input[type=password]"),
                       10, "no password field on the login page")[0]
    field.send_keys(password)
    field.submit()
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "main[id^=page-]")
               and "/login" not in d.current_url, 10, "login did not land on a page")


def open_page(driver: WebDriver, web: WebServer, path: str, name: str) -> None:
    """Load ``path`` and wait for its ``<main id="page-<name>">``."""
    driver.get(web.url + path)
    wait_until(driver, lambda d: d.find_elements(By.ID, f"page-{name}"), 15,
               lambda: f"no main#page-{name} at {path}: {d_text(driver)}\n"
                       f"forkq web's log:\n{web.log()[-3000:]}")


def d_text(driver: WebDriver) -> str:
    """The start of the page's text (for failure messages)."""
    try:
        return str(driver.find_element(By.TAG_NAME, "body").text)[:600]
    except Exception as exc:  # noqa: BLE001 - only a failure message
        return f"<unreadable: {exc}>"


@dataclass(frozen=True)
class Answer:
    """One plain-HTTP answer."""

    status: int
    headers: dict[str, str]
    body: str


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is an answer to look at, not to follow


class Http:
    """A plain HTTP visitor of ``base_url`` with its own cookies (no JavaScript, no
    redirects followed): for the requests a browser would not send."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.cookies), _NoRedirects())

    def cookie(self, name: str) -> str:
        """The value of cookie ``name`` ("" when not set)."""
        return next((c.value or "" for c in self.cookies if c.name == name), "")

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> Answer:
        return self._send(urllib.request.Request(
            self.base_url + path, headers={"Accept": "text/html", **(headers or {})}))

    def post(self, path: str, fields: Mapping[str, str] | list[tuple[str, str]],
             headers: Mapping[str, str] | None = None) -> Answer:
        body = urllib.parse.urlencode(fields).encode()
        return self._send(urllib.request.Request(
            self.base_url + path, data=body, method="POST",
            headers={"Accept": "text/html", **(headers or {}),
                     "Content-Type": "application/x-www-form-urlencoded"}))

    def _send(self, request: urllib.request.Request) -> Answer:
        try:
            with self.opener.open(request, timeout=10) as response:
                return Answer(response.status, dict(response.headers.items()),
                              response.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as error:
            return Answer(error.code, dict(error.headers.items()),
                          error.read().decode("utf-8", "replace"))


def click(driver: WebDriver, css: str, *, confirm: bool = False) -> None:
    """Click the first element matching ``css``, and accept the confirmation it asks when
    ``confirm``. The page's live refresh is held first (:func:`hold_still`): it swaps the
    element every second, and on a loaded host WebDriver's find-then-click can take longer
    than that every time. A click that navigates leaves the hold behind with its page; one
    that does not (a checkbox) leaves the page held, as a visitor's selection does. The
    previous click's navigation may still replace the page (and its hold) once: then the
    page is held again and the element found again."""

    def attempt(d: WebDriver) -> bool:
        hold_still(d)
        try:
            found = d.find_elements(By.CSS_SELECTOR, css)
            if not found:
                return False
            found[0].click()
            return True
        except (StaleElementReferenceException, ElementClickInterceptedException):
            return False

    wait_until(driver, attempt, 10, f"nothing to click at {css}")
    if confirm:
        wait_until(driver, expected_conditions.alert_is_present(), 5,
                   f"{css} asked no confirmation").accept()


def press(driver: WebDriver, scope: str, name: str, *, confirm: bool = False) -> None:
    """Click the button ``name`` inside the first element matching the CSS ``scope`` (a table
    row, a form); see :func:`click`."""
    click(driver, f'{scope} button[name="{name}"]', confirm=confirm)


def rows(driver: WebDriver, table: str, attribute: str) -> list[str]:
    """The ``attribute`` of every row of table ``#<table>`` (``data-jid``, say), in order;
    rows without it (a "no jobs" row) left out. Read in one script, so a live refresh
    cannot land between two rows (one WebDriver call per row took longer than the
    refresh's second on a loaded host)."""
    found = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]),"
        " row => row.getAttribute(arguments[1]));",
        f"#{table} tbody tr[{attribute}]", attribute)
    return [value for value in found or [] if value]


def hold_still(driver: WebDriver) -> None:
    """Stop the live refresh of this page (as forkq.js does while a visitor types): a test
    that edits the page's forms keeps its edits."""
    driver.execute_script("var main = document.querySelector('main');"
                          "if (main && !main.querySelector('[data-norefresh]')) {"
                          "  var hold = document.createElement('span');"
                          "  hold.setAttribute('data-norefresh', '');"
                          "  main.appendChild(hold); }")
