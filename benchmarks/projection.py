"""From the runs of the scaling suite to a cluster: time to target at P = 4 … 64 on dedicated cores, 10 Gbit/s.

`scaling.py` calls `measure_hop()` before its runs and `project()` after them; `python -m benchmarks scaling
--reproject OUT/scaling.json --gbit 25 --wire-rtt-us 20` projects a saved report again.

The model (one worker's step, all workers alike; s = bytes a worker sends per step, r(P) = bytes it reads) lives in
`mlless.planning.steptime`, which `mlless plan` fits on a job's run directories too:

    step(P) = local + σ + 3·L + κ·(s + r) + link(P)
    local   = fetch + compute + filter          the run's measured phase medians
    B       = the wire's bandwidth              measured: raw TCP to where the services are; --gbit on the cluster
    L       = one request/response hop          measured: Redis PING round trip (redis-py), plus --wire-rtt-us
                                                on the cluster; 3 hops are on the step's critical path: the
                                                update's write, the report → close round trip, the peers' read
    σ       = the supervisor's close            from P = 1: step − local − L (a lone worker writes and reads nothing)
    κ       = CPU seconds per byte exchanged    from P = 2 (the smallest P > 1 measured): (write + read + apply
                                                − 2·L − (s + r)/B) / (s + r): encode, seal (hash + sign), decode,
                                                scatter-add, copies
    link(P) = max((s + r)/B, P·s/B, P·r/B)      each worker's own link, and the store's link, which carries every
                                                worker's update in (P·s) and every read out (P·r), full duplex
    r(P)    = (P − 1)·s all-to-all              allreduce: one merged frame m = min(P·s, model bytes); scatter-reduce:
                                                (P − 1)/P·m, plus a 1/P share of m written (approximations, for
                                                patterns that do not exist yet)

Time to target = start-up + steps(P) · step(P). steps(P): samples to target N(P) = N₁ · P^β, β fitted in log space
on the measured P (clamped to [0, 1]: a larger global batch, P · batch, never needs fewer samples, nor more than
P times as many); steps = N(P) / (P · batch). Start-up: the P = 1 run's (workers start in parallel).

**Validation** against the measured runs, on this machine: the same formula with the loopback L and B, each
run's own local time and bytes, and its measured steps and start-up, under a roofline for the shared cores:
step ≥ (P·(CPU per step of the P = 1 worker + κ·(s + r)) + supervisor and broker CPU per step) / (cores − the cores the machine's other
work kept busy during the run, from /proc/stat less the run's own processes). On a quiet machine that last term
is ~0 and the figure is a prediction; on a loaded one it mostly checks the CPU model, so the table also gives the
error with it left out. σ comes from P = 1 and κ from P = 2, so those two are in sample for one constant each;
P = 3 is out of sample. Error = predicted / measured − 1 of the training time (from the first step), and of the
time to target with the start-up (measured, so it only dilutes the error).

**Projection** to P = 4 … 64 on dedicated cores (no roofline) and a `--gbit` link: local = the P = 1 run's fetch
+ compute, plus (P > 1) the largest measured P's filter; s = the largest measured P's bytes sent per worker per step.

What it leaves out: the stragglers a barrier waits for, Redis's single thread (at P = 64 it would serialise
P·(s + r) bytes per step through one core), the supervisor's per-report cost as P grows, evaluation (off the
step's path on dedicated cores), and steps(P) beyond P = 3 is an extrapolation of three points.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlless.planning.steptime import fit_beta, fit_kappa, step_seconds

from . import _common, netlink

PROJECT_P = (4, 8, 16, 32, 64)


def measure_hop(link: Any, value_bytes: int = 1 << 20, nbytes: int = 32 << 20, tcp_bytes: int = 128 << 20) -> dict[str, float]:
    """One hop to where the services are (`netlink.Link`): the round trip of a Redis PING (a client request and its
    answer), and the wire's bandwidth, raw TCP each way (harmonic mean: an update is written once and read back).
    Redis SET/GET through redis-py are recorded too; their client's per-byte cost belongs to κ, not to the wire."""
    put, got, ping_us = netlink.measure_redis(link, nbytes, value_bytes=value_bytes)
    up, down = netlink.measure_tcp(link, tcp_bytes)
    mbits = 2 / (1 / up + 1 / down)
    return {"rtt_seconds": ping_us / 1e6, "bytes_per_second": mbits * 1e6 / 8, "tcp_up_mbits": up,
            "tcp_down_mbits": down, "set_mbits": put, "get_mbits": got, "value_bytes": value_bytes}


def _local(run: dict[str, Any]) -> float:
    ph = run["phases_median"]
    return ph["fetch"] + ph["compute"] + ph["filter"]


