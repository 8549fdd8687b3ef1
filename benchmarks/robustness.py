"""Robust aggregation's cost, the final merge of a job's replicas, and what faults cost a job.

Parts (`--parts`, default all):

* aggregation: each rule of `spec.sync.aggregation` against `sum`, at P workers. What worker 0 does at a step's close
  to take in its peers' updates under all-to-all: under `sum`, add each peer's update to its replica; under a robust
  rule, combine every update of the step (its own too, `Exchange.combined`) and add the result. The updates are real:
  P replicas of the default optimizer each train one BSP step on their own batch (PMF on the MovieLens sample, LR on
  200k clicks). Then whole PMF jobs under each rule: wall time per step, read + apply per step, validation RMSE.
  SPIRT's anchor (§VI.D): its robust rules cost 5.9x (Zeno) and 8.2x (Meamed) plain averaging.
* merge: the final model of a job's replicas: P = 3 jobs (`train_local`, embedded) of MovieLens under each
  protocol and of the 200k clicks under ISP, to a step just past an evaluation; from the same final replicas,
  `layouts.model_of` (shared parts averaged, every pending entry added in full), their mean, their shared parts
  alone and the best single replica, scored on the whole validation split, beside the newest evaluation's snapshot.
* faults: the same PMF job (MovieLens sample, 2 workers, BSP) over a RabbitMQ node and a Redis of this suite's own
  (the fault tests' helpers, `tests/faults/conftest.py`, on free ports; the shared services are untouched), with
  one fault after `--fault-at` steps: RabbitMQ's connections force-closed, RabbitMQ restarted (3 s), Redis restarted
  without persistence (2 s), a worker killed -9. Stall s: the longest gap between step closes less the median one.
* failover: the supervisor killed -9 after `--fault-at` steps and `mlless train --resume`d at once, against the same
  job uninterrupted, over Redis + RabbitMQ and the embedded broker: what it resumed from, steps redone, the takeover's
  seconds, Δ validation RMSE at the same step count, whole wall time and cost.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from . import _common, _runs

MERGES = ("model_of", "mean", "shared parts", "best replica")
#: The merge part's sets: their model, and the step the jobs stop at: one past an evaluation (everySteps 25), so the
#: newest snapshot and the final replicas are a step apart. The clicks overfit early at P = 3; their step is before.
MERGE_SETS = {"movielens": ("pmf", 301), "lr200k": ("logistic-regression", 101)}
FAULTS = ("rabbitmq forced close", "rabbitmq restart", "redis restart, no persistence", "worker kill -9")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parts", default="aggregation,merge,faults,failover", help="comma list (default %(default)s)")
    p.add_argument("--workers", type=int, default=4, help="the aggregation part's P (default %(default)s)")
    p.add_argument("--repeats", type=int, default=30, help="timings per rule (default %(default)s)")
    p.add_argument("--epochs", type=float, help="of each aggregation job (default 2; --quick 0.5; 0: none)")
    p.add_argument("--protocols", default="isp,averaging,blocked,ssp,async",
                   help="the merge part's MovieLens protocols (default %(default)s; --quick isp,blocked)")
    p.add_argument("--seeds", default="1,2", help="the merge part's seeds (default %(default)s; --quick 1)")
    p.add_argument("--steps", type=int, help="of each fault and failover job (default 600; --quick 200)")
    p.add_argument("--fault-at", type=int, help="recorded steps before the fault (default 100; --quick 50)")


def run(args: argparse.Namespace) -> str:
    parts, out = args.parts.split(","), []
    args.steps = args.steps or (200 if args.quick else 600)
    args.fault_at = args.fault_at or (50 if args.quick else 100)
    work = args.data_dir / "robustness"
    work.mkdir(parents=True, exist_ok=True)
    if "aggregation" in parts:
        out.append(aggregation(args, work))
    if "merge" in parts:
        out.append(merge(args))
    if "faults" in parts:
        out.append(faults(args, work))
    if "failover" in parts:
        out.append(failover(args, work))
    return "\n".join(out)


# ---- robust aggregation ----------------------------------------------------------------------------------------------

def median_seconds(fn: Any, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return float(np.median(seconds))


def rule_cost(kind: str, dims: dict, updates: list[tuple[np.ndarray, np.ndarray]], rule: str, repeats: int) -> float:
    """Seconds worker 0 spends taking in its peers' updates of one step under `rule`."""
    from mlless.protocol.messages import Update
    from mlless.sync.aggregation import aggregation
    from mlless.sync.exchanges.alltoall import AllToAll
    from mlless.sync.exchanges.base import Published
    from mlless.spec.schema import default
    from mlless.training.models import build_model

    class Store:
        """What an exchange asks of its transport when it only combines (no frame is read or written)."""

        store_epoch = 0

    model = build_model(kind, dims)
    peers = [Update(r, 1, idx, val) for r, (idx, val) in enumerate(updates) if r]
    if rule == "sum":
        return median_seconds(lambda: [model.apply_update(u.indices, u.values) for u in peers], repeats)
    exchange = AllToAll(Store(), 0, lambda r, s: f"{r}:{s}", 1, 1.0, print, size=model.size,
                        aggregation=aggregation(rule, default("sync.trim")))
    own = [Published(1, "0:1", b"", *updates[0])]

    def robust() -> None:
        for update in exchange.combined(1, peers, own):
            model.apply_update(update.indices, update.values)
    return median_seconds(robust, repeats)


