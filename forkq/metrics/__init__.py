"""Job metrics: recorded by each processor child and flushed with its heartbeat
(:mod:`~forkq.metrics.recorder`), sampled per queue by the scheduler leader
(:mod:`~forkq.metrics.sampler`), read back for the dashboard (:mod:`~forkq.metrics.query`)
and for Prometheus (:mod:`~forkq.metrics.prometheus`). Where they live in Redis:
:mod:`~forkq.metrics.layout`."""
