"""The paper suite's claim 2: ISP vs ISP + the scale-in auto-tuner (and optionally BSP) on PMF, same stop rule.

Every run is `mlless train JOB.yaml --redis-url ... --amqp-url ... --out RUNDIR` (both URLs None for the embedded
broker) with a TrainingJob written here: PMF, the default optimizer, P workers, and

- BSP:          `sync.protocol: bsp`
- ISP:          `sync.protocol: isp`, `significanceThreshold: v` (PMF's default)
- ISP + tuner:  as ISP, plus `autoscaler: {enabled: true, intervalSeconds: I, horizonSeconds: H,
                minWorkers: 1}` (the papers' 20 s / 10 s, scaled to a job of tens of seconds)

Stop rule, identical for every variant: the *smoothed validation* RMSE (the stop rules' EWMA, read every
`evaluation.everySteps` steps on the same held-out rows) at or below a target T, plus `maxSeconds` as a
safety. The papers run "until convergence, defined as a threshold on the observed loss"; the validation loss
is used rather than the per-step training loss because the latter is measured on the P mini-batches of the
step, so its noise grows as workers leave (one worker: 6,250 ratings a step), and it drops at every epoch
boundary as the model meets ratings it has already fitted: a target on it rewards lucky mini-batches and
epochs, not the model. T is `target_loss`, or comes from an ISP pilot without a target: the smoothed
validation RMSE once the pilot has made `pilot_fraction` of the drop from its first evaluation to its best,
i.e. near convergence, where the tuner can act (before the knee it removes nobody, by design).

Per run, from summary.json / metrics.jsonl: time to target (`wall_seconds` when `stop_reason` is "target
loss reached"), the cost under two accountings (`cost_usd`, the whole bill: workers + supervisor + Redis +
RabbitMQ; and `cost_breakdown_usd.workers`, the worker functions only; README, "Cost"), Perf/$ =
1/(seconds × dollars) under each, the validation RMSE of the model handed back, and the workers over time.
Each variant runs `repeats` times, interleaved (ISP, tuner, ISP, ...); medians and min–max spread.

Target (issue "Reproduce the papers' headline results on a network that costs what a cluster's does"): the
tuner's Perf/$ ≥ 1.3x ISP's with time to target ≤ 1.05x and validation RMSE at most 0.005 above ISP's
(papers: 1.4-1.6x). The verdict reads the whole bill; the workers-only ratio is reported beside it.

`run_benchmark(BenchConfig(...))` is paper.py's entry point: it takes the service URLs, so the runs can go through
a rate-limited link, and returns a `BenchResult`.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlless.contract import STOP_TARGET_LOSS
from mlless.stopping.rules import SMOOTHING_SPAN
from mlless.smoothing import ewma
from mlless.spec.models import PMF_V

from . import _common, _runs

VARIANTS = ("BSP", "ISP", "ISP + tuner")
SLUGS = {"BSP": "bsp", "ISP": "isp", "ISP + tuner": "tuner"}


@dataclass(frozen=True)
class Target:
    """The issue's target for the tuner against ISP without it, on medians."""

    perf_per_dollar: float = 1.3  # tuner / ISP, at least
    time_to_target: float = 1.05  # tuner / ISP, at most
    validation_loss: float = 0.005  # tuner − ISP, at most


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark: the variants, how often, on what data, through which services."""

    data: Path  # a prepared dataset (`mlless prepare`)
    out: Path  # job manifests and run directories go here
    redis_url: str | None = _common.REDIS  # both None: the embedded broker
    amqp_url: str | None = _common.AMQP
    variants: tuple[str, ...] = ("ISP", "ISP + tuner")
    repeats: int = 3
    workers: int = 4
    v: float = PMF_V  # ISP significance threshold
    target_loss: float | None = None  # smoothed validation loss; None: from a pilot
    target_steps: int = 1  # steps the smoothed validation loss must stay at or below the target
    evaluate_every: int = 10
    pilot_seconds: float = 40.0
    pilot_fraction: float = 0.97  # of the pilot's drop in smoothed validation loss
    max_seconds: float = 90.0
    interval: float = 1.0  # autoscaler intervalSeconds (papers 20)
    horizon: float = 0.5  # autoscaler horizonSeconds Δ (papers 10)
    target: Target = field(default_factory=Target)

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
        if (self.redis_url is None) != (self.amqp_url is None):
            raise ValueError("give both redis_url and amqp_url, or neither for the embedded broker")


@dataclass(frozen=True)
class Spread:
    median: float | None
    low: float | None
    high: float | None

    @classmethod
    def of(cls, xs: list[float]) -> Spread:
        return cls(statistics.median(xs), min(xs), max(xs)) if xs else cls(None, None, None)


@dataclass(frozen=True)
class VariantSummary:
    runs: int
    reached: int  # runs that stopped on the target
    time_to_target: Spread  # over the runs that reached it
    cost: Spread
    cost_workers: Spread
    perf_per_dollar: Spread
    perf_per_dollar_workers: Spread
    validation_loss: Spread
    worker_seconds: Spread


@dataclass(frozen=True)
class Verdict:
    """Tuner over ISP, medians; `met` under the whole bill, `met_workers` under the workers-only accounting."""

    perf_per_dollar: float
    perf_per_dollar_workers: float
    time_to_target: float
    validation_delta: float
    cost: float
    worker_seconds: float
    met: bool
    met_workers: bool


@dataclass(frozen=True)
class BenchResult:
    config: BenchConfig
    target_loss: float
    pilot_note: str
    runs: list[dict[str, Any]]  # one per run, in the order they ran
    summary: dict[str, VariantSummary]
    verdict: Verdict | None  # None without both ISP and the tuner reaching the target
    # Tuner over ISP run by run (the two runs of a repeat ran back to back, under about the same machine load).
    paired: list[dict[str, float | None]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))


def prepare_data(data_dir: Path, rows: int, users: int, items: int, batch_size: int) -> Path:
    """The synthetic PMF set `mlless prepare --synthetic pmf ...` under data_dir (made once)."""
    return _common.prepare(data_dir / f"pmf-{rows}-{users // 1000}kx{items // 1000}k", "--synthetic", "pmf",
                           "--rows", str(rows), "--users", str(users), "--items", str(items),
                           "--batch-size", str(batch_size))


def write_job(path: Path, name: str, cfg: BenchConfig, variant: str, target: float | None, max_seconds: float) -> None:
    stop: dict[str, Any] = {"maxSeconds": max_seconds}
    if target is not None:
        stop |= {"targetLoss": target, "targetSteps": cfg.target_steps}
    autoscaler = None
    if variant == "ISP + tuner":
        autoscaler = {"enabled": True, "intervalSeconds": cfg.interval, "horizonSeconds": cfg.horizon, "minWorkers": 1}
    _runs.write_pmf_job(path, name=f"bench-tuner-{name}", workers=cfg.workers, data=cfg.data,
                          protocol="bsp" if variant == "BSP" else "isp", v=0.0 if variant == "BSP" else cfg.v,
                          stop=stop, evaluate_every=cfg.evaluate_every, autoscaler=autoscaler)


def evaluations(rows: list[dict]) -> tuple[list[float], list[float]]:
    """(times, losses) of the validation evaluations in a run's metrics.jsonl (a row repeats the newest one)."""
    points = _runs.evaluations(rows)
    return [r["time"] for r in points], [r["validation_loss"] for r in points]


