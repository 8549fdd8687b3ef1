"""ASHA against the full grid (#24): the best validation loss each finds and the worker-seconds each spends.

On the MovieLens sample (PMF) and on synthetic clicks (logistic regression), the same grid runs twice through
`mlless sweep`: once with earlyStopping none (every trial to its own stop rule) and once with ASHA. Targets: ASHA's
best validation loss within 0.005 of the grid's best, at <= 40 % of the grid's worker-seconds. Worker-seconds are
the trials' billed worker time (summary.json's worker cost over the price of a function-second). A sweep's workers
are forks of one warm process (functions/mlless/launch/zygote.py), whose start is billed to the first trial's first
worker: it is in the sum once.

    nice python benchmarks/sweep.py [--data-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

import _common

MAX_GAP = 0.005
MAX_SHARE = 0.40
#: η, and the rungs below a trial's own limit (maxEpochs): the first rung is at maxEpochs / η^RUNGS, the most
#: aggressive bracket of Hyperband (Li et al. 2018) that keeps RUNGS rungs for these η and limit.
REDUCTION_FACTOR = 3
RUNGS = 3

SETS = {
    "movielens": {
        "prepare": ("--sample", "movielens-small"),
        "template": {"workers": 1, "model": {"type": "pmf"}, "stop": {"maxEpochs": 6}},
        "parameters": [{"field": "optimizer.learningRate", "grid": [0.2, 0.1, 0.05, 0.02]},
                       {"field": "model.rank", "grid": [10, 20, 40]}, {"field": "model.l2", "grid": [0.1, 0.03]}],
    },
    "clicks": {
        "prepare": ("--synthetic", "lr", "--rows", "200000"),
        # 29 mini-batches an epoch: evaluated every 5 steps so that ASHA's rungs see a loss soon after they pass.
        "template": {"workers": 1, "model": {"type": "logistic-regression"}, "stop": {"maxEpochs": 10},
                     "optimizer": {"type": "adam", "lrDecay": "none"}, "evaluation": {"everySteps": 5}},
        "parameters": [{"field": "optimizer.learningRate", "grid": [0.01, 0.003, 0.03, 0.001, 0.1, 0.0003]},
                       {"field": "model.l2", "grid": [0.0, 1e-5, 1e-4]}],
    },
}


def min_resource(name: str) -> float:
    return round(SETS[name]["template"]["stop"]["maxEpochs"] / REDUCTION_FACTOR ** RUNGS, 3)


def worker_seconds(trial_dir: Path) -> float:
    summary = json.loads((trial_dir / "summary.json").read_text())
    job = json.loads((trial_dir / "job.json").read_text())
    pricing = job["pricing"]
    return summary["cost_breakdown_usd"]["workers"] / (pricing["function_memory_gb"] * pricing["price_per_gb_second"])


def run_sweep(name: str, data: Path, early: str, out: Path) -> dict[str, float]:
    s = SETS[name]
    template = {**s["template"], "dataset": {"uri": str(data), "cacheBatches": True}}
    doc = {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingSweep", "metadata": {"name": f"{name}-{early}"},
           "spec": {"template": {"spec": template}, "parameters": s["parameters"], "maxConcurrentTrials": 2,
                    "earlyStopping": {"type": early, "resource": "epochs", "minResource": min_resource(name),
                                      "reductionFactor": REDUCTION_FACTOR}}}
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    subprocess.run([sys.executable, "-m", "mlless", "sweep", str(path), "--out", str(out), "-q"], check=True)
    status = json.loads((out / "status.json").read_text())
    return {"best": status["bestValidationLoss"], "trials": len(status["trials"]),
            "stopped": sum(r["state"] == "Stopped" for r in status["trials"]),
            "worker_seconds": sum(worker_seconds(out / "trials" / r["name"]) for r in status["trials"]),
            "cost": status["costUSD"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR)
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    args = parser.parse_args()
    info = _common.machine_info()
    with tempfile.TemporaryDirectory(prefix="mlless-sweep-bench-") as tmp:
        for name in args.sets:
            data = _common.prepare(args.data_dir / f"sweep-{name}", *SETS[name]["prepare"])
            grid = run_sweep(name, data, "none", Path(tmp) / f"{name}-grid")
            asha = run_sweep(name, data, "asha", Path(tmp) / f"{name}-asha")
            gap, share = asha["best"] - grid["best"], asha["worker_seconds"] / grid["worker_seconds"]
            rows = [[label, r["trials"], r["stopped"], f"{r['best']:.4f}", f"{r['worker_seconds']:.1f}",
                     f"{r['cost']:.5f}"] for label, r in (("grid", grid), ("ASHA", asha))]
            body = "\n".join([
                f"## Sweeps: ASHA against the full grid on {name} (benchmarks/sweep.py)",
                "",
                f"`{_common.command_line()}`; {_common.machine_line(info)}. One worker per trial, two trials at a "
                f"time, reduction factor {REDUCTION_FACTOR}, rungs in "
                f"epochs from {min_resource(name):g}; template {json.dumps(SETS[name]['template'])}, "
                f"parameters {json.dumps(SETS[name]['parameters'])}.",
                "",
                _common.table(["sweep", "trials", "stopped", "best validation", "worker-seconds", "cost (USD)"], rows),
                "",
                f"- ASHA's best is {gap:+.4f} from the grid's ({'met' if gap <= MAX_GAP else 'MISSED'}, target "
                f"≤ {MAX_GAP}), at {share:.0%} of its worker-seconds ({'met' if share <= MAX_SHARE else 'MISSED'}, "
                f"target ≤ {MAX_SHARE:.0%}).",
            ])
            _common.update_results(f"sweep-{name}", body)
            print(body, flush=True)

if __name__ == "__main__":
    main()
