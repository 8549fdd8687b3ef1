"""The supervisor of a training job, one module per job it does.

`loop.Supervisor` runs the job and composes the others: `membership` (worker
states, joins, leaves, drops), `scaling` (the auto-tuner, scale requests,
evictions and admissions), `stopping` (the stop rules and the best
snapshot), `accounting` (step totals, the run record's rows, cost, metrics
and the summary), `evaluation` (snapshots, validation loss, the model
handed back) and `failover` (the state a successor takes over from).
"""