def calibrate(runs: list[dict[str, Any]], hop: dict[str, float]) -> dict[str, Any] | None:
    """σ, κ, β and the projection's inputs from one pair's runs at several P (those that reached the target)."""
    by_p = {r["workers"]: r for r in runs if r["reached"] and r["step_seconds_median"]}
    if 1 not in by_p:
        return None
    L, B = hop["rtt_seconds"], hop["bytes_per_second"]
    one = by_p[1]
    sigma = max(0.0, one["step_seconds_median"] - _local(one) - L)
    multi = sorted(p for p in by_p if p > 1)
    kappa = 0.0
    if multi:
        two = by_p[multi[0]]
        ph, s, r = two["phases_median"], two["bytes_sent_per_worker_step"], two["bytes_read_per_worker_step"] or 0.0
        kappa = fit_kappa(ph["write"] + ph["read"] + ph["apply"], s, r, L, B)
    largest = by_p[multi[-1]] if multi else one
    return {
        "sigma": sigma, "kappa": kappa, "L": L, "B": B,
        "beta": fit_beta([(p, by_p[p]["samples_to_target"]) for p in by_p]),
        "cpu_step_p1": (one["worker_cpu_from_first_step"] / one["steps_to_target"]
                        if one.get("worker_cpu_from_first_step") else None),
        "samples_p1": one["samples_to_target"], "batch": one["batch_size"], "startup_p1": one["startup_seconds"],
        "local_dedicated": one["phases_median"]["fetch"] + one["phases_median"]["compute"],
        "filter": largest["phases_median"]["filter"],  # a lone worker filters nothing
        "s": largest["bytes_sent_per_worker_step"] if multi else 0.0,
        "calibrated_on": {"sigma": 1, "kappa": multi[0] if multi else None},
    }


def validate(runs: list[dict[str, Any]], cal: dict[str, Any], pattern: str, cores: int) -> list[dict[str, Any]]:
    out = []
    for run in sorted(runs, key=lambda r: r["workers"]):
        if not run["reached"]:
            continue
        P, steps = run["workers"], run["steps_to_target"]
        m = step_seconds(P=P, local=_local(run), sigma=cal["sigma"], kappa=cal["kappa"], pattern=pattern,
                         s=run["bytes_sent_per_worker_step"] or 0.0, L=cal["L"], B=cal["B"])
        others = 0.0  # supervisor (and embedded broker, evaluation) plus the services' CPU per step, measured
        if run.get("supervisor_cpu_from_first_step") is not None:
            others += run["supervisor_cpu_from_first_step"] / steps
        if run.get("services_cpu_seconds"):
            others += sum(run["services_cpu_seconds"].values()) / max(1, run["summary"]["steps"])
        # The cores the machine's other work (other users; this script's own sampling) kept busy meanwhile.
        ours = (run.get("worker_cpu_whole_run") or 0.0) + (run.get("supervisor_cpu_whole_run") or 0.0) \
            + sum((run.get("services_cpu_seconds") or {}).values())
        external = max(0.0, (run.get("machine_busy_seconds") or 0.0) - ours) / run["process_seconds"]
        # A worker's CPU per step: the lone worker's measured CPU per step (its phases are wall time, which on a
        # loaded machine includes waiting for a core), plus κ per byte exchanged.
        worker_cpu = cal["cpu_step_p1"] + m["exchange_cpu"] if cal.get("cpu_step_p1") else m["worker_cpu"]
        quiet = max(m["step"], (P * worker_cpu + others) / cores)
        loaded = max(m["step"], (P * worker_cpu + others) / max(0.25, cores - external))
        measured, measured_train = run["seconds_to_target"], run["from_first_step"]
        out.append({"P": P, "steps": steps, "measured_step": measured_train / steps, "predicted_step": loaded,
                    "predicted_step_quiet": quiet, "external_cores": external,
                    "bound": "cores" if loaded > m["step"] else "path", "measured": measured,
                    "predicted": run["startup_seconds"] + steps * loaded,
                    "error": steps * loaded / measured_train - 1, "error_quiet": steps * quiet / measured_train - 1,
                    "error_with_startup": (run["startup_seconds"] + steps * loaded) / measured - 1,
                    "in_sample": P in cal["calibrated_on"].values()})
    return out


def projection(cal: dict[str, Any], pattern: str, gbit: float, wire_rtt: float, model_bytes: float | None,
               ps: tuple[int, ...] = (1, 2, 3) + PROJECT_P) -> list[dict[str, Any]]:
    L, B = cal["L"] + wire_rtt, gbit * 1e9 / 8
    rows, t1 = [], None
    for P in ps:
        samples = cal["samples_p1"] * P ** cal["beta"]
        steps = samples / (P * cal["batch"])
        m = step_seconds(P=P, local=cal["local_dedicated"] + (cal.get("filter", 0.0) if P > 1 else 0.0),
                         sigma=cal["sigma"], kappa=cal["kappa"], s=cal["s"],
                         pattern=pattern, L=L, B=B, model_bytes=model_bytes)
        t = cal["startup_p1"] + steps * m["step"]
        t1 = t if P == 1 else t1
        rows.append({"P": P, "steps": steps, "step": m["step"], "exchange_share": 1 - m["local"] / m["step"],
                     "link": m["link"], "read_bytes": m["read_bytes"], "seconds": t,
                     "speedup": (t1 / t) if t1 else None, "efficiency": (t1 / (P * t)) if t1 else None})
    return rows


