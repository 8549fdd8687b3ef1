"""Byzantine robustness on real jobs: one worker of four publishes a scaled sign flip (`mlless train --attack`).

Under the sum its updates move every replica; the robust rules (`spec.sync.aggregation`) keep the job on course.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlless.contract import STOP_DIVERGED
from mlless.cli import main as mlless_main

pytestmark = pytest.mark.slow

ATTACK = "3=scale:-10"
#: Per model: its data (the conftest fixture's name) and how long a job trains. LR reaches the clean run's loss
#: within 0.01 under attack by 10 epochs of 9 steps (0.0084 measured; 0.018 after 3); PMF's sparse rows move only
#: when most updates carry them, so it stays behind (docs/robustness.md). The network (6 steps an epoch at P = 4)
#: reaches 0.93 validation accuracy on the digits by 5 epochs with Adam at 0.01.
MODELS = {"logistic-regression": ("synthetic_lr_dir", 10), "pmf": ("movielens_dir", 5), "neural-net": ("digits_dir", 5)}
#: The spec.model fields beside the type: a tiny network, so that a job takes seconds.
MODEL_FIELDS = {"neural-net": {"network": "mlp", "hiddenSizes": [32]}}
#: The protocol each model is attacked under: a network's workers exchange gradients (its default), the others
#: their updates.
PROTOCOLS = {"neural-net": "gradient-averaging"}
#: LR trains with Adam at 0.01, lr/√epoch, as the figures above were measured. Under the normalized updates, LR's
#: default since, median and trimmed-mean ended 0.0128 above the clean run after 10 epochs (0.5747 against 0.5619;
#: benchmarks/RESULTS.md, "The importance-invariant step"): the rules' tolerance is the optimizer's as much as theirs.
#: The network's default Adam at 0.001 leaves it at 0.55 accuracy after 5 epochs.
OPTIMIZERS = {"logistic-regression": {"type": "adam", "learningRate": 0.01, "lrDecay": "sqrt-epoch"},
              "neural-net": {"type": "adam", "learningRate": 0.01}}
#: How far an attacked robust run may end from the clean run, per model and rule: under median and trimmed-mean PMF
#: misses the 0.01 asked for (0.042 measured after 5 epochs, 0.035 after 10); krum, which keeps whole updates, does
#: not (0.0016 after 5). The network's follow them.
WITHIN = {("logistic-regression", "median"): 0.01, ("logistic-regression", "trimmed-mean"): 0.01,
          ("logistic-regression", "krum"): 0.01, ("pmf", "median"): 0.06, ("pmf", "trimmed-mean"): 0.06,
          ("pmf", "krum"): 0.01, ("neural-net", "median"): 0.08, ("neural-net", "trimmed-mean"): 0.08,
          ("neural-net", "krum"): 0.04,
          # carrier-trimmed-mean leaves the ×−10 update out (beyond its norm bound) and still moves the rows one or two
          # honest updates carry: 0.0080 above the clean run on PMF, 0.0010 on LR (docs/robustness.md)
          ("logistic-regression", "carrier-trimmed-mean"): 0.01, ("pmf", "carrier-trimmed-mean"): 0.01}
#: The network's margins, loss and accuracy, from seeds 0 and 1 (clean: loss 0.214 and 0.218, accuracy 0.935 and 0.94
#: of 200 images; seed 2's clean run 0.233 and 0.925): median ended 0.052 and 0.059 above the clean loss and 0.01 and
#: 0.015 below its accuracy, krum 0.022 and 0.020 above and 0.01 and 0.015 below. At P = 4 a trim of 0.25 leaves the
#: middle two of four values, the median, so trimmed-mean is median here. The attacked sum diverged by step 17 (all
#: three seeds).
ACCURACY_WITHIN = {("neural-net", "median"): 0.03, ("neural-net", "trimmed-mean"): 0.03, ("neural-net", "krum"): 0.03}


def train(tmp: Path, data: Path, model: str, epochs: int, rule: str, attack: str | None) -> dict[str, Any]:
    job = tmp / f"{model}-{rule}-{bool(attack)}.yaml"
    job.write_text(yaml.safe_dump({
        "apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "robust"},
        "spec": {"workers": 4, "model": {"type": model, **MODEL_FIELDS.get(model, {})},
                 "dataset": {"uri": str(data), "cacheBatches": True},
                 "sync": {"protocol": PROTOCOLS.get(model, "bsp"), "aggregation": rule}, "stop": {"maxEpochs": epochs, "patience": 0},
                 "evaluation": {"everySteps": 5}} | ({"optimizer": OPTIMIZERS[model]} if model in OPTIMIZERS else {})}))
    run = tmp / job.stem
    argv = ["train", str(job), "--out", str(run), "-q"] + (["--attack", attack] if attack else [])
    proc = subprocess.run([sys.executable, "-m", "mlless", *argv], capture_output=True, timeout=600)
    assert (run / "summary.json").exists(), proc.stderr.decode()
    return json.loads((run / "summary.json").read_text())


@cache
def clean(tmp: Path, data: Path, model: str, epochs: int) -> dict[str, Any]:
    return train(tmp, data, model, epochs, "sum", None)


def data_of(model: str, request: pytest.FixtureRequest) -> tuple[Path, int]:
    """The model's prepared data and its epochs; a network needs torch, an optional extra."""
    if model == "neural-net":
        pytest.importorskip("torch")
    fixture, epochs = MODELS[model]
    return request.getfixturevalue(fixture), epochs


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("robust")


