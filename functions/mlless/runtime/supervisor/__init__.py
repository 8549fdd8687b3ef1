"""The supervisor of a training job, one module per job it does.

`loop.Supervisor` runs the job and composes the others: `membership` (worker
states, joins, leaves, drops), `stopping` (the stop rules and the best
snapshot), `accounting` (step totals, the run record's rows, cost, metrics
and the summary) and `evaluation` (snapshots, validation loss, the model
handed back).
"""
