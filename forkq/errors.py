"""Exception hierarchy and process exit codes.

Exit codes are how a forkq process tells its parent (the shell, systemd, or the
master) what happened. 78 is EX_CONFIG from sysexits.h: systemd units list it in
``RestartPreventExitStatus`` so a broken configuration does not restart-loop.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2  # argparse's usage error: unknown command or flag, missing argument
EXIT_DATAERR = 65  # EX_DATAERR: an operator command got input it cannot use (bad JSON args)
EXIT_NOT_FOUND = 66  # EX_NOINPUT: the named process, queue or job is not there
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: Redis did not answer
EXIT_SOFTWARE = 70  # EX_SOFTWARE: a child's code raised past its process boundary
EXIT_ORPHANED = 75  # EX_TEMPFAIL: a child outlived its master by the stop timeout
EXIT_NOPERM = 77  # EX_NOPERM: Redis refused the password or ACL user; do not restart
EXIT_CONFIG = 78  # EX_CONFIG: bad configuration; do not restart
EXIT_CHILD_BOOT = 79  # a processor child could not set itself up after fork; the master
# exits with it too when its children failed to boot too many times in a row


class ForkqError(Exception):
    """Base class of every error forkq raises on purpose."""


class ConfigError(ForkqError):
    """Invalid configuration. The message names the setting and where it came from.

    The CLI prints the message as one line and exits with :data:`EXIT_CONFIG`.
    """


class JobError(ForkqError):
    """A payload that cannot be executed; it goes straight to the dead set."""


class UnknownJobError(JobError):
    """The payload's ``class`` is not a registered job. Nothing is imported or called."""


class MalformedJobError(JobError):
    """The payload is not a JSON object with a string ``class`` and a list ``args``."""


class JobTimeoutError(ForkqError):
    """The job ran past its ``job_timeout``; its processor was killed. The job is retried."""


class JobKilledError(ForkqError):
    """The job's processor died under it too many times; the job goes to the dead set."""


class JobCancelledError(ForkqError):
    """Someone cancelled the job (``forkq cancel``, :func:`forkq.api.cancel`) while it ran, or
    the job raised it on seeing :func:`forkq.cancel_requested`: it goes to the dead set,
    never retried."""


class OverLimit(ForkqError):  # noqa: N818 - the public name (Sidekiq Enterprise's OverLimit)
    """A limiter (:mod:`forkq.limiter`) had no room within its ``wait_timeout``. Inside a
    job, escaping the job reschedules it rather than failing it."""

    def __init__(self, message: str, *, limiter: str = "") -> None:
        super().__init__(message)
        self.limiter = limiter


# Their ``error_class`` in retry and dead entries reads ``forkq.JobTimeoutError``.
JobTimeoutError.__module__ = JobKilledError.__module__ = JobCancelledError.__module__ = "forkq"
OverLimit.__module__ = "forkq"



class EnqueueError(ForkqError):
    """A push did not reach Redis, or its fate is unknown; raised by ``push``, ``push_bulk``
    and ``perform_*`` (the Redis error is chained as ``__cause__``).

    ``enqueued`` lists the jids Redis confirmed, ``not_enqueued`` those it certainly does
    not hold (it could not be reached, or it refused the command), ``unknown`` those whose
    command was sent but whose reply never came (a timeout, a dropped connection): Redis
    may have run it. Retrying an unknown push blindly may enqueue the job twice; look for
    its jid first (``forkq.api``'s ``Queue.find_job`` / ``ScheduledSet.find_job``)."""

    def __init__(self, message: str, *, enqueued: list[str], not_enqueued: list[str],
                 unknown: list[str]) -> None:
        super().__init__(message)
        self.enqueued = enqueued
        self.not_enqueued = not_enqueued
        self.unknown = unknown


class JobFailedError(ForkqError):
    """:func:`forkq.result` of a job that failed for good (dead or dropped): its
    ``error_class`` and ``error_message``, as filed."""

    def __init__(self, jid: str, error_class: str, error_message: str) -> None:
        super().__init__(f"job {jid} failed: {error_class}: {error_message}")
        self.jid = jid
        self.error_class = error_class
        self.error_message = error_message


class ResultTimeoutError(ForkqError, TimeoutError):
    """:func:`forkq.result` waited its ``timeout`` and no result was stored."""


class InputError(ForkqError):
    """An operator command got an argument it cannot use (text that is not UTF-8, which no
    Redis key or command can carry). The CLI prints the message and exits with
    :data:`EXIT_DATAERR`."""


class DamagedKeyError(ForkqError, ValueError):
    """A Redis key holds what forkq cannot read as what it must be (a counter that is no
    number). The CLI prints the message, which names the key, and exits with
    :data:`EXIT_FAILURE`."""


class NotFoundError(ForkqError):
    """An operator named a process, queue or job that is not there.

    The CLI prints the message and exits with :data:`EXIT_NOT_FOUND`."""