def converged_target(rows: list[dict], fraction: float) -> float:
    """The smoothed validation loss once `fraction` of the drop from the first evaluation to the best is made."""
    _, losses = evaluations(rows)
    if len(losses) < 2:
        raise RuntimeError("the pilot evaluated fewer than twice: lengthen it or evaluate more often")
    smooth = ewma(losses, SMOOTHING_SPAN)
    first, best = float(smooth[0]), float(smooth.min())
    return round(best + (1.0 - fraction) * (first - best), 4)


def workers_timeline(rows: list[dict]) -> str:
    """Run-length encoding of the worker count over time: '4@0s → 3@21.3s → 2@27.0s'."""
    parts, last = [], None
    for r in rows:
        if r["workers"] != last:
            parts.append(f"{r['workers']}@{r['time']:.1f}s")
            last = r["workers"]
    return " → ".join(parts) if parts else "–"


def worker_seconds(rows: list[dict]) -> float:
    """∫ workers dt over the recorded steps (what the tuner lowers)."""
    total, prev_t = 0.0, 0.0
    for r in rows:
        total += r["workers"] * (r["time"] - prev_t)
        prev_t = r["time"]
    return total


def _train(cfg: BenchConfig, variant: str, tag: str, target: float | None, max_seconds: float, stamp: str) -> dict[str, Any]:
    """One run; returns its row (and keeps its metrics rows under `_rows` for the pilot)."""
    name = f"{SLUGS[variant]}-{tag}"
    job, run = cfg.out / f"{name}.yaml", cfg.out / f"run-{stamp}-{name}"
    write_job(job, name, cfg, variant, target, max_seconds)
    load = _common.loadavg()  # other tenants of the machine take CPU from a small pool first: keep it with the run
    services = cfg.redis_url is not None
    _runs.mlless_train(job, run, services=services, redis_url=cfg.redis_url or _common.REDIS,
                       amqp_url=cfg.amqp_url or _common.AMQP)
    s, rows = _runs.summary(run), _runs.rows(run)
    b = s["cost_breakdown_usd"]
    wall = s["wall_seconds"]
    row = {
        "variant": variant, "tag": tag, "stop_reason": s["stop_reason"],
        "time_to_target": wall if s["stop_reason"] == STOP_TARGET_LOSS else None,
        "wall_seconds": wall, "steps": s["steps"], "epochs": s["epochs"],
        "cost": s["cost_usd"], "cost_workers": b["workers"], "cost_fixed": b["supervisor"] + b["redis"] + b["rabbitmq"],
        "perf_per_dollar": s["perf_per_dollar"], "perf_per_dollar_workers": s["perf_per_dollar_workers"],
        "train_loss": s["train_loss"], "validation_loss": s["validation_loss"],
        "worker_seconds": worker_seconds(rows), "workers": workers_timeline(rows),
        "knee_step": (s.get("autoscaler") or {}).get("knee_step"), "load_before": load, "run_dir": str(run),
        "_rows": rows,
    }
    print(f"  {variant:12s} {tag}: {s['stop_reason']}, {wall:.1f}s, {s['steps']} steps, val {s['validation_loss']:.4f}, "
          f"${s['cost_usd']:.5f} (workers ${b['workers']:.5f}), Perf/$ {row['perf_per_dollar']:.4g} "
          f"(workers {row['perf_per_dollar_workers']:.4g}), workers {row['workers']} (load {_common.loadavg()})", flush=True)
    return row


