"""`mlless plan`: the planner on recorded runs of a real small job at P = 1 and 2, its choice, its JSON, its bad input."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from mlless.contract import STOP_INTERRUPTED, STOP_MAX_EPOCHS, STOP_MAX_SECONDS
from mlless.cli import main as mlless_main
from mlless.planning.cli import PILOT_SECONDS, plan, worker_counts
from mlless.planning.model import FAR_EXTRAPOLATION, Link, _extrapolation_note, choose
from mlless.planning.measures import PlanError, measure
from mlless.planning.stoprule import samples_when_stop_fires
from mlless.progress import Progress
from mlless.runtime.local import Services, train_local
from mlless.spec import TrainingJob, load_manifest
from mlless.spec.config import StopConfig
from mlless.stopping.forecast import MIN_EVALUATIONS
from mlless.stopping.rules import ValidationWatch

EMBEDDED = Link(0.0, math.inf, "embedded")
COUNTS = [1, 2, 3, 4]


def write_job(path: Path, dataset: Path, model: str = "logistic-regression") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "plan"},
        "spec": {"workers": 1, "model": {"type": model}, "dataset": {"uri": str(dataset), "cacheBatches": True},
                 "evaluation": {"everySteps": 5}, "stop": {"maxEpochs": 8, "patience": 3}}}))
    return path


@pytest.fixture(scope="module")
def recorded(synthetic_lr_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Path]]:
    """The job file and its run directories at P = 1 and 2, trained for real (embedded transport)."""
    base = tmp_path_factory.mktemp("plan")
    job = write_job(base / "job.yaml", synthetic_lr_dir)
    runs = {}
    for P in (1, 2):
        runs[P] = base / f"run-p{P}"
        train_local(load_manifest(job, {"workers": P}), runs[P], Services(), Progress(enabled=False))
    return job, runs


def _plan(recorded, deadline=None, budget=None) -> dict:
    job, runs = recorded
    return plan(load_manifest(job), [measure(runs[1]), measure(runs[2])], COUNTS, EMBEDDED, 2, deadline, budget)


def test_a_run_s_evaluations_are_read_at_the_steps_their_snapshots_were_taken(recorded):
    # everySteps 5: a snapshot is asked for at a step close 5 or more steps after the last one (more when
    # evaluating would take too much of the time); its loss reaches the record at the step it arrived, mostly a
    # step or more later, but on the same step's row when the donor's snapshot came before that close's row was
    # written (a busy machine: the supervisor descheduled between asking and recording); its samples are those
    # trained by the snapshot's step.
    rows = [json.loads(line) for line in (recorded[1][1] / "metrics.jsonl").read_text().splitlines()]
    arrived = {}
    for row in rows:
        if row["validation_step"] is not None:
            arrived.setdefault(row["validation_step"], row["step"])
    assert len(arrived) >= 3
    taken = list(arrived)
    assert taken[0] == 5 and min(np.diff(taken)) >= 5
    assert all(step >= taken for taken, step in arrived.items())
    trained = dict(zip((r["step"] for r in rows), np.cumsum([r["samples"] for r in rows]).tolist()))
    assert [n for n, _ in measure(recorded[1][1]).evaluations] == [trained[step] for step in taken]


@pytest.mark.slow
def test_the_table_has_a_finite_positive_prediction_per_worker_count(recorded):
    result = _plan(recorded)
    preds = result["predictions"]
    assert [p["workers"] for p in preds] == COUNTS
    for p in preds:
        for k in ("seconds", "cost_usd", "perf_per_dollar", "steps", "epochs", "step_seconds", "startup"):
            assert math.isfinite(p[k]) and p[k] > 0, (p["workers"], k, p[k])
        assert p["epochs"] <= 8 + 1e-9  # the job's maxEpochs
        assert p["perf_per_dollar"] == pytest.approx(1 / (p["seconds"] * p["cost_usd"]))
    assert [p["measured"] for p in preds] == [True, True, False, False]
    # In sample, the model gives back roughly what the runs took (it can miss: the start-up is a shared fit, the
    # samples to stop a fit over P), and a measured P's step is its run's.
    job = load_manifest(recorded[0])
    steps = {}
    for P, run in recorded[1].items():
        wall = json.loads((run / "summary.json").read_text())["wall_seconds"]
        assert preds[P - 1]["seconds"] == pytest.approx(wall, rel=0.5)
        steps[P] = measure(run).step_at_cadence(job.evaluate_every)
        assert (preds[P - 1]["step_seconds"], preds[P - 1]["bound"]) == (pytest.approx(steps[P]), "run")
    # Past the runs, the step is never below the line through theirs (its slope at least 0).
    for p in preds[2:]:
        assert p["step_seconds"] >= steps[2] + max(0.0, steps[2] - steps[1]) * (p["workers"] - 2) - 1e-12
    # More workers cost more per second: the bill's rate grows with P.
    rates = [p["cost_usd"] / p["seconds"] for p in preds]
    assert rates == sorted(rates)
    assert result["choice"] is None


@pytest.mark.slow
def test_past_the_runs_workers_sharing_the_cores_slow_the_step_by_their_share(recorded):
    # On 2 cores, P workers and the supervisor are (P + 1)/2 processes to a core: the line through the runs' steps
    # per share (1 at P = 1, 1.5 at P = 2) times the share at P is a floor; with cores to spare it is the line.
    job = load_manifest(recorded[0])
    runs = [measure(recorded[1][1]), measure(recorded[1][2])]
    steps = {r.workers: r.step_at_cadence(job.evaluate_every) for r in runs}
    few, many = (plan(job, runs, [3, 4], EMBEDDED, cores, None, None)["predictions"] for cores in (2, 64))
    for on_two, on_many in zip(few, many):
        P = on_two["workers"]
        shared = (steps[1] + max(0.0, steps[2] / 1.5 - steps[1]) * (P - 1)) * (P + 1) / 2
        line = steps[1] + max(0.0, steps[2] - steps[1]) * (P - 1)
        assert on_two["step_seconds"] >= shared - 1e-12 and on_two["step_seconds"] >= on_many["step_seconds"]
        if shared > max(line, on_many["step_seconds"]):  # shared binds, unless the cores' roofline is higher still
            assert ((on_two["step_seconds"], on_two["bound"]) == (pytest.approx(shared), "shared")
                    or (on_two["bound"] == "cores" and on_two["step_seconds"] > shared))
        assert on_many["bound"] != "shared" or on_many["step_seconds"] == pytest.approx(line)


def test_a_deadline_picks_the_cheapest_count_that_meets_it_and_a_budget_the_fastest_within_it(recorded):
    preds = _plan(recorded)["predictions"]
    deadline = sorted(p["seconds"] for p in preds)[1]  # two counts meet it
    result = _plan(recorded, deadline=deadline)
    meets = [p for p in preds if p["seconds"] <= deadline]
    assert result["choice"]["workers"] == min(meets, key=lambda p: p["cost_usd"])["workers"]
    assert f"{deadline:g} s" in result["choice"]["why"] and "\n" not in result["choice"]["why"]
    budget = sorted(p["cost_usd"] for p in preds)[2]
    result = _plan(recorded, budget=budget)
    within = [p for p in preds if p["cost_usd"] <= budget]
    assert result["choice"]["workers"] == min(within, key=lambda p: p["seconds"])["workers"]
    unmet = ({"deadline": min(p["seconds"] for p in preds) / 2}, {"budget": min(p["cost_usd"] for p in preds) / 2})
    for constraint in unmet:
        result = _plan(recorded, **constraint)
        assert result["choice"]["workers"] is None and result["predictions"] == preds
        assert result["choice"]["why"].startswith("no worker count in P = 1-4"), result["choice"]


@pytest.mark.slow
def test_the_cli_plans_from_run_directories_as_text_and_as_json(recorded, capsys):
    job, runs = recorded
    args = ["plan", str(job), "--workers", "1-4", "--from", str(runs[1]), "--from", str(runs[2])]
    assert mlless_main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["workers"] for p in out["predictions"]] == COUNTS
    assert out["runs"] == [str(runs[1]), str(runs[2])]
    deadline = max(p["seconds"] for p in out["predictions"]) * 2
    assert mlless_main(args + ["--deadline", str(deadline)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["P", "time"] and len([ln for ln in lines if ln.strip()[:1].isdigit()]) == 4
    cheapest = min(out["predictions"], key=lambda p: p["cost_usd"])["workers"]
    assert lines[-1].startswith(f"P = {cheapest}: the cheapest")
    # A deadline no P meets: the table still, its last line says so, and the exit code is not 0.
    assert mlless_main(args + ["--deadline", "0.001"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len([ln for ln in lines if ln.strip()[:1].isdigit()]) == 4
    assert lines[-1].startswith("no worker count in P = 1-4 meets the 0.001 s deadline: the fastest")
    assert mlless_main(args + ["--deadline", "0.001", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["choice"]["workers"] is None


@pytest.mark.slow
def test_a_ctrl_c_during_a_pilot_ends_the_plan_there(recorded, tmp_path):
    job, _ = recorded
    out = tmp_path / "pilots"
    proc = subprocess.Popen([sys.executable, "-m", "mlless", "plan", str(job), "--workers", "1-3", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    metrics, deadline = out / "pilot-p1" / "metrics.jsonl", time.monotonic() + 60
    while time.monotonic() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"Traceback" not in err, err.decode()
    assert err.decode().strip().splitlines()[-1] == "mlless: interrupted"
    assert json.loads((out / "pilot-p1" / "summary.json").read_text())["stop_reason"] == STOP_INTERRUPTED
    assert not (out / "pilot-p2").exists()  # no second pilot, and no plan from a pilot cut short


def _one_line_error(capsys, argv: list[str], *needles: str) -> None:
    assert mlless_main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


@pytest.mark.slow
def test_bad_input_gets_one_line(recorded, tmp_path, capsys, movielens_dir):
    job, runs = recorded
    broken = tmp_path / "broken"
    shutil.copytree(runs[1], broken)
    (broken / "metrics.jsonl").unlink()
    base = ["plan", str(job), "--workers", "1-3"]
    _one_line_error(capsys, base + ["--from", str(broken)], str(broken), "metrics.jsonl")
    _one_line_error(capsys, base + ["--from", str(tmp_path / "nowhere")], "no such run directory")
    _one_line_error(capsys, base + ["--from", str(runs[1]), "--budget", "-1"], "--budget")
    _one_line_error(capsys, ["plan", str(job), "--workers", "3-1", "--from", str(runs[1])], "empty range")
    other = write_job(tmp_path / "pmf.yaml", movielens_dir, "pmf")
    _one_line_error(capsys, ["plan", str(other), "--workers", "1-2", "--from", str(runs[1])], "pmf")
    with pytest.raises(PlanError, match="no runs"):
        plan(load_manifest(job), [], COUNTS, EMBEDDED, 2, None, None)


def test_worker_counts_read_ranges_and_lists():
    assert worker_counts("1-4") == worker_counts("1..4") == [1, 2, 3, 4]
    assert worker_counts("1,2,4") == [1, 2, 4] and worker_counts("3") == [3] and worker_counts("1-2,5") == [1, 2, 5]
    for bad in ("0-2", "a", "", "2-1"):
        with pytest.raises(PlanError, match="--workers"):
            worker_counts(bad)


def _curve(samples: np.ndarray) -> np.ndarray:
    return 1.0 / (0.02 * np.sqrt(samples) + 2.0) + 0.3  # the reference curve's shape: falls to 0.3


def recorded_stop(stop: StopConfig, evaluations, samples_per_step: float) -> float | None:
    """The samples at the evaluation (samples, validation loss) where the supervisor's own rules fire, or None."""
    watch = ValidationWatch(stop.patience, stop.target_loss, stop.target_steps, stop.min_delta)
    for samples, loss in evaluations:
        step = int(samples / samples_per_step)
        watch.observe(step, loss, np.zeros(0))
        if watch.target_held(step) or watch.patience_exhausted():
            return samples
    return None


