"""Who may see and act on the dashboard: :class:`Auth` (roles and passwords), sessions,
CSRF tokens, the security headers and the bind rule.

Roles: ``admin`` sees everything and acts; ``readonly`` sees everything and acts on nothing
(every POST answers 403). Passwords come from the environment or from files
(:meth:`Auth.from_environ`): ``FORKQ_WEB_PASSWORD`` / ``FORKQ_WEB_PASSWORD_FILE`` for admin,
``FORKQ_WEB_READONLY_PASSWORD`` / ``FORKQ_WEB_READONLY_PASSWORD_FILE`` for read-only. With
none configured, auth is off and every visitor is admin: allowed only on a loopback address
(:func:`check_bind`; ``forkq web`` exits 78 otherwise).

A browser logs in with a form and gets a session cookie: ``role.expiry.nonce`` signed with
HMAC-SHA256 under a key derived from the configured passwords (so every process serving the
app accepts it, and changing a password ends every session), or under ``FORKQ_WEB_SECRET``
when set. A program (a Prometheus scraper) sends ``Authorization: Bearer <password>`` or
HTTP Basic with the password (any user name).

CSRF: every visitor gets a random ``forkq_csrf`` cookie (HttpOnly, SameSite=Strict); every
form carries the same value in ``csrf_token``, and a POST whose field does not match the
cookie is refused with 403 before its view runs (double-submit: another site can neither
read nor set the cookie).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from forkq.errors import ConfigError

ADMIN = "admin"
READONLY = "readonly"
SESSION_COOKIE = "forkq_session"
CSRF_COOKIE = "forkq_csrf"
SESSION_SECONDS = 12 * 3600
CSP = ("default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; "
       "base-uri 'none'; object-src 'none'")
HEADERS = (("Content-Security-Policy", CSP), ("X-Content-Type-Options", "nosniff"),
           ("X-Frame-Options", "DENY"), ("Referrer-Policy", "same-origin"),
           ("Cross-Origin-Opener-Policy", "same-origin"))


@dataclass(frozen=True)
class Auth:
    """The configured passwords (empty: that role has none). ``enabled`` when any is set."""

    admin_password: str = ""
    readonly_password: str = ""
    secret: str = ""

    def __post_init__(self) -> None:
        if self.admin_password and self.admin_password == self.readonly_password:
            raise ConfigError("web: the admin and read-only passwords must differ")

    @property
    def enabled(self) -> bool:
        return bool(self.admin_password or self.readonly_password)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, admin_file: str | None = None,
                     readonly_file: str | None = None) -> Auth:
        """Passwords from ``FORKQ_WEB_PASSWORD`` / ``..._FILE`` and ``FORKQ_WEB_READONLY_PASSWORD``
        / ``..._FILE`` (a file given by flag wins); a file's surrounding whitespace is dropped.
        ConfigError for a file that cannot be read or is empty, and for both a value and a
        file of the same role."""
        return cls(
            admin_password=_password(environ, "FORKQ_WEB_PASSWORD", admin_file),
            readonly_password=_password(environ, "FORKQ_WEB_READONLY_PASSWORD", readonly_file),
            secret=environ.get("FORKQ_WEB_SECRET", ""))

    def role_for(self, password: str) -> str | None:
        """The role this password opens, or None (compared in constant time)."""
        given = password.encode("utf-8", "surrogateescape")
        for role, expected in ((ADMIN, self.admin_password), (READONLY, self.readonly_password)):
            if expected and hmac.compare_digest(given, expected.encode("utf-8")):
                return role
        return None

    def _key(self) -> bytes:
        material = self.secret or f"{self.admin_password}\0{self.readonly_password}"
        return hashlib.sha256(b"forkq web session\0" + material.encode("utf-8")).digest()

    def session(self, role: str, now: float | None = None) -> str:
        """A signed session value for ``role``, valid :data:`SESSION_SECONDS`."""
        expiry = int((time.time() if now is None else now) + SESSION_SECONDS)
        body = f"{role}.{expiry}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._sign(body)}"

    def session_role(self, value: str, now: float | None = None) -> str | None:
        """The role of a session cookie that is signed by us and unexpired, else None."""
        body, _, signature = value.rpartition(".")
        if not body or not hmac.compare_digest(signature.encode(), self._sign(body).encode()):
            return None
        role, _, rest = body.partition(".")
        expiry = rest.partition(".")[0]
        if role not in (ADMIN, READONLY) or not expiry.isdigit():
            return None
        return role if int(expiry) > (time.time() if now is None else now) else None

    def _sign(self, body: str) -> str:
        digest = hmac.new(self._key(), body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def header_role(self, authorization: str) -> str | None:
        """The role an ``Authorization`` header (Bearer or Basic) proves, else None."""
        scheme, _, credentials = authorization.strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() == "bearer":
            return self.role_for(credentials)
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                return None
            return self.role_for(decoded.partition(":")[2])
        return None


def _password(environ: Mapping[str, str], variable: str, path: str | None) -> str:
    value = environ.get(variable, "")
    path = path or environ.get(f"{variable}_FILE") or None
    if path and value:
        raise ConfigError(f"web: give {variable} or a password file ({path}), not both")
    if not path:
        return value
    try:
        found = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"web: cannot read the password file {path}: {exc}") from None
    if not found:
        raise ConfigError(f"web: the password file {path} is empty")
    return found


def new_csrf_token() -> str:
    return secrets.token_urlsafe(24)


def csrf_ok(cookie: str, submitted: str) -> bool:
    """The form's token matches the visitor's CSRF cookie (both non-empty)."""
    return bool(cookie) and hmac.compare_digest(cookie.encode(), submitted.encode(
        "utf-8", "surrogateescape"))


def cookie(name: str, value: str, *, path: str, secure: bool, max_age: int | None = None) -> str:
    """A Set-Cookie value: HttpOnly, SameSite=Strict, Secure over HTTPS."""
    parts = [f"{name}={value}", f"Path={path or '/'}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def is_loopback(host: str) -> bool:
    """``host`` (an address or ``localhost``) is reachable only from this machine."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, auth: Auth) -> None:
    """ConfigError when ``host`` is not loopback and no password is configured."""
    if not auth.enabled and not is_loopback(host):
        raise ConfigError(
            f"web: refusing to listen on {host!r} without authentication; set "
            "FORKQ_WEB_PASSWORD (or FORKQ_WEB_PASSWORD_FILE, and/or the READONLY ones), or "
            "bind to 127.0.0.1")
