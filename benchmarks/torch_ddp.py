#!/usr/bin/env python
"""PyTorch DistributedDataParallel (gloo, CPU) against mlless at an equal number of processes, on biased MF.

Claim 3 of the issue "Reproduce the papers' headline results": at equal P, mlless reaches the target validation
RMSE sooner than PyTorch DDP; time to target and Perf/$ at the papers' VM price.

PyTorch: P OS processes started with `subprocess` and an environment rendezvous (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE), so that ranks >= 1 can be started under a prefix such as `ip netns exec NAME`; gloo backend; one torch
thread per rank (P processes on P cores' worth, as mlless's P workers). Biased MF of rank 20: user and item
factors, user and item biases, the training mean; loss = MSE + L2 x (|p_u|^2 + |q_i|^2 + b_u^2 + b_i^2), averaged
over the batch (per-sample regularisation, as Surprise and LIBMF apply it). Factors start N(0, 0.1), biases 0.

  sparse  nn.Embedding(sparse=True) + SparseAdam. torch 2.13's DDP reduces sparse gradients itself on gloo: each
          sparse parameter gets a bucket of its own, and ProcessGroupGloo's sparse allreduce gathers every rank's
          indices and values and sums them (DDP divides by P first, so the result is the mean). No manual
          all_gather is needed (it would be on NCCL, which has no sparse allreduce).
  dense   nn.Embedding(sparse=False) + Adam: DDP's bucketed allreduce of the whole (users + items) x 21 gradient.

Settings (`settings()`), from a small sweep at P = 2 on the MovieLens sample and the 1M skewed ratings, the
fewest seconds to target (RESULTS.md, "PyTorch DDP vs mlless"):
  * lr 0.03 for both optimizers: on MovieLens SparseAdam at 0.01 took 1.75x its epochs and 0.003 4.5x, Adam at
    0.01 2x and 0.003 5.6x; at 0.1 neither reached the target;
  * L2 0.1 on the MovieLens sample (LIBMF's default lambda), 0.02 on the synthetic ratings (Surprise's default
    reg_all): Adam scales each row's step to its gradient, so the rarely rated rows of MovieLens overfit at
    0.02-0.05 (best 0.887-0.898, then rising; time_to_quality.py's PyTorch row, without L2, ends at 0.899),
    while on the synthetic ratings 0.1 holds RMSE at 0.65-0.67, above the 0.631 target, and 0.02 is fastest;
  * batch per rank = the prepared set's batch (1,000 / 6,250), the batch each mlless worker trains on per step;
    1,024 on the 1M set took fewer epochs but 2-3x the seconds (per-step overhead).

Data and targets are time_to_quality.py's: the same prepared split; every epoch a seeded permutation of the
training ratings shared by all ranks, rank r taking every P-th rating from r (DistributedSampler's split, the tail
dropped so all ranks take as many steps); the target is that script's for the set (Surprise's 20-epoch RMSE on
the MovieLens sample, LIBMF's 10-iteration RMSE + 0.01 on the synthetic ratings). Rank 0 evaluates on the
validation split every `EVALUATE_EVERY` steps (mlless's default cadence) and broadcasts whether to stop. At the
end the ranks compare digests of their parameters (`replicas_identical`; a difference is named in the note).

A rank that dies is reported with its log (`-X faulthandler` puts its Python stack there). Seen here once in
~40 runs: rank 0 of the sparse variant aborted mid-training with "malloc(): unaligned tcache chunk detected"
(heap corruption inside torch / gloo; lr 0.1, 1M set), not reproduced in 4 x 60 s of the sparse variant since.

Figures: seconds to target from the start of training (after rendezvous, data loading and DDP set-up) and from
process launch; RMSE; TCP bytes sent by all ranks (`ss`, gloo's pairs and its rendezvous store); cost of P vCPUs
for that long at the papers' VM price (`_common.vm_cost`) and Perf/$ = 1/(seconds x dollars). mlless over Redis
+ RabbitMQ at the same P is run by time_to_quality.py's runner and costed with the library's own price model
(`mlless.telemetry.cost.job_cost`: P functions + supervisor + Redis + RabbitMQ for the same seconds).
Perf/$ is on the training time, as the papers exclude start-up; the dicts carry the from-launch figures too.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import time_to_quality as ttq  # noqa: E402

from mlless.data.dataset import Dataset  # noqa: E402
from mlless.spec.config import PricingConfig  # noqa: E402
from mlless.telemetry.cost import job_cost, perf_per_dollar  # noqa: E402

EVALUATE_EVERY = 25  # steps; mlless's default evaluation.everySteps
LAUNCH_SLACK = 120.0  # seconds allowed beyond max_seconds for start-up, data loading and shutdown


@dataclass(frozen=True)
class Settings:
    optimizer: str  # "SparseAdam" or "Adam"
    lr: float
    l2: float
    batch: int | None = None  # per rank; None: the prepared set's batch size


OPTIMIZERS = {"sparse": "SparseAdam", "dense": "Adam"}


def settings(variant: str, dataset: str) -> Settings:
    """The chosen settings of `variant` on `dataset` (see the module's docstring)."""
    return Settings(OPTIMIZERS[variant], lr=0.03, l2=0.1 if dataset == "movielens" else 0.02)


# ---- one rank -----------------------------------------------------------------------------------------------------

def tcp_bytes_sent(pid: int) -> int | None:
    """Bytes sent on the open TCP sockets of `pid`, from `ss` (None without it)."""
    try:
        out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    total, mine = 0, False
    for line in out.splitlines():
        if not line[:1].isspace():  # a socket's first line names its processes; the indented next one has counters
            mine = f"pid={pid}," in line
        elif mine and (m := re.search(r"\bbytes_sent:(\d+)", line)):
            total += int(m.group(1))
    return total


def train_rank(config: dict[str, Any]) -> None:
    """One DDP rank; rank 0 evaluates, decides when to stop and writes the result file."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    chosen = Settings(**config["settings"])
    ds = Dataset.open(config["data"])
    users, items, ratings = ttq.ratings(ds)
    users, items = users.astype(np.int64), items.astype(np.int64)
    n = len(ratings) // world  # ratings per rank per epoch
    batch = chosen.batch or ds.manifest.batch_size
    steps_per_epoch = -(-n // batch)
    lo, hi = ds.manifest.rating_min, ds.manifest.rating_max
    if rank == 0:
        val = ds.validation()
        vu, vi = torch.from_numpy(val.users.astype(np.int64)), torch.from_numpy(val.items.astype(np.int64))

    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    sparse = chosen.optimizer == "SparseAdam"
    model = biased_mf_class()(ds.manifest.n_users, ds.manifest.n_items, float(ratings.mean()), sparse)
    ddp = DistributedDataParallel(model)
    optimizer = getattr(torch.optim, chosen.optimizer)(ddp.parameters(), lr=chosen.lr)
    flag = torch.zeros(1)
    dist.barrier()
    started = time.perf_counter()
    startup = time.time() - config["launched"]
    points: list[tuple[float, float, float]] = []  # (seconds from training start, epochs, validation RMSE)
    hit: tuple[float, float, float] | None = None  # (seconds from training start, from launch, epochs)
    stop_reason = None
    step = 0
    while step < config["max_epochs"] * steps_per_epoch:
        epoch, offset = divmod(step, steps_per_epoch)
        if offset == 0:
            order = np.random.default_rng([0, epoch]).permutation(len(ratings))[rank::world][:n]
            u, i, r = (torch.from_numpy(a[order]) for a in (users, items, ratings))
        part = slice(offset * batch, (offset + 1) * batch)
        optimizer.zero_grad(set_to_none=True)
        pred, penalty = ddp(u[part], i[part])
        loss = torch.mean((pred - r[part]) ** 2) + chosen.l2 * torch.mean(penalty)
        loss.backward()
        optimizer.step()
        step += 1
        if step % config["evaluate_every"] == 0:
            if rank == 0:
                with torch.no_grad():
                    loss_v = ttq.rmse(model(vu, vi)[0].numpy(), val.ratings, lo, hi)
                seconds, epochs = time.perf_counter() - started, step / steps_per_epoch
                points.append((seconds, epochs, loss_v))
                if loss_v <= config["target"]:
                    hit = (seconds, time.time() - config["launched"], epochs)
                    stop_reason = "target reached"
                elif seconds > config["max_seconds"]:
                    stop_reason = f"max seconds ({config['max_seconds']:g})"
                flag.fill_(float(stop_reason is not None))
            dist.broadcast(flag, src=0)
            if flag.item():
                break
    # Before the gathers, so that the counts are the training's; gloo's connections stay open until destroy.
    sent = tcp_bytes_sent(os.getpid())
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (sent, digest))
    if rank == 0:
        result = {
            "points": points, "stop_reason": stop_reason or "max epochs", "steps": step, "batch_per_rank": batch,
            "startup_seconds": startup, "seconds_to_target": None if hit is None else hit[0],
            "seconds_from_launch": None if hit is None else hit[1], "epochs_to_target": None if hit is None else hit[2],
            "final_rmse": points[-1][2] if points else None, "best_rmse": min((p[2] for p in points), default=None),
            "bytes_sent": None if any(s is None for s, _ in gathered) else sum(s for s, _ in gathered),
            "replicas_identical": len({d for _, d in gathered}) == 1,
        }
        Path(config["result"]).write_text(json.dumps(result))
    dist.destroy_process_group()


def biased_mf_class() -> type:
    """The model (a function so that the launcher and the mlless runs need not import torch)."""
    import torch

    class BiasedMF(torch.nn.Module):
        """Rank-20 biased MF; forward returns predictions and each sample's squared norm of the rows it used."""

        def __init__(self, n_users: int, n_items: int, mean: float, sparse: bool) -> None:
            super().__init__()
            self.p = torch.nn.Embedding(n_users, ttq.RANK, sparse=sparse)
            self.q = torch.nn.Embedding(n_items, ttq.RANK, sparse=sparse)
            self.bu = torch.nn.Embedding(n_users, 1, sparse=sparse)
            self.bi = torch.nn.Embedding(n_items, 1, sparse=sparse)
            self.mean = mean
            for emb in (self.p, self.q):
                torch.nn.init.normal_(emb.weight, 0, 0.1)
            for emb in (self.bu, self.bi):
                torch.nn.init.zeros_(emb.weight)

        def forward(self, u: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            p, q, bu, bi = self.p(u), self.q(i), self.bu(u).squeeze(1), self.bi(i).squeeze(1)
            penalty = (p * p).sum(1) + (q * q).sum(1) + bu * bu + bi * bi
            return (p * q).sum(1) + bu + bi + self.mean, penalty

    return BiasedMF


# ---- the launcher -------------------------------------------------------------------------------------------------

def gloo_interface(addr: str, prefix: Sequence[str], holds: bool) -> str:
    """The interface gloo binds in a rank's namespace: the one holding `addr` (rank 0, which listens there), or the
    one routing to it (the others). Without it gloo binds the interface of the host name, outside a namespace."""
    cmd = ["ip", "-o", "-4", "addr", "show", "to", addr] if holds else ["ip", "-o", "route", "get", addr]
    out = subprocess.run([*prefix, *cmd], capture_output=True, text=True, check=True).stdout
    if holds:
        fields = out.split()
        if len(fields) < 2:
            raise RuntimeError(f"no interface holds {addr}: {' '.join(cmd)} printed {out!r}")
        return fields[1]
    m = re.search(r"\bdev (\S+)", out)
    if m is None:
        raise RuntimeError(f"no route to {addr}: {' '.join(cmd)} printed {out!r}")
    return m.group(1)


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class RankFailed(RuntimeError):
    """A DDP rank exited non-zero or ran out of time; `reason` is one line for a results table."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}\n{detail}")
        self.reason, self.detail = reason, detail


def run_ddp(data_dir: Path, dataset: str, workers: int, variant: str, target: float, max_seconds: float,
            exec_prefix: Sequence[str] | None = None, master_addr: str = "127.0.0.1", master_port: int | None = None,
            chosen: Settings | None = None, max_epochs: float = 100, evaluate_every: int = EVALUATE_EVERY,
            attempts: int = 2) -> dict:
    """Train with `workers` DDP ranks to `target` (or `max_seconds` of training); rank 0 runs here, in this
    namespace, listening on `master_addr`; ranks >= 1 start under `exec_prefix` (e.g. ["ip", "netns", "exec", NAME]).
    Returns the figures of `summarise` plus the rank-0 result (curve points, steps, stop reason, start-up).

    A run whose rank dies is started again, up to `attempts` times in all: torch 2.13's sparse backward under gloo
    aborted with heap corruption ("malloc(): unaligned tcache chunk detected") in one run of paper.py on 2026-11-24,
    which says nothing of DDP's speed. If every attempt fails, the row says so (not reached, with the reason)."""
    if variant not in OPTIMIZERS:
        raise ValueError(f"variant must be one of {sorted(OPTIMIZERS)}, not {variant!r}")
    chosen = chosen or settings(variant, dataset)
    label = f"PyTorch DDP {variant} P={workers} ({chosen.optimizer} lr {chosen.lr:g}, L2 {chosen.l2:g})"
    for attempt in range(1, attempts + 1):
        try:
            return _attempt(data_dir, dataset, workers, variant, target, max_seconds, list(exec_prefix or []),
                            master_addr, master_port, chosen, max_epochs, evaluate_every, label)
        except RankFailed as exc:
            print(f"    {label}, attempt {attempt} of {attempts}: {exc.reason}; {exc.detail.splitlines()[0]}", flush=True)
            reason = exc.reason
    figures = summarise(label, workers, None, None, None, None, None, None, lambda s: _common.vm_cost(workers, s),
                        f"failed {attempts} times: {reason}")
    return {**figures, "points": [], "variant": variant, "settings": asdict(chosen), "target": target, "run_dir": None}


def _attempt(data_dir: Path, dataset: str, workers: int, variant: str, target: float, max_seconds: float,
             prefix: list[str], master_addr: str, master_port: int | None, chosen: Settings, max_epochs: float,
             evaluate_every: int, label: str) -> dict:
    """One launch of run_ddp's ranks; raises RankFailed."""
    data = ttq.prepared(data_dir, dataset)
    run = data_dir / "torch-ddp" / f"{dataset}-{variant}-p{workers}-{int(time.time() * 1000) % 10**8}"
    run.mkdir(parents=True)
    port = master_port or free_port(master_addr)
    interfaces = [gloo_interface(master_addr, [], True), gloo_interface(master_addr, prefix, False)]
    launched = time.time()
    config = {"data": str(data), "settings": asdict(chosen), "target": target, "max_seconds": max_seconds,
              "max_epochs": max_epochs, "evaluate_every": evaluate_every, "launched": launched,
              "result": str(run / "result.json")}
    (run / "config.json").write_text(json.dumps(config))
    procs = []
    for rank in range(workers):
        env = {**os.environ, "MASTER_ADDR": master_addr, "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": str(workers), "GLOO_SOCKET_IFNAME": interfaces[rank > 0],
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        # faulthandler: a rank that gloo or the allocator aborts leaves its Python stack in its log.
        cmd = [sys.executable, "-X", "faulthandler", os.path.abspath(__file__),
               "--rank-config", str(run / "config.json")]
        with open(run / f"rank-{rank}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd if rank == 0 else [*prefix, *cmd], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    wait(procs, run, launched + max_seconds + LAUNCH_SLACK)
    result = json.loads((run / "result.json").read_text())
    note = f"stop: {result['stop_reason']}; start-up {result['startup_seconds']:.2f} s; {result['steps']} steps"
    if not result["replicas_identical"]:
        note += "; ranks' parameters differ"
    figures = summarise(label, workers, result["seconds_to_target"], result["seconds_from_launch"],
                        result["epochs_to_target"], result["final_rmse"], result["best_rmse"], result["bytes_sent"],
                        lambda s: _common.vm_cost(workers, s), note)
    return {**result, **figures, "variant": variant, "settings": asdict(chosen), "target": target, "run_dir": str(run)}


def wait(procs: list[subprocess.Popen], run: Path, deadline: float) -> None:
    """Wait for every rank; if one fails or time runs out, stop the others (ours, by pid) and raise with its log."""
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed or time.time() > deadline:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            rank = failed[0] if failed else 0
            what = f"exited {codes[rank]}" if failed else "timed out"
            log = (run / f"rank-{rank}.log").read_text(errors="replace")
            first = next((line.strip() for line in log.splitlines() if line.strip()), "")
            raise RankFailed(f"rank {rank} {what}" + (f" ({first[:120]})" if first else ""),
                             f"its log ({run}):\n{log[-3000:]}")
        time.sleep(0.05)


def summarise(system: str, workers: int, seconds: float | None, from_launch: float | None, epochs: float | None,
              final: float | None, best: float | None, bytes_sent: int | None, cost_of: Callable[[float], float],
              note: str) -> dict:
    """The comparison's figures of one run: cost and Perf/$ at the time to target (training only / from launch)."""
    cost = None if seconds is None else cost_of(seconds)
    cost_launch = None if from_launch is None else cost_of(from_launch)
    return {
        "system": system, "workers": workers, "reached": seconds is not None, "seconds_to_target": seconds,
        "seconds_from_launch": from_launch, "epochs_to_target": epochs, "final_rmse": final, "best_rmse": best,
        "bytes_sent": bytes_sent, "cost_usd": cost, "cost_usd_from_launch": cost_launch,
        "perf_per_dollar": None if cost is None else perf_per_dollar(seconds, cost),
        "perf_per_dollar_from_launch": None if cost_launch is None else perf_per_dollar(from_launch, cost_launch),
        "note": note,
    }


def run_mlless(data_dir: Path, dataset: str, workers: int, protocol: str, target: float, max_seconds: float) -> dict:
    """mlless with only model.type at `workers` workers over the local Redis + RabbitMQ (time_to_quality.py's
    runner), in the figures of `summarise`."""
    data = ttq.prepared(data_dir, dataset)
    base = data_dir / "time-to-quality"
    base.mkdir(parents=True, exist_ok=True)
    curve = ttq.run_mlless(Dataset.open(str(data)), data, "pmf", ttq.MllessRun(workers, True, protocol), target,
                           max_seconds, base)
    return mlless_figures(curve, workers, target)


def mlless_figures(curve: ttq.Curve, workers: int, target: float) -> dict:
    """An mlless run's curve in the figures of `summarise`, costed by the library's price model for the time to
    target."""
    summary = curve.summary or {}
    hit = curve.reached(target)
    pricing = PricingConfig()
    return summarise(curve.system, workers, None if hit is None else hit[0] - (curve.startup or 0.0),
                     None if hit is None else hit[0], None if hit is None else hit[1],
                     summary.get("validation_loss"), curve.best, summary.get("bytes_sent"),
                     lambda s: job_cost(pricing, [s] * workers, s).total, curve.note)


# ---- the comparison -----------------------------------------------------------------------------------------------

def table(rows: list[dict]) -> str:
    return _common.table(
        ["system", "s to target (training)", "s to target (from launch)", "epochs", "final RMSE", "best RMSE",
         "MB sent", "$ to target", "Perf/$", "note"],
        [(r["system"], r["seconds_to_target"], r["seconds_from_launch"], r["epochs_to_target"], r["final_rmse"],
          r["best_rmse"], None if r["bytes_sent"] is None else r["bytes_sent"] / 1e6,
          None if r["cost_usd"] is None else f"{r['cost_usd']:.3g}",
          None if r["perf_per_dollar"] is None else f"{r['perf_per_dollar']:.4g}", r["note"]) for r in rows])


def compare(args: argparse.Namespace, dataset: str) -> str:
    """DDP's variants and mlless's protocols on one set at P = args.workers; the set's table, in markdown."""
    data = ttq.prepared(args.data_dir, dataset)
    target = args.target if args.target is not None else ttq.pmf_target(dataset, Dataset.open(str(data)))[1]
    print(f"== {dataset}: target validation RMSE {target:.4f}", flush=True)
    overrides = {k: v for k, v in (("lr", args.lr), ("l2", args.l2), ("batch", args.batch)) if v is not None}
    rows = []
    for variant in args.variant.split(","):
        rows.append(run_ddp(args.data_dir, dataset, args.workers, variant, target, args.max_seconds,
                            args.exec_prefix.split(), args.master_addr,
                            chosen=replace(settings(variant, dataset), **overrides)))
        trace = " ".join(f"{e:.2f}:{loss:.4f}" for _, e, loss in rows[-1]["points"][:12])
        print(f"    {rows[-1]['system']}: {_common.fmt(rows[-1]['seconds_to_target'])} s to target; "
              f"epochs:RMSE {trace}", flush=True)
    for protocol in filter(None, args.protocols.split(",")):
        rows.append(run_mlless(args.data_dir, dataset, args.workers, protocol, target, args.max_seconds))
    return f"#### {ttq.ALL_SETS[dataset].title}, P = {args.workers}: target {target:.4f}\n\n{table(rows)}\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=_common.DEFAULT_DATA_DIR,
                   help="prepared datasets and runs (default %(default)s)")
    p.add_argument("--dataset", default="movielens,pmf1m-skew",
                   help=f"comma list of {', '.join(sorted(ttq.ALL_SETS))} "
                        "(default %(default)s: time_to_quality.py's quick sets)")
    p.add_argument("--workers", type=int, default=2, help="P, DDP ranks and mlless workers (default %(default)s)")
    p.add_argument("--variant", default="sparse,dense", help="comma list of %(default)s")
    p.add_argument("--protocols", default="bsp,isp",
                   help="mlless protocols to run beside (default %(default)s; '' for none)")
    p.add_argument("--target", type=float, help="target validation RMSE (default: time_to_quality.py's for the set)")
    p.add_argument("--max-seconds", type=float, default=120, help="cap on each run's training (default %(default)s)")
    p.add_argument("--lr", type=float, help="override the variant's learning rate (for tuning)")
    p.add_argument("--l2", type=float, help="override the variant's L2 (for tuning)")
    p.add_argument("--batch", type=int, help="override the batch per rank (for tuning; default the set's batch)")
    p.add_argument("--exec-prefix", default="", help="command prefix for ranks >= 1, e.g. 'ip netns exec NS'")
    p.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address (default %(default)s)")
    p.add_argument("--write-results", action="store_true", help="refresh this script's section of RESULTS.md")
    p.add_argument("--rank-config", type=Path, help=argparse.SUPPRESS)  # a rank started by run_ddp
    args = p.parse_args(argv)
    if args.rank_config:
        train_rank(json.loads(args.rank_config.read_text()))
        # Now and then torch 2.13 aborts the interpreter's exit after destroy_process_group ("terminate called
        # without an active exception", no Python frame): leave without the C++ destructors, the work being done.
        sys.stdout.flush()
        os._exit(0)
    unknown = set(args.dataset.split(",")) - set(ttq.ALL_SETS)
    if unknown:
        p.error(f"unknown dataset(s) {', '.join(sorted(unknown))}; choose from {', '.join(sorted(ttq.ALL_SETS))}")
    info = _common.machine_info()
    print(_common.machine_line(info), flush=True)
    parts = [compare(args, dataset) for dataset in args.dataset.split(",")]
    print("\n" + "\n".join(parts))
    body = "\n".join([
        "### PyTorch DDP vs mlless at equal P (`benchmarks/torch_ddp.py`)",
        "",
        f"Machine: {_common.machine_line(info)}. Command: `{_common.command_line()}`.",
        "",
        "Training seconds: DDP from its first step (after rendezvous, data loading and DDP set-up), mlless from its "
        "first step (the job's time minus its start-up); 'from launch': from starting the rank processes / the job. "
        "$ to target and Perf/$ = 1/(s x $) on the training seconds: DDP as P vCPUs at the papers' VM price "
        f"({_common.PAPERS_VM_PER_HOUR} $/h per {_common.PAPERS_VM_VCPUS} vCPUs), mlless by its own price model "
        "(P functions + supervisor + Redis + RabbitMQ). MB sent: DDP's TCP bytes (`ss`), mlless's `bytes_sent`.",
        "",
        *parts,
    ])
    if args.write_results:
        _common.update_results("torch_ddp", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