def _fires(stop: StopConfig, evaluations) -> tuple[float, bool]:
    return samples_when_stop_fires(stop, evaluations, samples_per_step=1000.0, interval_samples=1000.0,
                                   limit_samples=1e6, same_cadence=True)


def test_the_stop_rule_is_replayed_on_recorded_evaluations():
    xs = np.arange(1, 41) * 1000.0
    evals = list(zip(xs, _curve(xs)))
    stop = StopConfig(target_loss=float(_curve(np.array([20_000.0]))[0]), target_steps=0, patience=0)
    fired, by_rule = _fires(stop, evals)
    assert by_rule and 20_000 <= fired <= 23_000  # the smoothed loss lags the raw one by an evaluation or two
    assert fired == recorded_stop(stop, evals, 1000.0)
    bumpy = evals[:10] + [(x, 0.9) for x, _ in evals[10:]]  # stops improving after 10 evaluations
    assert _fires(StopConfig(patience=3), bumpy) == (evals[12][0], True)


def test_a_short_run_s_curve_is_extrapolated_to_where_the_rule_fires():
    xs = np.arange(1, 13) * 1000.0  # a pilot: 12 evaluations, 12k samples
    target = float(_curve(np.array([60_000.0]))[0])  # reached five times further on
    n, by_rule = samples_when_stop_fires(StopConfig(target_loss=target, target_steps=0, patience=0), list(zip(xs, _curve(xs))),
                                         samples_per_step=1000.0, interval_samples=1000.0, limit_samples=1e6,
                                         same_cadence=True)
    assert by_rule and 45_000 <= n <= 80_000
    n, by_rule = samples_when_stop_fires(StopConfig(target_loss=0.1, target_steps=0, patience=0), list(zip(xs, _curve(xs))),
                                         samples_per_step=1000.0, interval_samples=1000.0, limit_samples=5e5,
                                         same_cadence=True)
    assert (n, by_rule) == (5e5, False)  # the curve never reaches 0.1: the job's limit stops it


