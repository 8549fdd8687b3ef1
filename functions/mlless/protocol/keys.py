"""Names of the Redis keys a job uses (the transport prefixes them with the job id).

Updates live in a ring of slots per worker instead of one key per step, so a
job's memory in Redis is bounded without the supervisor deleting keys on the
hot path. A slot is overwritten only after every live worker has applied it:
writing step t+K needs step t+K-s-1 closed, and every worker that reported
that step had applied all updates up to t+K-2s-2, so K = 2s+2 slots suffice
for slack s; one more is kept as margin. The frame carries its step, so a
reader would detect an overwritten slot instead of applying it.

A key whose second field is a number (a rank, a partition, a block) lives on the Redis shard that number mod the
shard count names, every other key on the first (mlless.transport.shards): a new key with an owner keeps the
`kind:owner:...` shape so that it goes with its owner's.
"""


def update_slots(staleness: int) -> int:
    return 2 * staleness + 3


def update(rank: int, step: int, staleness: int) -> str:
    return f"update:{rank}:{step % update_slots(staleness)}"


def snapshot() -> str:
    return "snapshot"


def snapshot_pending(rank: int) -> str:
    """A peer's pending entries at a snapshot, under a protocol whose replicas keep rows at home (blocked)."""
    return f"snapshot-pending:{rank}"


def final_replica(rank: int) -> str:
    return f"final:{rank}"


def leaver_replica(rank: int) -> str:
    return f"leaver:{rank}"


def checkpoint(rank: int) -> str:
    """A worker's state when its invocation returns before the job ends; the next invocation resumes from it."""
    return f"checkpoint:{rank}"


def job_checkpoint() -> str:
    """The model a job resumes from: a suspended job's merged model, or the newest checkpoint a supervisor
    wrote for its successor."""
    return "job-checkpoint"


def job_state() -> str:
    """Where the job stands and what it has done, for a successor supervisor (runtime/supervisor/failover.py)."""
    return "job-state"


def job_rows(block: int) -> str:
    """A block of the run record's rows, for a successor whose run directory died with its predecessor."""
    return f"job-rows:{block}"
