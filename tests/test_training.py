"""End to end: a supervisor and real worker processes training over real Redis and RabbitMQ,
and over the embedded transport."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import yaml

from mlless.contract import STOP_BUDGET, STOP_INTERRUPTED, STOP_MAX_EPOCHS, STOP_MAX_SECONDS, STOP_NO_LIVE_WORKERS, STOP_TARGET_LOSS
from mlless.data.dataset import Dataset
from mlless.protocol import keys
from mlless.launch.launcher import LocalLauncher
from mlless.runtime.local import Services, new_job_id, train_local
from mlless.progress import Progress
from mlless.smoothing import RecentEwma
from mlless.stopping.rules import SMOOTHING_SPAN
from mlless.runtime.supervisor.loop import Supervisor
from mlless.runtime.supervisor.membership import WorkerState
from mlless.sync import sync_strategy
from mlless.spec import TrainingJob, from_manifest
from mlless.transport import connect
from mlless.transport.credentials import identity as env_identity  # the session's issuer (tests/conftest.py)

pytestmark = pytest.mark.slow


def manifest(dataset: Path, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mlless.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "test"},
        "spec": {"workers": 3, "model": {"type": "pmf"}, "dataset": {"uri": str(dataset), "cacheBatches": True}, **spec},
    }


def job_for(dataset: Path, **spec: Any) -> TrainingJob:
    return from_manifest(manifest(dataset, **spec))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def job_keys(redis_url: str, job_id: str) -> list[bytes]:
    return list(redis.Redis.from_url(redis_url).scan_iter(match=f"mlless:{job_id}:*"))


QUIET = Progress(enabled=False)


def test_pmf_over_redis_and_rabbitmq_reaches_target_rmse(movielens_dir, tmp_path, redis_url, amqp_url):
    job = job_for(movielens_dir, stop={"maxEpochs": 30, "patience": 0})
    summary = train_local(job, tmp_path, Services(redis_url, amqp_url), QUIET)

    assert summary["stop_reason"] == STOP_MAX_EPOCHS
    assert summary["loss_metric"] == "rmse"
    assert summary["validation_loss"] <= 0.92
    assert summary["workers_initial"] == summary["workers_final"] == 3
    assert summary["rejected_frames"] == 0
    assert job_keys(redis_url, summary["job_id"]) == []
    rows = read_metrics(tmp_path)
    assert len(rows) == summary["steps"]
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert set(rows[1]["phases"]) == {"fetch", "compute", "filter", "write", "wait", "read", "apply"}
    assert any(r["validation_loss"] is not None for r in rows)
    assert (tmp_path / "model.npz").exists()
    for key in ("train_loss", "epochs", "wall_seconds", "samples_per_second", "bytes_sent", "cost_usd"):
        assert summary[key] is not None and summary[key] > 0, key
    # Perf/$ under both accountings: the whole bill, and the worker functions alone (a smaller bill, a larger Perf/$)
    wall, cost = summary["wall_seconds"], summary["cost_usd"]
    assert summary["perf_per_dollar"] == pytest.approx(1 / (wall * cost))
    assert summary["perf_per_dollar_workers"] == pytest.approx(1 / (wall * summary["cost_breakdown_usd"]["workers"]))
    assert summary["perf_per_dollar_workers"] > summary["perf_per_dollar"]


def test_pmf_on_embedded_transport_reaches_target_rmse(movielens_dir, tmp_path):
    summary = train_local(job_for(movielens_dir, stop={"maxEpochs": 30}), tmp_path, Services(), QUIET)
    assert summary["validation_loss"] <= 0.92
    assert summary["workers_final"] == 3


@pytest.mark.parametrize("services", ["embedded", "redis+rabbitmq"])
def test_bsp_keeps_replicas_identical(movielens_dir, tmp_path, redis_url, amqp_url, services):
    svc = Services(redis_url, amqp_url) if services != "embedded" else Services()
    summary = train_local(job_for(movielens_dir, sync={"protocol": "bsp"}, stop={"maxSteps": 40}), tmp_path, svc, QUIET)
    assert summary["steps"] == 40
    # Identical up to float summation order: each worker adds the same updates in a different order.
    assert summary["replica_spread"] < 1e-4


def test_isp_sends_fewer_bytes_than_bsp_and_replicas_diverge_within_bounds(movielens_dir, tmp_path):
    results = {}
    for protocol in ("bsp", "isp"):
        job = job_for(movielens_dir, sync={"protocol": protocol}, stop={"maxSteps": 60})
        results[protocol] = train_local(job, tmp_path / protocol, Services(), QUIET)
    assert results["isp"]["bytes_sent"] * 2 < results["bsp"]["bytes_sent"]
    assert results["isp"]["replica_spread"] > results["bsp"]["replica_spread"]
    assert results["isp"]["validation_loss"] < results["isp"]["train_loss"] + 0.2


def test_a_job_whose_workers_all_diverge_hands_back_its_best_snapshot_and_fails(movielens_dir, tmp_path, capsys):
    from mlless.cli import EXIT_FAILED, main

    # Plain SGD at a step size far too large climbs for a few evaluations, then blows up.
    job = manifest(movielens_dir, workers=1, optimizer={"type": "sgd", "learningRate": 40},
                   evaluation={"everySteps": 2})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["train", str(path), "--out", str(tmp_path / "run")]) == EXIT_FAILED
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == STOP_NO_LIVE_WORKERS and "TrainingDiverged" in summary["dropped_workers"][0]["reason"]
    assert summary["final_validation_loss"] is None  # no replica survived...
    best = summary["best_validation"]
    assert summary["validation_loss"] == best["loss"] < 1.1 and summary["model_step"] == best["step"]  # ...the best did
    assert (tmp_path / "run" / "model.npz").exists() and "the best snapshot" in capsys.readouterr().err


def test_ssp_trains(movielens_dir, tmp_path, redis_url, amqp_url):
    job = job_for(movielens_dir, sync={"protocol": "ssp", "slack": 2}, stop={"maxEpochs": 10})
    summary = train_local(job, tmp_path, Services(redis_url, amqp_url), QUIET)
    assert summary["validation_loss"] < 1.0
    assert summary["rejected_frames"] == 0


def _supervise_with(
    job: TrainingJob, run_dir: Path, redis_url: str, amqp_url: str, during, supervisor_cls: type[Supervisor] = Supervisor
) -> dict[str, Any]:
    """Run a job in-process with a hook that gets the supervisor and launcher while it trains."""
    job_id = new_job_id(job.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    job_file = run_dir / "job.json"
    job_file.write_text(job.to_json())
    env = {"MLLESS_JOB_ID": job_id, "REDIS_URL": redis_url, "AMQP_URL": amqp_url}
    launcher = LocalLauncher(job_file, env, run_dir / "logs", env_identity(os.environ))
    transport = connect(job_id, role="supervisor", redis_url=redis_url, amqp_url=amqp_url)
    supervisor = supervisor_cls(job, job_id, transport, launcher, run_dir, QUIET)
    hook = threading.Thread(target=during, args=(supervisor, launcher), daemon=True)
    hook.start()
    try:
        return supervisor.run()
    finally:
        transport.close()
        hook.join(timeout=5)


def _when_step(supervisor: Supervisor, step: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while supervisor.closed < step and time.monotonic() < deadline:
        time.sleep(0.01)


#: A network the fault tests train beside PMF: small, on the digits, under gradient averaging with Adam (the
#: neural-net defaults), so that a test takes seconds.
NETWORK = {"type": "neural-net", "network": "mlp", "hiddenSizes": [32]}


@pytest.mark.parametrize("model", ["pmf", "network"])
def test_killed_worker_is_dropped_and_job_completes(request, tmp_path, redis_url, amqp_url, model):
    seen = []

    def kill_worker_1(supervisor, launcher):
        seen.append(supervisor)
        _when_step(supervisor, 10)
        os.kill(launcher.pid(1), signal.SIGKILL)

    if model == "network":
        pytest.importorskip("torch")
        job = job_for(request.getfixturevalue("digits_dir"), model=NETWORK, stop={"maxSteps": 80},
                      evaluation={"everySteps": 5})
    else:
        job = job_for(request.getfixturevalue("movielens_dir"), stop={"maxSteps": 80})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, kill_worker_1)
    assert summary["steps"] == 80
    assert [d["rank"] for d in summary["dropped_workers"]] == [1]
    # The job still wants 3 workers, so the supervisor starts a replacement; whether its process is up in time to
    # join before step 80 depends on the machine, so count the joins rather than assume them.
    assert [e["event"] for e in summary["scaling_events"]][:1] == ["launch"]
    joins = sum(e["event"] == "join" for e in summary["scaling_events"])
    assert summary["workers_final"] == 2 + joins
    assert job_keys(redis_url, summary["job_id"]) == []
    rows = read_metrics(tmp_path)
    assert rows[-1]["workers"] == 2 + joins
    if model == "pmf":
        assert summary["validation_loss"] < 1.1
        return
    # Gradient averaging: the killed worker's gradient of the step it died in is in no close, the survivors step
    # by the mean of theirs, and a replacement that joins in time takes its donor's Adam state: the replicas stay
    # equal to the last bit.
    assert job.sync.protocol == "gradient-averaging" and summary["replica_spread"] == 0.0
    # It trained on after the kill: the final model against the newest evaluation before it.
    at_kill = [r["validation_loss"] for r in rows if r["step"] <= 10 and r["validation_loss"] is not None]
    assert at_kill and summary["final_validation_loss"] < at_kill[-1] - 0.2, (at_kill, summary["final_validation_loss"])
    assert summary["validation_scores"]["accuracy"] > 0.6  # chance is 0.1
    # What a suspend or a Ctrl-C would have the job resume from: the final replicas' model, and the Adam state they
    # share, which took one step per step closed.
    [supervisor] = seen
    checkpoint = supervisor.evaluation.final_checkpoint(summary["steps"], supervisor.cursor)
    assert checkpoint.optimizer is not None and int(checkpoint.optimizer["t"][0]) == summary["steps"]


def test_stalled_worker_is_dropped_after_timeout(movielens_dir, tmp_path, redis_url, amqp_url):
    def stall_worker_0(supervisor, launcher):
        _when_step(supervisor, 3)
        os.kill(launcher.pid(0), signal.SIGSTOP)

    # Steps take milliseconds here, so the hook may see step 3 late: with 30 steps it once stopped the worker as the
    # job ended, and the job waited out the stopped worker's replica instead of dropping it from a step.
    job = job_for(movielens_dir, stop={"maxSteps": 120}, liveness={"workerTimeoutSeconds": 2})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, stall_worker_0)
    assert summary["steps"] == 120
    assert [d["rank"] for d in summary["dropped_workers"]] == [0]
    assert "no report" in summary["dropped_workers"][0]["reason"]
    # As above: a replacement is started, and joins if its process is up before the end.
    assert summary["workers_final"] == 2 + sum(e["event"] == "join" for e in summary["scaling_events"])


def test_logistic_regression_learns(synthetic_lr_dir, tmp_path):
    doc = manifest(synthetic_lr_dir, model={"type": "logistic-regression"}, stop={"maxEpochs": 5})
    summary = train_local(from_manifest(doc), tmp_path, Services(), QUIET)
    assert summary["loss_metric"] == "bce"
    labels = Dataset.open(str(synthetic_lr_dir)).validation().labels
    p = labels.mean()
    base_rate_bce = -(p * np.log(p) + (1 - p) * np.log(1 - p))
    assert summary["validation_loss"] < base_rate_bce - 0.05


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlless", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_cli_train_then_evaluate(movielens_dir, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(manifest(movielens_dir, workers=2, stop={"maxEpochs": 5})))
    proc = _cli("train", str(job_file), "--out", str(tmp_path / "run"))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err.decode()
    assert b"validation rmse" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    evaluate = _cli("evaluate", str(tmp_path / "run" / "model.npz"), str(movielens_dir))
    out, err = evaluate.communicate(timeout=60)
    assert evaluate.returncode == 0, err.decode()
    assert json.loads(out)["validation"] == pytest.approx(summary["validation_loss"], rel=1e-5)


@pytest.mark.parametrize("workers", ["0", "-1", "100000"])
def test_cli_workers_override_passes_the_schema(movielens_dir, tmp_path, workers):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(manifest(movielens_dir)))
    proc = _cli("train", str(job_file), "--workers", workers, "--out", str(tmp_path / "run"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert b"spec.workers:" in err and b"Traceback" not in err
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


def test_cli_rejects_invalid_manifest_naming_the_field(movielens_dir, tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(manifest(movielens_dir, sync={"protocol": "gossip"})))
    proc = _cli("train", str(job_file))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert b"spec.sync.protocol" in err and b"Traceback" not in err


def test_a_ctrl_c_during_the_command_s_imports_ends_in_one_line(monkeypatch, capsys):
    import builtins
    from mlless.__main__ import run

    imported = builtins.__import__

    def interrupted(name, *args, **kwargs):
        if name == "mlless.cli":
            raise KeyboardInterrupt  # as a Ctrl-C lands while `mlless` imports its parts
        return imported(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert run() == 130
    assert capsys.readouterr().err == "mlless: interrupted\n"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupt_stops_cleanly_and_deletes_keys(movielens_dir, tmp_path, redis_url, amqp_url, sig):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(manifest(movielens_dir, stop={"maxEpochs": 10000, "patience": 0})))
    run_dir = tmp_path / "run"
    proc = _cli("train", str(job_file), "--out", str(run_dir), "--redis-url", redis_url, "--amqp-url", amqp_url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"Traceback" not in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stop_reason"] == STOP_INTERRUPTED
    assert job_keys(redis_url, summary["job_id"]) == []
    # Every worker process ended with the job.
    pids = subprocess.run(["pgrep", "-f", f"MLLESS_JOB_ID={summary['job_id']}"], capture_output=True)
    assert pids.stdout == b""


class CorruptingSupervisor(Supervisor):
    """Replaces worker 2's published update with garbage after its report, before the step closes."""

    corrupt_steps = range(4, 8)

    def _close(self, step, reports):
        if step in self.corrupt_steps:
            self.transport.put(keys.update(2, step, sync_strategy(self.job.sync).staleness), b"MLs\x01not a frame")
        return super()._close(step, reports)