def aggregation(args: argparse.Namespace, work: Path) -> str:
    from mlless.data.dataset import Dataset
    from mlless.sync.aggregation import AGGREGATIONS
    from mlless.spec.config import default_optimizer
    from mlless.training.models import build_model
    from mlless.training.replica import Replica

    sets = {"pmf": _common.prepared(args.data_dir, "movielens"), "logistic-regression": _common.prepared(args.data_dir, "lr200k")}
    rows = []
    for kind, data in sets.items():
        ds = Dataset.open(str(data))
        updates = []
        for rank in range(args.workers):  # each replica's first BSP step on its own batch
            replica = Replica(build_model(kind, ds.dims()), default_optimizer(kind, args.workers), 0.0)
            replica.workers = args.workers
            result = replica.step(ds.batch(rank), 1, 1)
            updates.append((result.indices, result.values))
        base = rule_cost(kind, ds.dims(), updates, "sum", args.repeats)
        for rule in AGGREGATIONS:
            seconds = base if rule == "sum" else rule_cost(kind, ds.dims(), updates, rule, args.repeats)
            rows.append((kind, f"{build_model(kind, ds.dims()).size:,}", f"{int(np.mean([len(i) for i, _ in updates])):,}",
                         rule, f"{seconds * 1e3:.3f}", f"{seconds / base:.1f}x"))
    epochs = args.epochs if args.epochs is not None else (0.5 if args.quick else 2.0)
    jobs = []
    for rule in AGGREGATIONS if epochs else ():
        job = _runs.write_pmf_job(work / f"aggregation-{rule}.yaml", name="aggregation", workers=args.workers,
                                  data=sets["pmf"], protocol="bsp", stop={"maxEpochs": epochs}, sync={"aggregation": rule})
        run_dir = _runs.mlless_train(job, work / f"aggregation-{rule}-{int(time.time() * 1000) % 10**8}", False)
        s = _runs.summary(run_dir)
        barrier = [(r["phases"]["read"] or 0) + (r["phases"]["apply"] or 0) for r in _runs.rows(run_dir)
                   if r["phases"]["read"] is not None]
        jobs.append((rule, s["steps"], s["wall_seconds"] / s["steps"], 1e3 * float(np.mean(barrier)), s["validation_loss"]))
    return "\n".join([
        f"#### Robust aggregation: what a close costs worker 0 at P = {args.workers} (median of {args.repeats})", "",
        _common.table(["model", "parameters", "entries per update", "rule", "ms per step", "x sum"], rows), "",
        *([f"Whole jobs, one after the other: PMF on the MovieLens sample, P = {args.workers}, BSP, {epochs:g} epochs, "
           "all-to-all, embedded, no attacker; read + apply is what the workers spent taking in a step's updates.", "",
           _common.table(["rule", "steps", "wall s per step", "x sum", "read + apply ms per step", "x sum",
                          "validation RMSE"],
                         [(r, n, f"{w:.3f}", f"{w / jobs[0][2]:.2f}x", f"{b:.1f}", f"{b / jobs[0][3]:.2f}x", loss)
                          for r, n, w, b, loss in jobs]), ""]
          if jobs else [])])