def project(report: dict[str, Any], gbit: float = 10.0, wire_rtt_us: float = 50.0) -> dict[str, Any]:
    """The model of every pair of every data set in a scaling report; returns the figures and their markdown."""
    hop = report["hop"]
    cores = int(report["machine"]["cores"])
    parts = [f"### Projection: {gbit:g} Gbit/s, hop = loopback "
             f"{hop['rtt_seconds'] * 1e6:.0f} µs + {wire_rtt_us:g} µs wire, dedicated cores", "",
             f"Measured hop ({report.get('link', 'loopback')}): Redis PING {hop['rtt_seconds'] * 1e6:.0f} µs, "
             f"wire (TCP) {hop['bytes_per_second'] * 8 / 1e9:.1f} Gbit/s, redis-py SET {hop['set_mbits']:,.0f} / "
             f"GET {hop['get_mbits']:,.0f} Mbit/s. Model and its limits: benchmarks/projection.py's "
             "docstring. Validation on this machine: predicted / measured − 1 of the training time to target (from the "
             f"first step; then with the start-up, which both include), under a roofline for its {cores} shared cores "
             "less the cores other work kept busy during the run (/proc/stat; the quiet-machine column ignores it). "
             "σ is fitted on P = 1 and κ on the smallest P > 1 (in sample); larger P are out of sample.", ""]
    figures = []
    for d in report["datasets"]:
        groups: dict[str, list[dict]] = {}
        for r in d["runs"]:
            groups.setdefault(json.dumps(r["pair"], sort_keys=True), []).append(r)
        for key, runs in groups.items():
            pair = json.loads(key)
            label = f"{d['key']}: {pair['protocol']} × {pair['exchange']} ({pair['transport']})"
            cal = calibrate(runs, hop)
            if cal is None:
                parts += [f"#### {label}", "", "no P = 1 run reached the target: nothing to calibrate on", ""]
                continue
            val = validate(runs, cal, pair["exchange"], cores)
            model_bytes = None
            for r in runs:
                npz = Path(r["run_dir"]) / "model.npz"
                if npz.exists():
                    model_bytes = float(npz.stat().st_size)
            proj = projection(cal, pair["exchange"], gbit, wire_rtt_us / 1e6, model_bytes)
            out_of_sample = [v["error"] for v in val if not v["in_sample"]]  # training time (from the first step)
            figures.append({"dataset": d["key"], "pair": pair, "calibration": cal, "validation": val, "projection": proj,
                            "max_abs_error": max((abs(v["error"]) for v in val), default=None),
                            "max_abs_error_out_of_sample": max(map(abs, out_of_sample), default=None)})
            peers = {p["system"]: p["reached"] for p in d.get("peers", [])}
            peer_line = "; ".join(f"{k} {v[0]:.2f} s" for k, v in peers.items() if v)
            parts += [
                f"#### {label}", "",
                f"σ = {cal['sigma'] * 1e3:.2f} ms, κ = {cal['kappa'] * 1e9:.2f} ns/byte, β = {cal['beta']:.2f} "
                f"(samples to target ∝ P^β), batch {cal['batch']:,}, bytes sent per worker per step {cal['s'] / 1e3:,.1f} kB, "
                f"local {cal['local_dedicated'] * 1e3:.2f} ms/step + filter {cal.get('filter', 0.0) * 1e3:.2f} ms at P > 1." + (f" Same run: {peer_line}." if peer_line else ""), "",
                _common.table(["P", "steps", "measured ms/step", "predicted ms/step", "bound", "other work, cores",
                               "error", "error, quiet-machine model", "measured s to target", "predicted", "error",
                               "calibration"],
                              [(v["P"], v["steps"], f"{v['measured_step'] * 1e3:.2f}", f"{v['predicted_step'] * 1e3:.2f}",
                                v["bound"], f"{v['external_cores']:.2f}", f"{v['error']:+.0%}", f"{v['error_quiet']:+.0%}",
                                v["measured"], v["predicted"], f"{v['error_with_startup']:+.0%}",
                                "in sample" if v["in_sample"] else "out of sample") for v in val]), "",
                _common.table(["P", "steps to target", "step ms", "exchange share", "store link ms", "read MB/worker/step",
                               "s to target", "speed-up vs P = 1", "efficiency"],
                              [(p["P"], round(p["steps"]), f"{p['step'] * 1e3:.2f}", f"{p['exchange_share']:.0%}",
                                f"{p['link'] * 1e3:.2f}", f"{p['read_bytes'] / 1e6:.2f}", p["seconds"],
                                f"{p['speedup']:.2f}x", f"{p['efficiency']:.2f}") for p in proj]), ""]
    return {"gbit": gbit, "wire_rtt_us": wire_rtt_us, "figures": figures, "markdown": "\n".join(parts)}