def test_a_stop_extrapolated_from_fewer_evaluations_than_the_reference_fit_needs_is_noted(recorded):
    # A curve still falling at its 5th evaluation: its stop lies past the run, extrapolated from 5 points (as a PMF
    # pilot's at P = 2, which evaluates only at its rounds' ends); at 12 the reference curve has enough.
    job = load_manifest(recorded[0])
    full = measure(recorded[1][1])
    xs = np.arange(1, 13) * full.samples / 12
    falling = list(zip(xs.tolist(), (0.5 + 0.3 * 0.4 ** np.arange(1, 13)).tolist()))
    for count in (5, 12):
        run = dataclasses.replace(full, evaluations=tuple(falling[:count]), samples=int(xs[count - 1]),
                                  steps=full.steps * count // 12)
        result = plan(job, [run], [1], EMBEDDED, 2, None, None)
        said = [n for n in result["notes"] if "extrapolated from" in n]
        if count == 5:
            assert result["predictions"][0]["stops_on"] == "loss rule"
            assert result["predictions"][0]["epochs"] > run.samples / full.batch / full.batches_per_epoch
            assert said == [f"{full.run_dir}: its stop is extrapolated from 5 evaluations, fewer than the 8 the "
                            "reference curve needs (a protocol with rounds evaluates at their ends only): a longer "
                            "run (a pilot's --pilot-seconds, or a run given with --from) predicts it more firmly"]
        else:
            assert said == []


def test_a_stop_predicted_far_past_its_run_is_noted(recorded):
    # 12 evaluations are enough for the reference curve, but a stop 5x past the run rests on a curve that cannot
    # show where it flattens (the MovieLens pilots' stops, 6x past, came out 2-3x late).
    run = measure(recorded[1][1])
    run = dataclasses.replace(run, evaluations=run.evaluations[:1] * MIN_EVALUATIONS)
    assert _extrapolation_note(run, FAR_EXTRAPOLATION * run.samples) is None
    assert _extrapolation_note(run, 5 * run.samples) == (
        f"{run.run_dir}: its stop is extrapolated to 5.0x the run's samples (a curve still falling cannot show where "
        "it flattens): a longer run (a pilot's --pilot-seconds, or a run given with --from) predicts it more firmly")


def test_a_pilot_whose_curve_turned_up_stops_where_the_job_would():
    """A pilot evaluates more often than its job and ends before the job's patience runs out, after its validation
    loss turned up: the rule counts on from the pilot's curve read at the job's cadence, and no new best comes."""
    def u(x):
        return 0.5 + 0.1 * ((x - 10_000) / 10_000) ** 2  # overfits past 10k samples

    stop = StopConfig(patience=3)
    real = recorded_stop(stop, [(x, u(x)) for x in np.arange(1, 30) * 4000.0], 1000.0)  # the job, every 4k samples
    pilot = [(x, u(x)) for x in np.arange(1, 19) * 1000.0]  # every 1k, for 18k samples
    assert real > pilot[-1][0]
    n, by_rule = samples_when_stop_fires(stop, pilot, samples_per_step=1000.0, interval_samples=4000.0,
                                         limit_samples=1e6, same_cadence=False)
    assert by_rule and n == real


def test_a_run_s_evaluations_are_spaced_for_a_job_at_another_cadence_as_what_held_them_back_allows(recorded):
    # A pilot asked for an evaluation every 18 steps and had 8 in 270 (a round's end or the supervisor's time share
    # held them back, to one in 33.75): a job asking every 25 is held as much, one asking every 50 is not; one asking
    # every 9 has twice the pilot's.
    run = dataclasses.replace(measure(recorded[1][1]), evaluate_every=18, steps=270,
                              evaluations=tuple((1000.0 * k, 0.5) for k in range(1, 9)),
                              step_plain=0.001, evaluation_extra=0.010)
    assert run.evaluation_spacing(25) == pytest.approx(33.75)
    assert run.evaluation_spacing(50) == 50.0
    assert run.evaluation_spacing(9) == pytest.approx(33.75 / 2)
    assert run.evaluation_spacing(0) == 0.0
    assert run.step_at_cadence(25) == pytest.approx(0.001 + 0.010 / 33.75)
    assert run.step_at_cadence(0) == pytest.approx(0.001)


def test_past_a_short_run_its_newest_steps_set_the_pace(recorded):
    # The run's step fell as it went (the significance filter sends less as updates shrink): a job trained three
    # times as far steps at the run's mean for the first third, then at its newest steps'.
    run = dataclasses.replace(measure(recorded[1][1]), step_plain=0.015, step_newest=0.012)
    here = run.step_at_cadence(run.evaluate_every)
    assert run.step_through(run.samples, run.evaluate_every) == here
    assert run.step_through(3 * run.samples, run.evaluate_every) == pytest.approx(here - 2 / 3 * 0.003)


def test_choose_says_in_one_line_that_no_p_meets_an_unreachable_deadline():
    from mlless.planning.model import Prediction

    preds = [Prediction(P, 10.0 / P + P, 0.001 * P, None, 1, 1, 1, 1, "path", "loss rule", False) for P in (1, 2, 3)]
    pick, why = choose(preds, deadline=8.0, budget=None)
    assert pick.workers == 2 and why.startswith("P = 2")  # 7 s at $0.002; P = 3 takes 6.3 s at $0.003
    pick, why = choose(preds, deadline=5.0, budget=None)
    assert pick is None and why.endswith("the fastest, P = 3, is predicted to take 6.3 s"), why
    pick, why = choose(preds, deadline=None, budget=0.0005)
    assert pick is None and why.endswith("the cheapest, P = 1, is predicted to cost $0.00100"), why


@pytest.mark.slow
def test_without_runs_the_cli_runs_a_pilot_and_plans_from_it(recorded, tmp_path, capsys):
    job, runs = recorded
    # The default pilot is the job itself, cut at PILOT_SECONDS: this one, a few seconds long, ends where its runs
    # did (on patience, or at its 8 epochs), and its stop is measured, not extrapolated.
    out = tmp_path / "pilots"
    assert mlless_main(["plan", str(job), "--workers", "1-3", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["runs"] == [str(out / "pilot-p1"), str(out / "pilot-p2")]
    for P, d in zip((1, 2), result["runs"]):
        ran = TrainingJob.from_json((Path(d) / "job.json").read_text())
        assert ran.stop.max_seconds == PILOT_SECONDS and ran.stop.patience == 3 and ran.evaluate_every == 5
        assert not ran.autoscaler.enabled
        summary, whole = (json.loads((r / "summary.json").read_text()) for r in (Path(d), runs[P]))
        assert summary["stop_reason"] == whole["stop_reason"] != STOP_MAX_SECONDS, (summary, whole)
    assert [p["measured"] for p in result["predictions"]] == [True, True, False]
    # --pilot-epochs cuts it shorter: real runs of the job, at its own evaluations, to that length.
    out = tmp_path / "short"
    assert mlless_main(["plan", str(job), "--workers", "1-3", "--pilot-epochs", "2", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for d in result["runs"]:
        summary = json.loads((Path(d) / "summary.json").read_text())
        assert summary["stop_reason"] == STOP_MAX_EPOCHS and summary["epochs"] == pytest.approx(2, abs=0.1)
    assert all(math.isfinite(p["seconds"]) and p["seconds"] > 0 for p in result["predictions"])