# ---- the final merge -------------------------------------------------------------------------------------------------

def merge_scores(evaluation: Any, replicas: list) -> dict[str, float]:
    """The validation loss of each way of merging `replicas`."""
    from mlless.protocol import layouts

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


def merge_run(key: str, protocol: str, seed: int, data: Path, out: Path) -> list:
    from mlless.progress import Progress
    from mlless.runtime.local import Services, train_local
    from mlless.runtime.supervisor.evaluation import Evaluation
    from mlless.spec import from_manifest

    kind, steps = MERGE_SETS[key]
    job = from_manifest({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "merge"},
                         "spec": {"workers": 3, "seed": seed, "model": {"type": kind},
                                  "dataset": {"uri": str(data), "cacheBatches": True}, "sync": {"protocol": protocol},
                                  "stop": {"maxSteps": steps}, "evaluation": {"everySteps": 25}}})
    got: dict[str, float] = {}
    final_model = Evaluation.final_model

    def capture(self: Evaluation, replicas: list, *rest: Any) -> Any:  # the supervisor's merge, scored on the side
        if replicas:
            got.update(merge_scores(self, replicas))
        return final_model(self, replicas, *rest)

    Evaluation.final_model = capture
    try:
        train_local(job, out, Services(), Progress(enabled=False))
    finally:
        Evaluation.final_model = final_model
    snapshot = _runs.evaluations(_runs.rows(out))[-1]["validation_loss"]
    print(f"  {key} {protocol} seed {seed}: " + ", ".join(f"{k} {v:.4f}" for k, v in got.items())
          + f"; snapshot {snapshot:.4f}", flush=True)
    return [key, protocol, seed, *(got[m] for m in MERGES), snapshot, f"{got['mean'] - got['model_of']:+.4f}"]


def merge(args: argparse.Namespace) -> str:
    protocols = "isp,blocked" if args.quick and args.protocols == "isp,averaging,blocked,ssp,async" else args.protocols
    seeds = "1" if args.quick and args.seeds == "1,2" else args.seeds
    cases = [("movielens", p) for p in protocols.split(",")] + [("lr200k", "isp")]
    with tempfile.TemporaryDirectory(prefix="mlless-merge-") as tmp:
        rows = [merge_run(key, protocol, int(seed), _common.prepared(args.data_dir, key),
                          Path(tmp) / f"{key}-{protocol}-{seed}")
                for key, protocol in cases for seed in seeds.split(",")]
    return "\n".join([
        "#### The final model of a job's replicas", "",
        "P = 3, embedded; MovieLens (RMSE) to step 301, the 200k clicks (log loss) to step 101, evaluated every 25 "
        "steps. Each merge of the same final replicas scored on the whole validation split; snapshot: the newest "
        "evaluation, a step earlier.", "",
        _common.table(["set", "protocol", "seed", *MERGES, "snapshot", "mean − model_of"], rows), ""])


# ---- faults and failover ----------------------------------------------------------------------------------------------

def fault_job(args: argparse.Namespace, work: Path) -> Path:
    return _runs.write_pmf_job(work / "faults.yaml", name="faults", workers=2,
                               data=_common.prepared(args.data_dir, "movielens"), protocol="bsp",
                               stop={"maxSteps": args.steps}, evaluate_every=10)


def start(job: Path, run: Path, services: bool, *extra: str, urls: tuple[str, str] = (_common.REDIS, _common.AMQP)
          ) -> subprocess.Popen:
    cmd = _runs.train_command(job, run, services, redis_url=urls[0], amqp_url=urls[1], extra=extra)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def until_step(proc: subprocess.Popen, run: Path, step: int, what: str) -> None:
    while _runs.recorded(run) < step:
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the job ended before step {step}:\n{proc.communicate()[1][-2000:]}")
        time.sleep(0.02)


