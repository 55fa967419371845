"""The ``forkq`` command: parse → Config → call. No policy here.

``forkq [run] [flags]`` runs the daemon (plain ``forkq -C FILE`` too, as
``sidekiq -C``); ``forkq demo`` runs it on the example jobs; ``forkq bench``
measures it; ``forkq version`` (or ``--version``); a first word that is no command gets
the closest command suggested (exit 2). The operator's commands (``status``, ``quiet``,
``stop``, ``dump``, ``reload``, ``queues``, ``retries``, ``dead``, ``scheduled``, ``job``,
``limits``, ``uniques``, ``batches``, ``batch``, ``cancel``, ``enqueue``; see
:mod:`forkq.ops.commands`) find Redis as the daemon does (``-C``, ``--redis-url``,
``FORKQ_REDIS_URL``, ``REDIS_URL``) and print tables, or JSON with ``--json``.
Errors print one line on stderr (and ``{"error": …}`` on stdout with ``--json``):
a configuration error exits 78 (EX_CONFIG), a Redis that does not answer 69
(EX_UNAVAILABLE), anything named but absent 66, input it cannot use 65 (``enqueue`` of a name
the configured app does not register, unless ``--force``), other refusals 1.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import redis

from forkq import __version__, config, durability
from forkq.connection import connect
from forkq.daemon import logs
from forkq.errors import (
    EXIT_CONFIG,
    EXIT_DATAERR,
    EXIT_FAILURE,
    EXIT_NOPERM,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    ConfigError,
    ForkqError,
    InputError,
    NotFoundError,
    UnknownJobError,
)
from forkq.ops import options
from forkq.printable import json_text, printable
from forkq.wirejson import is_utf8

OPERATOR = ("status", "quiet", "stop", "dump", "reload", "queues", "retries", "dead",
            "scheduled", "cancel", "job", "limits", "uniques", "batches", "batch")
COMMANDS = ("run", "demo", "bench", "version", "enqueue", "web", "systemd-unit", *OPERATOR)
MOVED_BENCHES = {"--web": "bench/web_pages.py", "--scheduled": "bench/scheduled.py",
                 "--split": "bench/split.py", "--backlog": "bench/backlog.py"}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and not args[0].startswith("-") and args[0] not in COMMANDS:
        return _unknown_command(args[0])
    if not args or args[0] not in (*COMMANDS, "-h", "--help", "--version"):
        args.insert(0, "run")
    parsed = _parser().parse_args(args)
    try:
        return int(parsed.func(parsed))
    except (ForkqError, redis.RedisError) as exc:
        code, message = _failure(exc)
    if getattr(parsed, "json", False):
        print(json_text({"error": message}))
    print(f"forkq: {printable(message)}", file=sys.stderr)
    return code


def _unknown_command(word: str) -> int:
    """A first word that is no command (``forkq stauts``): say so, suggest the closest one."""
    close = difflib.get_close_matches(word, COMMANDS, n=1)
    hint = f"did you mean {close[0]}?" if close else f"commands: {', '.join(COMMANDS)}"
    print(f"forkq: unknown command {word!r}; {hint} (forkq --help lists them)", file=sys.stderr)
    return EXIT_USAGE


def _failure(exc: ForkqError | redis.RedisError) -> tuple[int, str]:
    """The exit status and the one-line message for an error that ends a command."""
    if isinstance(exc, ConfigError):
        return EXIT_CONFIG, f"config error: {exc}"
    if isinstance(exc, NotFoundError):
        return EXIT_NOT_FOUND, str(exc)
    if isinstance(exc, UnknownJobError | InputError):
        return EXIT_DATAERR, str(exc)
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.NoPermissionError):
        return EXIT_NOPERM, (f"Redis refused authentication: {exc} (check the password or "
                             "ACL user in redis_url)")
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return EXIT_UNAVAILABLE, f"Redis did not answer: {exc}"
    if isinstance(exc, redis.RedisError):
        return EXIT_FAILURE, f"Redis refused: {exc}"
    return EXIT_FAILURE, str(exc)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forkq", description="Prefork job daemon on Redis.")
    parser.add_argument("--version", action="version", version=f"forkq {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the daemon (the default command)")
    config.add_flags(run)
    run.set_defaults(func=_run)
    demo = commands.add_parser("demo", help="run the daemon on the example jobs, then stop")
    config.add_flags(demo)
    demo.set_defaults(func=_demo)
    bench = commands.add_parser(
        "bench", help="measure throughput, CPU per job, latency and launch",
        epilog="The side-by-side comparison with Sidekiq (--sidekiq) and the benchmarks of "
        "single features are in bench/ of a clone: " + ", ".join(MOVED_BENCHES.values()) + ".")
    bench.add_argument("-n", "--jobs", type=int, default=20_000, metavar="N", help="jobs per drain")
    bench.add_argument("-c", "--concurrency", type=_int_list, default=[2, 4, 8],
                       metavar="C[,C...]", help="forkq processor counts to measure (default 2,4,8)")
    bench.add_argument("--repeat", type=int, default=3, metavar="N",
                       help="repetitions, alternating the systems; the table shows the median")
    bench.add_argument("--latency-samples", type=int, default=200, metavar="N",
                       help="single pushes to an idle system for the latency figures")
    bench.add_argument("--sidekiq", action="store_true",
                       help="also run Ruby's Sidekiq 6.4.1 (ruby-sidekiq) 1x10 and 2x10 to "
                       "compare (bench/side_by_side.py of the clone forkq is installed from)")
    bench.add_argument("--redis-url", default=None, metavar="URL",
                       help="use this server (default: a private throwaway server)")
    for flag, script in MOVED_BENCHES.items():
        bench.add_argument(flag, nargs="?", action=_Moved, help=argparse.SUPPRESS,
                           default=None, const=script)
    bench.set_defaults(func=_bench)
    version = commands.add_parser("version", help="print the version")
    version.set_defaults(func=_version)
    _unit_parser(commands.add_parser("systemd-unit", help="print a systemd unit that runs this "
                                     "installation's forkq (hardened, Type=notify)"))
    _operator_parsers(commands)
    return parser


def _operator_parsers(commands: Any) -> None:
    """The operator's commands (forkq.ops.commands); each takes the connection flags and --json."""
    common = argparse.ArgumentParser(add_help=False)
    config.add_connection_flags(common)
    common.add_argument("--json", action="store_true", help="print one JSON object")
    commands.add_parser("status", parents=[common], help="processes, busy processors, queues "
                        "and totals").set_defaults(func=_operator)
    commands.add_parser("limits", parents=[common], help="concurrency limits (jobs running "
                        "and waiting per key), the limiters in use, the groups waiting"
                        ).set_defaults(func=_operator)
    uniques = commands.add_parser("uniques", parents=[common],
                                  help="unique jobs' locks: the job holding each, time left")
    uniques.add_argument("--limit", type=int, default=100, help="show at most N (0: all)")
    uniques.set_defaults(func=_operator)
    for name, verb in SIGNAL_COMMANDS.items():
        _signal_parser(commands.add_parser(name, parents=[common], help=f"ask processes to "
                                           f"{verb} (Sidekiq's remote signal)"))
    queues = commands.add_parser("queues", parents=[common],
                                 help="list, show, clear, pause or resume queues")
    queues.add_argument("action", nargs="?", default="list",
                        choices=("list", "jobs", "clear", "pause", "resume"))
    queues.add_argument("name", nargs="?", metavar="NAME",
                        help="the queue (jobs, clear, pause, resume)")
    _limit_flag(queues)
    queues.set_defaults(func=_operator)
    for name, what in (("retries", "failed jobs awaiting a retry"),
                       ("dead", "jobs out of retries"), ("scheduled", "jobs due later")):
        _set_parser(commands.add_parser(name, parents=[common], help=f"{what}: list, retry, "
                                        "delete, kill, clear"))
    job = commands.add_parser("job", parents=[common], help="find one job wherever it is "
                              "(queue, schedule, running, retry, dead), shown whole")
    job.add_argument("jid", metavar="JID")
    job.set_defaults(func=_operator)
    batches = commands.add_parser("batches", parents=[common], help="the newest batches: "
                                  "state, members pending and failed, progress")
    _limit_flag(batches, "batches")
    batches.set_defaults(func=_operator)
    batch = commands.add_parser("batch", parents=[common], help="one batch: its figures, "
                                "events and callbacks, its pending and failed members")
    batch.add_argument("bid", metavar="BID")
    _limit_flag(batch, "pending and failed members each")
    batch.set_defaults(func=_operator)
    _enqueue_parser(commands.add_parser("enqueue", parents=[common],
                                        help="push one job by name"))
    _web_parser(commands.add_parser("web", help="serve the web dashboard (loopback by default)"))
    cancel = commands.add_parser("cancel", parents=[common], help="cancel jobs: remove them "
                                 "where they wait, or stop the processor running them")
    cancel.add_argument("jids", nargs="*", metavar="JID")
    cancel.add_argument("--wait", type=options.seconds_option, default=None, metavar="SECONDS",
                        help="how long to wait for a running job to be stopped (default: "
                        f"cancel_grace + {CANCEL_WAIT_MARGIN:g})")
    cancel.set_defaults(func=_operator)


