"""Shared helpers for the benchmark scripts (not a test module; no asserts on wall time).

- `machine_info()`: CPU model, cores, RAM, library versions, load average.
- `table()`: a GitHub-markdown table from rows of values.
- `update_results()`: replace (or append) one script's section of benchmarks/RESULTS.md,
  delimited by ``<!-- BEGIN name -->`` / ``<!-- END name -->``.
- `prepare()`: run ``mlless prepare`` into a data directory unless it is already there.
- `write_pmf_job()` / `mlless_train()`: the PMF TrainingJob the runtime benchmarks run, and running it.
- `mlless_report()`: `mlless report` of labelled run directories.
- `vm_cost()`: the papers' VM price for peers that run on VMs.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import yaml

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
DEFAULT_DATA_DIR = Path(os.environ.get("MLLESS_BENCH_DATA", "/tmp/mlless-bench"))
REDIS = "redis://127.0.0.1:6379/0"
AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"
# The papers' IaaS price (MLLess, Middleware'21, Table 2 and setup): PyTorch ran on B1.4x8 VMs, 4 vCPUs at 0.2 $/h,
# as many workers as vCPUs, billed per second ("conservative ... clearly favors PyTorch"). mlless's own prices are
# `mlless.spec.config.PricingConfig`'s defaults (functions 3.4e-5 $/s, Redis 0.17 $/h, RabbitMQ 0.15 $/h).
PAPERS_VM_PER_HOUR = 0.2
PAPERS_VM_VCPUS = 4


def best_us(fn: Callable[[], Any], budget: float = 0.02, samples: int = 7) -> float:
    """Fastest of `samples` timings of `fn` in µs, each over as many calls as fill about `budget` seconds."""
    start = time.perf_counter()
    fn()
    calls = max(1, int(budget / max(time.perf_counter() - start, 1e-7)))
    fastest = float("inf")
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        fastest = min(fastest, (time.perf_counter() - start) / calls)
    return fastest * 1e6


def single_thread_env() -> None:
    """Pin BLAS/OpenMP pools to one thread (call before importing numpy-heavy libraries)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ram_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return float("nan")


def _version(mod: str) -> str:
    try:
        m = __import__(mod)
        return str(getattr(m, "__version__", "?"))
    except Exception:  # noqa: BLE001 - optional libraries
        return "not installed"


def library() -> str:
    """Where `mlless` was imported from, with the git commit when it is a checkout."""
    try:
        import mlless
    except ImportError:
        return "mlless not importable"
    where = Path(mlless.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "."], capture_output=True,
                               text=True, check=True).stdout.strip()
        return f"{where} (git {commit}{', uncommitted changes' if dirty else ''})"
    except (subprocess.CalledProcessError, OSError):
        return str(where)


def machine_info() -> dict[str, str]:
    return {
        "library": library(),
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "ram": f"{ram_gb():.1f} GB",
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "scipy": _version("scipy"),
        "torch": _version("torch"),
        "surprise": _version("surprise"),
        "sklearn": _version("sklearn"),
        "mlless": _version("mlless"),
        "load": loadavg(),
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    }


#: A 1-minute load average above this share of the cores counts as a busy machine in `load_note`.
BUSY_LOAD = 0.5


def load_note(start: str, end: str | None = None) -> str:
    """One sentence on how busy the machine was, from its load averages (as `loadavg` gives them) at the start and,
    if given, at the end: a busy machine's times are inflated and noisy, and the reader should know which it was."""
    loads = [float(x.split()[0]) for x in (start, end) if x and x != "n/a"]
    cores = os.cpu_count() or 1
    span = " and ".join(f"{x:g}" for x in loads)
    if not loads:
        return "The machine's load was not read."
    if max(loads) > BUSY_LOAD * cores:
        return f"The machine was busy (1-minute load average {span} on {cores} cores): times are inflated and noisy."
    return f"The machine was otherwise idle (1-minute load average {span} on {cores} cores)."


def machine_line(info: dict[str, str] | None = None) -> str:
    i = info or machine_info()
    return (f"{i['date']}; {i['cpu']}, {i['cores']} cores, {i['ram']} RAM; Python {i['python']}, "
            f"numpy {i['numpy']}, torch {i['torch']}, surprise {i['surprise']}, sklearn {i['sklearn']}; "
            f"load average at start {i['load']}; mlless from {i['library']}")


def fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if abs(v) >= 1e5:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:,.1f}"
        return f"{v:.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return "\n".join(lines)


def command_line() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0], HERE.parent)] + sys.argv[1:])


