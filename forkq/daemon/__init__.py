"""The daemon: what runs after ``forkq run``.

One master (:mod:`forkq.daemon.master`) forks and supervises the children
(:mod:`forkq.daemon.children`): ``concurrency`` processors and one scheduler. The modules
at this level are shared by every process of the tree: a forked child's life
(:mod:`~forkq.daemon.child_process`), the job a dead process held
(:mod:`~forkq.daemon.held_jobs`), logging, the self-pipe, outage and refusal reporting,
and proving a process on this host gone.
"""
