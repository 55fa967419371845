"""The systemd unit of a forkq daemon, written for this installation (``forkq systemd-unit``).

One template makes both units: ``forkq.service`` (one daemon per host) and, with
``instance``, the template ``forkq@.service`` (one daemon per instance name: the name picks
the config file and becomes the tag). The files shipped in ``systemd/`` are this module's
output for the documented paths (:data:`DEFAULT_FORKQ`; a test holds them equal), so an
installation elsewhere writes its own with the real path of its ``forkq`` executable,
which ``systemd-analyze verify`` requires to exist.

The hardening rates 1.4 ("OK") in ``systemd-analyze security``; what it leaves open is
what a job daemon needs: the network (Redis may be remote), ``/proc`` for the process
checks (:mod:`forkq.daemon.process_proof`), other users' files the app may read, and
writable-executable memory (``MemoryDenyWriteExecute=`` would break libffi callbacks of
ctypes / cffi in application code). Pure: no I/O but for locating the executable.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_FORKQ = "/opt/forkq/venv/bin/forkq"
"""The virtualenv path the shipped units and the README's install steps use."""


@dataclass(frozen=True)
class UnitOptions:
    """What varies between installations."""

    forkq: str = DEFAULT_FORKQ  # ExecStart's program: an absolute path (or "python -m forkq")
    user: str = "forkq"
    config: str = ""  # default: /etc/forkq/forkq.yml, or /etc/forkq/%i.yml for an instance
    instance: bool = False


_PATH = re.compile(r"/[A-Za-z0-9._/@+-]*")
_USER = re.compile(r"[a-z_][a-z0-9_-]*[$]?")


def unfit(flag: str, value: str, *, instance: bool) -> str:
    """Why ``value`` cannot go into the unit as ``flag`` ("" when it can): a user name as
    ``useradd`` makes them; an absolute path (the config may be empty: the default) of
    characters that need no quoting in ``ExecStart=`` and hold no ``%`` specifier but the
    instance's ``%i``. A newline or a space would let a value write directives of its own."""
    if flag == "--user":
        return "" if _USER.fullmatch(value) else f"--user {value!r}: not a user name"
    if flag == "--config" and not value:
        return ""
    plain = value.replace("%i", "") if instance else value
    if not _PATH.fullmatch(plain):
        return (f"{flag} {value!r}: give an absolute path of letters, digits and . _ / @ + -"
                + (" (and %i)" if instance else ""))
    return ""


HOMES = ("/home", "/root", "/run/user")
"""What the unit's ``ProtectHome=yes`` hides from the daemon."""


def hidden_at_home(forkq: str) -> str:
    """The interpreter (or the executable ``forkq`` names) when it lives under a home
    folder, which the unit's ``ProtectHome=yes`` hides, so the service could not start
    (pyenv, ``pip install --user``); "" when it does not."""
    candidates = [os.path.realpath(sys.executable), os.path.realpath(forkq.split()[0])]
    return next((path for path in candidates
                 if any(Path(path).is_relative_to(home) for home in HOMES)), "")


def this_forkq() -> str:
    """The ``forkq`` command of the running installation: the console script next to the
    interpreter (a virtualenv's ``bin/forkq``), else ``<python> -m forkq``. Symlinks are
    kept: a virtualenv's interpreter finds its packages through its own path."""
    script = Path(sys.executable).with_name("forkq")
    if script.is_file() and os.access(script, os.X_OK):
        return str(Path(os.path.abspath(script)))
    return f"{shlex.quote(os.path.abspath(sys.executable))} -m forkq"


def render(options: UnitOptions) -> str:
    """The unit file's text."""
    instance = options.instance
    config = options.config or ("/etc/forkq/%i.yml" if instance else "/etc/forkq/forkq.yml")
    exec_start = f"{options.forkq} -C {config}" + (" -g %i" if instance else "")
    folder = "forkq/%i" if instance else "forkq"
    header = _INSTANCE_HEADER if instance else _SINGLE_HEADER
    return _TEMPLATE.format(
        header=header.format(user=options.user, config=config),
        description="forkq background job daemon" + (" %i" if instance else ""),
        exec_start=exec_start, user=options.user, folder=folder,
        journal="forkq@NAME" if instance else "forkq")


_SINGLE_HEADER = """\
# forkq: one prefork job daemon, supervised by systemd.
#
# Install: `forkq systemd-unit > /etc/systemd/system/forkq.service` writes this file for the
# forkq installation that runs the command (see ExecStart=; --help lists the options). Then
# create the user, put the config in {config}, and start it:
#   useradd --system --home-dir /var/lib/forkq --shell /usr/sbin/nologin {user}
#   systemctl daemon-reload && systemctl enable --now forkq
# Change settings with a drop-in (`systemctl edit forkq`) rather than by editing this file.
# Several daemons on one host: `forkq systemd-unit --instance` writes forkq@.service instead."""

