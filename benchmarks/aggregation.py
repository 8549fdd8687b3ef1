"""The per-step cost of each aggregation rule (`spec.sync.aggregation`) against `sum`, at P workers (default 4).

SPIRT (paper 003, §VI.D) measured its robust rules at 8.2x (Meamed) and 5.9x (Zeno) the computational time of plain
averaging. Here the cost is what a worker does at a step's close to take in its peers' updates under all-to-all:
under `sum`, add each peer's update to the replica; under a robust rule, combine every update of the step (its own
too, `Exchange.combined`) and add the result. The updates are real: P replicas of the default optimizer each train
one step of BSP on their own mini-batch of the data set (PMF on the MovieLens sample, LR on synthetic clicks).

Then whole PMF jobs under each rule give the wall time per step and what the workers spent taking in updates.

    python benchmarks/aggregation.py [--workers 4] [--repeats 30] [--epochs 2]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (DEFAULT_DATA_DIR, command_line, load_note, loadavg, machine_line, mlless_train, prepare, table,  # noqa: E402
                     update_results, write_pmf_job)

from mlless.data.dataset import Dataset  # noqa: E402
from mlless.protocol.messages import Update  # noqa: E402
from mlless.sync.aggregation import AGGREGATIONS, aggregation  # noqa: E402
from mlless.sync.exchanges.alltoall import AllToAll  # noqa: E402
from mlless.sync.exchanges.base import Published  # noqa: E402
from mlless.spec.config import default_optimizer  # noqa: E402
from mlless.spec.schema import default  # noqa: E402
from mlless.training.models import build_model  # noqa: E402
from mlless.training.replica import Replica  # noqa: E402


class _Store:
    """What an exchange asks of its transport when it only combines (no frame is read or written)."""

    store_epoch = 0


def step_updates(dataset: Dataset, kind: str, workers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The BSP updates of `workers` replicas after one step each on their own batch."""
    out = []
    for rank in range(workers):
        model = build_model(kind, dataset.dims())
        replica = Replica(model, default_optimizer(kind, workers), 0.0)
        replica.workers = workers
        result = replica.step(dataset.batch(rank), 1, 1)
        out.append((result.indices, result.values))
    return out


def timed(run, repeats: int) -> float:
    """The median seconds of `run()` over `repeats` calls."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return float(np.median(seconds))


def cost(kind: str, dims: dict, updates: list[tuple[np.ndarray, np.ndarray]], rule: str, repeats: int) -> float:
    """Seconds worker 0 spends taking in its peers' updates of one step under `rule`."""
    model = build_model(kind, dims)
    peers = [Update(r, 1, idx, val) for r, (idx, val) in enumerate(updates) if r]
    if rule == "sum":
        return timed(lambda: [model.apply_update(u.indices, u.values) for u in peers], repeats)
    exchange = AllToAll(_Store(), 0, lambda r, s: f"{r}:{s}", 1, 1.0, print, size=model.size,
                        aggregation=aggregation(rule, default("sync.trim")))
    own = [Published(1, "0:1", b"", *updates[0])]

    def robust() -> None:
        for update in exchange.combined(1, peers, own):
            model.apply_update(update.indices, update.values)
    return timed(robust, repeats)


def job_step(data: Path, rule: str, workers: int, epochs: float) -> tuple[int, float, float, float]:
    """Steps, wall seconds per step, read + apply milliseconds per step and validation RMSE of a PMF job."""
    run = DEFAULT_DATA_DIR / "aggregation-runs" / rule
    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    job = run.parent / f"{rule}.yaml"
    write_pmf_job(job, name="aggregation", workers=workers, data=data, protocol="bsp", stop={"maxEpochs": epochs})
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["sync"]["aggregation"] = rule
    job.write_text(yaml.safe_dump(doc))
    mlless_train(job, run, False)
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    barrier = [(r["phases"]["read"] or 0) + (r["phases"]["apply"] or 0) for r in rows if r["phases"]["read"] is not None]
    return (summary["steps"], summary["wall_seconds"] / summary["steps"], 1e3 * float(np.mean(barrier)),
            summary["validation_loss"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--epochs", type=float, default=2.0, help="of each whole job (0: none)")
    args = parser.parse_args()
    machine, start_load = machine_line(), loadavg()
    sets = {"pmf": prepare(DEFAULT_DATA_DIR / "movielens-small", "--sample", "movielens-small"),
            "logistic-regression": prepare(DEFAULT_DATA_DIR / "aggregation-lr", "--synthetic", "lr", "--rows",
                                           "200000", "--batch-size", "6250")}
    rows = []
    for kind, data in sets.items():
        dataset = Dataset.open(str(data))
        updates = step_updates(dataset, kind, args.workers)
        size = build_model(kind, dataset.dims()).size
        base = cost(kind, dataset.dims(), updates, "sum", args.repeats)
        entries = int(np.mean([len(idx) for idx, _ in updates]))
        for rule in AGGREGATIONS:
            seconds = base if rule == "sum" else cost(kind, dataset.dims(), updates, rule, args.repeats)
            rows.append((kind, f"{size:,}", f"{entries:,}", rule, seconds * 1e3, seconds / base))
    job_rows = [(rule, *job_step(sets["pmf"], rule, args.workers, args.epochs)) for rule in AGGREGATIONS] \
        if args.epochs else []
    body = "\n".join([
        "## Byzantine-robust aggregation: the cost per step (`spec.sync.aggregation`)",
        "",
        f"`{command_line()}`; {machine}. {load_note(start_load, loadavg())} The "
        "rules of one model were timed one after the other in one run (median of the repeats).",
        "",
        f"P = {args.workers}. What worker 0 does at a close to take in a step's updates under all-to-all: under sum, "
        "add its peers' updates to its replica; under a robust rule, combine all the updates of the step, its own "
        "too, and add the result. The updates are real BSP updates of the default optimizer, one step of each "
        "replica on its own batch. SPIRT's anchor (§VI.D): its robust rules cost 5.9x (Zeno) and 8.2x (Meamed) "
        "plain averaging.",
        "",
        table(["model", "parameters", "entries per update", "rule", "ms per step", "x sum"], rows),
        "",
        f"Whole jobs, one after the other: PMF on the MovieLens sample, P = {args.workers}, BSP, {args.epochs:g} "
        "epochs, all-to-all, embedded transport, no attacker. A step's read + apply is what its workers spent, on "
        "average, reading and taking in the step's updates (the rule runs there).",
        "",
        table(["rule", "steps", "wall s per step", "x sum", "read + apply ms per step", "x sum", "validation RMSE"],
              [(rule, steps, wall, wall / job_rows[0][2], barrier, barrier / job_rows[0][3], loss)
               for rule, steps, wall, barrier, loss in job_rows]),
    ])
    update_results("aggregation", body)


if __name__ == "__main__":
    main()
