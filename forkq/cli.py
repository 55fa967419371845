"""The ``forkq`` command: parse → Config → call. No policy here.

``forkq [run] [flags]`` runs the daemon (plain ``forkq -C FILE`` too, as
``sidekiq -C``); ``forkq demo`` runs it on the example jobs; ``forkq bench``
measures it; ``forkq version``. Configuration errors print one line and exit
78 (EX_CONFIG).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from forkq import __version__, config, logs
from forkq.errors import EXIT_CONFIG, EXIT_FAILURE, ConfigError, ForkqError

COMMANDS = ("run", "demo", "bench", "version")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in (*COMMANDS, "-h", "--help"):
        args.insert(0, "run")
    parsed = _parser().parse_args(args)
    try:
        return int(parsed.func(parsed))
    except ConfigError as exc:
        print(f"forkq: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ForkqError as exc:
        print(f"forkq: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forkq", description="Prefork job daemon on Redis.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the daemon (the default command)")
    config.add_flags(run)
    run.set_defaults(func=_run)
    demo = commands.add_parser("demo", help="run the daemon on the example jobs, then stop")
    config.add_flags(demo)
    demo.set_defaults(func=_demo)
    bench = commands.add_parser("bench", help="measure throughput and latency")
    bench.add_argument("-n", "--jobs", type=int, default=10_000, help="no-op jobs to run")
    bench.add_argument("-c", "--concurrency", type=int, default=4, help="processor children")
    bench.add_argument("--latency-samples", type=int, default=200,
                       help="single pushes to an idle daemon for the latency figures")
    bench.add_argument("--sidekiq", action="store_true",
                       help="also run the jobs through Ruby's Sidekiq (ruby-sidekiq) to compare")
    bench.add_argument("--scheduled", type=int, default=0, metavar="N",
                       help="instead: schedule N jobs over --over seconds; print how late "
                       "they start and whether each ran exactly once")
    bench.add_argument("--over", type=float, default=30.0, help="seconds (with --scheduled)")
    bench.add_argument("--daemons", type=int, default=2,
                       help="forkq daemons sharing the server (with --scheduled)")
    bench.add_argument("--redis-url", default=None,
                       help="use this server (default: a private throwaway server)")
    bench.set_defaults(func=_bench)
    version = commands.add_parser("version", help="print the version")
    version.set_defaults(func=_version)
    return parser


def _version(args: argparse.Namespace) -> int:
    print(f"forkq {__version__}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from forkq import periodic
    from forkq.processor import MIDDLEWARE
    from forkq.registry import REGISTRY
    from forkq.supervisor import Supervisor

    settings = config.load(args, os.environ)
    logs.configure(settings.log_level, settings.log_file)
    config.import_required(settings)
    periodic.check_jobs(settings, REGISTRY)
    return Supervisor(settings, registry=REGISTRY, middleware=MIDDLEWARE,
                      reload=lambda: config.load(args, os.environ)).run()


def _demo(args: argparse.Namespace) -> int:
    from forkq import demo

    settings = config.load(args, os.environ)
    return demo.run(settings)


def _bench(args: argparse.Namespace) -> int:
    if args.scheduled:
        from forkq import benchsched

        return benchsched.run(jobs=args.scheduled, over=args.over, daemons=args.daemons,
                              concurrency=args.concurrency, redis_url=args.redis_url,
                              sidekiq=args.sidekiq)
    from forkq import bench

    return bench.run(jobs=args.jobs, concurrency=args.concurrency,
                     latency_samples=args.latency_samples, redis_url=args.redis_url,
                     sidekiq=args.sidekiq)
