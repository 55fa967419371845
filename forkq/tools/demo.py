"""``forkq demo``: run the real daemon on the example jobs, show them processed, stop it.

The daemon runs as a subprocess (``forkq run -C <file>``) with its log on this
terminal; the demo enqueues :mod:`forkq.examples` through the same Redis (the
embedded server when the config says ``redis_url: embedded``), waits until
every job is counted in ``stat:processed``, and stops the daemon with TERM.
"""

from __future__ import annotations

import sys

import redis

from forkq import examples, keys
from forkq.client import Client
from forkq.config import Config
from forkq.connection import connect
from forkq.errors import EXIT_FAILURE, EXIT_OK, ForkqError
from forkq.subprocesses import wait_for
from forkq.tools.driver import DaemonProcess, answers

TIMEOUT = 30.0


def run(config: Config) -> int:
    """Run the demo with ``config`` (its file must name ``forkq.examples`` in ``require``)."""
    if config.config_file is None:
        raise ForkqError("demo needs a config file: forkq demo -C etc/forkq.yml")
    daemon = DaemonProcess(config.config_file)
    redis_client = connect(config.redis_url, embedded_dir=config.embedded_dir)
    daemon.start()
    try:
        if not wait_for(lambda: answers(redis_client), TIMEOUT):
            raise ForkqError(f"no Redis answering at {config.redis_url}")
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


def _processed(redis_client: redis.Redis) -> int:
    return int(redis_client.get(keys.STAT_PROCESSED) or 0)