def finish(proc: subprocess.Popen, what: str) -> None:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: mlless train failed:\n{err[-2000:]}")


def faults(args: argparse.Namespace, work: Path) -> str:
    sys.path.insert(0, str(_common.ROOT / "tests"))
    from faults.conftest import rabbit_node, redis_server

    job, lines = fault_job(args, work), []
    with rabbit_node() as rabbit:
        for case in FAULTS:
            with redis_server() as port:
                urls = (f"redis://127.0.0.1:{port}/0", rabbit.url)
                run = work / case.replace(" ", "-").replace(",", "")
                shutil.rmtree(run, ignore_errors=True)
                proc = start(job, run, True, urls=urls)
                until_step(proc, run, args.fault_at, case)
                down = 0.0
                if case == "rabbitmq forced close":
                    rabbit.ctl("close_all_connections", "benchmark")
                elif case == "rabbitmq restart":
                    rabbit.ctl("stop_app")
                    time.sleep(down := 3.0)
                    rabbit.ctl("start_app")
                elif case == "worker kill -9":
                    os.kill(min(_runs.worker_pids(proc.pid)), signal.SIGKILL)
                if case == "redis restart, no persistence":
                    subprocess.run(["redis-cli", "-u", urls[0], "shutdown", "nosave"], capture_output=True)
                    time.sleep(down := 2.0)
                    with redis_server(port=urlsplit(urls[0]).port):
                        finish(proc, case)
                else:
                    finish(proc, case)
                s, times = _runs.summary(run), [r["time"] for r in _runs.rows(run)]
                gaps = [b - a for a, b in zip(times, times[1:])]
                lines.append([case, f"{down:g}", f"{max(gaps) - statistics.median(gaps):.2f}", s["steps"],
                              len(s["dropped_workers"]), s["workers_final"], s["rejected_frames"],
                              s["repaired_frames"], f"{s['replica_spread']:.1e}", s["stop_reason"]])
                print("  ", lines[-1], flush=True)
    return "\n".join([
        f"#### Recovery per service fault: PMF, MovieLens sample, P = 2, BSP, {args.steps} steps, the fault after "
        f"{args.fault_at}", "",
        _common.table(["fault", "down s", "stall s", "steps", "dropped", "workers at the end", "rejected frames",
                       "repaired frames", "replica spread", "stop reason"], lines), ""])


def failover(args: argparse.Namespace, work: Path) -> str:
    job, lines = fault_job(args, work), []
    for services in (True, False):
        transport = "Redis + RabbitMQ" if services else "embedded"
        reference = work / f"reference-{transport[:5]}"
        shutil.rmtree(reference, ignore_errors=True)
        finish(start(job, reference, services), "uninterrupted")
        ref = _runs.summary(reference)
        run = work / f"killed-{transport[:5]}"
        shutil.rmtree(run, ignore_errors=True)  # the kill is timed by the rows of this run's metrics.jsonl
        proc = start(job, run, services)
        until_step(proc, run, args.fault_at, "failover")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        recorded = _runs.recorded(run)
        finish(start(job, run, services, "--resume"), "resumed")
        s = _runs.summary(run)
        [t] = s["takeovers"]
        lines.append([transport, args.fault_at, t["from"], max(0, recorded - t["step"]), f"{t['seconds']:.2f}",
                      s["steps"], f"{s['validation_loss'] - ref['validation_loss']:+.4f}",
                      f"{s['wall_seconds']:.1f} / {ref['wall_seconds']:.1f}",
                      f"{s['cost_usd']:.5f} / {ref['cost_usd']:.5f}"])
        print("  ", lines[-1], flush=True)
    return "\n".join([
        f"#### Supervisor failover: PMF, MovieLens sample, P = 2, BSP, {args.steps} steps, kill -9 and --resume", "",
        _common.table(["transport", "killed at step", "resumed from", "steps redone", "takeover s", "steps",
                       "Δ validation RMSE", "wall s (killed + resumed / uninterrupted)", "cost $ (same)"], lines), ""])
