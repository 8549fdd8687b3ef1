"""The supervisor's Prometheus metrics: names, labels and values, read back the way Prometheus would."""
from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mlless.telemetry.cost import billed_seconds
from mlless.telemetry.metrics import PHASE_BUCKETS, SupervisorMetrics, billed_units
from mlless.telemetry.rows import StepRow
from mlless.contract import STEP_PHASES as PHASES

JOB = "demo"


def families(text: str) -> dict:
    """Parsed families by name (the parser strips `_total` from counter family names)."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample as {(sample name, labels): value}."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, frozenset({"job": JOB, **labels}.items()))]


def scrape(m: SupervisorMetrics) -> str:
    return generate_latest(m.registry).decode()


def drive(m: SupervisorMetrics) -> None:
    """A short job: two steps, a validation, billing, cost, tuner events."""
    phases = {"fetch": 0.0002, "compute": 0.003, "filter": 0.0004, "write": 0.02, "wait": 0.05, "read": 0.7, "apply": 4.0}
    m.step_closed(step=1, train_loss=1.1, workers=3, bytes_published=1000, entries_filtered=50, phases=phases)
    m.step_closed(step=2, train_loss=0.9, workers=2, bytes_published=500, entries_filtered=25, phases={**phases, "wait": None},
                   staleness=3)
    m.validation(0.95)
    m.worker_invocation_started(0, "pod-0")
    m.worker_billed(0, "pod-0", 0.05)
    m.cost({"workers": 0.001, "supervisor": 0.0005, "redis": 0.0002, "rabbitmq": 0.0001})
    m.tuner_decision("keep")
    m.tuner_decision("remove")
    m.tuner_decision("remove")
    m.knee(40)
    m.rejected_frames(2)
    m.outlook(0.25, 30.0, 0.004, (20.0, 45.0))


@pytest.fixture
def metrics():
    m = SupervisorMetrics(JOB, memory_gb=2.0, granularity=0.1)
    yield m
    m.close()


def test_names_follow_prometheus_conventions(metrics):
    drive(metrics)
    text = scrape(metrics)
    # The text format also lists each counter's and histogram's `_created` timestamp as a gauge family.
    fams = [f for f in text_string_to_metric_families(text) if not f.name.endswith("_created")]
    assert len(fams) == 18
    for f in fams:
        assert f.name.startswith("mlless_"), f.name
        assert f.documentation, f"{f.name} has no HELP text"
        for s in f.samples:
            assert s.labels.get("job") == JOB, s
            if f.type == "counter" and not s.name.endswith("_created"):
                assert s.name.endswith("_total"), s.name
    # Counters carry _total in the exposition itself; nothing else does.
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split()
            assert (kind == "counter") == name.endswith("_total"), line
    # Base units: durations in seconds, sizes in bytes.
    names = {f.name for f in fams}
    assert {"mlless_step_phase_seconds", "mlless_update_bytes", "mlless_worker_billed_seconds"} <= names


def test_outlook_gauges_show_progress_eta_and_projected_cost_and_nan_while_unknown(metrics):
    drive(metrics)
    text = scrape(metrics)
    assert value(text, "mlless_progress_ratio") == 0.25
    assert value(text, "mlless_eta_seconds") == 30.0
    assert value(text, "mlless_projected_cost_usd") == pytest.approx(0.004)
    assert value(text, "mlless_eta_band_seconds", bound="low") == 20.0
    assert value(text, "mlless_eta_band_seconds", bound="high") == 45.0
    metrics.outlook(0.0, None, None)
    text = scrape(metrics)
    assert math.isnan(value(text, "mlless_eta_seconds")) and math.isnan(value(text, "mlless_projected_cost_usd"))
    assert math.isnan(value(text, "mlless_eta_band_seconds", bound="high"))


def test_step_closed(metrics):
    drive(metrics)
    text = scrape(metrics)
    assert value(text, "mlless_steps_total") == 2
    assert value(text, "mlless_train_loss") == pytest.approx(0.9)
    assert value(text, "mlless_validation_loss") == pytest.approx(0.95)
    assert value(text, "mlless_active_workers") == 2
    assert value(text, "mlless_step_staleness") == 3
    assert value(text, "mlless_update_bytes_total") == 1500
    assert value(text, "mlless_filtered_entries_total") == 75


def test_phase_histogram_buckets(metrics):
    drive(metrics)
    fam = families(scrape(metrics))["mlless_step_phase_seconds"]
    assert fam.type == "histogram"
    buckets: dict[str, dict[float, float]] = {}
    for s in fam.samples:
        if s.name.endswith("_bucket"):
            buckets.setdefault(s.labels["phase"], {})[float(s.labels["le"])] = s.value
    assert set(buckets) == set(PHASES)
    for phase, b in buckets.items():
        assert sorted(b) == sorted([*PHASE_BUCKETS, math.inf]), phase  # 0.1 ms .. 10 s, plus +Inf
    assert min(PHASE_BUCKETS) == 0.0001 and max(PHASE_BUCKETS) == 10.0
    # fetch 0.2 ms lands in le=0.00025; apply 4 s in le=5; both steps counted.
    assert buckets["fetch"][0.0001] == 0 and buckets["fetch"][0.00025] == 2
    assert buckets["apply"][2.5] == 0 and buckets["apply"][5.0] == 2
    assert buckets["wait"][math.inf] == 1  # the None timing of step 2 is left out
    counts = {s.labels["phase"]: s.value for s in fam.samples if s.name.endswith("_count")}
    assert counts == {**dict.fromkeys(PHASES, 2.0), "wait": 1.0}


def test_unknown_phase_and_outcome_are_rejected(metrics):
    with pytest.raises(ValueError, match="phase"):
        metrics.step_closed(step=1, train_loss=1.0, workers=1, bytes_published=0, entries_filtered=0, phases={"nap": 1.0})
    with pytest.raises(ValueError, match="outcome"):
        metrics.tuner_decision("maybe")


@pytest.mark.parametrize("seconds, billed", [(0.0, 0.0), (0.05, 0.1), (0.1, 0.1), (0.15, 0.2), (0.3, 0.3), (1.0001, 1.1)])
def test_billed_seconds_round_up_per_started_unit(seconds, billed):
    m = SupervisorMetrics(JOB, granularity=0.1)
    m.worker_billed(1, "pod-1", seconds)
    text = scrape(m)
    assert value(text, "mlless_worker_billed_seconds_total", worker="1", pod="pod-1") == pytest.approx(billed)
    assert billed_units(seconds, 0.1) * 0.1 == pytest.approx(billed_seconds(seconds, 0.1))  # same rule as the cost model


def test_billing_adds_only_the_increment_and_reinvocation_adds_on_top(metrics):
    def billed() -> tuple[float, float]:
        text = scrape(metrics)
        return (
            value(text, "mlless_worker_billed_seconds_total", worker="0", pod="p"),
            value(text, "mlless_worker_billed_gigabyte_seconds_total", worker="0", pod="p"),
        )

    metrics.worker_invocation_started(0, "p")
    assert billed() == (0, 0)  # the series exists before the first billed unit
    history = []
    for duration in (0.05, 0.08, 0.1, 0.15, 0.15, 0.12, 0.95):
        metrics.worker_billed(0, "p", duration)
        history.append(billed())
    assert [s for s, _ in history] == pytest.approx([0.1, 0.1, 0.1, 0.2, 0.2, 0.2, 1.0])
    for s, gbs in history:
        assert gbs == pytest.approx(2.0 * s)  # GB-s = billed seconds x memory
    # A re-invocation of the same worker starts from zero and adds on top.
    metrics.worker_invocation_started(0, "p")
    metrics.worker_billed(0, "p", 0.05)
    assert billed() == pytest.approx((1.1, 2.2))
    metrics.worker_billed(0, "p", 0.25)
    assert billed() == pytest.approx((1.3, 2.6))
    # A different pod of the same worker is its own series.
    metrics.worker_billed(0, "q", 0.01)
    text = scrape(metrics)
    assert value(text, "mlless_worker_billed_seconds_total", worker="0", pod="q") == pytest.approx(0.1)
    assert value(text, "mlless_worker_billed_seconds_total", worker="0", pod="p") == pytest.approx(1.3)


def test_gigabyte_seconds_follow_memory():
    m = SupervisorMetrics(JOB, memory_gb=0.5, granularity=1.0)
    m.worker_billed(3, "w3", 2.2)
    text = scrape(m)
    assert value(text, "mlless_worker_billed_seconds_total", worker="3", pod="w3") == 3.0
    assert value(text, "mlless_worker_billed_gigabyte_seconds_total", worker="3", pod="w3") == 1.5


def test_counters_are_monotonic(metrics):
    seen: dict = {}
    for step in range(1, 30):
        metrics.step_closed(step=step, train_loss=1 / step, workers=3, bytes_published=step * 10, entries_filtered=step, phases={})
        metrics.worker_billed(0, "p", step * 0.037)
        if step == 15:
            metrics.worker_invocation_started(0, "p")
        if step == 20:
            metrics.step_closed(step=10, train_loss=1.0, workers=3, bytes_published=0, entries_filtered=0, phases={})  # late/stale
        metrics.rejected_frames(step % 3)
        for f in text_string_to_metric_families(scrape(metrics)):
            if f.type != "counter":
                continue
            for s in f.samples:
                key = (s.name, frozenset(s.labels.items()))
                assert s.value >= seen.get(key, 0), key
                seen[key] = s.value
    assert value(scrape(metrics), "mlless_steps_total") == 29  # a stale step does not count twice


def test_cost_gauge_by_component(metrics):
    metrics.cost({"workers": 0.003, "supervisor": 0.001, "redis": 0.0005, "rabbitmq": 0.0004})
    text = scrape(metrics)
    got = {c: value(text, "mlless_cost_usd", component=c) for c in ("workers", "supervisor", "redis", "rabbitmq", "total")}
    assert got == pytest.approx({"workers": 0.003, "supervisor": 0.001, "redis": 0.0005, "rabbitmq": 0.0004, "total": 0.0049})
    assert families(text)["mlless_cost_usd"].type == "gauge"
    metrics.cost({"workers": 0.002, "total": 0.01})  # a gauge may go down; an explicit total wins
    text = scrape(metrics)
    assert value(text, "mlless_cost_usd", component="workers") == 0.002
    assert value(text, "mlless_cost_usd", component="total") == 0.01


def test_tuner_metrics(metrics):
    drive(metrics)
    text = scrape(metrics)
    assert value(text, "mlless_tuner_decisions_total", outcome="remove") == 2
    assert value(text, "mlless_tuner_decisions_total", outcome="keep") == 1
    assert value(text, "mlless_tuner_decisions_total", outcome="no-decision") == 0
    assert value(text, "mlless_tuner_knee_step") == 40
    assert value(text, "mlless_rejected_frames_total") == 2


def test_http_scrape_matches_registry(metrics):
    drive(metrics)
    port = metrics.serve(0, "127.0.0.1")
    assert port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    assert value(text, "mlless_steps_total") == 2
    assert value(text, "mlless_worker_billed_gigabyte_seconds_total", worker="0", pod="pod-0") == pytest.approx(0.2)
    assert samples(text) == samples(scrape(metrics)) | {
        k: v for k, v in samples(text).items() if k[0].endswith("_created")
    }
    with pytest.raises(RuntimeError):
        metrics.serve(0, "127.0.0.1")


def test_registries_are_per_job():
    a, b = SupervisorMetrics("a"), SupervisorMetrics("b")  # same names, no "Duplicated timeseries" error
    a.rejected_frames(3)
    assert 'mlless_rejected_frames_total{job="a"} 3.0' in scrape(a)
    assert 'job="a"' not in scrape(b)
    shared = CollectorRegistry()
    SupervisorMetrics("c", registry=shared)
    with pytest.raises(ValueError):
        SupervisorMetrics("d", registry=shared)  # one registry holds one job's metrics


def metrics_from_run(run_dir: Path) -> str:
    """Replays a run record into fresh metrics, as the supervisor fed them live: the record loses nothing
    the live metrics had, apart from the per-worker billing series."""
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = SupervisorMetrics(summary.get("job_id") or summary["job"])
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = StepRow(**json.loads(line))
        metrics.step_closed(
            step=row.step,
            train_loss=math.nan if row.loss is None else row.loss,
            workers=row.workers,
            bytes_published=row.bytes_sent,
            entries_filtered=row.entries_pending,
            phases=row.phases,
        )
        if row.validation_loss is not None:
            metrics.validation(row.validation_loss)
    metrics.validation(summary["validation_loss"])  # the final model's, newer than any snapshot
    metrics.cost({**summary["cost_breakdown_usd"], "total": summary["cost_usd"]})
    metrics.rejected_frames(summary["rejected_frames"])
    return scrape(metrics)


def test_metrics_from_run(tmp_path: Path):
    rows = [
        {"step": 1, "time": 1.0, "epoch": 0.1, "loss": 1.2, "validation_loss": None, "workers": 3, "samples": 30,
         "bytes_sent": 100, "bytes_filtered": 80, "entries_sent": 10, "entries_pending": 10, "cost_usd": 0.001,
         "phases": dict.fromkeys(PHASES, 0.001)},
        {"step": 2, "time": 2.0, "epoch": 0.2, "loss": 1.0, "validation_loss": 1.1, "workers": 2, "samples": 20,
         "bytes_sent": 50, "bytes_filtered": 40, "entries_sent": 5, "entries_pending": 5, "cost_usd": 0.002,
         "phases": {**dict.fromkeys(PHASES, 0.002), "wait": None, "read": None, "apply": None}},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps({
        "job": JOB, "validation_loss": 1.05, "cost_usd": 0.0025, "rejected_frames": 1,
        "cost_breakdown_usd": {"workers": 0.001, "supervisor": 0.0005, "redis": 0.0006, "rabbitmq": 0.0004},
    }))
    text = metrics_from_run(tmp_path)
    assert value(text, "mlless_steps_total") == 2
    assert value(text, "mlless_train_loss") == 1.0
    assert value(text, "mlless_validation_loss") == 1.05
    assert value(text, "mlless_active_workers") == 2
    assert value(text, "mlless_update_bytes_total") == 150
    assert value(text, "mlless_filtered_entries_total") == 15
    assert value(text, "mlless_step_phase_seconds_count", phase="compute") == 2
    assert value(text, "mlless_step_phase_seconds_count", phase="apply") == 1
    assert value(text, "mlless_cost_usd", component="total") == 0.0025
    assert value(text, "mlless_cost_usd", component="redis") == 0.0006
    assert value(text, "mlless_rejected_frames_total") == 1
