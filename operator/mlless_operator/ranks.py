"""Which worker pods to delete and which ranks to create (pod backend): pure, so unit-tested directly.

A rank is a worker's identity for the whole session: its Redis keys and its
RabbitMQ queue are named after it. The supervisor adopts an unknown rank that
says hello as a joiner, but a *reused* rank would collide with what its
previous holder left behind, so a new worker always gets a rank above every
rank used so far in the session.

Which pods go first on scale-in:
1. pods whose rank the supervisor took out (`status.removedRanks`): their
   worker has already handed on its updates, deleting the pod costs nothing;
2. pods that have finished (phase Succeeded or Failed): they never run again;
3. then the highest ranks, the newest workers, with the least training in them.
Pods of 1 and 2 never count as workers, so they are always deleted, and a
scale-out replaces them with new ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from mlless.contract import LABEL_RANK
from mlless_operator.conditions import FINISHED_POD_PHASES

Manifest = Mapping[str, Any]


def removed_ranks(status: Mapping[str, Any]) -> list[int]:
    """status.removedRanks, the ranks the supervisor took out, as integers."""
    return [int(r) for r in status.get("removedRanks") or [] if isinstance(r, int) or str(r).isdigit()]


def pod_rank(pod: Manifest) -> int | None:
    """The rank label of a worker pod; None when absent or not a non-negative integer (not one of ours)."""
    raw = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_RANK)
    try:
        rank = int(raw)
    except (TypeError, ValueError):
        return None
    return rank if rank >= 0 else None


@dataclass(frozen=True)
class PodScalePlan:
    delete: list[str] = field(default_factory=list)  # pod names, in the order to delete them
    create: list[int] = field(default_factory=list)  # new ranks
    highest: int = -1  # the highest rank used so far, the new ones included


def plan_pod_scale(pods: Iterable[Manifest], workers: int, removed: Iterable[int] = (), highest_used: int = -1) -> PodScalePlan:
    """Bring the job's running worker pods to `workers`.

    `pods` are the job's worker pods as listed, `removed` is status.removedRanks,
    `highest_used` the highest rank the operator remembers creating this session
    (a pod deleted on a user's scale-in leaves no other trace of its rank).
    """
    removed_ranks = {int(r) for r in removed}
    retired: list[tuple[int, str]] = []
    active: list[tuple[int, str]] = []
    highest = max([highest_used, *removed_ranks], default=-1)
    for pod in pods:
        rank = pod_rank(pod)
        if rank is None:
            continue
        highest = max(highest, rank)  # terminating pods too: their rank is still taken
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        phase = (pod.get("status") or {}).get("phase")
        (retired if rank in removed_ranks or phase in FINISHED_POD_PHASES else active).append((rank, meta["name"]))
    retired.sort(key=lambda rn: (rn[0] not in removed_ranks, rn[0]))  # removed ranks first, then finished pods
    active.sort(reverse=True)  # highest rank first
    excess = max(0, len(active) - max(0, workers))
    missing = max(0, workers - len(active))
    create = list(range(highest + 1, highest + 1 + missing))
    return PodScalePlan(
        delete=[name for _, name in retired] + [name for _, name in active[:excess]],
        create=create,
        highest=create[-1] if create else highest,
    )
