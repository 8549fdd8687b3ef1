"""The pure parts of the scaling suite (benchmarks/scaling.py, benchmarks/projection.py): which pairs run, what a
run's records give, and the model's arithmetic. No runs, no timings asserted (the benchmark's business)."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

# The benchmarks are a package at the repository's root (`python -m benchmarks`).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _runs, projection, scaling  # noqa: E402
from mlless.planning import steptime  # noqa: E402

PRICING = {"function_memory_gb": 2.0, "price_per_gb_second": 1.7e-05, "billing_granularity_seconds": 0.1,
           "redis_per_hour": 0.17, "rabbitmq_per_hour": 0.15}
PHASES = {"fetch": 0.0, "compute": 0.004, "filter": 0.001, "write": 0.002, "wait": 0.003, "read": 0.001, "apply": 0.001}


def test_default_pairs_are_what_the_schema_admits(tmp_path):
    pairs, refused = scaling.pairs_for("pmf", tmp_path, None, None, ["embedded"], [1, 2, 3])
    assert {p.protocol for p in pairs} | {line.split()[1] for line in refused} == set(_runs.sync_choices("protocol"))
    assert {p.exchange for p in pairs} <= set(_runs.sync_choices("exchange", [scaling.EXCHANGE_TODAY]))
    assert all(p.transport == "embedded" for p in pairs)


def test_a_pair_the_library_refuses_is_reported_not_run(tmp_path):
    pairs, refused = scaling.pairs_for("pmf", tmp_path, ["no-such-protocol"], None, ["embedded"], [2])
    assert pairs == [] and "no-such-protocol" in refused[0]


def test_the_job_carries_only_the_pair_and_what_it_must(tmp_path):
    doc = scaling.job_doc("j", "pmf", tmp_path, scaling.Pair("bsp", "all-to-all", "embedded"), 2, {"maxSteps": 3})
    assert set(doc["spec"]) == {"workers", "model", "dataset", "sync", "stop"}
    assert doc["spec"]["model"] == {"type": "pmf"}
    assert _runs.refusal(doc) is None
    if not _runs.has_spec_field("sync.exchange"):
        assert doc["spec"]["sync"] == {"protocol": "bsp"}
        with pytest.raises(ValueError):
            scaling.job_doc("j", "pmf", tmp_path, scaling.Pair("bsp", "allreduce", "embedded"), 2, {})


def _row(step, t, val=None, workers=2, cost=0.0, **phases):
    return {"step": step, "time": t, "epoch": step / 10, "loss": 1.0, "validation_loss": val, "workers": workers,
            "samples": 100 * workers, "bytes_sent": 1000 * workers, "cost_usd": cost, "phases": {**PHASES, **phases}}


def test_analyse_reads_the_target_step_bytes_and_phases():
    rows = [_row(1, 1.0), _row(2, 1.1, 0.9), _row(3, 1.2, 0.5), _row(4, 1.3, 0.4, wait=None, read=None, apply=None)]
    out = scaling.analyse(rows, {"startup_seconds": 0.9, "stop_reason": "target loss reached"}, None, 0.6, 2,
                          "all-to-all", {"pricing": PRICING})
    assert out["reached"] and out["steps_to_target"] == 3 and out["seconds_to_target"] == 1.2
    assert out["from_first_step"] == pytest.approx(0.3)
    assert out["samples_to_target"] == 600
    assert out["bytes_sent_per_worker_step"] == 1000 and out["bytes_read_per_worker_step"] == 1000
    assert out["bytes_read_derived"]
    assert out["step_seconds_median"] == pytest.approx(0.1)
    assert out["phases_median"]["compute"] == 0.004
    busy = sum(v for k, v in PHASES.items() if k != "wait") * 2 * 3
    assert out["worker_busy_seconds_to_target"] == pytest.approx(busy)


def test_a_recorded_bytes_read_wins_over_the_derived_one():
    row = {**_row(1, 1.0), "bytes_read": 5000}
    assert scaling.bytes_read_per_worker(row, 2, "allreduce") == (2500, False)
    assert scaling.bytes_read_per_worker(_row(1, 1.0, workers=3), 3, "all-to-all") == (2000, True)
    assert scaling.bytes_read_per_worker(_row(1, 1.0), 2, "allreduce") == (None, True)


def test_billed_seconds_are_recovered_from_the_cost():
    gb = PRICING["function_memory_gb"] * PRICING["price_per_gb_second"]
    t, billed = 2.0, 3.7
    cost = billed * gb + t * gb + t * (0.17 + 0.15) / 3600
    assert scaling.billed_worker_seconds({"time": t, "cost_usd": cost}, PRICING) == pytest.approx(billed)


def test_efficiency_is_against_the_same_pairs_single_worker():
    pair = {"protocol": "bsp", "exchange": "all-to-all", "transport": "embedded"}
    runs = [{"pair": pair, "workers": P, "seconds_to_target": t, "from_first_step": t - 1, "worker_cpu_to_target": c,
             "worker_cpu_from_first_step": c - 1} for P, t, c in ((1, 4.0, 3.0), (2, 2.5, 4.0))]
    scaling.add_efficiency(runs)
    assert runs[1]["efficiency"]["wall"] == pytest.approx(4 / (2 * 2.5))
    assert runs[1]["efficiency"]["cpu"] == pytest.approx(3 / 4)
    assert runs[0]["efficiency"]["wall"] == 1.0


def test_the_model_reads_every_peer_all_to_all_and_the_store_link_caps_it():
    kw = dict(local=0.001, sigma=0.0005, kappa=1e-9, s=1e6, pattern="all-to-all", L=1e-4, B=1.25e9)
    one, two, many = (projection.step_seconds(P=P, **kw) for P in (1, 2, 64))
    assert one["read_bytes"] == 0 and one["link"] == 0 and one["step"] == pytest.approx(0.001 + 0.0005 + 1e-4)
    assert two["read_bytes"] == 1e6
    assert many["read_bytes"] == 63e6 and many["link"] == pytest.approx(64 * 63e6 / 1.25e9)
    assert steptime.bytes_read("allreduce", 4, 1e6, 2e6) == (2e6, 0.0)


def test_beta_fits_a_power_law_and_is_clamped():
    assert steptime.fit_beta([(1, 100.0), (2, 200.0 * 2 ** -0.5), (3, 300.0 * 3 ** -0.5)]) == pytest.approx(0.5)
    assert steptime.fit_beta([(1, 100.0), (2, 50.0)]) == 0.0
    assert steptime.fit_beta([(1, 100.0), (2, 800.0)]) == 1.0
    assert math.isclose(steptime.fit_beta([(1, 100.0)]), 0.0)
