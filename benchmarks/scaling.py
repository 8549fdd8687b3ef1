"""Scaling out: time to target and parallel efficiency at P = 1, 2, 3 for each sync protocol × exchange pattern.

For each data set (the 10M Zipf-skewed ratings and the 1M clicks; `--quick`: the 1M ratings and 200k clicks) and
each protocol × exchange pair (default: every `sync.protocol` the importable mlless's schema has and accepts for the
model, and every `sync.exchange`, which is all-to-all alone while the schema has no such field; `--quick`: the
model's default pair and BSP; `--protocols` / `--exchanges` name others as they appear),
at each P of `--workers` (default 1,2,3), one `mlless train` run with only `model.type`, the P, the pair and the
stop rule set, and from it:

* **seconds to target**: the first evaluation in metrics.jsonl at or below the target, from the job's start, and
  from its first step (the start-up subtracted): the time-to-quality suite's rule, and its targets
  (`_peers.pmf_target`: LIBMF's 10-iteration RMSE with 2 threads + 0.01; `_peers.lr_target`: VW's one-pass BCE
  + 0.005);
* **worker CPU-seconds to target**: the workers' processes' user + system CPU (from /proc, sampled every 50 ms
  against the newest step in metrics.jsonl, so it is read at the target's step), summed over the workers;
  with their start-up (imports, loading the batches) and from the first step. Also the workers' *busy* seconds
  (Σ over workers and steps of every phase but `wait`, from metrics.jsonl: wall time, so on an over-committed
  machine it includes being descheduled) and their *billed* seconds (the invocations' durations, which the
  run records only inside `cost_usd`: recovered from it, to the 0.1 s billing granularity);
* **parallel efficiency** T₁ / (P · T_P) against the same pair's P = 1 run, in wall time, and in worker
  CPU-seconds C₁ / C_P (C_P is already the sum over the P workers); each from the job's start and from its
  first step;
* **bytes sent and read per worker per step**, means over the steps up to the target (metrics.jsonl records the bytes sent, summed over workers; a
  row's `bytes_read` is used when the library records one, otherwise it is derived from the pattern:
  all-to-all, each worker reads every peer's update, (P − 1)/P of what was sent) and **the per-step phase
  breakdown** (fetch, compute, filter, write, wait, read, apply: the Report message's timings, means over the
  workers as the supervisor records them; medians over the steps up to the target; the step time is the
  median gap between step closes).

In the same run: LIBMF with 1 and 2 threads on the ratings, Vowpal Wabbit one pass on the clicks, each timed
to the same target (their `fit` / pass as the time-to-quality suite times them).

Then `projection.py` models the same runs (see its docstring): calibrated on them and on a loopback hop measured
in this run, it predicts their time to target (its validation error is reported) and projects P = 4 … 64 on
dedicated cores behind a `--gbit` link (10 Gbit/s); `--reproject JSON` projects a saved run again.

Output: per data set, the markdown tables, and in `--out` scaling.json with every raw figure and each run's
directory.
On this 2-core machine P = 2 and 3 share the cores with the supervisor and the broker: read the CPU-second
figures before the wall-time ones.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import _common, _peers, _runs, netlink, projection

PHASES = ("fetch", "compute", "filter", "write", "wait", "read", "apply")
BUSY = tuple(p for p in PHASES if p != "wait")
EXCHANGE_TODAY = "all-to-all"  # the only pattern before `sync.exchange` exists
DATASETS = {"pmf10m-skew": "pmf", "lr": "logistic-regression"}
QUICK = {"pmf1m-skew": "pmf", "lr200k": "logistic-regression"}
#: Sets run only when named: the dense Higgs-like set of LambdaML's and MLES's dense LR.
OTHERS = {"higgs": "logistic-regression"}
TRANSPORTS = {"embedded": False, "services": True}


# ---- configurations --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    protocol: str
    exchange: str
    transport: str  # "embedded" | "services"

    @property
    def label(self) -> str:
        return f"{self.protocol} × {self.exchange} ({self.transport})"


#: Further spec.sync and spec.optimizer fields for every run (`--sync localSteps=64`, `--optimizer type="normalized"`):
#: none by default, a user gives only model.type.
SYNC_SETTINGS: dict[str, Any] = {}
OPTIMIZER_SETTINGS: dict[str, Any] = {}


def job_doc(name: str, kind: str, data: Path, pair: Pair, workers: int, stop: dict[str, Any]) -> dict[str, Any]:
    """The TrainingJob: only model.type, P, the pair and the stop rule (and `--sync`'s fields); `sync.exchange` only
    where the schema has it."""
    sync: dict[str, Any] = {"protocol": pair.protocol, **SYNC_SETTINGS}
    if _runs.has_spec_field("sync.exchange"):
        sync["exchange"] = pair.exchange
    elif pair.exchange != EXCHANGE_TODAY:
        raise ValueError(f"this mlless has no sync.exchange: only {EXCHANGE_TODAY} runs")
    spec = {"workers": workers, "model": {"type": kind}, "dataset": {"uri": str(data), "cacheBatches": True},
            "sync": sync, "stop": stop} | ({"optimizer": dict(OPTIMIZER_SETTINGS)} if OPTIMIZER_SETTINGS else {})
    return {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name}, "spec": spec}


def pairs_for(kind: str, data: Path, protocols: list[str] | None, exchanges: list[str] | None,
              transports: list[str], workers: list[int]) -> tuple[list[Pair], list[str]]:
    """The pairs to run for `kind` and a line per pair the library refuses (at any of `workers`)."""
    protocols = protocols or list(_runs.sync_choices("protocol"))
    exchanges = exchanges or list(_runs.sync_choices("exchange", [EXCHANGE_TODAY]))
    pairs, refused = [], []
    for protocol in protocols:
        for exchange in exchanges:
            pair = Pair(protocol, exchange, transports[0])
            try:
                why = next((w for w in (_runs.refusal(job_doc("probe", kind, data, pair, p, {"maxSteps": 1}))
                                        for p in workers) if w), None)
            except ValueError as e:
                why = str(e)
            if why:
                refused.append(f"{kind}: {protocol} × {exchange} not run: {why}")
                continue
            pairs += [Pair(protocol, exchange, t) for t in transports]
    return pairs, refused


# ---- one run -----------------------------------------------------------------------------------------------------

def run_pair(kind: str, data: Path, pair: Pair, workers: int, target: float, max_seconds: float, base: Path,
             urls: tuple[str, str]) -> dict[str, Any]:
    name = f"scale-{kind[:3]}-{pair.protocol}-{pair.exchange}-{pair.transport[:3]}-p{workers}"
    doc = job_doc(name, kind, data, pair, workers, _runs.bench_stop({"targetLoss": float(target), "maxSeconds": float(max_seconds)}))
    job = base / f"{name}.yaml"
    job.write_text(json.dumps(doc))  # JSON is YAML
    out = base / f"run-{name}-{int(time.time() * 1000) % 10**8}"
    services = TRANSPORTS[pair.transport]
    svc = _runs.service_pids() if services else {}
    svc_before = {k: sum((_runs.proc_stat(p) or (0, 0.0))[1] for p in v) for k, v in svc.items()}
    load = _common.loadavg()
    busy_before = _runs.machine_busy_seconds()
    started = time.perf_counter()
    proc = subprocess.Popen(_runs.train_command(job, out, services, redis_url=urls[0], amqp_url=urls[1]))
    watcher = _runs.Watcher(proc, out, workers)
    watcher.start()
    rc = proc.wait()
    watcher.stopping.set()
    watcher.join()
    process_seconds = time.perf_counter() - started
    machine_busy = _runs.machine_busy_seconds() - busy_before
    svc_cpu = {k: sum((_runs.proc_stat(p) or (0, 0.0))[1] for p in v) - svc_before[k] for k, v in svc.items()}
    if rc != 0:
        raise subprocess.CalledProcessError(rc, f"mlless train {job}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    result = analyse(rows, summary, watcher, target, workers, pair.exchange, json.loads((out / "job.json").read_text()))
    result.update(pair=asdict(pair), workers=workers, run_dir=str(out), load_before=load,
                  process_seconds=process_seconds, services_cpu_seconds=svc_cpu or None, machine_busy_seconds=machine_busy,
                  batch_size=json.loads((data / "manifest.json").read_text())["batch_size"])
    hit = result["seconds_to_target"]
    print(f"    {pair.label:<36} P={workers}  "
          + (f"target in {hit:6.2f} s ({result['steps_to_target']} steps), worker CPU {result['worker_cpu_to_target']:.2f} s"
             if hit is not None else f"target not reached ({summary['stop_reason']}, best {result['best_loss']:.4f})")
          + f"  load {load}", flush=True)
    return result


def bytes_read_per_worker(row: dict[str, Any], workers: int, exchange: str) -> tuple[float | None, bool]:
    """(bytes read per worker in this step's row, whether it was derived rather than recorded)."""
    if row.get("bytes_read") is not None:
        return row["bytes_read"] / max(1, row["workers"]), False
    if exchange == EXCHANGE_TODAY:
        return row["bytes_sent"] * (row["workers"] - 1) / max(1, row["workers"]), True
    return None, True


def billed_worker_seconds(row: dict[str, Any], pricing: dict[str, Any]) -> float:
    """The workers' billed invocation seconds up to a row, recovered from its cost_usd (telemetry.cost.job_cost)."""
    gb_price = pricing["function_memory_gb"] * pricing["price_per_gb_second"]
    g = pricing["billing_granularity_seconds"]
    t = row["time"]
    supervisor = (math.ceil(t / g - 1e-9) * g if g > 0 else t) * gb_price
    services = t * (pricing["redis_per_hour"] + pricing["rabbitmq_per_hour"]) / 3600.0
    return max(0.0, (row["cost_usd"] - supervisor - services) / gb_price)


def analyse(rows: list[dict], summary: dict, watcher: _runs.Watcher | None, target: float, workers: int, exchange: str,
            job: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run (see the module docstring); pure but for the watcher's samples."""
    startup = summary["startup_seconds"]
    hit = next((i for i, r in enumerate(rows) if r["validation_loss"] is not None and r["validation_loss"] <= target), None)
    upto = rows[: (hit + 1) if hit is not None else len(rows)]
    timed = [r for r in upto if r["phases"].get("wait") is not None] or upto
    phases = {p: statistics.median(r["phases"][p] or 0.0 for r in timed) for p in PHASES} if timed else {}
    gaps = [b["time"] - a["time"] for a, b in zip(upto, upto[1:])]
    busy = sum(sum(r["phases"][p] or 0.0 for p in BUSY) * r["workers"] for r in upto)
    sent = [r["bytes_sent"] / max(1, r["workers"]) for r in upto]
    read = [bytes_read_per_worker(r, workers, exchange) for r in upto]
    read_bytes = [b for b, _ in read if b is not None]  # a row's bytes_read arrives with the next step's report
    samples_to_target = sum(r["samples"] for r in upto)
    out: dict[str, Any] = {
        "target": target,
        "reached": hit is not None,
        "stop_reason": summary["stop_reason"],
        "best_loss": min((r["validation_loss"] for r in rows if r["validation_loss"] is not None), default=math.nan),
        "startup_seconds": startup,
        "seconds_to_target": rows[hit]["time"] if hit is not None else None,
        "from_first_step": rows[hit]["time"] - startup if hit is not None else None,
        "steps_to_target": rows[hit]["step"] if hit is not None else None,
        "epochs_to_target": rows[hit]["epoch"] if hit is not None else None,
        "samples_to_target": samples_to_target if hit is not None else None,
        "step_seconds_median": statistics.median(gaps) if gaps else None,
        "step_seconds_mean": (upto[-1]["time"] - upto[0]["time"]) / (len(upto) - 1) if len(upto) > 1 else None,
        "phases_median": phases,
        # Means, not medians: a protocol that publishes once a round (averaging) sends nothing on most steps.
        "bytes_sent_per_worker_step": statistics.fmean(sent) if sent else None,
        "bytes_read_per_worker_step": statistics.fmean(read_bytes) if read_bytes else None,
        "bytes_read_derived": bool(read and read[0][1]),
        "worker_busy_seconds_to_target": busy if hit is not None else None,
        "worker_billed_seconds_to_target": billed_worker_seconds(rows[hit], job["pricing"]) if hit is not None else None,
        "summary": {k: summary.get(k) for k in ("steps", "epochs", "wall_seconds", "bytes_sent", "samples",
                                                   "cost_usd", "validation_loss", "stop_reason")},
    }
    cpu_hit = cpu_first = (None, None)
    if watcher is not None and hit is not None:
        cpu_hit, cpu_first = watcher.cpu_at(rows[hit]["step"]), watcher.cpu_at(1)
    total = watcher.samples[-1] if watcher is not None and watcher.samples else None
    out.update(
        worker_cpu_to_target=cpu_hit[0],
        worker_cpu_from_first_step=(cpu_hit[0] - cpu_first[0]) if cpu_hit[0] is not None and cpu_first[0] is not None else None,
        supervisor_cpu_to_target=cpu_hit[1],
        supervisor_cpu_from_first_step=(cpu_hit[1] - cpu_first[1]) if cpu_hit[1] is not None and cpu_first[1] is not None else None,
        worker_cpu_whole_run=total[2] if total else None,
        supervisor_cpu_whole_run=total[3] if total else None,
    )
    return out


def add_efficiency(results: list[dict[str, Any]]) -> None:
    """T₁ / (P·T_P) in wall time and C₁ / C_P in worker CPU-seconds, against the same pair's P = 1 run."""
    for r in results:
        one = next((o for o in results if o["pair"] == r["pair"] and o["workers"] == 1), None)
        P = r["workers"]

        def eff(key: str, per_worker: bool) -> float | None:
            if one is None or one.get(key) is None or r.get(key) in (None, 0):
                return None
            return one[key] / ((P if per_worker else 1) * r[key])

        r["efficiency"] = {"wall": eff("seconds_to_target", True), "wall_from_first_step": eff("from_first_step", True),
                           "cpu": eff("worker_cpu_to_target", False),
                           "cpu_from_first_step": eff("worker_cpu_from_first_step", False)}


# ---- tables ------------------------------------------------------------------------------------------------------

def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:.2f}"


def _kb(v: float | None) -> str:
    return "–" if v is None else f"{v / 1e3:,.1f}"


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def tables(title: str, target: float, peers: list[_common.Curve], results: list[dict[str, Any]]) -> str:
    rows = []
    single = next((c.reached(target) for c in peers if c.system.startswith("LIBMF, 1 ")), None)
    for c in peers:
        hit = c.reached(target)
        threads = 2 if c.system.startswith("LIBMF, 2 ") else 1 if c.system.startswith("LIBMF, 1 ") else None
        eff = _x(single[0] / (threads * hit[0])) if threads and single and hit else "–"
        rows.append((c.system, threads or "–", None if hit is None else hit[0], "–", None if hit is None else hit[1],
                     c.note or "–", eff, "–", "–", "–", "–", c.best))
    for r in results:
        e = r["efficiency"]
        rows.append((f"mlless {r['pair']['protocol']} × {r['pair']['exchange']} ({r['pair']['transport']})", r["workers"],
                     r["seconds_to_target"], r["from_first_step"], r["epochs_to_target"], r["steps_to_target"],
                     _x(e["wall"]), _x(e["wall_from_first_step"]), r["worker_cpu_to_target"], r["worker_cpu_from_first_step"],
                     f"{_x(e['cpu'])} / {_x(e['cpu_from_first_step'])}", r["best_loss"]))
    t1 = _common.table(["system", "P", "s to target", "from first step", "epochs", "steps / note", "eff. wall",
                        "eff. wall from 1st step", "worker CPU-s", "worker CPU-s from 1st step", "eff. CPU (/ from 1st step)",
                        "best loss"], rows)
    rows2 = []
    for r in results:
        ph = r["phases_median"]
        rows2.append((f"{r['pair']['protocol']} × {r['pair']['exchange']} ({r['pair']['transport']})", r["workers"],
                      _kb(r["bytes_sent_per_worker_step"]),
                      _kb(r["bytes_read_per_worker_step"]) + (" (derived)" if r["bytes_read_derived"] else ""),
                      _ms(r["step_seconds_median"]), *(_ms(ph.get(p)) for p in PHASES),
                      r["worker_busy_seconds_to_target"], r["worker_billed_seconds_to_target"], r["load_before"]))
    t2 = _common.table(["pair", "P", "sent kB/worker/step", "read kB/worker/step", "step ms", *(f"{p} ms" for p in PHASES),
                        "worker busy-s to target", "worker billed-s to target", "load before"], rows2)
    return (f"#### {title}: target {target:.4f}\n\n{t1}\n\nPer step, up to the target (medians over steps; phases are "
            f"means over the workers):\n\n{t2}\n")


# ---- the suite ---------------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--datasets", help=f"comma list (default {','.join(DATASETS)}; --quick: {','.join(QUICK)}; "
                                      f"also: {','.join(OTHERS)})")
    p.add_argument("--protocols", help="comma list (default: every sync.protocol the schema admits for the model; "
                                       "--quick: the model's default and bsp)")
    p.add_argument("--exchanges", help="comma list (default: every sync.exchange the schema has; --quick: the default)")
    p.add_argument("--workers", default="1,2,3", help="comma list of P (default %(default)s)")
    p.add_argument("--sync", action="append", default=[], metavar="FIELD=VALUE",
                   help="a spec.sync field for every run, its value in JSON (e.g. localSteps=64); repeatable")
    p.add_argument("--optimizer", action="append", default=[], metavar="FIELD=VALUE",
                   help='a spec.optimizer field for every run, its value in JSON (e.g. type=\'"normalized"\'); repeatable')
    p.add_argument("--transports", help="comma list of embedded, services (Redis + RabbitMQ) (default: services; "
                                        "--quick: embedded)")
    p.add_argument("--link", help="a tbf rate (e.g. 200mbit): the services in a netns behind it (netlink.py); "
                                  "implies --transports services")
    p.add_argument("--max-seconds", type=float, help="cap on each mlless run (default 120; --quick: 30)")
    p.add_argument("--target", type=float, help="the validation loss to reach instead of the anchor's (for a set whose "
                                                 "anchor is within reach in a fraction of an epoch)")
    p.add_argument("--no-projection", action="store_true", help="skip projection.py's model")
    p.add_argument("--gbit", type=float, default=10.0, help="the projection's link, Gbit/s (default %(default)s)")
    p.add_argument("--wire-rtt-us", type=float, default=50.0,
                   help="round trip the projection's wire adds to the loopback hop (default %(default)s)")
    p.add_argument("--reproject", type=Path, metavar="JSON", help="only project a saved scaling.json again")


def run_dataset(key: str, kind: str, args: argparse.Namespace, base: Path, urls: tuple[str, str],
                pairs: list[Pair]) -> dict[str, Any]:
    from mlless.data.dataset import Dataset

    data = _common.prepared(args.data_dir, key)
    ds = Dataset.open(str(data))
    print(f"== {key} ({kind})", flush=True)
    if kind == "pmf":
        libmf2 = _peers.run_libmf(ds, 2, 10)
        libmf1 = _peers.run_libmf(ds, 1, 10)
        _, target = _peers.pmf_target(key, ds, libmf2)
        peers = [libmf2, libmf1]
    else:
        vw, target = _peers.lr_target(ds, data)
        peers = [vw]
    target = args.target if args.target is not None else target
    results = []
    for pair in pairs:
        for P in args.workers:
            try:
                results.append(run_pair(kind, data, pair, P, target, args.max_seconds, base, urls))
            except subprocess.CalledProcessError as e:
                print(f"    {pair.label} P={P}: run failed ({e}); skipped", flush=True)
    add_efficiency(results)
    title = _common.ALL_SETS[key].title
    return {"key": key, "kind": kind, "title": title, "target": target, "data": str(data),
            "n_train": ds.manifest.n_train, "batch_size": ds.manifest.batch_size,
            "peers": [{"system": c.system, "points": c.points, "reached": c.reached(target)} for c in peers],
            "runs": results, "table": tables(title, target, peers, results)}


def run(args: argparse.Namespace) -> str:
    from mlless.spec.config import default_sync

    if args.reproject:
        return projection.project(json.loads(args.reproject.read_text()), args.gbit, args.wire_rtt_us)["markdown"]
    args.workers = [int(w) for w in args.workers.split(",")]
    args.max_seconds = args.max_seconds or (30.0 if args.quick else 120.0)
    for settings, given in ((SYNC_SETTINGS, args.sync), (OPTIMIZER_SETTINGS, args.optimizer)):
        for setting in given:
            name, _, value = setting.partition("=")
            settings[name] = json.loads(value)
    sets = QUICK if args.quick else DATASETS
    if args.datasets:
        sets = {k: {**DATASETS, **QUICK, **OTHERS}[k] for k in args.datasets.split(",")}
    transports = (args.transports or ("embedded" if args.quick and not args.link else "services")).split(",")
    if args.link:
        transports = ["services"]
    base = args.data_dir / "scaling"
    base.mkdir(parents=True, exist_ok=True)
    with netlink.limited_link(args.link) as link:
        urls = (link.redis_url, link.amqp_url)
        hop = None
        if not args.no_projection:
            hop = projection.measure_hop(link)
            print(f"hop ({link.description}): {hop['rtt_seconds'] * 1e6:.0f} µs round trip, "
                  f"{hop['bytes_per_second'] * 8 / 1e9:.2f} Gbit/s TCP (redis-py SET {hop['set_mbits']:,.0f} / GET "
                  f"{hop['get_mbits']:,.0f} Mbit/s)", flush=True)
        parts, refusals = [], []
        for key, kind in sets.items():
            data = _common.prepared(args.data_dir, key)
            protocols, exchanges = args.protocols and args.protocols.split(","), args.exchanges and args.exchanges.split(",")
            if args.quick:  # the model's default pair and BSP beside it
                default = default_sync(kind)
                protocols = protocols or list(dict.fromkeys([default.protocol, "bsp"]))
                exchanges = exchanges or [default.exchange]
            pairs, refused = pairs_for(kind, data, protocols, exchanges, transports, args.workers)
            refusals += refused
            for line in refused:
                print("  " + line, flush=True)
            parts.append(run_dataset(key, kind, args, base, urls, pairs))
            print(parts[-1]["table"], flush=True)
        report = {"machine": _common.machine_info(), "command": _common.command_line(), "link": link.description,
                  "hop": hop, "refused": refusals, "datasets": parts}
        md = [f"Link: {link.description}. Seconds from the job's start to the first evaluation at or below the target "
              "(and from the first step); efficiency T₁/(P·T_P) in wall time and C₁/C_P in the workers' summed "
              "CPU-seconds, against the same pair at P = 1. LIBMF / VW: their fit or pass as the time-to-quality "
              "suite times it.", "", *(f"- {line}" for line in refusals), "" if refusals else "",
              *(d["table"] for d in parts)]
        if hop is not None:
            report["projection"] = projection.project(report, args.gbit, args.wire_rtt_us)
            md.append(report["projection"]["markdown"])
    (args.out / "scaling.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return "\n".join(md)
