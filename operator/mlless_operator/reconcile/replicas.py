"""The highest worker rank of a session, remembered on the job (`mlless.io/highest-rank`).

A job's backend brings its workers to a replica count (`Backend.scale`). Knative
and OpenFaaS pick which replica goes themselves; the supervisor only ever
invokes the ranks it keeps, so a surplus replica just idles until it is removed.
The pod backend chooses pods by rank (`mlless_operator.ranks`), and never
reuses one: besides existing pods and status.removedRanks, it counts the
highest rank it created this session, which this annotation remembers even
after that pod is gone without a trace (a user's scale-in).

A session starts with ranks 0..N-1, which a new supervisor expects: at creation
and at each resume from suspension (`reconcile.suspension`). status.removedRanks
is the supervisor's; a resumed supervisor starts its own list.
"""
from __future__ import annotations

from typing import Any, Mapping

import kopf

from mlless.contract import ANNOTATION_HIGHEST_RANK


def highest_rank(body: Mapping[str, Any]) -> int:
    """The highest rank the operator created this session (-1 if none is recorded)."""
    raw = (body["metadata"].get("annotations") or {}).get(ANNOTATION_HIGHEST_RANK)
    try:
        return int(raw)
    except (TypeError, ValueError):
        return -1


def remember_highest_rank(patch: kopf.Patch, rank: int | None) -> None:
    """Record on the job the highest rank now used (None: the backend has no ranks, nothing to record)."""
    if rank is not None:
        patch.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_HIGHEST_RANK] = str(rank)
