"""The networks suite's arithmetic and tables, apart from its runs (so that tests can feed them records).

- `overhead_table()`: part 1's table and verdicts;
- `ratio_line()` / `bound()`: a time-to-target ratio against its goal, and what bounds a miss: start-up, the steps
  to the target (convergence) or the time a step takes, split into compute and exchange by the phases;
- `largest_rise()` / `curve_marks()`: a validation curve's instability and its loss at each epoch.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from . import _common

EXCHANGE_PHASES = ("write", "wait", "read", "apply")


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:.1f}"


def verdict(value: float | None, goal: float) -> str:
    if value is None or math.isnan(value):
        return "not measured"
    return f"**{'met' if value <= goal else 'missed'}** ({value:.2f} against ≤ {goal:g})"


def plain_median(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The plain loop's medians, the mean of its runs' (before and after the job)."""
    return {k: sum(r["median"][k] for r in runs) / len(runs) for k in runs[0]["median"]}


def load_robust(side: dict[str, float], job: dict[str, Any]) -> float | None:
    """The job's step over the loop's, from ratios each taken within one run: the job's step over its own compute
    phase (what the job adds to the gradient: the Adam step, messages, its loop), times mlless's gradient over the
    loop's whole step in one process, both under the same load. Assumes a worker computes as fast as that process."""
    compute = (job["phases"] or {}).get("compute")
    if not compute or job["step"] is None:
        return None
    return job["step"] / compute * side["mlless gradient"] / side["plain step"]


def overhead_table(rows: list[dict[str, Any]], goal: float) -> str:
    """Part 1: each network's plain loop, mlless's pieces beside it in one process, and the job's step."""
    table, notes = [], []
    for r in rows:
        plain, side, job = plain_median(r["plain"]), r["side"]["median"], r["job"]
        ph = job["phases"]
        exchange = sum(ph.get(p) or 0.0 for p in ("write", "read", "apply")) if ph else None
        ratio = None if job["step"] is None else job["step"] / plain["step"]
        robust = load_robust(side, job)
        in_process = side["mlless step"] / side["plain step"]
        table.append([r["network"], r["parameters"],
                      " and ".join(_ms(p["median"]["step"]) for p in r["plain"])
                      + f" ({_ms(plain['fetch'])} / {_ms(plain['forward_backward'])} / {_ms(plain['optimizer'])})",
                      f"{_ms(side['plain step'])} / {_ms(side['mlless step'])} ({_ms(side['mlless gradient'])} + "
                      f"{_ms(side['mlless descend'])}): {in_process:.3f}",
                      _ms(job["step"]), _ms(ph.get("fetch")), _ms(ph.get("compute")), _ms(ph.get("wait")),
                      _ms(exchange), _ms(job["other"]), "–" if ratio is None else f"{ratio:.3f}",
                      "–" if robust is None else f"{robust:.3f}", verdict(ratio, goal), r["load"]])
        if ratio is not None and ratio > goal:
            parts = {"compute beyond the loop's forward and backward": (ph.get("compute") or 0.0)
                     - plain["forward_backward"] - plain["fetch"],
                     "the close's round trip (wait)": ph.get("wait") or 0.0,
                     "write, read and apply": exchange or 0.0,
                     "the rest of the step (the Adam step at P = 1, the worker's loop)":
                         (job["other"] or 0.0) - plain["optimizer"]}
            worst = max(parts, key=parts.get)
            notes.append(f"{r['network']}: {ratio:.2f}× the loop; the most of the {_ms(job['step'] - plain['step'])} "
                         f"ms more a step is {worst} ({_ms(parts[worst])} ms); in one process mlless's pieces take "
                         f"{in_process:.3f}× the loop's, and the load-robust estimate is "
                         + ("–" if robust is None else f"{robust:.3f}×"))
    header = ["network", "parameters", "plain loop step ms, before and after the job (fetch / fwd+bwd / Adam)",
              "one process: loop / mlless step ms (gradient + descend): ratio", "mlless job step ms", "fetch",
              "compute", "wait", "write+read+apply", "other", "job ÷ loop", "load-robust estimate", f"≤ {goal:g}×",
              "load before"]
    note = rows[0]["threads_note"] if rows else ""
    return (f"### Overhead at P = 1\n\nMedian step, ms, one torch thread (mlless: {note}); batches of 64 of the "
            "shapes set, Adam 0.001. The job's phases are its metrics.jsonl's; `other` is its step less them (at "
            "P = 1 it holds the Adam step, which the worker takes inside its compute lap but does not time). The "
            "load-robust estimate multiplies ratios each taken within one run (`load_robust`): on a busy machine the "
            "loop and the job, minutes apart, see different loads.\n\n"
            f"{_common.table(header, table)}\n" + "".join(f"\n- {n}" for n in notes) + ("\n" if notes else ""))