CANCEL_WAIT_MARGIN = 3.0
"""Seconds ``forkq cancel`` waits beyond ``cancel_grace``: the master sees a request within
a second, and kills a job that ignores it within a second of the grace's end."""


SIGNAL_COMMANDS = {"quiet": "stop taking jobs", "stop": "finish or requeue their jobs, then exit",
                   "dump": "log their stacks (TTIN)",
                   "reload": "re-read their configuration (HUP; forkq processes only)"}


def _signal_parser(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("identities", nargs="*", metavar="IDENTITY",
                     help="a process identity, or its first parts when they name one (host:pid)")
    sub.add_argument("--all", action="store_true", help="every live process")
    sub.set_defaults(func=_operator)


def _limit_flag(sub: argparse.ArgumentParser, what: str = "jobs") -> None:
    sub.add_argument("--limit", type=options.limit_option, default=options.DEFAULT_LIMIT,
                     metavar="N",
                     help=f"list at most N {what} (default {options.DEFAULT_LIMIT}; 0 = all)")


def _set_parser(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("action", nargs="?", default="list",
                     choices=("list", "retry", "delete", "kill", "clear"))
    sub.add_argument("jids", nargs="*", metavar="JID")
    sub.add_argument("--all", action="store_true", help="act on every job of the set")
    _limit_flag(sub)
    sub.set_defaults(func=_operator)


def _enqueue_parser(sub: argparse.ArgumentParser) -> None:
    config.add_setting_flags(sub, ("require",))
    sub.add_argument("name", metavar="NAME",
                     help="the job's registered name (or a Ruby class run by Sidekiq)")
    sub.add_argument("args", nargs="*", metavar="ARG",
                     help="each is JSON when it parses as JSON (42, true, [1]), else a string; "
                     "put -- before a negative number")
    sub.add_argument("-q", "--queue", dest="to_queue", default=None, metavar="QUEUE",
                     help="queue (default: the job's own)")
    sub.add_argument("--retry", type=options.retry_option, default=None, metavar="true|false|N",
                     help="true, false or a number of retries")
    sub.add_argument("--in", dest="in_seconds", type=options.seconds_option, default=None,
                     metavar="SECONDS", help="run it this many seconds from now")
    sub.add_argument("--at", type=options.when_option, default=None, metavar="WHEN",
                     help="run it at this epoch, or ISO 8601 time (local unless it has an offset)")
    sub.add_argument("--force", action="store_true",
                     help="push even when the configured app (require) has no job NAME")
    sub.set_defaults(func=_enqueue)


def _unit_parser(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--user", default="forkq", metavar="USER",
                     help="the user (and group) the daemon runs as (default forkq)")
    sub.add_argument("--config", default="", metavar="PATH",
                     help="the config file ExecStart names (default /etc/forkq/forkq.yml; "
                     "with --instance /etc/forkq/%%i.yml)")
    sub.add_argument("--instance", action="store_true",
                     help="the template forkq@.service: one daemon per instance name, which "
                     "picks the config file and the tag")
    sub.add_argument("--forkq", default=None, metavar="PATH",
                     help="the forkq executable ExecStart runs (default: this "
                     "installation's, next to the running Python)")
    sub.set_defaults(func=_systemd_unit)


def _systemd_unit(args: argparse.Namespace) -> int:
    from forkq.ops import systemd_unit

    for flag, value in (("--user", args.user), ("--config", args.config),
                        ("--forkq", args.forkq or "/")):
        problem = systemd_unit.unfit(flag, value, instance=args.instance)
        if problem:
            raise InputError(f"systemd-unit: {problem}")
    unit = systemd_unit.UnitOptions(forkq=args.forkq or systemd_unit.this_forkq(),
                                    user=args.user, config=args.config, instance=args.instance)
    hidden = systemd_unit.hidden_at_home(unit.forkq)
    if hidden:
        print(f"forkq: note: {hidden} lives in a home folder, which the unit's "
              "ProtectHome=yes hides (and User= may not read): the service would not start; "
              "install forkq in a virtualenv outside /home and /root (e.g. /opt/forkq/venv "
              "on the system's Python), or relax ProtectHome in a drop-in", file=sys.stderr)
    sys.stdout.write(systemd_unit.render(unit))
    return 0


def _web_parser(sub: argparse.ArgumentParser) -> None:
    config.add_connection_flags(sub)
    sub.add_argument("--bind", default="127.0.0.1", metavar="HOST",
                     help="address to listen on (default 127.0.0.1; another one needs a "
                     "password: FORKQ_WEB_PASSWORD or FORKQ_WEB_PASSWORD_FILE)")
    sub.add_argument("--port", type=int, default=9191, metavar="PORT",
                     help="port (default 9191; 0 takes a free one)")
    sub.add_argument("--password-file", default=None, metavar="FILE",
                     help="the admin password, read from FILE (or FORKQ_WEB_PASSWORD[_FILE])")
    sub.add_argument("--readonly-password-file", default=None, metavar="FILE",
                     help="the read-only password, read from FILE "
                     "(or FORKQ_WEB_READONLY_PASSWORD[_FILE])")
    sub.add_argument("--refresh", type=options.seconds_option, default=5.0, metavar="SECONDS",
                     help="how often the pages refresh themselves (default 5)")
    sub.set_defaults(func=_web)


def _web(args: argparse.Namespace) -> int:
    from forkq import web
    from forkq.registry import REGISTRY
    from forkq.web import host_guard, security, server

    settings = config.load(args, os.environ)
    logs.configure(settings.log_level, log_format=settings.log_format)  # the daemon's lines
    logs.set_role("web")
    auth = security.Auth.from_environ(os.environ, admin_file=args.password_file,
                                      readonly_file=args.readonly_password_file)
    security.check_bind(args.bind, auth)
    if settings.require:
        config.import_required(settings)
    client = _client(settings)
    app = web.make_app(client, auth=auth, allow_anonymous=security.is_loopback(args.bind),
                       refresh_seconds=max(1.0, args.refresh), periodic=settings.periodic,
                       registry=REGISTRY if settings.require else None)
    roles = " + ".join(role for role, password in (("admin", auth.admin_password), (
        "read-only", auth.readonly_password)) if password) or "off (loopback only)"
    if not auth.enabled:
        app = host_guard.loopback_hosts_only(app)
    return server.serve(app, host=args.bind, port=args.port, describe=f"(auth: {roles})")


def _client(settings: config.Config) -> redis.Redis:
    """A client for the configured Redis, checked with a PING (ConnectionError if it is down)."""
    client = connect(settings.redis_url, embedded_dir=settings.embedded_dir, socket_timeout=10)
    client.ping()
    return client


def _operator(args: argparse.Namespace) -> int:
    from forkq.ops import commands as ops  # only here: the daemon's launch does not import it

    settings = config.load(args, os.environ)
    _check_utf8_arguments(args)
    if args.command == "cancel" and args.wait is None:  # the daemons' grace, as configured
        args.wait = settings.cancel_grace + CANCEL_WAIT_MARGIN
    client = _client(settings)
    return ops.emit(ops.command(args.command)(client, args), as_json=args.json)


def _check_utf8_arguments(args: argparse.Namespace) -> None:
    """InputError naming the first argument that is not UTF-8 text (bytes that are not UTF-8
    on the command line reach Python as lone surrogates): a queue name, a jid, a process.
    Checked before Redis is asked anything."""
    paths = {setting.dest for setting in config.SETTINGS if setting.path and setting.flags}
    for name, value in vars(args).items():
        if name in paths:
            continue  # file system paths (-C, --logfile...): any bytes the system allows
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and not is_utf8(item):
                raise InputError(f"{args.command}: argument {item!r} is not UTF-8 text")


def _enqueue(args: argparse.Namespace) -> int:
    settings = config.load(args, os.environ)
    defaults = _job_defaults(settings, args.name, force=args.force)
    from forkq.ops import commands as ops  # only here, as in _operator

    return ops.emit(ops.enqueue(_client(settings), args, defaults), as_json=args.json)


def _job_defaults(settings: config.Config, name: str, *, force: bool) -> dict[str, Any]:
    """The registered job's own payload options (its queue, retry, ...) when the app is known:
    the config's ``require`` (``-C``, ``-r``, ``FORKQ_REQUIRE``), imported as ``run`` does, or
    else the module a dotted NAME names (``myapp.tasks.ping``: ``myapp.tasks``, from the
    current directory). A name the configured app does not register is refused
    (:class:`UnknownJobError`, exit 65) unless ``force``; with no app known nothing can be
    checked, which stderr says. {} when there are no options to take."""
    from forkq.registry import REGISTRY

    if not settings.require:
        spec, why = _spec_from_name(name)
        if spec is None:
            print(f"forkq: note: no app configured (require), so nothing was checked{why}: "
                  f"{name!r} is pushed as given", file=sys.stderr)
            return {}
        return _options(spec)
    config.import_required(settings)
    spec = REGISTRY.find(name)
    if spec is not None:
        return _options(spec)
    known = sorted(REGISTRY.names())
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    if not force:
        raise UnknownJobError(
            f"enqueue: {name!r} is not a job of this app ({_listed(known)}); {hint}give "
            "--force to push it anyway (for another worker, such as Sidekiq, to run)")
    print(f"forkq: note: {name!r} is not a job of this app ({_listed(known)}); {hint}pushed "
          "anyway (--force)", file=sys.stderr)
    return {}


def _options(spec: Any) -> dict[str, Any]:
    """What a registered job puts in its payloads (its queue and retry too)."""
    return {**spec.options.payload_options(), "queue": spec.options.queue,
            "retry": spec.options.retry}


def _spec_from_name(name: str) -> tuple[Any, str]:
    """The job NAME registers once the module its dotted name starts with is imported (the
    name of a function job is ``<module>.<function>``), and why there is none ("" or a
    reason for the note)."""
    from forkq.registry import REGISTRY

    module = name.rpartition(".")[0]
    if not module:
        return None, ""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(module)
    # The boundary with user code: whatever its import raises only means "not checked".
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        return None, f" (importing {module!r}: {type(exc).__name__}: {exc})"
    spec = REGISTRY.find(name)
    return spec, "" if spec is not None else f" ({module!r} registers no job {name!r})"


def _listed(names: list[str], most: int = 8) -> str:
    """``"known: a, b, c"`` (at most ``most`` of them), or that there are none."""
    if not names:
        return "it registers no job"
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"known: {', '.join(names[:most])}{more}"


def _version(args: argparse.Namespace) -> int:
    print(f"forkq {__version__}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from forkq import cron
    from forkq.daemon.master.supervisor import Supervisor
    from forkq.middleware import SERVER
    from forkq.registry import REGISTRY

    settings = config.load(args, os.environ)
    logs.configure(settings.log_level, settings.log_file, settings.log_format)
    config.import_required(settings)
    if settings.opentelemetry:  # after the app set its tracer provider, before any fork
        from forkq import opentelemetry

        opentelemetry.instrument()
    durability.configure(settings.durability)  # the processors' durable=True pushes
    cron.check_jobs(settings, REGISTRY)
    return Supervisor(settings, registry=REGISTRY, middleware=SERVER,
                      reload=lambda: config.load(args, os.environ)).run()


def _demo(args: argparse.Namespace) -> int:
    from forkq.tools import demo
    settings = config.load(args, os.environ)
    return demo.run(settings)


def _bench(args: argparse.Namespace) -> int:
    from forkq.tools import bench
    options = bench.Options(jobs=args.jobs, concurrencies=args.concurrency, repeat=args.repeat,
                            latency_samples=args.latency_samples, redis_url=args.redis_url)
    return bench.side_by_side(options) if args.sidekiq else bench.run(options)


class _Moved(argparse.Action):
    """A flag of ``forkq bench`` whose benchmark moved to ``bench/`` of a clone: a usage
    error naming the script."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser.error(f"{option_string} moved out of the package: run python {self.const} "
                     "in a clone of forkq's repository (--help of the script for its flags)")


def _int_list(value: str) -> list[int]:
    """``"2,4,8"`` → ``[2, 4, 8]``, each a positive integer."""
    try:
        numbers = [int(part) for part in value.split(",")]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, "
                                         f"got {value!r}")
    return numbers
