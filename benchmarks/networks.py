"""Networks (issue #46): what mlless costs over PyTorch on a `neural-net` job, and whether workers pay.

Parts (`--parts`, default all). The data (`_netdata.py`): "shapes", a CIFAR-shaped generated set (32×32×3 uint8,
10 classes told apart by shape alone, 12,800 training and 1,000 validation images, batches of 64), and
scikit-learn's digits for the quick convergence parts. Every process trains with one torch thread a worker
(`_netruns.pinning`), Adam at 0.001 and batches of 64 a worker, from the same seeded initial network; mlless's
jobs run over Redis + RabbitMQ (`--transport embedded`: the in-process broker).

* overhead (P = 1): mlless's step against a plain PyTorch loop (`_torchnet.plain`) on the same network, batches,
  order and thread: (a) in one process, step by step alternating, mlless's own pieces (`NeuralNet.gradient`,
  `Replica.descend`) against the loop's, both under the same load; (b) an `mlless train` job of `--steps` steps
  (evaluation off) against the loop run alone just before it: the median step (the gap between step closes), its
  phases from metrics.jsonl (fetch, compute, wait: the round trip of the step's close, write/read/apply, and
  `other`, the step less its phases, which holds the optimizer's step at P = 1). Target: job ÷ loop ≤ 1.1.
* ddp: mlless (its default, gradient averaging) against PyTorch DDP (`_torchnet.train_rank`, gloo) at P = 2 (and 4
  on 4 or more cores): seconds to the target validation loss, from the first step (DDP: from the start of
  training, its evaluations off the clock) and from launch. Target: mlless ≤ 1.0 × DDP.
* second-worker: mlless P = 1 against P = 2 (gradient averaging), the same target: seconds and workers'
  CPU-seconds to it. Target: T₂ ≤ 0.65 T₁ on this 2-core machine.
* ga-ma: LambdaML's comparison, gradient averaging against model averaging (`averaging`, localSteps per
  `--local-steps`), and SPIRT's norm filter (`norm-isp`) at P = 2, each run `--ga-ma-epochs` epochs long: time to
  target, best and final loss, the validation curve by epoch, its largest rise above its best so far (instability).
* exchange: the exchange's cost per step for MobileNetV3-small (1.5M parameters, 6 MB) and ResNet-18 (11.2M,
  45 MB) under each `sync.exchange` pattern at P = 2 over Redis: gradient-averaging jobs of a few steps on
  batches of 8 (compute is not the point), evaluation off; median write, wait, read and apply, and the bytes
  sent and read per worker-step; the first pattern again with float16 frames (`sync.precision`).

The target is a validation cross-entropy (`--target`; shapes 0.8, which MobileNetV3-small passes at about 70 %
accuracy; digits 0.3): mlless's metrics.jsonl records the validation loss of each evaluation, not its accuracy.
Accuracy is reported where known: DDP's at the evaluation that reached the target, mlless's for the model the job
handed back (its best snapshot, `summary.json`). A missed target is bounded by what the figures say: start-up
(met from the first step, missed from launch), convergence (more steps to the target) or the per-step cost, split
into compute and exchange by the phases.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from . import _common, _netdata, _netruns, _torchnet
from ._netfigures import curve_marks, largest_rise, overhead_table, ratio_line

PARTS = ("overhead", "ddp", "second-worker", "ga-ma", "exchange")
#: (full, quick) defaults.
DEFAULTS = {
    "overhead_networks": ("mobilenet_v3_small,cnn", "mobilenet_v3_small"), "steps": (30, 6), "warmup": (3, 2),
    "set": ("shapes32", "digits"), "network": ("mobilenet_v3_small", "cnn"), "evaluate_every": (25, 5),
    "max_epochs": (6.0, 12.0), "max_seconds": (1200.0, 90.0), "local_steps": ("4,16", "4"), "ga_ma_epochs": (5.0, 8.0),
    "exchange_networks": ("mobilenet_v3_small,resnet18", "mobilenet_v3_small"), "exchange_steps": (10, 3),
}
TARGETS = {"shapes32": 0.8, "digits": 0.3}
EXCHANGES = ("all-to-all", "allreduce", "scatter-reduce", "in-store")
#: The exchange part's extra rows: the first pattern's frames in these precisions.
NARROW_PRECISIONS = ("float16",)
#: in-store's steps at most: its Lua merge of a 45 MB gradient holds Redis for about 16 s a step (a loaded 2-core
#: machine), so it runs on a Redis of its own (`_common.own_redis`).
IN_STORE_STEPS = 3
GOALS = {"overhead": 1.1, "ddp": 1.0, "second-worker": 0.65}


def add_arguments(p: argparse.ArgumentParser) -> None:
    def default(key: str) -> str:
        full, quick = DEFAULTS[key]
        return f"default {full}; --quick: {quick}"

    p.add_argument("--parts", default=",".join(PARTS), help="comma list (default %(default)s)")
    p.add_argument("--transport", choices=["services", "embedded"], default="services",
                   help="mlless's transport (default %(default)s: Redis + RabbitMQ)")
    p.add_argument("--overhead-networks", help=f"overhead: comma list ({default('overhead_networks')})")
    p.add_argument("--steps", type=int, help=f"overhead: steps timed ({default('steps')})")
    p.add_argument("--warmup", type=int, help=f"overhead: steps before them ({default('warmup')})")
    p.add_argument("--set", choices=list(_netdata.SETS), help=f"ddp, second-worker, ga-ma: the data ({default('set')})")
    p.add_argument("--network", help=f"ddp, second-worker, ga-ma: the network ({default('network')})")
    p.add_argument("--target", type=float, help="the validation loss to reach (default: "
                                                + ", ".join(f"{k} {v:g}" for k, v in TARGETS.items()) + ")")
    p.add_argument("--evaluate-every", type=int, help=f"steps between evaluations ({default('evaluate_every')})")
    p.add_argument("--max-epochs", type=float, help=f"cap on each run ({default('max_epochs')})")
    p.add_argument("--max-seconds", type=float, help=f"cap on each run's training ({default('max_seconds')})")
    p.add_argument("--seed", type=int, default=0, help="ddp, second-worker, ga-ma: the seed of the initial network "
                                                        "and of the batch order, for every system (default %(default)s)")
    p.add_argument("--lr", type=float, default=0.001, help="ddp, second-worker, ga-ma: Adam's learning rate, for every "
                                                           "system and P (default %(default)s)")
    p.add_argument("--ddp-workers", help="ddp: comma list of P (default 2, and 4 on 4 or more cores)")
    p.add_argument("--local-steps", help=f"ga-ma: averaging's localSteps, comma list ({default('local_steps')})")
    p.add_argument("--ga-ma-epochs", type=float, help=f"ga-ma: every run's epochs, past the target "
                                                      f"({default('ga_ma_epochs')})")
    p.add_argument("--exchange-networks", help=f"exchange: comma list ({default('exchange_networks')})")
    p.add_argument("--exchange-steps", type=int, help=f"exchange: steps timed ({default('exchange_steps')})")
    p.add_argument("--exchanges", default=",".join(EXCHANGES), help="exchange: patterns (default %(default)s)")


def settle(args: argparse.Namespace) -> None:
    """The defaults of the options left unset, full or quick."""
    for key, pair in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, pair[1] if args.quick else pair[0])
    args.target = args.target if args.target is not None else TARGETS.get(args.set, 1.0)
    cores = os.cpu_count() or 1
    args.ddp_workers = [int(w) for w in (args.ddp_workers or ("2,4" if cores >= 4 else "2")).split(",")]


# ---- part 1: overhead at P = 1 ---------------------------------------------------------------------------------------

def overhead(args: argparse.Namespace, base: Path) -> str:
    data = _netdata.prepared_set(args.data_dir, "shapes32")
    rows = []
    for network in args.overhead_networks.split(","):
        print(f"== overhead: {network}", flush=True)
        doc = _netruns.job_doc(f"net-overhead-{network.replace('_', '-')}", data, network, 1,
                               {"maxSteps": args.warmup + args.steps}, 0)
        side = _torchnet.run_side_by_side(doc, data, args.steps, args.warmup, base)
        before = _torchnet.run_plain(data, network, args.steps, args.warmup, base)
        job = _netruns.run_job(doc, base, args.transport == "services")
        after = _torchnet.run_plain(data, network, args.steps, args.warmup, base)
        figures = _netruns.step_figures(job["rows"], args.warmup)
        rows.append({"network": network, "parameters": before["parameters"], "side": side, "plain": [before, after],
                     "job": figures, "threads_note": job["threads_note"], "load": job["load_before"]})
        print(f"    plain {before['median']['step'] * 1e3:.1f} and {after['median']['step'] * 1e3:.1f} ms, "
              f"mlless job {(figures['step'] or 0) * 1e3:.1f} ms a step", flush=True)
    return overhead_table(rows, GOALS["overhead"])


# ---- parts 2-4: time to target ----------------------------------------------------------------------------------------

class Convergence:
    """The time-to-target runs, each run once and shared by the parts that read it."""

    def __init__(self, args: argparse.Namespace, base: Path) -> None:
        self.args, self.base = args, base
        self.data = (_netdata.prepared_set(args.data_dir, args.set))
        self.runs: dict[tuple, dict[str, Any]] = {}
        self.stop = {"targetLoss": args.target, "targetSteps": 1, "maxEpochs": args.max_epochs,
                     "maxSeconds": args.max_seconds}

    def mlless(self, workers: int, protocol: str = "gradient-averaging", local_steps: int | None = None,
               epochs: float | None = None) -> dict:
        """A run to the target, or with `epochs` one of that many epochs (its time to the target read off its
        curve)."""
        key = ("mlless", workers, protocol, local_steps, epochs)
        if key not in self.runs:
            sync: dict[str, Any] = {"protocol": protocol} | ({"localSteps": local_steps} if local_steps else {})
            name = f"net-{self.args.network[:9].replace('_', '-')}-{protocol[:4]}{local_steps or ''}-p{workers}"
            stop = self.stop if epochs is None else {"maxEpochs": epochs}
            doc = _netruns.job_doc(name, self.data, self.args.network, workers, stop, self.args.evaluate_every, sync,
                                   lr=self.args.lr, seed=self.args.seed)
            print(f"== mlless {protocol}{f' H={local_steps}' if local_steps else ''} P={workers}", flush=True)
            self.runs[key] = _netruns.run_job(doc, self.base, self.args.transport == "services", target=self.args.target)
        return self.runs[key]

    def ddp(self, workers: int) -> dict:
        key = ("ddp", workers)
        if key not in self.runs:
            print(f"== PyTorch DDP P={workers}", flush=True)
            a = self.args
            self.runs[key] = _torchnet.run_ddp(self.data, a.network, workers, a.target, a.max_seconds, a.max_epochs,
                                               a.evaluate_every, self.base, lr=a.lr, seed=a.seed)
        return self.runs[key]

    def title(self) -> str:
        return (f"{_netdata.SETS[self.args.set].title}, {self.args.network}, target validation loss "
                f"{self.args.target:g}, evaluation every {self.args.evaluate_every} steps, Adam {self.args.lr:g}, "
                f"seed {self.args.seed}")


def mlless_row(label: str, run: dict[str, Any]) -> list[Any]:
    a = run.get("analysis")
    if a is None:
        return [label, run.get("workers"), "–", "–", "–", "–", "–", "–", "–", "–", run.get("refused") or "failed"]
    acc = run["scores"].get("accuracy")
    note = f"stop: {a['stop_reason']}; start-up {a['startup_seconds']:.1f} s; best {a['best_loss']:.4f}"
    return [label, run["workers"], a["from_first_step"], a["seconds_to_target"], a["steps_to_target"],
            a["epochs_to_target"], None if a["step_seconds_median"] is None else a["step_seconds_median"] * 1e3,
            None if acc is None else f"{acc:.3f} (handed back)", a["worker_cpu_to_target"], run["load_before"], note]


def ddp_row(workers: int, run: dict[str, Any]) -> list[Any]:
    hit = run.get("hit")
    if "failed" in run:
        return ["PyTorch DDP (gloo)", workers, "–", "–", "–", "–", "–", "–", "–", "–", run["failed"]]
    note = (f"stop: {run['stop_reason']}; start-up {run['startup_seconds']:.1f} s; evaluations "
            f"{run['evaluation_seconds']:.1f} s off the clock" + ("" if run["replicas_identical"] else "; ranks differ"))
    return ["PyTorch DDP (gloo)", workers, hit and hit["seconds"], hit and hit["from_launch"], hit and hit["step"],
            hit and hit["epochs"], run["step_seconds_median"] * 1e3, hit and f"{hit['accuracy']:.3f} (at target)",
            "–", "–", note]


HEADER = ["system", "P", "s to target from 1st step", "from launch", "steps", "epochs", "step ms (median)",
          "accuracy", "worker CPU-s to target", "load before", "note"]


def ddp_part(conv: Convergence) -> str:
    rows, lines = [], []
    for P in conv.args.ddp_workers:
        m, d = conv.mlless(P), conv.ddp(P)
        rows += [mlless_row("mlless gradient-averaging", m), ddp_row(P, d)]
        ma, hit = m.get("analysis"), d.get("hit")
        lines.append(ratio_line(f"P = {P}: mlless ÷ DDP", ma, hit and {
            "from_first_step": hit["seconds"], "seconds_to_target": hit["from_launch"], "steps_to_target": hit["step"],
            "step_seconds_median": d["step_seconds_median"]}, GOALS["ddp"], same_batch=True))
    return (f"### PyTorch DDP against mlless at equal P\n\n{conv.title()}.\n\n{_common.table(HEADER, rows)}\n\n"
            + "\n".join(f"- {line}" for line in lines) + "\n")


def second_worker_part(conv: Convergence) -> str:
    one, two = conv.mlless(1), conv.mlless(2)
    rows = [mlless_row("mlless gradient-averaging", one), mlless_row("mlless gradient-averaging", two)]
    a1, a2 = one.get("analysis"), two.get("analysis")
    line = ratio_line("T₂ ÷ T₁", a2, a1, GOALS["second-worker"], same_batch=False)
    cpu = ""
    if a1 and a2 and a1.get("worker_cpu_to_target") and a2.get("worker_cpu_to_target"):
        cpu = (f"- Workers' CPU-seconds to target: {a1['worker_cpu_to_target']:.1f} at P = 1, "
               f"{a2['worker_cpu_to_target']:.1f} at P = 2 (C₁ ÷ C₂ = "
               f"{a1['worker_cpu_to_target'] / a2['worker_cpu_to_target']:.2f}).\n")
    phases = [[P, *(None if a is None else a["phases_median"].get(p, 0) * 1e3 for p in _netruns.PHASES)]
              for P, a in ((1, a1), (2, a2))]
    return (f"### Does a second worker pay?\n\n{conv.title()}; one thread a worker ({one['threads_note']} at P = 1, "
            f"{two['threads_note']} at P = 2).\n\n{_common.table(HEADER, rows)}\n\nPhases, ms (medians up to the "
            f"target):\n\n{_common.table(['P', *_netruns.PHASES], phases)}\n\n- {line}\n{cpu}")


def ga_ma_part(conv: Convergence) -> str:
    epochs = conv.args.ga_ma_epochs
    runs = [("gradient-averaging", None, conv.mlless(2, epochs=epochs))]
    runs += [("averaging", H, conv.mlless(2, "averaging", H, epochs)) for H in map(int, conv.args.local_steps.split(","))]
    runs.append(("norm-isp", None, conv.mlless(2, "norm-isp", epochs=epochs)))  # SPIRT's norm filter, its defaults
    reached = max((c[1] for _, _, run in runs for c in run.get("curve", [])), default=0.0)
    marks = list(range(1, int(min(reached, epochs)) + 1))
    rows = []
    for protocol, H, run in runs:
        a = run.get("analysis")
        if a is None:
            rows.append([protocol, H or "–", run.get("refused") or "failed", *["–"] * (6 + len(marks))])
            continue
        losses = [c[3] for c in run["curve"]]
        acc = run["scores"].get("accuracy")
        rows.append([protocol, H or "–", a["from_first_step"] if a["reached"] else f"not reached ({a['stop_reason']})",
                     a["steps_to_target"], a["epochs_to_target"], a["best_loss"], losses[-1] if losses else None,
                     largest_rise(losses), None if acc is None else acc,
                     None if a["bytes_sent_per_worker_step"] is None else a["bytes_sent_per_worker_step"] / 1e6,
                     *curve_marks(run["curve"], marks)])
    header = ["protocol", "H", "s to target from 1st step", "steps", "epochs", "best loss", "last loss", "largest rise above best",
              "accuracy (handed back)", "MB sent/worker-step", *(f"loss at epoch {e}" for e in marks)]
    return (f"### Gradient averaging against model averaging (LambdaML) and the norm filter (SPIRT), P = 2\n\n"
            f"{conv.title()}; every run "
            f"{epochs:g} epochs, past the target, so that a rise after the best shows.\n\n"
            f"{_common.table(header, rows)}\n")


# ---- part 5: the exchange per step -------------------------------------------------------------------------------------

def exchange(args: argparse.Namespace, base: Path) -> str:
    data = _netdata.prepared_set(args.data_dir, "shapes32-b8")
    rows = []
    patterns = args.exchanges.split(",")
    # Every pattern in float32, and the first in each narrower precision: what `spec.sync.precision` saves.
    cases = [(pattern, "float32") for pattern in patterns] + [(patterns[0], p) for p in NARROW_PRECISIONS]
    for network in args.exchange_networks.split(","):
        for pattern, precision in cases:
            steps = min(args.exchange_steps, IN_STORE_STEPS) if pattern == "in-store" else args.exchange_steps
            skip = 2 if steps >= 4 else 1
            label = pattern if precision == "float32" else f"{pattern}, {precision}"
            print(f"== exchange: {network} × {label}", flush=True)
            doc = _netruns.job_doc(f"net-x-{network[:6].replace('_', '-')}-{pattern}-{precision}", data, network, 2,
                                   {"maxSteps": skip + steps}, 0,
                                   {"protocol": "gradient-averaging", "exchange": pattern, "precision": precision})
            if pattern == "in-store" and args.transport == "services":
                with _common.own_redis() as url:
                    run = _netruns.run_job(doc, base, True, redis_url=url)
            else:
                run = _netruns.run_job(doc, base, args.transport == "services")
            if "refused" in run or not run["rows"]:
                rows.append([network, label, "–", run.get("refused") or "failed", *["–"] * 8])
                continue
            f = _netruns.step_figures(run["rows"], skip)
            ph = f["phases"]
            rows.append([network, label, f"{steps} after {skip}", *(None if v is None else v * 1e3 for v in
                                             (f["step"], ph.get("compute"), ph.get("write"), ph.get("wait"),
                                              ph.get("read"), ph.get("apply"))),
                         None if f["sent"] is None else f["sent"] / 1e6, None if f["read"] is None else f["read"] / 1e6,
                         run["load_before"]])
    header = ["network", "exchange", "steps timed", "step ms", "compute ms", "write ms", "wait ms", "read ms", "apply ms",
              "MB sent/worker-step", "MB read/worker-step", "load before"]
    return ("### The exchange per step, P = 2, gradient averaging, over "
            f"{'Redis + RabbitMQ' if args.transport == 'services' else 'the embedded broker'}\n\n"
            f"{_netdata.SETS['shapes32-b8'].title}; medians over the steps timed (in-store at most {IN_STORE_STEPS}, "
            "on a Redis of its own: its merge holds Redis); wait is "
            "the barrier (the slower worker's compute, the close's round trip), apply the Adam step by the mean.\n\n"
            f"{_common.table(header, rows)}\n")


# ---- the suite -------------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> str:
    _common.single_thread_env()
    settle(args)
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"--parts: {', '.join(unknown)} is none of {', '.join(PARTS)}")
    base = args.data_dir / "networks"
    base.mkdir(parents=True, exist_ok=True)
    out = []
    if "overhead" in parts:
        out.append(overhead(args, base))
    conv = Convergence(args, base) if {"ddp", "second-worker", "ga-ma"} & set(parts) else None
    if "ddp" in parts:
        out.append(ddp_part(conv))
    if "second-worker" in parts:
        out.append(second_worker_part(conv))
    if "ga-ma" in parts:
        out.append(ga_ma_part(conv))
    if "exchange" in parts:
        out.append(exchange(args, base))
    if conv is not None:
        raw = {"/".join(map(str, k)): {kk: vv for kk, vv in v.items() if kk != "rows"} for k, v in conv.runs.items()}
        (args.out / "networks.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    return "\n".join(out)