def bound(a: dict[str, Any], b: dict[str, Any], ideal_steps: float) -> str:
    """What makes `a`'s time to target differ from `b`'s: the steps to it against `ideal_steps` × b's, and the
    time a step takes, split into compute and exchange by a's phases (and b's if it has them)."""
    steps = a["steps_to_target"] / b["steps_to_target"]
    step_time = a["step_seconds_median"] / b["step_seconds_median"]
    convergence, per_step = steps / ideal_steps, step_time
    words = [f"steps to target ×{steps:.2f} (ideal ×{ideal_steps:g})", f"step time ×{step_time:.2f}"]
    ph_a, ph_b = a.get("phases_median") or {}, b.get("phases_median") or {}
    if ph_a:
        exchange_a = sum(ph_a.get(p) or 0.0 for p in EXCHANGE_PHASES)
        split = f"compute {_ms(ph_a.get('compute'))} ms, exchange (write+wait+read+apply) {_ms(exchange_a)} ms"
        if ph_b:
            exchange_b = sum(ph_b.get(p) or 0.0 for p in EXCHANGE_PHASES)
            split += f" against {_ms(ph_b.get('compute'))} and {_ms(exchange_b)} ms"
        words.append(f"of a step: {split}")
    main = "convergence (steps to the target)" if convergence > per_step else "the time a step takes"
    return f"bounded by {main}: " + ", ".join(words)


def ratio_line(label: str, a: dict[str, Any] | None, b: dict[str, Any] | None, goal: float, same_batch: bool) -> str:
    """`label`: a's seconds to target over b's, from the first step and from launch, against `goal`; what bounds a
    miss. `same_batch`: a and b train the same global batch (else a's is twice b's: P = 2 against P = 1)."""
    if a is None or b is None or a.get("from_first_step") is None or b.get("from_first_step") is None:
        missing = "the reference" if a is not None and a.get("from_first_step") is not None else "mlless"
        return f"{label}: {verdict(None, goal)}: {missing} did not reach the target"
    first = a["from_first_step"] / b["from_first_step"]
    launch = a["seconds_to_target"] / b["seconds_to_target"]
    text = f"{label}: from the first step {verdict(first, goal)}; from launch {launch:.2f}"
    if first <= goal < launch:
        return text + " — start-up bounds the miss from launch"
    if first > goal:
        text += "; " + bound(a, b, 1.0 if same_batch else 0.5)
    return text


def largest_rise(losses: Sequence[float | None]) -> float | None:
    """The most a validation curve rose above its best so far (0 for a curve that never rose)."""
    best, rise = math.inf, 0.0
    seen = False
    for v in losses:
        if v is None:
            continue
        seen = True
        if not math.isfinite(v):
            return math.inf
        best = min(best, v)
        rise = max(rise, v - best)
    return rise if seen else None


def curve_marks(curve: Sequence[tuple[float, float, int, float]], epochs: Sequence[float]) -> list[float | None]:
    """The newest validation loss at each of `epochs` (None before the first evaluation, or past the run)."""
    out: list[float | None] = []
    last_epoch = curve[-1][1] if curve else 0.0
    for e in epochs:
        before = [c[3] for c in curve if c[1] <= e]
        out.append(before[-1] if before and e <= last_epoch + 1e-9 else None)
    return out