def test_malformed_update_frame_is_rejected_counted_and_not_applied(movielens_dir, tmp_path, redis_url, amqp_url):
    job = job_for(movielens_dir, sync={"protocol": "bsp"}, stop={"maxSteps": 20})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, lambda s, l: None, CorruptingSupervisor)
    assert summary["steps"] == 20
    assert summary["dropped_workers"] == []
    # Workers 0 and 1 each refused worker 2's frame at each corrupted step.
    assert summary["rejected_frames"] == 2 * len(CorruptingSupervisor.corrupt_steps)
    # Worker 2 kept its own updates, the others never got them: the replicas differ (BSP would be identical).
    assert summary["replica_spread"] > 1e-3
    assert np.isfinite(summary["validation_loss"])


@pytest.mark.parametrize(
    ("stop", "reason"),
    [
        ({"targetLoss": 0.95, "targetSteps": 5}, STOP_TARGET_LOSS),
        # Patience off: a limit is what these test, and early stopping would end the job before it.
        ({"maxSeconds": 2, "patience": 0}, STOP_MAX_SECONDS),
        ({"budgetUSD": 0.0015, "maxEpochs": 1000, "patience": 0}, STOP_BUDGET),
    ],
)
def test_stop_rules(movielens_dir, tmp_path, stop, reason):
    summary = train_local(job_for(movielens_dir, stop=stop), tmp_path, Services(), QUIET)
    assert summary["stop_reason"] == reason
    rows = read_metrics(tmp_path)
    if "targetLoss" in stop:
        # The target is read on the smoothed validation loss, which must have stayed at or below it since the
        # streak began; the stop comes targetSteps (5) steps after the snapshot that began it, before the next evaluation.
        evaluations = [(r["step"], r["validation_loss"]) for k, r in enumerate(rows)
                       if r["validation_loss"] is not None and (k == 0 or r["validation_loss"] != rows[k - 1]["validation_loss"])]
        window = RecentEwma(SMOOTHING_SPAN)
        smoothed = [window.update(v) for _, v in evaluations]
        streak = len(smoothed)
        while streak > 0 and smoothed[streak - 1] <= 0.95:
            streak -= 1
        assert streak < len(smoothed), "the smoothed validation loss never reached the target"
        began = evaluations[streak][0]  # the row showing the evaluation: at or after the snapshot's step
        assert began < rows[-1]["step"] <= began + 5 + 25
    if "maxSeconds" in stop:
        assert 2 <= rows[-1]["time"] < 10
    if "budgetUSD" in stop:
        assert rows[-1]["cost_usd"] >= 0.0015 > rows[-2]["cost_usd"]


