"""Training without I/O: the replica a worker trains step by step."""
