"""One step's seconds at P workers: LambdaML's per-step terms (§5.3), in mlless's measured units.

One worker's step, all workers alike; s = bytes a worker sends per step, r(P) = bytes it reads:

    step(P) = local + σ + hops·L + κ·(w + r) + link(P)
    local   = fetch + compute + filter           a worker's own work on its mini-batch (the batch is per worker, so
                                                 this does not shrink with P; the steps per epoch do: LambdaML's C/w)
    L       = one request/response hop; B = the wire's bandwidth
    hops    = 3 at P > 1 (the update's write, the report → close round trip, the peers' read); 1 alone
    σ       = the supervisor's close, and what else a step waits on
    κ       = CPU seconds per byte exchanged (encode, seal, decode, scatter-add, copies)
    link(P) = max((w + r)/B, P·w/B, P·r/B)       each worker's own link, and the store's, which carries every
                                                 worker's update in and every read out (full duplex)

`benchmarks/projection.py` validates this on the scaling runs and projects it to a cluster; `mlless plan`
(`planning.model`) fits it on a job's run directories.
"""
from __future__ import annotations

import math

#: Request/response hops on a step's critical path at P > 1 (a lone worker's step makes one: its report).
HOPS = 3


def bytes_read(pattern: str, P: int, s: float, model_bytes: float | None) -> tuple[float, float]:
    """(read, extra written) bytes per worker per step under an exchange pattern."""
    merged = P * s if model_bytes is None else min(P * s, model_bytes)
    if pattern == "allreduce":
        return merged, 0.0
    if pattern == "scatter-reduce":
        return (P - 1) / P * merged, merged / P
    return (P - 1) * s, 0.0  # all-to-all


def step_seconds(*, P: int, local: float, sigma: float, kappa: float, s: float, pattern: str, L: float, B: float,
                 model_bytes: float | None = None) -> dict[str, float]:
    """The step's seconds on its critical path, and its parts."""
    r, extra = bytes_read(pattern, P, s, model_bytes) if P > 1 else (0.0, 0.0)
    w = s + extra if P > 1 else 0.0
    link = max((w + r) / B, P * w / B, P * r / B) if P > 1 else 0.0  # B = inf: no wire (0.0)
    hops = HOPS if P > 1 else 1
    cpu = kappa * (w + r)
    return {"step": local + sigma + hops * L + cpu + link, "local": local, "close": sigma + L, "hops": hops * L,
            "exchange_cpu": cpu, "link": link, "read_bytes": r, "worker_cpu": local + cpu}


def fit_kappa(exchange_seconds: float, s: float, r: float, L: float, B: float) -> float:
    """κ from a P > 1 step's measured write + read + apply: what is left after two hops and the wire, per byte."""
    if s + r <= 0:
        return 0.0
    return max(0.0, (exchange_seconds - 2 * L - (s + r) / B) / (s + r))


def fit_beta(points: list[tuple[int, float]]) -> float:
    """β of N(P) = N₁·P^β (samples to the stop by P: LambdaML's f(w)), least squares in log space through the
    P = 1 point when there is one; clamped to [0, 1]: a larger global batch, P · batch, never needs fewer samples,
    nor more than P times as many."""
    pts = [(math.log(P), math.log(n)) for P, n in points if n and n > 0]
    if len(pts) < 2:
        return 0.0
    one = dict(points).get(1)
    if one:
        x0, y0 = 0.0, math.log(one)
        num = sum((x - x0) * (y - y0) for x, y in pts)
        den = sum((x - x0) ** 2 for x, y in pts)
    else:
        mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        num = sum((x - mx) * (y - my) for x, y in pts)
        den = sum((x - mx) ** 2 for x, _ in pts)
    return min(1.0, max(0.0, num / den)) if den > 0 else 0.0
