"""The normalized updates (#23, item 4) on numbers as a user gives them: real worker processes at P = 2 learn a CSV
whose numeric columns run into the thousands, and the same CSV with one column multiplied by 1,000 learns the
same (`functions/mlless/training/kernels/linear.pyx`, `normalized_step`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlless.cli import main
from mlless.data.dataset import Dataset
from mlless.runtime.local import Services, train_local

from test_training import QUIET, job_for

pytestmark = pytest.mark.slow


def flights(root: Path, distance_unit: float) -> Path:
    """6,000 rows: a departure clock (0-2359), a distance (up to 5,000, times `distance_unit`), a log-normal count
    and a categorical carrier, labelled by a logistic model of the standardised numbers; prepared as CSV."""
    rng = np.random.default_rng(5)
    n = 6000
    clock = rng.integers(0, 24, n) * 100 + rng.integers(0, 60, n)
    distance = np.minimum(rng.lognormal(np.log(600.0), 0.8, n), 5000.0).round()
    count = np.minimum(rng.lognormal(1.0, 1.5, n), 1e4).round()
    carrier = rng.integers(0, 12, n)
    score = (1.2 * (clock - 1200) / 690 - 1.0 * (distance - 800) / 600 + 0.3 * np.log1p(count)
             + np.linspace(-1.0, 1.0, 12)[carrier] - 0.4)
    label = (rng.random(n) < 1 / (1 + np.exp(-score))).astype(int)
    lines = ["label,clock,distance,count,carrier"] + [
        f"{y},{c},{d * distance_unit:g},{k:g},c{a}" for y, c, d, k, a in zip(label, clock, distance, count, carrier)]
    (root / "flights.csv").write_text("\n".join(lines) + "\n")
    assert main(["prepare", "--format", "csv", str(root / "flights.csv"), "--label", "label", "--out",
                 str(root / "data"), "--batch-size", "250", "--quiet"]) == 0
    return root / "data"


def test_normalized_updates_at_two_workers_learn_raw_columns_whatever_their_units(tmp_path):
    losses = []
    for unit in (1.0, 1000.0):
        root = tmp_path / f"unit{unit:g}"
        root.mkdir()
        data = flights(root, unit)
        job = job_for(data, workers=2, model={"type": "logistic-regression"}, optimizer={"type": "normalized"},
                      stop={"maxEpochs": 3})
        summary = train_local(job, root / "run", Services(), QUIET)
        assert summary["dropped_workers"] == [] and summary["rejected_frames"] == 0
        losses.append(summary["validation_loss"])
        p = float(Dataset.open(str(data)).validation().labels.mean())
        base_rate = -(p * np.log(p) + (1 - p) * np.log(1 - p))
        # The clock and the distance explain much of the labels: well below the base rate's BCE.
        assert summary["validation_loss"] < 0.85 * base_rate, (unit, summary["validation_loss"], base_rate)
    # Two workers' orders differ from run to run, so the two runs agree closely, not exactly.
    assert losses[1] == pytest.approx(losses[0], abs=0.01), losses
