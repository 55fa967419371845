"""systemd's sd_notify protocol, without libsystemd: READY, RELOADING, STOPPING, STATUS, WATCHDOG.

The protocol: systemd passes a ``Type=notify`` service the address of a datagram socket in
``NOTIFY_SOCKET``, either a filesystem path or an abstract name written with a leading ``@``
(which stands for the NUL byte). The service sends UTF-8 datagrams of newline-separated
``KEY=value`` lines to it, e.g. ``READY=1\\nSTATUS=3 of 5 busy``. When ``WatchdogSec=`` is set,
systemd also passes ``WATCHDOG_USEC`` (and usually ``WATCHDOG_PID``, the pid meant to ping) and
kills the service if no ``WATCHDOG=1`` arrives within that many microseconds; pinging at half
that interval is the convention.

The contract of :class:`Notifier`:

* Without ``NOTIFY_SOCKET`` (not under systemd) it is disabled: every send returns ``False``,
  opens nothing and logs nothing, so callers never need to check :attr:`Notifier.enabled`.
* A send never raises: an ``OSError`` (socket gone, queue full past a short timeout) is logged at
  debug level and reported as ``False``. Values are sent on one line each: a newline inside a
  value is replaced by a space so that it cannot forge another field.
* The socket (one ``AF_UNIX``/``SOCK_DGRAM``, close-on-exec) is opened on the first send, not in
  the constructor, so a notifier built before a fork holds no file descriptor yet. Build and use
  it in the master only: units declare ``NotifyAccess=main``, so systemd drops (and logs) any
  message from a forked child.
* After :meth:`Notifier.reloading`, systemd waits for :meth:`Notifier.ready` again.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)

_SEND_TIMEOUT = 1.0  # seconds; a full notify queue must not stall the supervisor loop for long


def _address(notify_socket: str) -> bytes:
    """The ``sendto`` address for a ``NOTIFY_SOCKET`` value; ``@name`` is an abstract socket."""
    if notify_socket.startswith("@"):
        notify_socket = "\0" + notify_socket[1:]
    return os.fsencode(notify_socket)


def _watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Half of ``WATCHDOG_USEC`` in seconds, or None when the watchdog is not meant for ``pid``."""
    watchdog_pid = environ.get("WATCHDOG_PID", "")
    if watchdog_pid and watchdog_pid != str(pid):
        return None
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 2 / 1_000_000 if usec > 0 else None


def _message(fields: Mapping[str, str | int]) -> bytes:
    """``KEY=value`` lines joined by newlines, in the order given."""
    lines = (f"{key}={str(value).replace(chr(10), ' ')}" for key, value in fields.items())
    return "\n".join(lines).encode("utf-8")


class Notifier:
    """Sends sd_notify messages to systemd; silent and harmless when not run by systemd."""

    def __init__(self, address: bytes | None, *, watchdog_interval: float | None = None) -> None:
        """``address`` as passed to ``sendto`` (None: disabled); see :meth:`from_environ`."""
        self._address = address or None
        self._interval = watchdog_interval if self._address else None
        self._sock: socket.socket | None = None
        self._last_ping: float | None = None

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] | None = None, *, pid: int | None = None
    ) -> Notifier:
        """The notifier systemd asked for in ``environ`` (default ``os.environ``).

        ``pid`` (default: this process) is compared with ``WATCHDOG_PID``: the watchdog is off
        when systemd meant it for another process.
        """
        env = os.environ if environ is None else environ
        notify_socket = env.get("NOTIFY_SOCKET", "")
        if not notify_socket:
            return cls(None)
        interval = _watchdog_interval(env, os.getpid() if pid is None else pid)
        return cls(_address(notify_socket), watchdog_interval=interval)

    @property
    def enabled(self) -> bool:
        """Whether ``NOTIFY_SOCKET`` was set, i.e. whether anything will be sent."""
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``); None when off."""
        return self._interval

    def send(self, **fields: str | int) -> bool:
        """Send ``fields`` as one datagram, e.g. ``send(READY=1, STATUS="idle")``.

        Returns whether the datagram was handed to the kernel; False when disabled, when
        ``fields`` is empty or on ``OSError`` (logged at debug). Never raises.
        """
        if self._address is None or not fields:
            return False
        try:
            self._socket().sendto(_message(fields), self._address)
        except OSError as exc:
            log.debug("sd_notify to %r failed: %s", self._address, exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        """Startup (or a reload) is complete: systemd moves the unit to active."""
        return self.send(READY=1, STATUS=status)

    def reloading(self) -> bool:
        """A reload began; the unit stays "reloading" until the next :meth:`ready`."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send(RELOADING=1, MONOTONIC_USEC=usec)

    def stopping(self) -> bool:
        """Shutdown began: systemd shows the unit as deactivating."""
        return self.send(STOPPING=1)

    def status(self, text: str) -> bool:
        """One line of free text for ``systemctl status``."""
        return self.send(STATUS=text)

    def watchdog(self, now: float) -> bool:
        """Ping the watchdog if it is on and ``watchdog_interval`` passed since the last ping.

        ``now`` is a ``time.monotonic()`` reading; the first call pings at once. A failed send
        does not count as a ping, so the next call retries. Returns whether a ping was sent.
        """
        if self._interval is None:
            return False
        if self._last_ping is not None and now - self._last_ping < self._interval:
            return False
        sent = self.send(WATCHDOG=1)
        if sent:
            self._last_ping = now
        return sent

    def close(self) -> None:
        """Close the socket if open; a later send opens a new one."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _socket(self) -> socket.socket:
        """The datagram socket, opened on first use."""
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # close-on-exec (PEP 446)
            sock.settimeout(_SEND_TIMEOUT)
            self._sock = sock
        return self._sock