def test_supervisor_and_worker_entry_points_over_services(movielens_dir, tmp_path, redis_url, amqp_url):
    """What the pods run: `mlless supervisor` with workers started separately, sharing only a job id."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(manifest(movielens_dir, workers=2, stop={"maxSteps": 30})))
    env = {**os.environ, "MLLESS_JOB_ID": new_job_id("pods"), "REDIS_URL": redis_url, "AMQP_URL": amqp_url}
    supervisor = _cli("supervisor", "--job", str(job_file), "--out", str(tmp_path / "run"), "--metrics-port", "0", env=env)
    workers = [_cli("worker", "--job", str(job_file), "--rank", str(rank), env=env) for rank in range(2)]
    _, err = supervisor.communicate(timeout=120)
    assert supervisor.returncode == 0, err.decode()
    for worker in workers:
        assert worker.wait(timeout=30) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 30 and summary["workers_final"] == 2
    assert job_keys(redis_url, summary["job_id"]) == []


def test_prometheus_metrics_of_a_real_run(movielens_dir, tmp_path, redis_url, amqp_url):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    seen = {}
    job = job_for(movielens_dir, stop={"maxSteps": 25})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, lambda s, l: seen.setdefault("supervisor", s))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(seen["supervisor"].metrics.registry).decode())
        for s in family.samples
    }
    job_label = ("job", summary["job_id"])
    assert samples[("mlless_steps_total", (job_label,))] == 25
    billed = {dict(k[1])["worker"]: v for k, v in samples.items() if k[0] == "mlless_worker_billed_seconds_total"}
    assert set(billed) == {"0", "1", "2"} and all(v > 0 for v in billed.values())
    gbs = {dict(k[1])["worker"]: v for k, v in samples.items() if k[0] == "mlless_worker_billed_gigabyte_seconds_total"}
    assert gbs == pytest.approx({w: 2 * s for w, s in billed.items()})
    assert samples[("mlless_update_bytes_total", (job_label,))] == summary["bytes_sent"]


def test_worker_gives_up_when_the_supervisor_is_gone(movielens_dir, tmp_path, redis_url, amqp_url):
    """A function must not bill forever waiting for a supervisor that died."""
    from mlless.protocol.framing import decode
    from mlless.protocol.messages import Failed, Hello

    job_file = tmp_path / "job.json"
    job_file.write_text(job_for(movielens_dir, liveness={"workerTimeoutSeconds": 0.5}).to_json())
    job_id = new_job_id("orphan")
    silent_supervisor = connect(job_id, role="supervisor", redis_url=redis_url, amqp_url=amqp_url)
    try:
        env = {**os.environ, "MLLESS_JOB_ID": job_id, "REDIS_URL": redis_url, "AMQP_URL": amqp_url}
        worker = _cli("worker", "--job", str(job_file), "--rank", "0", env=env)
        assert worker.wait(timeout=60) == 1
        messages = [decode(silent_supervisor.receive(timeout=5)) for _ in range(2)]
        assert isinstance(messages[0], Hello)
        assert isinstance(messages[1], Failed) and "no message from the supervisor" in messages[1].reason
    finally:
        silent_supervisor.delete_job()
        silent_supervisor.close()


class _FailsAtStep40(Supervisor):
    """A supervisor with a bug: its close of step 40 raises."""

    def _close(self, step, reports):
        if step == 40:
            raise ZeroDivisionError("a bug at step 40")
        return super()._close(step, reports)


def test_an_unexpected_supervisor_error_still_ends_the_job_cleanly(movielens_dir, tmp_path, redis_url, amqp_url):
    """Issue #22: any exception in the supervisor's loop ends the job as a failure, with the workers' replicas
    handed in, summary.json and the model written, and the job's keys deleted."""
    from mlless.runtime.supervisor.failover import failed as _failed

    job = job_for(movielens_dir, sync={"protocol": "isp"}, stop={"maxSteps": 400}, evaluation={"everySteps": 5})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, lambda s, l: None, supervisor_cls=_FailsAtStep40)
    assert summary["stop_reason"] == "internal error: ZeroDivisionError: a bug at step 40"
    assert summary["steps"] == 39 and summary["dropped_workers"] == []
    assert json.loads((tmp_path / "summary.json").read_text())["stop_reason"] == summary["stop_reason"]
    assert (tmp_path / "model.npz").exists() and summary["validation_loss"] is not None
    assert _failed(summary)  # `mlless train` exits 1
    assert job_keys(redis_url, summary["job_id"]) == []


class InterruptedAsItsWorkersStart(Supervisor):
    """Ctrl-C once the workers have connected, before the close that starts them: none has closed a step."""

    def _await_workers(self, ranks, state, timeout, exit_reason):
        super()._await_workers(ranks, state, timeout, exit_reason)
        if state == WorkerState.STARTING:
            raise KeyboardInterrupt


def test_workers_that_never_closed_a_step_publish_their_final_replicas_when_the_job_stops(movielens_dir, tmp_path,
                                                                                          redis_url, amqp_url):
    # A replica frame carried the newest closed step, -1 here, which no frame may: each worker failed on it.
    job = job_for(movielens_dir, stop={"maxSteps": 20})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, lambda s, l: None, InterruptedAsItsWorkersStart)
    assert summary["stop_reason"] == STOP_INTERRUPTED and summary["steps"] == 0
    assert summary["dropped_workers"] == [], summary["dropped_workers"]
    assert summary["workers_final"] == job.workers
