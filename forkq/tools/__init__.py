"""Tooling around the daemon: ``forkq bench`` (forkq's own figures; the comparison with
Sidekiq and the benchmarks of single features live in ``bench/`` of a clone), ``forkq demo``,
and the driver that runs a real daemon as a subprocess."""
