#!/usr/bin/env python
"""The final model of a job's replicas: their mean against every pending entry added in full (`layouts.model_of`).

A replica is the shared state plus its own pending entries (what the significance filter, a round or SSP's slack
has not sent yet). At a job's end the supervisor merges the final replicas into the model it hands back
(`SyncStrategy.merge_final_replicas`). This script trains P = 3 jobs (`mlless.runtime.local.train_local`, embedded
transport) of MovieLens under each protocol and of the 200k clicks under ISP, to a fixed step just past an evaluation, and
scores on the whole validation split, from the same final replicas: `layouts.model_of` (shared parts averaged,
every pending entry added in full: the state a resumed job continues from), their mean, their shared parts alone,
and the best single replica; beside them the newest evaluation's snapshot, one step earlier.

    python benchmarks/final_merge.py [--protocols isp,averaging,blocked,ssp,async] [--seeds 1,2] [--write]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import time_to_quality as ttq  # noqa: E402

import numpy as np  # noqa: E402

from mlless.progress import Progress  # noqa: E402
from mlless.protocol import layouts  # noqa: E402
from mlless.runtime.local import Services, train_local  # noqa: E402
from mlless.runtime.supervisor.evaluation import Evaluation  # noqa: E402
from mlless.spec import from_manifest  # noqa: E402
from mlless.telemetry.rows import evaluated  # noqa: E402

#: Each set's model, and the step the jobs stop at: one past an evaluation (everySteps 25), so the newest snapshot
#: and the final replicas are a step apart. The clicks overfit early at P = 3; their step is before that.
SETS = {"movielens": ("pmf", 301), "lr200k": ("logistic-regression", 101)}
MERGES = ("model_of", "mean", "shared parts", "best replica")


def scores(evaluation: Evaluation, replicas: list[layouts.Arrays]) -> dict[str, float]:
    """The validation loss of each way of merging `replicas`."""
    def loss(params: np.ndarray) -> float:
        return evaluation.evaluate(np.asarray(params, np.float32), evaluation.validation_batch)

    shared = []
    for arrays in replicas:
        params = arrays[layouts.PARAMS].astype(np.float64)
        idx, val = layouts.pending(arrays)
        params[idx] -= val
        shared.append(params)
    return {"model_of": loss(layouts.model_of(replicas)), "mean": loss(layouts.mean_of(replicas)),
            "shared parts": loss(np.mean(shared, axis=0)),
            "best replica": min(loss(arrays[layouts.PARAMS]) for arrays in replicas)}


def run(key: str, protocol: str, seed: int, data: Path, out: Path) -> dict[str, object]:
    kind, steps = SETS[key]
    job = from_manifest({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "merge"},
                         "spec": {"workers": 3, "seed": seed, "model": {"type": kind},
                                  "dataset": {"uri": str(data), "cacheBatches": True}, "sync": {"protocol": protocol},
                                  "stop": {"maxSteps": steps}, "evaluation": {"everySteps": 25}}})
    got: dict[str, float] = {}
    final_model = Evaluation.final_model

    def capture(self: Evaluation, replicas, step, run_dir, job_id):
        if replicas:
            got.update(scores(self, replicas))
        return final_model(self, replicas, step, run_dir, job_id)

    Evaluation.final_model = capture
    try:
        train_local(job, out, Services(), Progress(enabled=False))
    finally:
        Evaluation.final_model = final_model
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    snapshot = [r["validation_loss"] for r, new in zip(rows, evaluated(rows)) if new][-1]
    print(f"  {key} {protocol} seed {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in got.items())
          + f"; snapshot {snapshot:.4f}", flush=True)
    return {"set": key, "protocol": protocol, "seed": seed, "snapshot": snapshot, **got}


def report(results: list[dict[str, object]], machine: str, command: str) -> str:
    rows = [[r["set"], r["protocol"], r["seed"], *(_common.fmt(r[m]) for m in MERGES), _common.fmt(r["snapshot"]),
             f"{float(r['mean']) - float(r['model_of']):+.4f}"] for r in results]
    return "\n".join([
        "## The final model of a job's replicas (`benchmarks/final_merge.py`)", "",
        f"`{command}`; {machine}. P = 3, embedded transport; MovieLens (RMSE) to step 301, the 200k clicks (log "
        "loss) to step 101, evaluated every 25 steps. Each merge of the same final replicas scored on the whole "
        "validation split; snapshot: the newest evaluation, a step earlier (the donor's replica, plus its peers' "
        "pending entries under blocked).", "",
        _common.table(["set", "protocol", "seed", *MERGES, "snapshot", "mean − model_of"], rows),
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--protocols", default="isp,averaging,blocked,ssp,async", help="MovieLens's (default %(default)s)")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR)
    p.add_argument("--write", action="store_true", help="write the section `final-merge` of RESULTS.md")
    args = p.parse_args(argv)
    machine = _common.machine_line()
    cases = [("movielens", proto) for proto in args.protocols.split(",")] + [("lr200k", "isp")]
    results = []
    with tempfile.TemporaryDirectory(prefix="mlless-merge-") as tmp:
        for key, protocol in cases:
            data = ttq.prepared(args.data_dir, key)
            for seed in (int(s) for s in args.seeds.split(",")):
                results.append(run(key, protocol, seed, data, Path(tmp) / f"{key}-{protocol}-{seed}"))
    text = report(results, machine, _common.command_line())
    print(text)
    if args.write:
        _common.update_results("final-merge", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
