"""What runs in the forked children: the processor (fetch → execute → acknowledge, failures
filed by the retry policy) and the scheduler (campaigns for the cluster's leadership; the
leader moves due jobs, recovers dead daemons' jobs and fires periodic jobs)."""
