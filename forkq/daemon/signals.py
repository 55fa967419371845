"""The self-pipe: signal handlers record, the loop acts.

:class:`SelfPipe` installs a handler that does nothing for each signal it
watches and points :func:`signal.set_wakeup_fd` at a non-blocking pipe, so the C
level handler writes the signal number into the pipe. The owning loop calls
:meth:`SelfPipe.wait` (poll on the pipe, plus any other fds) and gets the
signals received, in order. No logging, waiting or raising ever happens in a
handler.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from types import FrameType

from forkq.daemon import pipes

STOP_SIGNAL = signal.SIGUSR1
"""What a child is stopped with: sent by its master (finish the job, or hand over, and exit),
or by the child's own heartbeat thread when the master is gone."""


class SelfPipe:
    """A wakeup pipe for ``signals``; install in the process that will read it."""

    def __init__(self, signals: Iterable[signal.Signals]) -> None:
        self.signals = tuple(signals)
        self._numbers = frozenset(int(s) for s in self.signals)
        self._read_fd, self._write_fd = pipes.pipe(nonblocking=True)
        self.pending = False
        """Whether one of :attr:`signals` arrived since the last :meth:`drain`: a check
        without a system call or a call, for a loop that must stay cheap (the pipe also holds
        the bytes of signals other handlers serve; only a drain or a wait clears those)."""
        self.on_signal: Callable[[], None] | None = None  # also called by the handler
        self._previous_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in self.signals:
            signal.signal(signum, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        """The handler: the wakeup fd has already recorded the signal; note that it has,
        and call :attr:`on_signal` (which must only record or wake, as a handler does)."""
        self.pending = True
        if self.on_signal is not None:
            self.on_signal()

    @property
    def fd(self) -> int:
        """The read end, for callers that wait on several fds."""
        return self._read_fd

    def wait(
        self, timeout: float, *, also: Iterable[int] = ()
    ) -> tuple[list[signal.Signals], list[int]]:
        """Block up to ``timeout`` seconds for a signal or one of the ``also`` fds.

        Returns the signals received (oldest first) and the ``also`` fds that are readable.
        """
        fds = [self._read_fd, *also]
        readable = pipes.readable(fds, timeout)
        ready = [fd for fd in readable if fd != self._read_fd]
        return self.drain(), ready

    def drain(self) -> list[signal.Signals]:
        """The signals recorded so far, without blocking."""
        self.pending = False
        received: list[signal.Signals] = []
        while True:
            try:
                data = os.read(self._read_fd, 512)
            except BlockingIOError:
                return received
            if not data:
                return received
            received.extend(signal.Signals(b) for b in data if b in self._numbers)

    def close(self) -> None:
        """Restore default handlers and the previous wakeup fd; close the pipe."""
        for signum in self.signals:
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._read_fd)
        os.close(self._write_fd)
