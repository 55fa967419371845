"""``forkq demo``: run the real daemon on the example jobs, show them processed, stop it.

The daemon runs as a subprocess (``forkq run -C <file>``) with its log on this
terminal; the demo enqueues :mod:`forkq.examples` through the same Redis, waits until
every job is counted in ``stat:processed``, and stops the daemon with TERM.

The Redis is a private embedded server (in the config's ``embedded_dir``) unless the demo
is told otherwise by ``--redis-url`` or ``FORKQ_REDIS_URL``: a ``REDIS_URL`` that happens to
be set in the environment, or a ``redis_url`` in the file, is not used, so trying the demo
never writes example jobs into an application's Redis. The demo says which one it uses.
"""

from __future__ import annotations

import os
import sys

import redis

from forkq import examples, keys
from forkq.client import Client
from forkq.config import Config
from forkq.connection import EMBEDDED, connect
from forkq.errors import EXIT_FAILURE, EXIT_OK, ForkqError
from forkq.subprocesses import wait_for
from forkq.tools.driver import DaemonProcess, answers

TIMEOUT = 30.0
TOLD = ("flag --redis-url", "env FORKQ_REDIS_URL")  # the origins that choose the demo's Redis


def run(config: Config) -> int:
    """Run the demo with ``config`` (its file must name ``forkq.examples`` in ``require``)."""
    if config.config_file is None:
        raise ForkqError("demo needs a config file: forkq demo -C etc/forkq.yml")
    url = _redis_url(config)
    daemon = DaemonProcess(config.config_file, env={**os.environ, "FORKQ_REDIS_URL": url})
    redis_client = connect(url, embedded_dir=config.embedded_dir)
    daemon.start()
    try:
        if not wait_for(lambda: answers(redis_client), TIMEOUT):
            raise ForkqError(f"no Redis answering at {url}")
        before = int(redis_client.get(keys.STAT_PROCESSED) or 0)
        jids = examples.enqueue_all(Client(redis_client))
        print(f"demo: enqueued {len(jids)} example jobs", file=sys.stderr, flush=True)
        done = wait_for(lambda: _processed(redis_client) - before >= len(jids), TIMEOUT)
        count = _processed(redis_client) - before
    finally:
        status = daemon.stop()
    print(f"demo: {count} of {len(jids)} example jobs processed; daemon exited with {status}",
          file=sys.stderr)
    return EXIT_OK if done and status == 0 else EXIT_FAILURE


def _redis_url(config: Config) -> str:
    """The Redis the demo uses (module doc), said on stderr with why."""
    if config.origin("redis_url") in TOLD:
        print(f"demo: the Redis named by {config.origin('redis_url')}", file=sys.stderr)
        return config.redis_url
    origin = config.origin("redis_url")
    ignored = ""
    if os.environ.get("REDIS_URL"):
        ignored = " (REDIS_URL is set in the environment: not used)"
    elif config.redis_url != EMBEDDED and origin != "default":
        ignored = f" (not the redis_url of {origin})"
    print(f"demo: a private embedded server in {config.embedded_dir}{ignored}; give "
          "--redis-url or FORKQ_REDIS_URL to use another Redis", file=sys.stderr, flush=True)
    return EMBEDDED


def _processed(redis_client: redis.Redis) -> int:
    return int(redis_client.get(keys.STAT_PROCESSED) or 0)
