"""Plain PyTorch and PyTorch DDP (gloo, CPU) on the networks mlless trains: the peers of the networks suite.

Both train what an mlless `neural-net` job trains, the way a PyTorch user would write it:

* the network: `mlless.training.networks.build` (torchvision's builders with GroupNorm, the same code mlless
  trains), initialised under `torch.manual_seed(seed)` as `NeuralNet` does (so the same initial weights);
* the data: the prepared set's batch files, all read into memory first (mlless's `cacheBatches`), in mlless's order
  (`mlless.data.feed.Schedule`: at step s, rank r of P trains the batch at cursor position s·P + r), pixels as
  (pixel − mean) / std per channel with the manifest's statistics;
* the loss: mean cross-entropy; `torch.optim.Adam` (lr 0.001 unless told, PyTorch's other defaults);
* `threads` torch threads per process (one interop thread).

`plain` (one process, no process group): times `warmup` + `steps` steps of the training loop and each step's
parts: fetch (the batch to a normalised tensor), forward and backward, the optimizer's step.

`ddp` (P processes, `DistributedDataParallel` at its defaults over gloo, environment rendezvous on loopback):
trains until rank 0's validation loss is at or below the target (or `max_seconds` of training, or `max_epochs`).
Rank 0 evaluates the whole validation split (512 images at a time, as mlless) every `evaluate_every` steps; the
clock stops while it does (its ranks wait in the next allreduce), so DDP's seconds are training alone, which
favours it: mlless's supervisor evaluates beside its workers, on the same cores. Figures: seconds to target from
the start of training (after rendezvous and loading) and from launch, steps, epochs, validation loss and
accuracy at every evaluation, TCP bytes sent (`ss`), whether the ranks' parameters ended identical.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import _common, _ddp

LAUNCH_SLACK = 180.0  # seconds allowed beyond max_seconds for imports, loading, rendezvous and shutdown
EVAL_ROWS = 512


# ---- inside a process ----------------------------------------------------------------------------------------------

class Data:
    """The prepared set in memory, in mlless's order, as tensors."""

    def __init__(self, uri: str, seed: int) -> None:
        import torch
        from mlless.data.dataset import Dataset
        from mlless.data.feed import Schedule

        self.dataset = ds = Dataset.open(uri)
        self.dims = ds.dims()
        self.shape = (int(self.dims["channels"]), int(self.dims["height"]), int(self.dims["width"]))
        self.classes = int(self.dims["n_classes"])
        self.mean = torch.tensor(self.dims["pixel_mean"], dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(self.dims["pixel_std"], dtype=torch.float32).view(-1, 1, 1)
        self.batches = [ds.batch(i) for i in range(ds.n_batches)]
        self.schedule = Schedule(ds.n_batches, seed)
        val = ds.validation()
        self.val_x, self.val_y = self.tensors(val.images, val.labels)

    def tensors(self, images: np.ndarray, labels: np.ndarray) -> tuple[Any, Any]:
        import torch

        x = (torch.from_numpy(images).to(torch.float32) - self.mean) / self.std
        return x, torch.from_numpy(labels.astype(np.int64))

    def take(self, step: int, world: int, rank: int) -> tuple[Any, Any]:
        """The batch rank `rank` of `world` trains at 0-based step `step`."""
        b = self.batches[self.schedule.batch_index(step * world + rank)]
        return self.tensors(b.images, b.labels)

    def epochs(self, steps: int, world: int) -> float:
        return steps * world / len(self.batches)


def build(network: str, data: Data, seed: int) -> Any:
    import torch
    from mlless.training import networks

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return networks.build(network, [128], None, data.shape, data.classes)


def evaluate(net: Any, data: Data) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) on the validation split, in evaluation mode."""
    import torch
    import torch.nn.functional as F

    net.eval()
    with torch.no_grad():
        z = torch.cat([net(data.val_x[i:i + EVAL_ROWS]) for i in range(0, len(data.val_x), EVAL_ROWS)])
    net.train()
    return float(F.cross_entropy(z, data.val_y)), float((z.argmax(1) == data.val_y).float().mean())


def plain_step(net: Any, optimizer: Any, data: Data, step: int) -> tuple[float, dict[str, float]]:
    """One step of the plain loop on the step's batch: its loss, and the seconds of its fetch, forward and backward,
    optimizer step, and the whole step."""
    import torch.nn.functional as F

    t0 = time.perf_counter()
    x, y = data.take(step, 1, 0)
    t1 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    t2 = time.perf_counter()
    optimizer.step()
    t3 = time.perf_counter()
    return float(loss.detach()), {"fetch": t1 - t0, "forward_backward": t2 - t1, "optimizer": t3 - t2, "step": t3 - t0}


def plain(config: dict[str, Any]) -> dict[str, Any]:
    """`warmup` + `steps` steps of a plain training loop; per-step seconds of each part after the warm-up."""
    import torch

    torch.set_num_threads(config["threads"])
    torch.set_num_interop_threads(1)
    data = Data(config["data"], config["seed"])
    net = build(config["network"], data, config["seed"])
    optimizer = torch.optim.Adam(net.parameters(), lr=config["lr"])
    parts: dict[str, list[float]] = {"fetch": [], "forward_backward": [], "optimizer": [], "step": []}
    losses = []
    for step in range(config["warmup"] + config["steps"]):
        loss, laps = plain_step(net, optimizer, data, step)
        losses.append(loss)
        if step >= config["warmup"]:
            for name, seconds in laps.items():
                parts[name].append(seconds)
    return {"median": {k: statistics.median(v) for k, v in parts.items()},
            "mean": {k: statistics.fmean(v) for k, v in parts.items()}, "losses": losses,
            "parameters": sum(p.numel() for p in net.parameters())}


def side_by_side(config: dict[str, Any]) -> dict[str, Any]:
    """`plain`'s loop and mlless's own pieces of a step, alternating step by step in one process so that both see
    the same load: mlless's replica's gradient (`NeuralNet.gradient`: pixels normalised, forward, backward into the
    flat gradient, its bounds checked) and its optimizer step (`Replica.descend`, the Adam kernel over the flat
    vector), on the same batches. Where a job's step goes beyond these is the job's (messages, the close, the
    worker's loop)."""
    import torch
    from mlless.spec.job import from_manifest
    from mlless.training.replica import Replica
    from mlless.training.warm_start import initial_model

    torch.set_num_threads(config["threads"])
    torch.set_num_interop_threads(1)
    job = from_manifest(config["job"])
    data = Data(config["data"], job.seed)
    net = build(job.model.options["network"], data, job.seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=job.optimizer.learning_rate)
    replica = Replica(initial_model(job, data.dataset), job.optimizer, 0.0)
    parts: dict[str, list[float]] = {name: [] for name in ("plain fetch", "plain forward_backward", "plain optimizer",
                                                           "plain step", "mlless gradient", "mlless descend",
                                                           "mlless step")}
    losses: dict[str, list[float]] = {"plain": [], "mlless": []}
    for step in range(config["warmup"] + config["steps"]):
        loss, laps = plain_step(net, optimizer, data, step)
        losses["plain"].append(loss)
        t3 = time.perf_counter()
        result = replica.gradient(data.batches[data.schedule.batch_index(step)], step + 1)
        t4 = time.perf_counter()
        replica.descend(result.indices, result.values, data.schedule.progress(step))
        t5 = time.perf_counter()
        losses["mlless"].append(result.loss_sum / result.samples)
        if step >= config["warmup"]:
            for name, seconds in [*((f"plain {k}", v) for k, v in laps.items()), ("mlless gradient", t4 - t3),
                                  ("mlless descend", t5 - t4), ("mlless step", t5 - t3)]:
                parts[name].append(seconds)
    return {"median": {k: statistics.median(v) for k, v in parts.items()},
            "mean": {k: statistics.fmean(v) for k, v in parts.items()}, "losses": losses}


def train_rank(config: dict[str, Any]) -> dict[str, Any] | None:
    """One DDP rank; rank 0 evaluates, decides when to stop, and returns the result (the others None)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(config["threads"])
    torch.set_num_interop_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    data = Data(config["data"], config["seed"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    net = build(config["network"], data, config["seed"])
    ddp = DistributedDataParallel(net)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=config["lr"])
    flag = torch.zeros(1)
    dist.barrier()
    started = time.perf_counter()
    startup = time.time() - config["launched"]
    evaluating = 0.0  # seconds rank 0 spent evaluating, off the clock
    points: list[dict[str, float]] = []
    hit: dict[str, float] | None = None
    stop_reason = "max epochs"
    step_seconds: list[float] = []
    max_steps = int(config["max_epochs"] * len(data.batches) / world)
    step = 0
    while step < max_steps:
        t0 = time.perf_counter()
        x, y = data.take(step, world, rank)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        step += 1
        step_seconds.append(time.perf_counter() - t0)
        if step % config["evaluate_every"] == 0:
            if rank == 0:
                e0 = time.perf_counter()
                seconds = e0 - started - evaluating
                loss, accuracy = evaluate(net, data)
                evaluating += time.perf_counter() - e0
                point = {"seconds": seconds, "from_launch": seconds + startup, "step": step,
                         "epochs": data.epochs(step, world), "loss": loss, "accuracy": accuracy}
                points.append(point)
                print(f"    DDP P={world} step {step} {point['epochs']:.2f} ep {seconds:7.1f} s  loss {loss:.4f} "
                      f"acc {accuracy:.3f}", flush=True)
                done = None
                if loss <= config["target"]:
                    hit, done = point, "target reached"
                elif seconds > config["max_seconds"]:
                    done = f"max seconds ({config['max_seconds']:g})"
                if done:
                    stop_reason = done
                flag.fill_(float(done is not None))
            dist.broadcast(flag, src=0)
            if flag.item():
                break
    sent = _ddp.tcp_bytes_sent(os.getpid())
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters())).hexdigest()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (sent, digest))
    dist.destroy_process_group()
    if rank:
        return None
    return {"points": points, "hit": hit, "stop_reason": stop_reason, "steps": step, "startup_seconds": startup,
            "evaluation_seconds": evaluating, "step_seconds_median": statistics.median(step_seconds),
            "bytes_sent": None if any(s is None for s, _ in gathered) else sum(s for s, _ in gathered),
            "replicas_identical": len({d for _, d in gathered}) == 1}


# ---- the launcher --------------------------------------------------------------------------------------------------

def _env(rank: int, world: int, port: int, threads: int) -> dict[str, str]:
    return {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
            "WORLD_SIZE": str(world), "GLOO_SOCKET_IFNAME": _ddp.gloo_interface("127.0.0.1", [], True),
            "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(_common.ROOT), os.environ.get("PYTHONPATH")]))}


def launch(mode: str, config: dict[str, Any], run: Path, world: int, deadline_seconds: float) -> dict[str, Any]:
    """Run `world` processes of `python -m benchmarks._torchnet MODE` on `config`; rank 0's result."""
    run.mkdir(parents=True, exist_ok=True)
    config = {**config, "launched": time.time(), "result": str(run / "result.json")}
    (run / "config.json").write_text(json.dumps(config))
    port = _ddp.free_port("127.0.0.1")
    procs = []
    for rank in range(world):
        cmd = [sys.executable, "-X", "faulthandler", "-m", "benchmarks._torchnet", mode, str(run / "config.json")]
        with open(run / f"rank-{rank}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd, env=_env(rank, world, port, config["threads"]), stdout=log, stderr=subprocess.STDOUT))
    _ddp.wait(procs, run, config["launched"] + deadline_seconds)
    return json.loads((run / "result.json").read_text())


def run_plain(data: Path, network: str, steps: int, warmup: int, base: Path, lr: float = 0.001, seed: int = 0,
              threads: int = 1) -> dict[str, Any]:
    config = {"data": str(data), "network": network, "steps": steps, "warmup": warmup, "lr": lr, "seed": seed,
              "threads": threads}
    run = base / f"plain-{network}-{int(time.time() * 1000) % 10**8}"
    return launch("plain", config, run, 1, LAUNCH_SLACK + 60.0 * (steps + warmup))


def run_side_by_side(job: dict[str, Any], data: Path, steps: int, warmup: int, base: Path,
                     threads: int = 1) -> dict[str, Any]:
    config = {"job": job, "data": str(data), "steps": steps, "warmup": warmup, "threads": threads}
    run = base / f"side-by-side-{int(time.time() * 1000) % 10**8}"
    return launch("side-by-side", config, run, 1, LAUNCH_SLACK + 120.0 * (steps + warmup))


def run_ddp(data: Path, network: str, workers: int, target: float, max_seconds: float, max_epochs: float,
            evaluate_every: int, base: Path, lr: float = 0.001, seed: int = 0, threads: int = 1) -> dict[str, Any]:
    """DDP to `target`; the result of `train_rank`, or {"failed": reason} if a rank died or ran out of time."""
    config = {"data": str(data), "network": network, "target": target, "max_seconds": max_seconds,
              "max_epochs": max_epochs, "evaluate_every": evaluate_every, "lr": lr, "seed": seed, "threads": threads}
    run = base / f"ddp-{network}-p{workers}-{int(time.time() * 1000) % 10**8}"
    try:
        return launch("ddp", config, run, workers, max_seconds * 3 + LAUNCH_SLACK)
    except _ddp.RankFailed as exc:
        print(f"    DDP P={workers}: {exc.reason}", flush=True)
        return {"failed": exc.reason, "points": [], "hit": None}


MODES = {"plain": plain, "side-by-side": side_by_side, "ddp": train_rank}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=list(MODES))
    p.add_argument("config", type=Path)
    args = p.parse_args(argv)
    config = json.loads(args.config.read_text())
    result = MODES[args.mode](config)
    if result is not None:
        Path(config["result"]).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # as _ddp.main: torch may abort the interpreter's exit after destroy_process_group


if __name__ == "__main__":
    raise SystemExit(main())
