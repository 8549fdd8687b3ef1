"""The update-conservation audit behind MLLESS_AUDIT=1.

Every replica is the shared state plus its own unsent accumulator, and the
shared state must be the initial model plus every update any worker ever
computed, minus those still unsent somewhere. The check therefore fails if a
leaver's unsent updates were lost or applied twice, if an update frame was
applied by some workers and not others, or if a joiner started from the
wrong state. Workers that crash take their unsent updates with them, so it
is not checked once a worker was dropped.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mlless.protocol import layouts
from mlless.protocol.messages import Tensors
from mlless.protocol.layouts import CONTRIBUTION, PARAMS


def audit_conservation(x0: np.ndarray, finals: list[Tensors], leavers: list[Tensors], dropped: bool) -> dict[str, Any]:
    """Compare each final replica with what conservation predicts; frames carry params, pending and contribution."""
    if dropped:
        return {"checked": False, "reason": "a dropped worker took its unsent updates with it"}
    if any(CONTRIBUTION not in t.arrays for t in finals + leavers):
        return {"checked": False, "reason": "a worker did not track its contribution (MLLESS_AUDIT unset there)"}
    size = len(x0)
    contributed = sum(t.arrays[CONTRIBUTION] for t in finals + leavers)
    still_pending = sum(np.bincount(*layouts.pending(t.arrays), minlength=size) for t in finals)
    expected_shared = x0 + contributed - still_pending
    errors = []
    for t in finals:
        shared = t.arrays[PARAMS].astype(np.float64)
        indices, values = layouts.pending(t.arrays)
        shared[indices] -= values
        errors.append(float(np.max(np.abs(shared - expected_shared))))
    return {
        "checked": True,
        "max_error": max(errors, default=0.0),
        "update_scale": float(np.max(np.abs(contributed))),
        "replicas": len(finals),
        "leavers": len(leavers),
        "leaver_pending_entries": sum(len(layouts.pending(t.arrays)[0]) for t in leavers),
        "leaver_pending_max": max((float(np.max(np.abs(layouts.pending(t.arrays)[1]), initial=0)) for t in leavers), default=0.0),
    }
