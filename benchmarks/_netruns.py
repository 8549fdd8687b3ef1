"""mlless `neural-net` jobs as the networks suite runs and reads them.

- `job_doc()`: the TrainingJob: the network, P, Adam's rate, the sync fields under test, the stop rule and the
  evaluation cadence (`dataset.cacheBatches` on, as the peers hold the set in memory);
- `pinning()`: how a job gets `threads` torch threads per worker: `MLLESS_CPU_CORES` where the library reads it,
  else the job's CPU affinity at its start (a worker takes its share of the cores it may run on,
  training/models/network.py `torch_threads`); `Unpinner` then gives the job's processes every core back once its
  first step is recorded, so that its workers keep their thread counts but neither they nor the supervisor (its
  evaluations) are held to the cores they started on;
- `run_job()`: `mlless train` with the CPU watcher of `_runs`, its records read back;
- `step_figures()`: the median step and its phases after a warm-up, and the bytes per worker-step.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from . import _common, _runs, scaling

PHASES = scaling.PHASES


def job_doc(name: str, data: Path, network: str, workers: int, stop: dict[str, Any], evaluate_every: int,
            sync: dict[str, Any] | None = None, lr: float = 0.001, seed: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "workers": workers, "seed": seed, "model": {"type": "neural-net", "network": network},
        "dataset": {"uri": str(data), "cacheBatches": True}, "optimizer": {"type": "adam", "learningRate": lr},
        "stop": stop, "evaluation": {"everySteps": evaluate_every}}
    if sync:
        spec["sync"] = dict(sync)
    return {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name}, "spec": spec}


def cpu_cores_variable() -> str | None:
    """The environment variable that sets a network worker's torch threads, if this mlless has one."""
    try:
        from mlless import contract
    except ImportError:
        return None
    return getattr(contract, "ENV_CPU_CORES", None)


def pinning(workers: int, threads: int) -> tuple[dict[str, str], set[int] | None, str]:
    """(environment, the cores to start the job on or None, a note) that give each of `workers` workers `threads`
    torch threads."""
    variable = cpu_cores_variable()
    if variable:
        return {variable: str(threads)}, None, f"{variable}={threads}"
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) // workers == threads:
        return {}, None, f"{threads} thread{'s' * (threads > 1)} a worker (its share of {len(cores)} cores)"
    if threads * workers > len(cores):
        return {}, None, f"{max(1, len(cores) // workers)} thread(s) a worker: {threads} × P is more than the cores"
    chosen = set(cores[:threads * workers])
    return {}, chosen, (f"{threads} thread{'s' * (threads > 1)} a worker: the job started on {len(chosen)} of "
                        f"{len(cores)} cores, all given back after its first step")


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _runs.proc_stat(int(entry.name))):
            children.setdefault(st[0], []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


class Unpinner(threading.Thread):
    """Once the job's first step is recorded, sets every thread of its processes to run on `cores` again."""

    def __init__(self, proc: subprocess.Popen, run_dir: Path, cores: set[int]) -> None:
        super().__init__(daemon=True)
        self.proc, self.run_dir, self.cores = proc, run_dir, cores
        self.done = False

    def run(self) -> None:
        while self.proc.poll() is None and not _runs.recorded(self.run_dir):
            time.sleep(0.05)
        for pid in descendants(self.proc.pid):
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    os.sched_setaffinity(int(task.name), self.cores)
                except OSError:  # gone meanwhile
                    pass
        self.done = True


def run_job(doc: dict[str, Any], base: Path, services: bool, threads: int = 1,
            target: float | None = None, redis_url: str = _common.REDIS) -> dict[str, Any]:
    """Run the job; its records, and with `target` the figures of `scaling.analyse` (time to it, CPU, phases)."""
    name = doc["metadata"]["name"]
    spec = doc["spec"]
    why = _runs.refusal(doc)
    if why:
        print(f"    {name}: refused: {why}", flush=True)
        return {"name": name, "refused": why}
    job = _runs.write_job(base / f"{name}.yaml", name, spec)
    out = base / f"run-{name}-{int(time.time() * 1000) % 10**8}"
    env, start_on, note = pinning(spec["workers"], threads)
    load = _common.loadavg()
    started = time.perf_counter()
    proc = subprocess.Popen(_runs.train_command(job, out, services, redis_url=redis_url), env={**os.environ, **env},
                            preexec_fn=None if start_on is None else lambda: os.sched_setaffinity(0, start_on))
    if start_on is not None:
        Unpinner(proc, out, os.sched_getaffinity(0)).start()
    watcher = _runs.Watcher(proc, out, spec["workers"])
    watcher.start()
    rc = proc.wait()
    watcher.stopping.set()
    watcher.join()
    process_seconds = time.perf_counter() - started
    rows = _runs.rows(out)
    summary = _runs.summary(out) if (out / "summary.json").exists() else {}
    result: dict[str, Any] = {
        "name": name, "workers": spec["workers"], "sync": spec.get("sync", {}), "run_dir": str(out), "rc": rc,
        "threads_note": note, "load_before": load, "load_after": _common.loadavg(),
        "process_seconds": process_seconds, "summary": summary, "rows": rows,
        "curve": [(r["time"], r["epoch"], r["step"], r["validation_loss"]) for r in _runs.evaluations(rows)],
        "scores": summary.get("validation_scores") or {},
        "worker_cpu_whole_run": watcher.samples[-1][2] if watcher.samples else None,
    }
    if rc != 0 or not summary:
        print(f"    {name}: mlless train exited {rc} ({summary.get('stop_reason', 'no summary')})", flush=True)
    if target is not None and rows and summary:
        job_json = json.loads((out / "job.json").read_text())
        exchange = spec.get("sync", {}).get("exchange", scaling.EXCHANGE_TODAY)
        result["analysis"] = scaling.analyse(rows, summary, watcher, target, spec["workers"], exchange, job_json)
    return result


def step_figures(rows: list[dict[str, Any]], skip: int) -> dict[str, Any]:
    """Median step (the gap between closes) and phases over the rows after the first `skip`, with `other`, the
    step less its phases; mean bytes sent and read per worker-step."""
    later = rows[skip:]
    gaps = [b["time"] - a["time"] for a, b in zip(rows[max(skip - 1, 0):], rows[max(skip, 1):])]
    timed = [r for r in later if all(r["phases"].get(p) is not None for p in PHASES)]
    phases = {p: statistics.median(r["phases"][p] for r in timed) for p in PHASES} if timed else {}
    step = statistics.median(gaps) if gaps else None
    sent = [r["bytes_sent"] / max(1, r["workers"]) for r in later]
    read = [r["bytes_read"] / max(1, r["workers"]) for r in later if r.get("bytes_read") is not None]
    return {"step": step, "steps_timed": len(gaps), "phases": phases,
            "other": None if step is None or not phases else step - sum(phases.values()),
            "sent": statistics.fmean(sent) if sent else None, "read": statistics.fmean(read) if read else None}
