"""mlless runs as the suites start and read them: a TrainingJob written, `mlless train` run, its records read.

- `write_job()` / `write_pmf_job()`: a manifest from a spec (the PMF job most runtime benchmarks train);
- `train_command()` / `mlless_train()`: `python -m mlless train` with this interpreter and environment, so it trains
  with the `mlless` the driver imports (export PYTHONPATH to measure a checkout);
- `rows()` / `summary()` / `evaluations()`: a run's metrics.jsonl and summary.json;
- `MllessRun` / `run_mlless()`: a run with only `model.type` (and the P, transport and protocol under test) as a
  `Curve`, timed from the job's start;
- `sync_choices()` / `has_spec_field()` / `refusal()`: what the importable library's schema admits;
- `Watcher`: the CPU seconds of a run's supervisor and worker processes against its newest step.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from . import _common

CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- jobs ---------------------------------------------------------------------------------------------------------

#: What a benchmark's stop block holds unless it says otherwise: its runs go to a target or a budget, which early
#: stopping (on by default with every limit) would cut short; the forecast suite sets its own patience.
BENCH_STOP = {"patience": 0}


def bench_stop(stop: dict[str, Any]) -> dict[str, Any]:
    """`stop` with `BENCH_STOP`'s fields where it leaves them unset."""
    return BENCH_STOP | stop


def write_job(path: Path, name: str, spec: dict[str, Any], kind: str = "TrainingJob") -> Path:
    """The manifest of `spec` at `path` (JSON, which is YAML); a stop block gets `BENCH_STOP`'s defaults."""
    if "stop" in spec:
        spec = spec | {"stop": bench_stop(spec["stop"])}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"apiVersion": "mlless.io/v1alpha1", "kind": kind, "metadata": {"name": name},
                                "spec": spec}, indent=1))
    return path


def write_pmf_job(path: Path, *, name: str, workers: int, data: Path, protocol: str, stop: dict[str, Any],
                  v: float | None = None, evaluate_every: int = 0, autoscaler: dict[str, Any] | None = None,
                  sync: dict[str, Any] | None = None) -> Path:
    """A PMF job with batches cached in the workers; `v` sets the ISP threshold, `sync` further sync fields."""
    sync = {"protocol": protocol, **(sync or {})}
    if v is not None:
        sync["significanceThreshold"] = v
    spec: dict[str, Any] = {"workers": workers, "model": {"type": "pmf"},
                            "dataset": {"uri": str(data), "cacheBatches": True}, "sync": sync, "stop": stop,
                            "evaluation": {"everySteps": evaluate_every}}
    if autoscaler is not None:
        spec["autoscaler"] = autoscaler
    return write_job(path, name, spec)


def train_command(job: Path, run: Path, services: bool, *, redis_url: str = _common.REDIS,
                  amqp_url: str = _common.AMQP, extra: Sequence[str] = ()) -> list[str]:
    """`mlless train JOB --out RUN -q`, over Redis + RabbitMQ at the URLs or the embedded broker."""
    cmd = [sys.executable, "-m", "mlless", "train", str(job), "--out", str(run), "-q", *extra]
    if services:
        cmd += ["--redis-url", redis_url, "--amqp-url", amqp_url]
    return cmd


def mlless_train(job: Path, run: Path, services: bool, *, redis_url: str = _common.REDIS,
                 amqp_url: str = _common.AMQP, env: dict[str, str] | None = None) -> Path:
    """Runs `train_command` to its end (an error if it fails); returns RUN."""
    subprocess.run(train_command(job, run, services, redis_url=redis_url, amqp_url=amqp_url), check=True,
                   env=None if env is None else {**os.environ, **env})
    return run


def rows(run: Path) -> list[dict[str, Any]]:
    """The run's metrics.jsonl, one dict a step (none before it exists)."""
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def recorded(run: Path) -> int:
    """The steps a running job has recorded so far (complete lines of its metrics.jsonl)."""
    path = run / "metrics.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def evaluations(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows at which a new validation loss was recorded (a row repeats the newest evaluation)."""
    from mlless.telemetry.rows import evaluated

    return [r for r, new in zip(records, evaluated(records)) if new]


def mlless_report(out: Path, runs: Sequence[tuple[str, Path | str]], title: str) -> None:
    """`mlless report` of ``runs`` (label, run directory) into OUT."""
    cmd = [sys.executable, "-m", "mlless", "report", "--out", str(out), "--title", title]
    for label, _ in runs:
        cmd += ["--label", label]
    subprocess.run(cmd + [str(run) for _, run in runs], check=True)


# ---- a run with the defaults, as a curve ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MllessRun:
    workers: int
    services: bool
    protocol: str | None  # None: the model's default, as a user would get it
    v: float | None = None  # ISP's significance threshold; None keeps the default, as a user would

    def label(self, kind: str) -> str:
        from mlless.spec.config import default_sync

        v = "" if self.v is None else f" v={self.v:g}"
        protocol = f"default ({default_sync(kind).protocol})" if self.protocol is None else self.protocol.upper()
        return f"mlless P={self.workers} {'Redis+RabbitMQ' if self.services else 'embedded'} {protocol}{v}"


