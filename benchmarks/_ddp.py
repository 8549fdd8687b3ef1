"""PyTorch DistributedDataParallel (gloo, CPU) as a peer at an equal number of processes, on biased MF.

P OS processes started with `subprocess` and an environment rendezvous (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE), so that ranks >= 1 can be started under a prefix such as `ip netns exec NAME`; gloo backend; one torch
thread per rank (P processes on P cores' worth, as mlless's P workers). Biased MF of rank 20: user and item
factors, user and item biases, the training mean; loss = MSE + L2 x (|p_u|^2 + |q_i|^2 + b_u^2 + b_i^2), averaged
over the batch (per-sample regularisation, as Surprise and LIBMF apply it). Factors start N(0, 0.1), biases 0.

  sparse  nn.Embedding(sparse=True) + SparseAdam. DDP reduces sparse gradients itself on gloo: each sparse
          parameter gets a bucket of its own, and ProcessGroupGloo's sparse allreduce gathers every rank's
          indices and values and sums them (DDP divides by P first, so the result is the mean).
  dense   nn.Embedding(sparse=False) + Adam: DDP's bucketed allreduce of the whole (users + items) x 21 gradient.

Settings (`settings()`), from a small sweep at P = 2 on the MovieLens sample and the 1M skewed ratings, the
fewest seconds to target (RESULTS.md, "PyTorch DDP vs mlless"): lr 0.03 for both optimizers; L2 0.1 on the
MovieLens sample (LIBMF's default lambda), 0.02 on the synthetic ratings (Surprise's default reg_all); batch per
rank = the prepared set's batch, the batch each mlless worker trains on per step.

Data and targets are the suites' (`_common.prepared`, `_peers.pmf_target`): every epoch a seeded permutation of the
training ratings shared by all ranks, rank r taking every P-th rating from r (DistributedSampler's split, the tail
dropped so all ranks take as many steps). Rank 0 evaluates on the validation split every `EVALUATE_EVERY` steps
(mlless's default cadence) and broadcasts whether to stop. At the end the ranks compare digests of their
parameters (`replicas_identical`; a difference is named in the note). A rank that dies is reported with its log
(`-X faulthandler` puts its Python stack there).

Figures (`summarise`): seconds to target from the start of training (after rendezvous, data loading and DDP
set-up) and from process launch; RMSE; TCP bytes sent by all ranks (`ss`); cost of P vCPUs for that long at the
papers' VM price (`vm_cost`) and Perf/$ = 1/(seconds x dollars). `mlless_figures` puts an mlless run's curve in the
same figures, costed by the library's own price model (P functions + supervisor + Redis + RabbitMQ).
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import _common
from ._peers import RANK

# The papers' IaaS price (MLLess, Middleware'21, Table 2 and setup): PyTorch ran on B1.4x8 VMs, 4 vCPUs at 0.2 $/h,
# as many workers as vCPUs, billed per second ("conservative ... clearly favors PyTorch").
PAPERS_VM_PER_HOUR = 0.2
PAPERS_VM_VCPUS = 4

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
    from mlless.data.dataset import Dataset

    ds = Dataset.open(config["data"])
    users, items, ratings = _common.ratings(ds)
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
                    loss_v = _common.rmse(model(vu, vi)[0].numpy(), val.ratings, lo, hi)
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
            self.p = torch.nn.Embedding(n_users, RANK, sparse=sparse)
            self.q = torch.nn.Embedding(n_items, RANK, sparse=sparse)
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

    A run whose rank dies is started again, up to `attempts` times in all: torch's sparse backward under gloo has
    aborted with heap corruption ("malloc(): unaligned tcache chunk detected"), which says nothing of DDP's speed.
    If every attempt fails, the row says so (not reached, with the reason)."""
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
    figures = summarise(label, workers, None, None, None, None, None, None, lambda s: vm_cost(workers, s),
                        f"failed {attempts} times: {reason}")
    return {**figures, "points": [], "variant": variant, "settings": asdict(chosen), "target": target, "run_dir": None}


def _attempt(data_dir: Path, dataset: str, workers: int, variant: str, target: float, max_seconds: float,
             prefix: list[str], master_addr: str, master_port: int | None, chosen: Settings, max_epochs: float,
             evaluate_every: int, label: str) -> dict:
    """One launch of run_ddp's ranks; raises RankFailed."""
    data = _common.prepared(data_dir, dataset)
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
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(_common.ROOT), os.environ.get("PYTHONPATH")]))}
        # faulthandler: a rank that gloo or the allocator aborts leaves its Python stack in its log.
        cmd = [sys.executable, "-X", "faulthandler", "-m", "benchmarks._ddp", "--rank-config", str(run / "config.json")]
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
                        lambda s: vm_cost(workers, s), note)
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


def vm_cost(processes: int, seconds: float) -> float:
    """Dollars for `processes` single-core processes running `seconds` at the papers' VM price per vCPU-second."""
    return processes * seconds * PAPERS_VM_PER_HOUR / PAPERS_VM_VCPUS / 3600.0


def summarise(system: str, workers: int, seconds: float | None, from_launch: float | None, epochs: float | None,
              final: float | None, best: float | None, bytes_sent: int | None, cost_of: Callable[[float], float],
              note: str) -> dict:
    """The comparison's figures of one run: cost and Perf/$ at the time to target (training only / from launch)."""
    from mlless.telemetry.cost import perf_per_dollar

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


def mlless_figures(curve: _common.Curve, workers: int, target: float) -> dict:
    """An mlless run's curve in the figures of `summarise`, costed by the library's price model for the time to
    target."""
    summary = curve.summary or {}
    hit = curve.reached(target)
    from mlless.spec.config import PricingConfig
    from mlless.telemetry.cost import job_cost

    pricing = PricingConfig()
    return summarise(curve.system, workers, None if hit is None else hit[0] - (curve.startup or 0.0),
                     None if hit is None else hit[0], None if hit is None else hit[1],
                     summary.get("validation_loss"), curve.best, summary.get("bytes_sent"),
                     lambda s: job_cost(pricing, [s] * workers, s).total, curve.note)


def main(argv: list[str] | None = None) -> int:
    """A rank started by `run_ddp` (`python -m benchmarks._ddp --rank-config FILE`)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank-config", type=Path, required=True)
    args = p.parse_args(argv)
    train_rank(json.loads(args.rank_config.read_text()))
    # Now and then torch aborts the interpreter's exit after destroy_process_group ("terminate called without an
    # active exception", no Python frame): leave without the C++ destructors, the work being done.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