_INSTANCE_HEADER = """\
# forkq@NAME: several forkq daemons on one host, one per instance name.
#
# `systemctl enable --now forkq@billing` runs `forkq -C /etc/forkq/billing.yml -g billing`: the
# instance name picks the config file and becomes the tag shown in process titles, so
# `ps` and `systemctl status` tell the daemons apart. Each instance gets its own working
# directory, /var/lib/forkq/NAME, so that two embedded servers (redis_url: embedded) never share
# a data directory.
#
# Install: `forkq systemd-unit --instance > /etc/systemd/system/forkq@.service` writes this file
# for the forkq installation that runs the command (see ExecStart=). Then create the user, put
# one config per instance in {config} (%i: the instance name), and reload:
#   useradd --system --home-dir /var/lib/forkq --shell /usr/sbin/nologin {user}
#   systemctl daemon-reload"""

_TEMPLATE = """\
{header}
#
# Logs: forkq writes one line per event to stderr, which systemd connects to journald. forkq
# sees JOURNAL_STREAM and leaves its own timestamps out, as journald adds them
# (`journalctl -u {journal}`).

[Unit]
Description={description}
# Start once the network is configured and, when Redis runs on this host, after it. After= only
# orders: a host without redis-server.service simply ignores that name.
After=network-online.target redis-server.service
Wants=network-online.target

[Service]
# forkq tells systemd itself when it is ready (READY=1, once its processors are up), reloading
# (RELOADING=1 on SIGHUP, READY=1 again when done) and stopping (STOPPING=1), with a STATUS line
# such as "3 of 5 busy" for `systemctl status`.
Type=notify
# Only the master may notify: messages from forked processors are dropped.
NotifyAccess=main
ExecStart={exec_start}
# SIGHUP: reread the config; the master keeps the old one if the new one is invalid.
ExecReload=/bin/kill -HUP $MAINPID

# Stopping. KillMode=mixed sends KillSignal (TERM) to the master only, which then stops its
# processors in order: quiet, let running jobs finish until the YAML `timeout`, requeue the rest.
# Only when TimeoutStopSec runs out does systemd send SIGKILL, to the whole control group.
# (The default, control-group, would TERM every processor at once behind the master's back.)
KillMode=mixed
KillSignal=SIGTERM
# Must stay above the YAML `timeout` (graceful-stop deadline, default 25 s) plus a margin for
# requeueing and exiting; raise both together.
TimeoutStopSec=40
# Covers importing the application (`require`) and connecting to Redis before READY=1.
TimeoutStartSec=60

# Restart after a crash or a watchdog kill, but not after exit status 78 (EX_CONFIG) or 77
# (EX_NOPERM, Redis refused the password or ACL user): they stay bad however often the
# daemon is restarted.
Restart=on-failure
RestartSec=2
RestartPreventExitStatus=78 77
# The master pings WATCHDOG=1 every WatchdogSec/2 from its loop; a master stuck for 30 s is
# killed (SIGABRT) and, through Restart=on-failure, started again.
WatchdogSec=30

User={user}
Group={user}
# The working directory holds the embedded Redis's data (.forkq/) when one is used.
WorkingDirectory=/var/lib/{folder}
# Creates /var/lib/{folder} owned by the user at start.
StateDirectory={folder}
# /var/log/{folder} and /run/{folder}, owned by the user and writable under ProtectSystem=strict,
# for the log_file and pid_file settings (see etc/forkq.yml).
LogsDirectory={folder}
RuntimeDirectory={folder}
# Log lines reach journald as they are written, not when a buffer fills.
Environment=PYTHONUNBUFFERED=1
# Files forkq creates are not readable by other users.
UMask=0027

# Hardening: jobs run arbitrary application code, so give them as little as possible
# (`systemd-analyze security forkq` rates this unit 1.4, "OK").
NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
# The whole file system is read-only except the state directory (a Redis unix socket elsewhere,
# e.g. /run/redis/redis-server.sock, can still be connected to). Add ReadWritePaths= (in a
# drop-in) for anything else the application writes.
ProtectSystem=strict
ReadWritePaths=/var/lib/{folder}
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
PrivateMounts=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
# Other users' processes are hidden; /proc/sys stays readable (forkq reads the boot id).
ProtectProc=invisible
RestrictSUIDSGID=yes
LockPersonality=yes
RestrictRealtime=yes
RestrictNamespaces=yes
RemoveIPC=yes
# Redis over TCP or a unix socket, sd_notify over a unix socket: nothing else.
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
SystemCallArchitectures=native
# What an ordinary service calls, minus the privileged calls; others fail with EPERM.
SystemCallFilter=@system-service
SystemCallFilter=~@privileged
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
"""