def _summarise(rows: list[dict[str, Any]]) -> VariantSummary:
    def col(key: str) -> list[float]:
        return [r[key] for r in rows if r[key] is not None]
    return VariantSummary(
        runs=len(rows), reached=len(col("time_to_target")), time_to_target=Spread.of(col("time_to_target")),
        cost=Spread.of(col("cost")), cost_workers=Spread.of(col("cost_workers")),
        perf_per_dollar=Spread.of(col("perf_per_dollar")), perf_per_dollar_workers=Spread.of(col("perf_per_dollar_workers")),
        validation_loss=Spread.of(col("validation_loss")), worker_seconds=Spread.of(col("worker_seconds")))


def _verdict(isp: VariantSummary, tuner: VariantSummary, target: Target) -> Verdict | None:
    if not (isp.reached and tuner.reached):
        return None

    def ratio(a: Spread, b: Spread) -> float:
        assert a.median is not None and b.median is not None
        return a.median / b.median

    ppd, ppd_w = ratio(tuner.perf_per_dollar, isp.perf_per_dollar), ratio(tuner.perf_per_dollar_workers, isp.perf_per_dollar_workers)
    ttt = ratio(tuner.time_to_target, isp.time_to_target)
    assert tuner.validation_loss.median is not None and isp.validation_loss.median is not None
    d_val = tuner.validation_loss.median - isp.validation_loss.median
    rest = ttt <= target.time_to_target and d_val <= target.validation_loss
    return Verdict(ppd, ppd_w, ttt, d_val, ratio(tuner.cost, isp.cost), ratio(tuner.worker_seconds, isp.worker_seconds),
                   met=ppd >= target.perf_per_dollar and rest, met_workers=ppd_w >= target.perf_per_dollar and rest)


def run_pilot(cfg: BenchConfig) -> list[dict]:
    """The metrics rows of an ISP run without a target (`pilot_seconds` long): what the targets are read from."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    variant = "ISP" if "ISP" in cfg.variants else cfg.variants[0]
    return _train(cfg, variant, "pilot", None, cfg.pilot_seconds, time.strftime("%H%M%S"))["_rows"]


def run_benchmark(cfg: BenchConfig, pilot: list[dict] | None = None) -> BenchResult:
    """Run the variants `repeats` times each, interleaved, to the same validation target: `target_loss`, or
    `pilot_fraction` of the drop of the `pilot` rows (a pilot is run when none is given)."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%H%M%S")
    target, pilot_note = cfg.target_loss, ""
    if target is None:
        pilot = pilot or run_pilot(cfg)
        target = converged_target(pilot, cfg.pilot_fraction)
        times, losses = evaluations(pilot)
        pilot_note = (f"Target chosen by a {cfg.pilot_seconds:g} s ISP pilot without a target: its smoothed "
                      f"validation RMSE went from {losses[0]:.4f} (at {times[0]:.1f} s) to a best of "
                      f"{min(ewma(losses, SMOOTHING_SPAN)):.4f}; {cfg.pilot_fraction:g} of that drop gives "
                      f"**{target:.4f}**.")
        print(pilot_note, flush=True)
    runs: list[dict[str, Any]] = []
    for rep in range(cfg.repeats):
        for variant in cfg.variants:
            runs.append(_train(cfg, variant, f"r{rep + 1}", target, cfg.max_seconds, stamp))
    for r in runs:
        del r["_rows"]
    summary = {v: _summarise([r for r in runs if r["variant"] == v]) for v in cfg.variants}
    verdict = (_verdict(summary["ISP"], summary["ISP + tuner"], cfg.target)
               if "ISP" in summary and "ISP + tuner" in summary else None)
    return BenchResult(cfg, target, pilot_note, runs, summary, verdict, _paired(runs))