@pytest.mark.parametrize("model", MODELS)
def test_an_attacker_wrecks_the_sum(model, workdir, request):
    data, epochs = data_of(model, request)
    attacked = train(workdir, data, model, epochs, "sum", ATTACK)
    loss = attacked["validation_loss"]
    assert attacked["stop_reason"] == STOP_DIVERGED or loss is None or not math.isfinite(loss) or \
        loss > clean(workdir, data, model, epochs)["validation_loss"] + 0.2


@pytest.mark.parametrize(("model", "rule"), sorted(WITHIN))
def test_robust_rules_end_near_the_clean_run(model, rule, workdir, request):
    data, epochs = data_of(model, request)
    attacked = train(workdir, data, model, epochs, rule, ATTACK)
    assert attacked["stop_reason"] != STOP_DIVERGED
    # The attacker's replica holds what it published, as every replica holds its own update: the replicas end equal.
    # (Under gradient averaging it once moved by its attack, apart from the shared state.)
    assert attacked["replica_spread"] < 1e-4
    reference = clean(workdir, data, model, epochs)
    assert attacked["validation_loss"] == pytest.approx(reference["validation_loss"], abs=WITHIN[model, rule])
    if (model, rule) in ACCURACY_WITHIN:
        assert attacked["validation_scores"]["accuracy"] >= \
            reference["validation_scores"]["accuracy"] - ACCURACY_WITHIN[model, rule]


def test_the_attack_flag_is_checked_before_anything_starts(movielens_dir, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob",
                                   "metadata": {"name": "robust"},
                                   "spec": {"workers": 2, "model": {"type": "pmf"},
                                            "dataset": {"uri": str(movielens_dir)}}}))
    assert mlless_main(["train", str(job), "--out", str(tmp_path / "run"), "--attack", "5=sign-flip"]) == 2
    assert not (tmp_path / "run").exists()


def test_the_reducer_combines_as_all_to_all_workers_do(movielens_dir, tmp_path):
    """Under allreduce and scatter-reduce the owner of a partition combines it: the same model as all-to-all's."""
    losses = {}
    for exchange in ("all-to-all", "allreduce", "scatter-reduce"):
        job = tmp_path / f"{exchange}.yaml"
        job.write_text(yaml.safe_dump({
            "apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "robust"},
            "spec": {"workers": 4, "model": {"type": "pmf"}, "dataset": {"uri": str(movielens_dir), "cacheBatches": True},
                     "sync": {"protocol": "bsp", "aggregation": "median", "exchange": exchange},
                     "stop": {"maxEpochs": 1}, "evaluation": {"everySteps": 0}}}))
        assert mlless_main(["train", str(job), "--out", str(tmp_path / exchange), "-q", "--attack", ATTACK]) == 0
        summary = json.loads((tmp_path / exchange / "summary.json").read_text())
        assert summary["replica_spread"] < 1e-4 and summary["rejected_frames"] == 0
        losses[exchange] = summary["validation_loss"]
    assert losses["allreduce"] == pytest.approx(losses["all-to-all"], abs=1e-4)
    assert losses["scatter-reduce"] == pytest.approx(losses["all-to-all"], abs=1e-4)
