"""The sandbox of the generated systemd unit, rebuilt without systemd (none runs here).

:func:`script` turns a unit's hardening into a shell script for ``unshare --mount`` (as root):

- ``PrivateTmp=`` — a fresh ``/tmp`` holding only the folders the unit would reach there
  (the state folder, which stands for ``StateDirectory=``; the Redis and sd_notify sockets'
  folders, as ``BindPaths=`` would give them);
- ``PrivateDevices=`` — a fresh ``/dev`` with null, zero, full, random, urandom, tty and a
  private ``shm``;
- ``ProtectSystem=strict`` — the root file system read-only (the state folder, on its own
  mount, stays writable: ``ReadWritePaths=``); ``ProtectKernelTunables=`` and
  ``ProtectControlGroups=`` — ``/proc/sys``, ``/sys``, ``/sys/fs/cgroup`` read-only;
- ``ProtectHome=`` — ``/home``, ``/root``, ``/run/user`` inaccessible (empty, mode 000),
  but for this Python's own install when it lives there (:func:`interpreter_home`);
- ``User=``, ``NoNewPrivileges=``, ``CapabilityBoundingSet=``, ``AmbientCapabilities=`` —
  ``setpriv`` to ``nobody`` (the unit's user does not exist here) with no capability left;
- ``SystemCallFilter=`` (with ``@default``, which systemd always allows),
  ``SystemCallErrorNumber=EPERM``, ``RestrictAddressFamilies=`` and
  ``SystemCallArchitectures=native`` — a seccomp filter built from the unit's own lines and
  ``systemd-analyze syscall-filter``'s groups, installed by this module's ``__main__``
  through libseccomp just before it ``exec`` s ``ExecStart=``.

Not rebuilt (each needs systemd's own machinery, a kernel feature this host may lack, or a
change to the host): ``ProtectProc=invisible`` (a ``/proc`` mount option, shared with the
host here), ``RestrictNamespaces=``, ``LockPersonality=``, ``RestrictRealtime=``,
``RestrictSUIDSGID=``, ``ProtectKernelModules=`` / ``ProtectKernelLogs=`` /
``ProtectClock=`` / ``ProtectHostname=`` beyond what ``~@privileged`` and the empty
capability set already deny, ``PrivateMounts=``, ``RemoveIPC=``, ``UMask=``, journald, the
watchdog, and systemd's supervision itself.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

NOBODY = 65534
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def directives(unit: str) -> dict[str, list[str]]:
    """Key → every value given (``[Service]`` keys are unique enough to ignore sections)."""
    found: dict[str, list[str]] = {}
    for line in unit.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def syscall_groups() -> dict[str, list[str]]:
    """``systemd-analyze syscall-filter``: each ``@group`` → its members (calls and groups)."""
    out = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif line.startswith("    ") and not line.strip().startswith("#") and current is not None:
            current.append(line.strip())
        elif not line.strip():
            current = None
    return groups


def allowed_calls(unit: str) -> list[str]:
    """The system calls the unit's ``SystemCallFilter=`` lines allow, as systemd reads them:
    the first line an allow-list (plus ``@default``), each ``~`` line taken away from it."""
    groups = syscall_groups()

    def expand(names: list[str]) -> set[str]:
        calls: set[str] = set()
        for name in names:
            calls |= expand(groups[name]) if name.startswith("@") else {name}
        return calls

    lines = directives(unit)["SystemCallFilter"]
    assert not lines[0].startswith("~"), "the emulation builds an allow-list filter"
    allowed = expand(lines[0].split())
    for line in lines[1:]:
        assert line.startswith("~"), line
        allowed -= expand(line[1:].split())
    return sorted(allowed | expand(["@default"]))


def interpreter_home() -> tuple[Path, ...]:
    """The install of this Python when it lives under /root or /home (pyenv, as on the
    machine these tests were written on), which ``ProtectHome=yes`` would hide: the sandbox
    shows that one folder read-only (a real installation keeps its virtualenv in /opt, on a
    system Python; ``forkq systemd-unit`` warns otherwise). Empty when it lives elsewhere."""
    prefix = Path(os.path.realpath(sys.base_prefix))
    hidden = any(prefix.is_relative_to(home) for home in ("/root", "/home", "/run/user"))
    return (prefix,) if hidden else ()


def families(unit: str) -> list[int]:
    """The address families ``RestrictAddressFamilies=`` leaves to ``socket()``."""
    [line] = directives(unit)["RestrictAddressFamilies"]
    return [int(getattr(socket, name)) for name in line.split()]


def script(unit: str, *, keep: list[Path], state: Path, command: list[str],
           expose: tuple[Path, ...] = (), installed: tuple[Path, ...] = ()) -> str:
    """The shell script that builds the sandbox in a fresh mount namespace and ``exec`` s
    ``command`` (``keep``: folders under /tmp the private /tmp must still show; ``state``:
    the writable state folder, one of them; ``expose``: folders under a home that must stay
    readable, see :func:`interpreter_home`; ``installed``: a forkq checkout under /tmp, shown
    read-only as ``ProtectSystem=strict`` shows the real install)."""
    found = directives(unit)
    for key, value in (("PrivateTmp", "yes"), ("PrivateDevices", "yes"),
                       ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("ProtectKernelTunables", "yes"), ("ProtectControlGroups", "yes"),
                       ("NoNewPrivileges", "yes"), ("CapabilityBoundingSet", ""),
                       ("SystemCallErrorNumber", "EPERM"), ("SystemCallArchitectures", "native")):
        assert found.get(key) == [value], f"the unit no longer says {key}={value}"
    q = shlex.quote
    new_tmp = state.parent / "private-tmp"
    lines = ["set -eu", "mount --make-rprivate /",
             f"mkdir -p {q(str(new_tmp))}",
             f"mount -t tmpfs -o mode=1777 tmpfs {q(str(new_tmp))}",
             f"mkdir {q(str(new_tmp / '.dev'))}",
             f"mount -t tmpfs -o mode=0755 tmpfs {q(str(new_tmp / '.dev'))}"]
    for device in DEVICES:
        target = q(str(new_tmp / ".dev" / device))
        lines += [f"touch {target}", f"mount --bind /dev/{device} {target}"]
    lines += [f"mkdir {q(str(new_tmp / '.dev' / 'shm'))}",
              f"mount -t tmpfs -o mode=1777 tmpfs {q(str(new_tmp / '.dev' / 'shm'))}"]
    for folder in keep:
        inside = new_tmp / folder.relative_to("/tmp")
        lines += [f"mkdir -p {q(str(inside))}", f"mount --bind {q(str(folder))} {q(str(inside))}"]
    for folder in installed:
        inside = q(str(new_tmp / folder.relative_to("/tmp")))
        lines += [f"mkdir -p {inside}", f"mount --bind {q(str(folder))} {inside}",
                  f"mount -o remount,bind,ro {inside}"]
    for number, path in enumerate(expose):  # held aside before the homes are covered
        held = new_tmp / ".expose" / str(number)
        lines += [f"mkdir -p {q(str(held))}", f"mount --bind {q(str(path))} {q(str(held))}"]
    lines += [f"mount --move {q(str(new_tmp / '.dev'))} /dev",
              f"rmdir {q(str(new_tmp / '.dev'))}",
              f"mount --move {q(str(new_tmp))} /tmp",
              "mount -o remount,bind,ro /"]
    for tree in ("/proc/sys", "/sys", "/sys/fs/cgroup"):
        lines += [f"mount --bind {tree} {tree}", f"mount -o remount,bind,ro {tree}"]
    for home in ("/home", "/root", "/run/user"):
        shown = [path for path in expose if path.is_relative_to(home)]
        mode = "0711" if shown else "000"  # a way through to what must stay, nothing to list
        lines.append(f"if [ -d {home} ]; then mount -t tmpfs -o mode={mode} tmpfs {home}; fi")
        for path in shown:
            held = Path("/tmp/.expose") / str(expose.index(path))
            lines += [f"mkdir -p {q(str(path))}", f"mount --bind {q(str(held))} {q(str(path))}",
                      f"mount -o remount,bind,ro {q(str(path))}", f"umount {q(str(held))}"]
    if expose:
        lines.append("rm -r /tmp/.expose")
    lines.append(f"cd {q(str(state))}")  # WorkingDirectory=, inside the new mounts
    launcher = [sys.executable, str(Path(__file__).resolve()), json.dumps(
        {"allow": allowed_calls(unit), "families": families(unit)})]
    lines.append(" ".join(["exec setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}",
                           "--clear-groups", "--no-new-privs", "--bounding-set=-all",
                           "--inh-caps=-all", "--", *map(q, launcher), "--",
                           *map(q, command)]))
    return "\n".join(lines) + "\n"


# --- the launcher: install the seccomp filter, then exec ----------------------------------

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4


def _errno_action(number: int) -> int:
    return 0x00050000 | (number & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def install_filter(allow: list[str], address_families: list[int]) -> None:
    """Every call but ``allow`` fails with EPERM; ``socket()`` only for ``address_families``
    (this process has no-new-privs, so no privilege is needed)."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.c_void_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    context = lib.seccomp_init(_errno_action(errno.EPERM))
    assert context, "seccomp_init failed"
    for name in allow:
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0 or name == "socket":  # not on this architecture; socket: below
            continue
        result = lib.seccomp_rule_add_array(context, SCMP_ACT_ALLOW, number, 0, None)
        assert result == 0, f"seccomp rule for {name}: {result}"
    socket_call = lib.seccomp_syscall_resolve_name(b"socket")
    for family in address_families:
        compare = _ArgCmp(0, SCMP_CMP_EQ, family, 0)
        result = lib.seccomp_rule_add_array(context, SCMP_ACT_ALLOW, socket_call, 1,
                                            ctypes.byref(compare))
        assert result == 0, f"seccomp rule for socket({family}): {result}"
    assert lib.seccomp_load(context) == 0, "seccomp_load failed"


if __name__ == "__main__":
    settings, separator, *command = sys.argv[1:]
    assert separator == "--" and command, sys.argv
    chosen = json.loads(settings)
    install_filter(chosen["allow"], chosen["families"])
    os.execv(command[0], command)