def update_results(name: str, body: str, path: Path = RESULTS) -> None:
    """Replace the section `name` of RESULTS.md with `body` (append it when absent)."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    print(f"updated section '{name}' of {path}")


def prepare(out: Path, *args: str) -> Path:
    """`mlless prepare ... --out OUT` unless OUT already holds a manifest; returns OUT."""
    if (out / "manifest.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "mlless", "prepare", *args, "--out", str(out), "--quiet"]
    print("$ " + " ".join(cmd[2:]).replace("-m mlless", "mlless"), flush=True)
    started = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"  prepared {out} in {time.perf_counter() - started:.1f}s", flush=True)
    return out


def write_pmf_job(path: Path, *, name: str, workers: int, data: Path, protocol: str, stop: dict[str, Any],
                  v: float | None = None, evaluate_every: int = 0, autoscaler: dict[str, Any] | None = None) -> Path:
    """A PMF TrainingJob manifest with batches cached in the workers; `v` sets the ISP threshold."""
    sync: dict[str, Any] = {"protocol": protocol}
    if v is not None:
        sync["significanceThreshold"] = v
    spec: dict[str, Any] = {
        "workers": workers,
        "model": {"type": "pmf"},
        "dataset": {"uri": str(data), "cacheBatches": True},
        "sync": sync,
        "stop": stop,
        "evaluation": {"everySteps": evaluate_every},
    }
    if autoscaler is not None:
        spec["autoscaler"] = autoscaler
    doc = {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name}, "spec": spec}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def mlless_train(job: Path, run: Path, services: bool, *, redis_url: str = REDIS, amqp_url: str = AMQP) -> Path:
    """`mlless train JOB --out RUN -q`, over Redis + RabbitMQ (the local ones by default) or the embedded broker.

    Runs `python -m mlless` with this interpreter and environment: export PYTHONPATH to train with a checkout's
    library rather than the installed one (machine_line() names the one the benchmark imported). Returns RUN.
    """
    subprocess.run(mlless_train_command(job, run, services, redis_url=redis_url, amqp_url=amqp_url), check=True)
    return run


def mlless_train_command(job: Path, run: Path, services: bool, *, redis_url: str = REDIS,
                         amqp_url: str = AMQP) -> list[str]:
    """The command `mlless_train` runs, for a caller that starts it itself (to watch its processes meanwhile)."""
    cmd = [sys.executable, "-m", "mlless", "train", str(job), "--out", str(run), "-q"]
    if services:
        cmd += ["--redis-url", redis_url, "--amqp-url", amqp_url]
    return cmd


def sync_choices(field: str, fallback: Sequence[str] = ()) -> tuple[str, ...]:
    """The values the importable mlless's schema admits for `sync.<field>` ("protocol", "exchange"); `fallback`
    when the schema has no such field (an older library: e.g. only today's all-to-all exchange)."""
    from mlless.spec import schema

    try:
        return schema.choices(f"sync.{field}")
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


def mlless_report(out: Path, runs: Sequence[tuple[str, Path | str]], title: str) -> None:
    """`mlless report` of ``runs`` (label, run directory) into OUT, with this interpreter and environment."""
    cmd = [sys.executable, "-m", "mlless", "report", "--out", str(out), "--title", title]
    for label, _ in runs:
        cmd += ["--label", label]
    subprocess.run(cmd + [str(run) for _, run in runs], check=True)


def vm_cost(processes: int, seconds: float) -> float:
    """Dollars for `processes` single-core processes running `seconds` at the papers' VM price per vCPU-second."""
    return processes * seconds * PAPERS_VM_PER_HOUR / PAPERS_VM_VCPUS / 3600.0


class Stopwatch:
    def __enter__(self) -> "Stopwatch":
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
        self.cpu_seconds = time.process_time() - self.cpu_start


def binary_label(y: float) -> str:
    """A 0/1 label as Vowpal Wabbit's -1/+1."""
    return "1" if y > 0.5 else "-1"


def vw_file(batches: list, path: Path, label: Callable[[float], str] = binary_label) -> Path:
    """The dataset in Vowpal Wabbit's text format (written once; VW's documented input), each row's label
    written by `label`."""
    if path.exists():
        return path
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        for b in batches:
            for row in range(len(b.labels)):
                lo, hi = b.indptr[row], b.indptr[row + 1]
                feats = " ".join(f"{j}:{v:.6g}" for j, v in zip(b.indices[lo:hi].tolist(), b.values[lo:hi].tolist()))
                fh.write(f"{label(float(b.labels[row]))} | {feats}\n")
    tmp.rename(path)
    return path
