"""Tooling around the daemon: ``forkq bench`` (and its scheduled and Sidekiq side-by-side
variants), ``forkq demo``, and the driver that runs a real daemon as a subprocess."""
