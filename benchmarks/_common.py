"""What every suite shares: the machine's header, tables, timers, and the data sets prepared once under the data dir.

- `machine_info()` / `machine_line()` / `load_note()`: CPU, cores, RAM, library versions and path, load average;
- `table()` / `fmt()`: GitHub-markdown tables;
- `own_redis()`: a private redis-server for the duration of a block;
- `prepare()` / `prepared()`: `mlless prepare` into the data dir unless it is already there; `DATASETS`, `QUICK`,
  `MODEL_SETS`: the sets the suites share, by key;
- `Curve`: a system's validation loss after each unit of training, and when it first reached a target;
- `rmse()` / `bce()` / `ratings()` / `all_batches()`: what the peers and mlless are scored with.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = Path(os.environ.get("MLLESS_BENCH_DATA", "/tmp/mlless-bench"))
REDIS = "redis://127.0.0.1:6379/0"
AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"
#: A 1-minute load average above this share of the cores counts as a busy machine in `load_note`.
BUSY_LOAD = 0.5


class Failed(RuntimeError):
    """A suite that found a failure (a fuzz finding): its report, printed and written before the driver exits 1."""


# ---- the machine ------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def own_redis() -> Iterator[str]:
    """A private redis-server on a free loopback port, its URL, stopped on exit: for runs that would hold a shared
    Redis (a Lua merge of tens of MB answers every other client BUSY meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not start")
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
        return str(getattr(__import__(mod), "__version__", "?"))
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
        "library": library(), "cpu": cpu_model(), "cores": str(os.cpu_count()), "ram": f"{ram_gb():.1f} GB",
        "python": platform.python_version(), "numpy": _version("numpy"), "scipy": _version("scipy"),
        "torch": _version("torch"), "surprise": _version("surprise"), "sklearn": _version("sklearn"),
        "mlless": _version("mlless"), "load": loadavg(),
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
    }


def machine_line(info: dict[str, str] | None = None) -> str:
    i = info or machine_info()
    return (f"{i['date']}; {i['cpu']}, {i['cores']} cores, {i['ram']} RAM; Python {i['python']}, "
            f"numpy {i['numpy']}, torch {i['torch']}, surprise {i['surprise']}, sklearn {i['sklearn']}; "
            f"load average at start {i['load']}; mlless from {i['library']}")


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


def command_line() -> str:
    """This run's command, as a reader would type it from the repository's root."""
    return "python -m benchmarks " + " ".join(sys.argv[1:])


# ---- tables and timers ------------------------------------------------------------------------------------------

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


class Stopwatch:
    def __enter__(self) -> "Stopwatch":
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
        self.cpu_seconds = time.process_time() - self.cpu_start


def single_thread_env() -> None:
    """Pin BLAS/OpenMP pools to one thread in this process's children (and in this one, before numpy is imported)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ.setdefault(var, "1")


# ---- data ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataSet:
    key: str
    title: str
    prepare_args: tuple[str, ...]


DATASETS = {
    "movielens": DataSet("movielens", "MovieLens sample (100k ratings)", ("--sample", "movielens-small")),
    "pmf10m": DataSet("pmf10m", "synthetic 10M ratings, uniform ids",
                      ("--synthetic", "pmf", "--rows", "10000000", "--users", "70000", "--items", "10000", "--skew", "0")),
    "pmf10m-skew": DataSet("pmf10m-skew", "synthetic 10M ratings, Zipf 0.8 ids",
                           ("--synthetic", "pmf", "--rows", "10000000", "--users", "70000", "--items", "10000")),
    "lr": DataSet("lr", "synthetic Criteo-layout clicks, 1M rows, 2^18 features", ("--synthetic", "lr", "--rows", "1000000")),
    "higgs": DataSet("higgs", "synthetic Higgs-like dense set, 1M rows, 28 features",
                     ("--synthetic", "higgs", "--rows", "1000000")),
}
#: The small sets every `--quick` run uses.
QUICK = {
    "movielens": DATASETS["movielens"],
    "pmf1m-skew": DataSet("pmf1m-skew", "synthetic 1M ratings, Zipf 0.8 ids",
                          ("--synthetic", "pmf", "--rows", "1000000", "--users", "20000", "--items", "4000")),
    "lr200k": DataSet("lr200k", "synthetic Criteo-layout clicks, 200k rows", ("--synthetic", "lr", "--rows", "200000")),
}
#: The models of issue #23: (mlless model, `mlless prepare --synthetic` set, the quality compared).
MODEL_CASES = {
    "svm": ("svm", "lr", "accuracy"),
    "linear-regression": ("linear-regression", "regression", "rmse"),
    "softmax": ("softmax", "multiclass", "accuracy"),
    "dense-lr": ("logistic-regression", "higgs", "accuracy"),
    "kmeans": ("kmeans", "blobs", "inertia"),
}
MODEL_SETS = {case: DataSet(case, f"{case} on synthetic {synthetic}, 200k rows", ("--synthetic", synthetic, "--rows", "200000"))
              for case, (_, synthetic, _) in MODEL_CASES.items()}
ALL_SETS = {**DATASETS, **QUICK, **MODEL_SETS}
#: The model type of each ratings or clicks set.
KINDS = {"movielens": "pmf", "pmf1m-skew": "pmf", "pmf10m": "pmf", "pmf10m-skew": "pmf",
         "lr200k": "logistic-regression", "lr": "logistic-regression", "higgs": "logistic-regression"}


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


def prepared(data_dir: Path, key: str) -> Path:
    """Data set `key` prepared under `data_dir` (once), where every suite that shares these sets looks for it."""
    return prepare(data_dir / f"ttq-{key}", *ALL_SETS[key].prepare_args)


def all_batches(ds: Any) -> list:
    return [ds.batch(i) for i in range(ds.n_batches)]


def ratings(ds: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bs = all_batches(ds)
    return (np.concatenate([b.users for b in bs]), np.concatenate([b.items for b in bs]),
            np.concatenate([b.ratings for b in bs]).astype(np.float32))


def rmse(pred: np.ndarray, truth: np.ndarray, lo: float | None, hi: float | None) -> float:
    if lo is not None:
        pred = np.clip(pred, lo, hi)
    return float(np.sqrt(np.mean((pred.astype(np.float64) - truth) ** 2)))


def bce(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p.astype(np.float64), 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


@dataclass
class Curve:
    """One system's validation loss after each unit of training (iteration / epoch / evaluation)."""

    system: str
    points: list[tuple[float, float, float]] = field(default_factory=list)  # (seconds, epochs, loss)
    note: str = ""
    startup: float | None = None  # mlless: seconds before the first step (process start, workers connecting)
    summary: dict | None = None  # mlless: the run's summary.json (cost, bytes sent, final loss)
    run_dir: Path | None = None  # mlless: where the run wrote metrics.jsonl and summary.json

    def add(self, seconds: float, epochs: float, loss: float) -> None:
        self.points.append((seconds, epochs, loss))
        print(f"    {self.system:<34} {epochs:6.2f} ep {seconds:8.2f} s  loss {loss:.4f}", flush=True)

    def reached(self, target: float) -> tuple[float, float] | None:
        for seconds, epochs, loss in self.points:
            if loss <= target:
                return seconds, epochs
        return None

    @property
    def best(self) -> float:
        return min((p[2] for p in self.points), default=math.nan)
