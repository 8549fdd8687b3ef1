"""Warm start (`spec.model.initFrom`): retraining on new ratings from the earlier model against a cold start.

The MovieLens sample's training batches are shuffled rows, so its first 80 % of batches are a random 80 % of its
ratings: the "old" ratings. A first job trains PMF on them alone (a data set that lists only those batches, with
the same users, items and validation split). Then the new ratings arrive: a cold job and a warm job (started from
the first job's model) each train on all the ratings, side by side, and the table gives when each first reached the
target validation RMSE: the cold job's best plus `--slack`, what a cold start on the full data reaches.

    python benchmarks/warm_start.py [--workers 2] [--epochs 6] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_DATA_DIR, command_line, load_note, loadavg, machine_line, mlless_train, prepare, table, update_results  # noqa: E402


def old_ratings(full: Path, out: Path, fraction: float) -> Path:
    """A data set of `full`'s first `fraction` of training batches (same dimensions and validation split)."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(full, out)
    manifest = json.loads((out / "manifest.json").read_text())
    keep = int(manifest["n_batches"] * fraction)
    dropped = [f"train/batch-{i:06d}.npz" for i in range(keep, manifest["n_batches"])]
    for name in dropped:
        (out / name).unlink()
        manifest["checksums"].pop(name, None)
    manifest["n_train"] = keep * manifest["batch_size"]  # only the last batch is short, and it is dropped
    manifest["n_batches"] = keep
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return out


def job(path: Path, data: Path, workers: int, epochs: float, init_from: Path | None = None) -> Path:
    model: dict[str, Any] = {"type": "pmf"}
    if init_from is not None:
        model["initFrom"] = str(init_from)
    spec = {"workers": workers, "model": model, "dataset": {"uri": str(data), "cacheBatches": True},
            "sync": {"protocol": "isp"}, "stop": {"maxEpochs": epochs}, "evaluation": {"everySteps": 5}}
    path.write_text(yaml.safe_dump({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob",
                                    "metadata": {"name": path.stem}, "spec": spec}))
    return path


def curve(run: Path) -> list[tuple[int, float, float, float]]:
    """(step, epoch, seconds, validation RMSE) of each evaluation."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["epoch"], r["time"], r["validation_loss"]) for r in rows if r.get("validation_loss") is not None]


def reached(points: list[tuple[int, float, float, float]], target: float) -> tuple[Any, Any, Any]:
    """Step, epoch and seconds of the first evaluation at or below `target` (None: never)."""
    return next(((s, e, t) for s, e, t, loss in points if loss <= target), (None, None, None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=float, default=6.0)
    parser.add_argument("--old", type=float, default=0.8, help="fraction of the ratings that are old")
    parser.add_argument("--slack", type=float, default=0.005)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_DATA_DIR / "warm-start")
    args = parser.parse_args()
    for run in args.out.glob("run-*"):
        shutil.rmtree(run)
    machine, start_load = machine_line(), loadavg()
    full = prepare(DEFAULT_DATA_DIR / "movielens-small", "--sample", "movielens-small")
    old = old_ratings(full, args.out / "old-ratings", args.old)
    first = mlless_train(job(args.out / "old.yaml", old, args.workers, args.epochs), args.out / "run-old", False)
    rows = []
    for repeat in range(args.repeats):
        runs = {name: mlless_train(job(args.out / f"{name}.yaml", full, args.workers, args.epochs,
                                       first if name == "warm" else None), args.out / f"run-{name}-{repeat}", False)
                for name in ("cold", "warm")}
        curves = {name: curve(run) for name, run in runs.items()}
        target = min(loss for *_, loss in curves["cold"]) + args.slack
        for name, points in curves.items():
            step, epoch, seconds = reached(points, target)
            rows.append((repeat + 1, name, target, points[0][3], step, epoch, seconds,
                         min(loss for *_, loss in points)))
    old_loss = json.loads((first / "summary.json").read_text())["validation_loss"]
    body = "\n".join([
        "## Warm start: retraining on new ratings (`spec.model.initFrom`)",
        "",
        f"`{command_line()}`; {machine}. {load_note(start_load, loadavg())} Compare the "
        "two rows of a repeat, run one after the other.",
        "",
        f"PMF on the MovieLens sample, P = {args.workers}, ISP, {args.epochs:g} epochs, evaluated every 5 steps. The "
        f"old model trained on a random {args.old:.0%} of the training ratings (validation RMSE {old_loss:.4f}); "
        "cold and warm train on all of them, warm from the old model. Target: the cold run's best validation RMSE "
        f"+ {args.slack:g}.",
        "",
        "model.npz holds no optimizer state: the warm job's per-sample AdaGrad starts from empty accumulators, so "
        "its first steps are as large as a cold job's and its first evaluation (after 5 steps) is above the old "
        "model's RMSE.",
        "",
        table(["repeat", "start", "target", "first evaluation", "step at target", "epochs at target",
               "seconds at target", "best"], rows),
    ])
    update_results("warm_start", body)


if __name__ == "__main__":
    main()
