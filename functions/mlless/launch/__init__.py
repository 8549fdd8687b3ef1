"""Starting a job's workers: local processes (forked from a warm zygote, or spawned) and, on a cluster, the
supervisor's view of the platform that runs them."""
