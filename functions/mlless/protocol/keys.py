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

Who may write a key follows from its name (`writer`): a worker writes only its
own rank's keys and the shared ones, the supervisor its own and clears any
other (a reader of a frame still checks its sender: `mlless.protocol.framing`).
The transport rejects a value sealed by anyone else (`mlless.transport.base`).
"""
from mlless.protocol.identity import SUPERVISOR, speaks_for

#: Keys named `PREFIX:RANK...`: only that rank's worker writes them.
RANK_KEYS = ("update", "snapshot-pending", "final", "leaver", "checkpoint")
#: Keys only the supervisor writes.
SUPERVISOR_KEYS = ("job-checkpoint", "job-state", "job-rows")


def number(key: str) -> int | None:
    """The number a key's second field holds (a worker's rank, a partition, a block of rows: `update:3:1` -> 3), or
    None: who may write it (`writer`) and which Redis shard keeps it (transport/shards.py) both read it."""
    parts = key.split(":", 2)
    field = parts[1] if len(parts) > 1 else ""
    return int(field) if field.isascii() and field.isdecimal() else None


def writer(key: str) -> int | None:
    """Who alone writes `key`: a worker's rank, SUPERVISOR, or None for a key any member writes (the snapshot, a
    reduced part: the frame's sender says who wrote it)."""
    head = key.partition(":")[0]
    if head in SUPERVISOR_KEYS:
        return SUPERVISOR
    return number(key) if head in RANK_KEYS else None


def may_write(signer: int, key: str) -> bool:
    """Whether a value under `key` sealed by `signer` (`mlless.protocol.identity`) is accepted: the supervisor
    empties keys it asks to be written anew (runtime/supervisor/evaluation.py), so it may write any."""
    owner = writer(key)
    return signer == SUPERVISOR or owner is None or (owner != SUPERVISOR and speaks_for(signer, owner))


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
