"""`mlless sweep`: a local sweep with ASHA over real jobs, the bad-input lines, ASHA's rule, and `mlless report`."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from mlless.cli import main
from mlless.contract import EXIT_USAGE, STOP_ASHA
from mlless.spec.sweep import SWEEP_SCHEMA
from mlless.sweep.asha import TrialProgress, cutoff, judge, level, min_peers, rung_values
from mlless.runtime import sweep as local
from mlless.sweep.manifest import EarlyStopping, load_sweep

from generated import assert_generated

ROOT = Path(__file__).resolve().parent.parent
RULE = EarlyStopping("asha", "steps", 20.0, 2.0)
#: A trial's length: rungs at 20, 40 and 80 steps below it.
MAX_STEPS = 120


def sweep_doc(dataset: Path, **spec) -> dict:
    """Logistic regression on a small synthetic set, one worker per trial, every trial at once (their start-ups
    overlap): the worst of three at a rung is above the median ASHA keeps (reduction factor 2)."""
    return {
        "apiVersion": "mlless.io/v1alpha1", "kind": "TrainingSweep", "metadata": {"name": "lr-sweep"},
        "spec": {
            "template": {"spec": {"workers": 1, "model": {"type": "logistic-regression"},
                                  "dataset": {"uri": str(dataset), "cacheBatches": True},
                                  "optimizer": {"type": "adam", "lrDecay": "none"},
                                  "evaluation": {"everySteps": 10}, "stop": {"maxSteps": MAX_STEPS}}},
            "parameters": [{"field": "optimizer.learningRate", "grid": [0.05, 0.0001, 0.00001]}],
            "maxTrials": 3,
            "maxConcurrentTrials": 3,
            "earlyStopping": {"type": "asha", "resource": "steps", "minResource": 20, "reductionFactor": 2},
            **spec,
        },
    }


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def swept(synthetic_lr_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    out = tmp / "out"
    # One trial at a time, the good learning rate first: each later trial meets it at every rung. Three at once raced:
    # the worst trial, alone ahead at every rung, went on at each (the first at a rung always does).
    doc = sweep_doc(synthetic_lr_dir, maxConcurrentTrials=1)
    # The sweep looks when a trial wakes it (a rung reached, a trial ended), not on its timer.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local, "POLL_SECONDS", 600.0)
        assert main(["sweep", str(write(tmp, doc)), "--out", str(out), "-q"]) == 0
    return out


def test_the_local_sweep_stops_losers_and_hands_back_the_best_trial(swept, synthetic_lr_dir, capsys):
    status = json.loads((swept / "status.json").read_text())
    rows = {row["name"]: row for row in status["trials"]}
    assert status["phase"] == "Succeeded" and status["trialsCreated"] == 3 == len(rows)
    stopped = [row for row in rows.values() if row["state"] == "Stopped"]
    assert stopped, "ASHA stopped no trial"
    for row in stopped:  # stopped at the rung the sweep said, within an evaluation of it, with its reason recorded
        rung = int(row["stopReason"].rsplit(" ", 1)[1])
        assert row["stopReason"] == STOP_ASHA.format(rung=rung)
        assert level(RULE, rung) <= row["killedAt"] <= level(RULE, rung) + 10
        summary = json.loads((swept / "trials" / row["name"] / "summary.json").read_text())
        assert summary["steps"] == row["killedAt"]
    # The best trial is the one with the lowest best validation loss, and its model in best/ scores it.
    best = min((r for r in rows.values() if r["state"] != "Failed"), key=lambda r: r["bestValidationLoss"])
    assert status["bestTrial"] == best["name"] and best["state"] == "Succeeded"
    assert main(["evaluate", str(swept / "best" / "model.npz"), str(synthetic_lr_dir)]) == 0
    evaluated = json.loads(capsys.readouterr().out)["validation"]
    assert evaluated == pytest.approx(best["bestValidationLoss"], rel=1e-6)
    assert status["costUSD"] == pytest.approx(sum(r["costUSD"] for r in rows.values()))
    # Each trial is a run directory of its own: its own job id.
    ids = {json.loads((swept / "trials" / n / "summary.json").read_text())["job_id"] for n in rows}
    assert len(ids) == 3


def test_report_shows_the_curves_and_the_parameters(swept, tmp_path, capsys):
    assert main(["report", str(swept), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "trials.png" in page and "param-0.png" in page and "optimizer.learningRate" in page
    status = json.loads((swept / "status.json").read_text())
    for row in status["trials"]:
        assert row["name"] in page
    assert (tmp_path / "report" / "trials.png").stat().st_size > 0


@pytest.mark.parametrize("change, field", [
    (lambda s: s["parameters"].append({"field": "model.rnak", "grid": [1]}), "spec.parameters[1].field"),
    (lambda s: s["parameters"].append({"field": "stop", "grid": [1]}), "spec.parameters[1].field"),
    (lambda s: s["parameters"].append({"field": "model.rank", "grid": [10, 2000]}), "spec.parameters[1].grid[1]"),
    (lambda s: s["parameters"].append({"field": "sync.protocol", "grid": ["isp", "blocked"]}),
     "spec.parameters[1].grid[1]"),
    (lambda s: s["parameters"].append({"field": "model.l2", "uniform": {"min": -1, "max": 0.1}}),
     "spec.parameters[1].uniform.min"),
    (lambda s: s["parameters"].append({"field": "model.l2", "uniform": {"min": 0.1, "max": 0.1}}),
     "spec.parameters[1].uniform"),
    (lambda s: s["parameters"].append({"field": "model.l2", "logUniform": {"min": 0, "max": 0.1}}),
     "spec.parameters[1].logUniform.min"),
    (lambda s: s["parameters"].append({"field": "model.l2", "logUniform": {"min": 0.1}}),
     "spec.parameters[1].logUniform"),
    (lambda s: s.pop("maxTrials") and s["parameters"].append({"field": "model.l2", "choice": [0.1]}),
     "spec.maxTrials"),
    (lambda s: s["parameters"].append({"field": "model.l2", "grid": []}), "spec.parameters[1].grid"),
    (lambda s: s.update(budgetUSD=0.01) or s["template"]["spec"]["stop"].update(budgetUSD=0.02),
     "spec.template.spec.stop.budgetUSD"),
    (lambda s: s.update(budgetUSD=0.01) or s["parameters"].append({"field": "stop.budgetUSD", "grid": [0.001, 0.5]}),
     "spec.parameters[1].grid[1]"),
    (lambda s: s["template"]["spec"].update(workers=0), "spec.template.spec.workers"),
])
def test_bad_input_is_one_line_naming_the_field_and_nothing_starts(change, field, synthetic_lr_dir, tmp_path, capsys):
    doc = sweep_doc(synthetic_lr_dir)
    change(doc["spec"])
    out = tmp_path / "out"
    assert main(["sweep", str(write(tmp_path, doc)), "--out", str(out)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mlless: error: ") and f" {field}:" in err, err
    assert not out.exists()


def test_a_dataset_the_trials_cannot_train_on_is_one_line_and_nothing_starts(tmp_path, capsys):
    """As `mlless train` refuses a job's dataset: missing, or too few rows for a trial's clusters."""
    from mlless.data.dataset import Dataset

    missing = sweep_doc(tmp_path / "no-such-data")
    few = tmp_path / "few"
    assert main(["prepare", "--synthetic", "blobs", "--rows", "300", "--out", str(few), "--quiet"]) == 0
    rows = Dataset.open(str(few)).manifest.n_train
    kmeans = sweep_doc(few, parameters=[{"field": "model.clusters", "grid": [2, rows + 1]}])
    kmeans["spec"]["template"]["spec"] |= {"model": {"type": "kmeans"}, "optimizer": {}}
    for doc, says in ((missing, "no-such-data/manifest.json: not found"),
                      (kmeans, f"trial lr-sweep-2: spec.model.clusters: {rows + 1} is more than the {rows} training rows")):
        out = tmp_path / "out"
        assert main(["sweep", str(write(tmp_path, doc)), "--out", str(out)]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("mlless: error: ") and says in err, err
        assert not out.exists()


def test_a_trainingjob_is_refused_by_name(tmp_path, capsys):
    assert main(["sweep", str(ROOT / "examples" / "movielens.yaml")]) == EXIT_USAGE
    assert "kind" in capsys.readouterr().err


def test_the_example_is_valid():
    sweep = load_sweep(ROOT / "examples" / "sweep-movielens.yaml")
    trials = sweep.assignments()
    assert len(trials) == sweep.max_trials
    for values in trials:  # each drawn value is inside its range
        assert 0.01 <= values["model.l2"] <= 0.1


def test_asha_keeps_the_best_fraction_at_each_rung():
    rng = np.random.default_rng(3)
    trials = []
    for i in range(12):
        trials.append(TrialProgress(f"t{i}", running=True, values=list(rng.uniform(0.5, 1.0, size=3))))
        stopped = judge(RULE, trials)
        for trial in trials:
            if trial.name in stopped:
                trial.running = False
                k = stopped[trial.name]
                peers = [t.values[k] for t in trials if len(t.values) > k]
                assert len(peers) >= min_peers(RULE)
                assert trial.values[k] > np.quantile(peers, 1 - 1 / RULE.reduction_factor)
            elif trial.running:  # it passed every rung it reached
                assert trial.passed == len(trial.values)
    assert judge(RULE, [TrialProgress("only", True, values=[9.0])]) == {}  # the first at a rung goes on
    # With η = 3 the second at a rung goes on too, however far behind: one comparison is no ranking.
    eta3 = EarlyStopping("asha", "steps", 20.0, 3.0)
    assert judge(eta3, [TrialProgress("a", False, values=[1.0]), TrialProgress("b", True, values=[9.0])]) == {}
    assert judge(eta3, [TrialProgress("a", False, values=[1.0]), TrialProgress("b", False, values=[2.0]),
                        TrialProgress("c", True, values=[9.0])]) == {"c": 0}
    assert cutoff(RULE, [1.0, 3.0]) == pytest.approx(2.0)


def test_rung_values_are_the_best_loss_when_the_rung_is_reached():
    curve = [(10, None), (20, 0.9), (30, 0.8), (40, 0.85), (79, 0.7), (80, 0.75), (200, 0.6)]
    assert level(RULE, 2) == 80
    assert rung_values(RULE, curve) == [0.9, 0.8, 0.7, 0.6]  # rungs 20, 40, 80, 160
    assert rung_values(RULE, curve, limit=80) == [0.9, 0.8]  # rungs at or past the trial's own end are not rungs


def test_the_crd_and_the_reference_are_generated_from_the_schema():
    assert_generated("crds/trainingsweep.yaml", "mlless.spec.sweep_crd")
    assert_generated("docs/sweep-reference.md", "mlless.spec.sweep_reference")
    crd = yaml.safe_load((ROOT / "crds" / "trainingsweep.yaml").read_text())
    version = crd["spec"]["versions"][0]
    assert version["schema"]["openAPIV3Schema"]["properties"]["spec"] == SWEEP_SCHEMA
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert {"Trials", "Running", "Best", "Cost"} <= set(columns)
