"""What a run leaves behind: Prometheus metrics, the run record, cost accounting and reports."""
