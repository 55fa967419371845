"""The master process: one loop (:mod:`~forkq.daemon.master.supervisor`) that owns the
signals, forks and reaps the children, settles a gone child's job, culls the hung, writes
the process record, reloads the YAML, talks to systemd. It never runs a job."""