def run_mlless(data: Path, kind: str, run: MllessRun, target: float, max_seconds: float, base: Path,
               urls: tuple[str, str] = (_common.REDIS, _common.AMQP)) -> _common.Curve:
    """`mlless train` with only model.type set (over Redis + RabbitMQ at ``urls`` when ``run.services``); the curve is
    every evaluation in metrics.jsonl, timed from the job's start."""
    name = f"ttq-{kind[:3]}-{run.workers}-{'svc' if run.services else 'emb'}-{run.protocol or 'default'}"
    sync: dict[str, Any] = {} if run.protocol is None else {"protocol": run.protocol}
    if run.v is not None:
        name += f"-v{run.v:g}".replace(".", "-")
        sync["significanceThreshold"] = run.v
    spec = {"workers": run.workers, "model": {"type": kind}, "dataset": {"uri": str(data), "cacheBatches": True},
            **({"sync": sync} if sync else {}), "stop": {"targetLoss": float(target), "maxSeconds": float(max_seconds)}}
    job = write_job(base / f"{name}.yaml", name, spec)
    out = base / f"run-{name}-{int(time.time() * 1000) % 10**8}"
    started = time.perf_counter()
    mlless_train(job, out, run.services, redis_url=urls[0], amqp_url=urls[1])
    process_seconds = time.perf_counter() - started
    s = summary(out)
    curve = _common.Curve(run.label(kind), startup=s["startup_seconds"], summary=s, run_dir=out)
    for row in evaluations(rows(out)):
        curve.add(row["time"], row["epoch"], row["validation_loss"])
    curve.note = (f"stop: {s['stop_reason']}; start-up {s['startup_seconds']:.2f} s; "
                  f"whole process {process_seconds:.1f} s")
    return curve


# ---- what the library admits -----------------------------------------------------------------------------------------

def sync_choices(name: str, fallback: Sequence[str] = ()) -> tuple[str, ...]:
    """The values the importable mlless's schema admits for `sync.<name>` ("protocol", "exchange"); `fallback`
    when the schema has no such field (an older library: e.g. only today's all-to-all exchange)."""
    from mlless.spec import schema

    try:
        return schema.choices(f"sync.{name}")
    except KeyError:
        return tuple(fallback)


def has_spec_field(path: str) -> bool:
    """Whether the importable mlless's schema has the spec field at dotted `path` ("sync.exchange")."""
    from mlless.spec import schema

    node = schema.SPEC_SCHEMA
    for name in path.split("."):
        node = node.get("properties", {}).get(name)
        if node is None:
            return False
    return True


def refusal(doc: dict[str, Any]) -> str | None:
    """None when the importable mlless accepts the TrainingJob `doc` (schema and every pairing rule it checks),
    otherwise its error, on one line."""
    from mlless.spec.job import from_manifest

    try:
        from_manifest(doc)
    except ValueError as e:  # SpecError is a ValueError
        return " ".join(str(e).split())
    return None


# ---- watching a run's processes -------------------------------------------------------------------------------------

def proc_stat(pid: int) -> tuple[int, float] | None:
    """(ppid, user + system CPU seconds) of a process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def worker_pids(job_pid: int) -> dict[int, float]:
    """The worker processes of the `mlless train` process `job_pid`, with their CPU seconds: its `mlless worker`
    children, or forks of its zygote (launch/zygote.py), which are the zygote's children and carry its command line."""
    stats = {int(e.name): st for e in Path("/proc").iterdir() if e.name.isdigit() and (st := proc_stat(int(e.name)))}
    zygotes = {pid for pid, st in stats.items() if st[0] == job_pid and " zygote" in _cmdline(pid)}
    return {pid: st[1] for pid, st in stats.items()
            if st[0] in zygotes or (st[0] == job_pid and " worker" in _cmdline(pid))}


def machine_busy_seconds() -> float:
    """CPU seconds every core of this machine has been busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / CLK_TCK


def service_pids() -> dict[str, list[int]]:
    """Redis and RabbitMQ server processes on this machine (their CPU includes every other user's traffic)."""
    found: dict[str, list[int]] = {"redis": [], "rabbitmq": []}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm == "redis-server":
                found["redis"].append(int(entry.name))
            elif comm == "beam.smp":
                found["rabbitmq"].append(int(entry.name))
    return found


class Watcher(threading.Thread):
    """Samples, every `period` s, the CPU seconds of `mlless train` (supervisor, embedded broker, evaluation) and
    of its worker processes, against the newest step written to the run's metrics.jsonl."""

    def __init__(self, proc: subprocess.Popen, run_dir: Path, workers: int, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.proc, self.metrics, self.workers, self.period = proc, run_dir / "metrics.jsonl", workers, period
        self.worker_cpu: dict[int, float] = {}  # pid -> last seen CPU seconds
        self.samples: list[tuple[float, int, float, float]] = []  # (time, newest step, workers' CPU, supervisor's)
        self.stopping = threading.Event()
        self._offset, self._step, self._last_scan = 0, 0, 0.0

    def _newest_step(self) -> int:
        try:
            with self.metrics.open("rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return self._step
        end = chunk.rfind(b"\n")
        if end >= 0:
            lines = chunk[:end].splitlines()
            self._offset += end + 1
            if lines:
                self._step = json.loads(lines[-1])["step"]
        return self._step

    def _scan_children(self) -> None:
        for pid, cpu in worker_pids(self.proc.pid).items():
            self.worker_cpu.setdefault(pid, cpu)

    def sample(self) -> None:
        now = time.perf_counter()
        if len(self.worker_cpu) < self.workers and now - self._last_scan > 0.2:
            self._scan_children()
            self._last_scan = now
        for pid in self.worker_cpu:
            st = proc_stat(pid)
            if st is not None:
                self.worker_cpu[pid] = st[1]
        sup = proc_stat(self.proc.pid)
        step = self._newest_step()
        prev_sup = self.samples[-1][3] if self.samples else 0.0
        self.samples.append((now, step, sum(self.worker_cpu.values()), sup[1] if sup else prev_sup))

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(self.period)

    def cpu_at(self, step: int) -> tuple[float | None, float | None]:
        """(workers', supervisor's) CPU seconds when the row of `step` was first seen (within one period)."""
        for _, s, w, sup in self.samples:
            if s >= step:
                return w, sup
        return None, None
