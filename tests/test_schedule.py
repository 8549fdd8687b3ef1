"""The learning-rate schedule (spec.optimizer.warmupEpochs, lrDecay cosine and step) and adamw's default decay."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mlless.data.batches import RatingsBatch
from mlless.data.feed import Schedule
from mlless.protocol.layouts import WorkerPosition
from mlless.spec import SpecError, from_manifest
from mlless.spec.config import OptimizerConfig, default_optimizer
from mlless.spec.crd import crd_manifest
from mlless.spec.job import TrainingJob
from mlless.spec.models import ADAMW_WEIGHT_DECAY
from mlless.training.models import build_model
from mlless.training.replica import Replica

LR = 0.2


def manifest(optimizer: dict, stop: dict | None = None, model: str = "logistic-regression") -> dict:
    spec = {"model": {"type": model}, "dataset": {"uri": "/data"}, "optimizer": optimizer}
    if stop is not None:
        spec["stop"] = stop
    return {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "t"}, "spec": spec}


def test_warm_up_ramps_linearly_from_zero_to_the_rate():
    c = OptimizerConfig(learning_rate=LR, warmup_epochs=2.0)
    for epoch in np.linspace(1.0, 3.0, 9):  # the first two passes
        assert c.lr_at(epoch) == pytest.approx(LR * (epoch - 1) / 2)
    assert c.lr_at(3.0) == c.lr_at(7.5) == pytest.approx(LR)
    # sqrt-epoch under a warm-up: the ramp times lr/sqrt(epoch), whose epoch is the integer part
    s = OptimizerConfig(learning_rate=LR, warmup_epochs=0.5, lr_decay="sqrt-epoch")
    assert s.lr_at(1.25) == pytest.approx(LR / 2) and s.lr_at(4.9) == pytest.approx(LR / 2)


def test_cosine_peaks_after_the_warm_up_halves_midway_and_ends_at_zero_on_the_horizon():
    c = OptimizerConfig(learning_rate=LR, lr_decay="cosine", warmup_epochs=1.0, horizon_epochs=5.0)
    assert c.lr_at(2.0) == pytest.approx(LR)  # the warm-up's end: 1 epoch done
    assert c.lr_at(4.0) == pytest.approx(LR / 2)  # halfway from 1 to 5 epochs done
    assert c.lr_at(6.0) == pytest.approx(0.0, abs=1e-12) and c.lr_at(9.0) == 0.0  # the horizon, and beyond
    rates = [c.lr_at(e) for e in np.linspace(2.0, 6.0, 41)]
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert c.lr_at(3.0) == pytest.approx(LR * (1 + math.cos(math.pi / 4)) / 2)


def test_step_drops_by_gamma_every_decay_epochs_after_the_warm_up():
    c = OptimizerConfig(learning_rate=LR, lr_decay="step", decay_epochs=2.0, gamma=0.5)
    assert [c.lr_at(e) for e in (1.0, 2.9, 3.1, 4.9, 5.1)] == pytest.approx([LR, LR, LR / 2, LR / 2, LR / 4])
    w = OptimizerConfig(learning_rate=LR, lr_decay="step", decay_epochs=2.0, gamma=0.5, warmup_epochs=1.0)
    assert [w.lr_at(e) for e in (1.5, 3.9, 4.1, 6.1)] == pytest.approx([LR / 2, LR, LR / 2, LR / 4])


def test_the_rate_changes_every_step_within_an_epoch():
    schedule = Schedule(n_batches=10, seed=0)
    c = OptimizerConfig(learning_rate=LR, lr_decay="cosine", warmup_epochs=1.0, horizon_epochs=3.0)
    rates = [c.lr_at(schedule.progress(p)) for p in range(30)]
    warm, decay = rates[:10], rates[10:]
    assert 0 < warm[0] < LR / 10 and all(a < b for a, b in zip(warm, warm[1:])) and warm[-1] < LR
    assert all(a > b for a, b in zip(decay, decay[1:])) and 0 < decay[-1] < LR / 100  # the last step is not lost
    # the midpoint keeps each step in its own epoch: sqrt-epoch changes once an epoch, as before
    assert all(math.floor(schedule.progress(p)) == schedule.epoch(p) + 1 for p in range(100))


@pytest.mark.parametrize("optimizer, stop, line", [
    ({"lrDecay": "cosine"}, None, "spec.optimizer.lrDecay: cosine needs spec.stop.maxEpochs"),
    ({"lrDecay": "cosine"}, {"maxSteps": 100}, "spec.optimizer.lrDecay: cosine needs spec.stop.maxEpochs"),
    ({"lrDecay": "step"}, None, "spec.optimizer.lrDecay: step needs spec.optimizer.decayEpochs"),
    ({"warmupEpochs": 3}, {"maxEpochs": 3}, "spec.optimizer.warmupEpochs: 3 is not below spec.stop.maxEpochs 3"),
    ({"lrDecay": "step", "decayEpochs": 0}, None, "spec.optimizer.decayEpochs"),
    ({"gamma": 1}, None, "spec.optimizer.gamma"),
    ({"warmupEpochs": -0.5}, None, "spec.optimizer.warmupEpochs"),
    ({"lrDecay": "linear"}, None, "spec.optimizer.lrDecay"),
])
def test_a_bad_schedule_field_is_one_line_naming_it(optimizer, stop, line):
    with pytest.raises(SpecError) as refused:
        from_manifest(manifest(optimizer, stop))
    [only] = str(refused.value).splitlines()[1:]
    assert only.strip().startswith(line), only


def test_the_crd_states_the_schedules_rules_for_the_api_server():
    rules = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    messages = {r["message"] for r in rules}
    assert {"spec.optimizer.lrDecay: cosine needs spec.stop.maxEpochs, the epoch at which its rate reaches 0",
            "spec.optimizer.lrDecay: step needs spec.optimizer.decayEpochs, the epochs between two drops",
            "spec.optimizer.warmupEpochs must be below spec.stop.maxEpochs"} <= messages


def test_a_resolved_job_carries_the_schedule_and_its_horizon_to_the_workers():
    job = from_manifest(manifest({"type": "adam", "lrDecay": "cosine", "warmupEpochs": 0.25}, {"maxEpochs": 4}))
    assert (job.optimizer.horizon_epochs, job.optimizer.warmup_epochs) == (4, 0.25)
    again = TrainingJob.from_json(job.to_json())  # what a worker process reads
    assert again.optimizer == job.optimizer and again.optimizer.lr_at(3.125) == job.optimizer.lr_at(3.125)
    # no horizon on another schedule: the resolved manifest's default epoch limit would otherwise change it
    assert from_manifest(manifest({"lrDecay": "step", "decayEpochs": 1})).optimizer.horizon_epochs is None


def test_adamw_decays_weights_a_zero_gradient_leaves_alone():
    job = from_manifest(manifest({"type": "adamw", "learningRate": 0.1}))
    assert job.model.l2 == ADAMW_WEIGHT_DECAY
    replica = Replica(build_model(job.model.type, {"n_features": 8}, job.model), job.optimizer, 0.0)
    assert replica.config.weight_decay == ADAMW_WEIGHT_DECAY
    replica.model.set_params(np.ones(9, np.float32))  # 8 weights and the bias
    idx = np.arange(9, dtype=np.int32)
    for step in range(3):
        replica.optimizer.step(replica.params, idx, np.zeros(9, np.float32), lr=0.1)
    np.testing.assert_allclose(replica.params, (1 - 0.1 * ADAMW_WEIGHT_DECAY) ** 3, rtol=1e-6)
    # adam keeps the model's own default decay, which barely moves them; a given l2 wins under adamw
    adam = from_manifest(manifest({"type": "adam"}))
    assert Replica(build_model("logistic-regression", {"n_features": 8}, adam.model), adam.optimizer,
                   0.0).config.weight_decay < ADAMW_WEIGHT_DECAY / 1000
    given = manifest({"type": "adamw"})
    given["spec"]["model"]["l2"] = 0.3
    assert from_manifest(given).model.l2 == 0.3
    # pmf's l2 is a penalty in its loss: adamw leaves its default alone
    assert from_manifest(manifest({"type": "adamw"}, model="pmf")).model.l2 is None


DIMS = {"n_users": 20, "n_items": 15, "mean_rating": 3.0}


def train(replica: Replica, schedule: Schedule, batches: list[RatingsBatch], cursor: int, steps: int) -> int:
    """`steps` steps of a worker alone in its job from `cursor`, each at the schedule's epoch; the cursor after."""
    for _ in range(steps):
        position = schedule.position(cursor, (0,), 0)
        replica.step(batches[schedule.batch_index(position)], schedule.progress(position), position + 1)
        cursor += 1
    return cursor