def _paired(runs: list[dict[str, Any]]) -> list[dict[str, float | None]]:
    by_tag = {(r["variant"], r["tag"]): r for r in runs}
    out = []
    for (variant, tag), isp in by_tag.items():
        tuner = by_tag.get(("ISP + tuner", tag))
        if variant != "ISP" or tuner is None:
            continue
        ttt = (tuner["time_to_target"] / isp["time_to_target"]
               if tuner["time_to_target"] is not None and isp["time_to_target"] is not None else None)
        out.append({"perf_per_dollar": tuner["perf_per_dollar"] / isp["perf_per_dollar"],
                    "perf_per_dollar_workers": tuner["perf_per_dollar_workers"] / isp["perf_per_dollar_workers"],
                    "time_to_target": ttt})
    return out


def _fmt_spread(s: Spread, digits: str) -> tuple[str, str]:
    if s.median is None:
        return "–", "–"
    return f"{s.median:{digits}}", f"{s.low:{digits}}–{s.high:{digits}}"


def median_runs(result: BenchResult) -> list[tuple[str, str]]:
    """(variant, run dir) of the median-time run of each variant: the runs a report shows."""
    out = []
    for variant in result.config.variants:
        rs = sorted((r for r in result.runs if r["variant"] == variant), key=lambda r: r["wall_seconds"])
        out.append((variant, rs[(len(rs) - 1) // 2]["run_dir"]))
    return out


def verdict_line(result: BenchResult) -> str:
    v, t = result.verdict, result.config.target
    if v is None:
        return "Tuner vs ISP: no verdict (a variant never reached the target)."
    return (f"Tuner vs ISP (medians): Perf/$ **{v.perf_per_dollar:.2f}x** on the whole bill (target ≥ {t.perf_per_dollar:g}x; "
            f"workers only {v.perf_per_dollar_workers:.2f}x), time to target **{v.time_to_target:.2f}x** (target ≤ "
            f"{t.time_to_target:g}x), validation RMSE Δ **{v.validation_delta:+.4f}** (target ≤ +{t.validation_loss:g}), "
            f"cost {v.cost:.2f}x, worker·s {v.worker_seconds:.2f}x → **{'met' if v.met else 'MISSED'}** "
            f"({'met' if v.met_workers else 'missed'} under the workers-only accounting). Run by run (tuner / ISP of "
            f"the same repeat): Perf/$ " + ", ".join(f"{p['perf_per_dollar']:.2f}x" for p in result.paired)
            + "; time to target " + ", ".join("–" if p["time_to_target"] is None else f"{p['time_to_target']:.2f}x"
                                              for p in result.paired) + ".")


def tables(result: BenchResult) -> str:
    per_run = [(r["variant"], r["tag"], r["stop_reason"], r["time_to_target"], r["steps"], f"{r['epochs']:.2f}",
                f"{r['cost']:.5f}", f"{r['cost_workers']:.5f}", f"{r['cost_fixed']:.5f}", f"{r['perf_per_dollar']:.4g}",
                f"{r['perf_per_dollar_workers']:.4g}", r["validation_loss"], r["worker_seconds"], r["workers"],
                r["load_before"], r["run_dir"].rsplit("/", 1)[-1]) for r in result.runs]
    t1 = _common.table(["variant", "run", "stop reason", "time to target s", "steps", "epochs", "cost $", "workers $",
                        "supervisor+services $", "Perf/$", "Perf/$ workers", "val RMSE", "worker·s",
                        "workers over time (count@seconds)", "load average before", "run dir"], per_run)
    rows2 = []
    for variant, s in result.summary.items():
        rows2.append((variant, f"{s.reached}/{s.runs}", *_fmt_spread(s.time_to_target, ".2f"), *_fmt_spread(s.cost, ".5f"),
                      *_fmt_spread(s.perf_per_dollar, ".4g"), *_fmt_spread(s.perf_per_dollar_workers, ".4g"),
                      *_fmt_spread(s.validation_loss, ".4f"), _fmt_spread(s.worker_seconds, ".0f")[0]))
    t2 = _common.table(["variant", "reached target", "time to target s (median)", "spread", "cost $ (median)", "spread",
                        "Perf/$ (median)", "spread", "Perf/$ workers (median)", "spread", "val RMSE (median)", "spread",
                        "worker·s (median)"], rows2)
    return t1 + "\n\n" + t2