def test_a_resumed_worker_continues_the_schedule_where_it_checkpointed():
    rng = np.random.default_rng(4)
    batches = [RatingsBatch(rng.integers(0, 20, 30).astype(np.int32), rng.integers(0, 15, 30).astype(np.int32),
                            rng.uniform(1, 5, 30).astype(np.float32)) for _ in range(6)]
    schedule = Schedule(len(batches), seed=1)
    config = default_optimizer("pmf").replace(type="adam", learning_rate=0.05, lr_decay="cosine",
                                              warmup_epochs=1.0, horizon_epochs=4.0)

    def replica() -> Replica:
        return Replica(build_model("pmf", DIMS, seed=2), config, 0.7)

    straight = replica()
    train(straight, schedule, batches, 0, 18)
    first = replica()
    cursor = train(first, schedule, batches, 0, 9)
    checkpoint = first.snapshot(optimizer=True) | WorkerPosition(9, 8, cursor, 0, (0,)).arrays()
    resumed = replica()
    resumed.restore(checkpoint)
    train(resumed, schedule, batches, WorkerPosition.read(checkpoint).cursor, 9)
    np.testing.assert_array_equal(resumed.params, straight.params)
    # the check can fail: a schedule restarted from its beginning (the warm-up again) trains another model
    restarted = replica()
    restarted.restore(checkpoint)
    for k in range(9):
        position = schedule.position(cursor + k, (0,), 0)
        restarted.step(batches[schedule.batch_index(position)], schedule.progress(k), position + 1)
    assert not np.array_equal(restarted.params, straight.params)
