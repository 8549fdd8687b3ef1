"""Sparse optimizers against hand-written numpy steps, including the lazy semantics."""
from __future__ import annotations

import numpy as np
import pytest

from mlless.spec.config import OptimizerConfig, default_optimizer
from mlless.training.optim import Optimizer

SIZE = 12


class Reference:
    """Dense float64 re-implementation, restricted to idx (lazy semantics)."""

    def __init__(self, cfg: OptimizerConfig) -> None:
        self.c = cfg
        self.v = np.zeros(SIZE)
        self.m = np.zeros(SIZE)
        self.s = np.zeros(SIZE)
        self.t = 0

    def step(self, x, idx, g, lr):
        c = self.c
        self.t += 1
        x0 = x[idx].copy()
        if c.type == "sgd":
            upd = g
        elif c.type in ("momentum", "nesterov"):
            self.v[idx] = c.momentum * self.v[idx] + g
            upd = self.v[idx] if c.type == "momentum" else c.momentum * self.v[idx] + g
        else:
            self.m[idx] = c.beta1 * self.m[idx] + (1 - c.beta1) * g
            self.s[idx] = c.beta2 * self.s[idx] + (1 - c.beta2) * g * g
            mhat = self.m[idx] / (1 - c.beta1 ** self.t)
            shat = self.s[idx] / (1 - c.beta2 ** self.t)
            upd = mhat / (np.sqrt(shat) + c.epsilon)
        delta = -lr * upd - lr * c.weight_decay * x0
        x[idx] += delta
        return delta


@pytest.mark.parametrize("kind", ["sgd", "momentum", "nesterov", "adam", "adamw"])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_steps_match_reference(kind, wd):
    rng = np.random.default_rng(0)
    cfg = OptimizerConfig(type=kind, learning_rate=0.05, momentum=0.8, weight_decay=wd)
    opt, ref = Optimizer(SIZE, cfg), Reference(cfg)
    x = rng.normal(size=SIZE).astype(np.float32)
    xr = x.astype(np.float64)
    for step in range(6):
        idx = np.sort(rng.choice(SIZE, size=5, replace=False)).astype(np.int32)
        g = rng.normal(size=5).astype(np.float32)
        before = x.copy()
        delta = opt.step(x, idx, g, lr=0.05)
        dref = ref.step(xr, idx, g.astype(np.float64), 0.05)
        np.testing.assert_allclose(delta, dref, rtol=2e-4, atol=1e-6)
        np.testing.assert_allclose(x, xr, rtol=2e-4, atol=1e-6)
        # the returned delta is exactly what was applied
        np.testing.assert_array_equal(x[idx], before[idx] + delta)
        untouched = np.setdiff1d(np.arange(SIZE), idx)
        np.testing.assert_array_equal(x[untouched], before[untouched])
    assert opt.t == 6


def test_momentum_is_lazy_untouched_velocity_not_decayed():
    opt = Optimizer(SIZE, OptimizerConfig(type="nesterov", learning_rate=1.0, momentum=0.5))
    x = np.zeros(SIZE, np.float32)
    opt.step(x, np.array([3], np.int32), np.array([1.0], np.float32))
    v_after_first = opt.state()["velocity"][3]
    for _ in range(5):  # steps that do not touch entry 3
        opt.step(x, np.array([4], np.int32), np.array([1.0], np.float32))
    assert opt.state()["velocity"][3] == v_after_first == 1.0
    assert x[3] == pytest.approx(-1.5)  # only the first step moved it: μ·v + g = 1.5
    # next touch uses the preserved velocity: v = 0.5·1 + 1 = 1.5, step = 0.5·1.5 + 1 = 1.75
    d = opt.step(x, np.array([3], np.int32), np.array([1.0], np.float32))
    assert d[0] == pytest.approx(-1.75)


def test_lazy_adam_uses_global_step_for_bias_correction():
    cfg = OptimizerConfig(type="adam", learning_rate=0.1)
    opt = Optimizer(SIZE, cfg)
    x = np.zeros(SIZE, np.float32)
    for _ in range(4):
        opt.step(x, np.array([0], np.int32), np.array([1.0], np.float32))
    d = opt.step(x, np.array([7], np.int32), np.array([2.0], np.float32))  # first touch, t = 5
    m = 0.1 * 2.0 / (1 - 0.9 ** 5)
    v = 0.001 * 4.0 / (1 - 0.999 ** 5)
    assert d[0] == pytest.approx(-0.1 * m / (np.sqrt(v) + 1e-8), rel=1e-5)


def test_weight_decay_alone_shrinks_touched_entries_only():
    opt = Optimizer(SIZE, OptimizerConfig(type="sgd", learning_rate=0.5, weight_decay=0.2))
    x = np.ones(SIZE, np.float32)
    opt.step(x, np.array([1, 2], np.int32), np.zeros(2, np.float32))
    assert x[1] == x[2] == pytest.approx(0.9)
    assert np.all(np.delete(x, [1, 2]) == 1)


def test_state_roundtrip_continues_identically():
    rng = np.random.default_rng(1)
    cfg = OptimizerConfig(type="adam", learning_rate=0.01)
    a = Optimizer(SIZE, cfg)
    x = rng.normal(size=SIZE).astype(np.float32)
    idx = np.arange(0, SIZE, 2, dtype=np.int32)
    for _ in range(3):
        a.step(x, idx, rng.normal(size=len(idx)).astype(np.float32))
    b = Optimizer(SIZE, cfg)
    b.load_state(a.state())
    g = rng.normal(size=len(idx)).astype(np.float32)
    xa, xb = x.copy(), x.copy()
    np.testing.assert_array_equal(a.step(xa, idx, g), b.step(xb, idx, g))
    with pytest.raises(ValueError):
        b.load_state({"m": np.zeros(3, np.float32), "v": np.zeros(SIZE, np.float32), "t": np.array([1])})
    # All or nothing: a state that does not fit changes nothing (a worker then starts the optimizer afresh from a job
    # checkpoint another optimizer's replicas left, `Worker.start_from_job_checkpoint`).
    before = b.state()
    with pytest.raises(ValueError, match="'v'"):
        b.load_state({"m": np.ones(SIZE, np.float32), "v": np.ones(3, np.float32), "t": np.array([9])})
    assert b.t == int(before["t"][0]) and all(np.array_equal(b.state()[k], before[k]) for k in ("m", "v"))


def test_bad_inputs_and_configs():
    opt = Optimizer(SIZE, OptimizerConfig(type="momentum"))
    x = np.zeros(SIZE, np.float32)
    with pytest.raises(IndexError):
        opt.step(x, np.array([SIZE], np.int32), np.ones(1, np.float32))
    with pytest.raises(ValueError):
        opt.step(x, np.array([1, 2], np.int32), np.ones(1, np.float32))
    with pytest.raises(ValueError):
        OptimizerConfig(type="rmsprop")
    with pytest.raises(ValueError):
        OptimizerConfig(learning_rate=-1)


def test_lr_schedule_and_defaults():
    c = OptimizerConfig(type="adam", learning_rate=0.04, lr_decay="sqrt-epoch")
    assert c.lr_at(1) == pytest.approx(0.04) and c.lr_at(4) == pytest.approx(0.02)
    assert OptimizerConfig(learning_rate=0.3).lr_at(9) == 0.3
    assert default_optimizer("pmf").type == "adagrad" and default_optimizer("pmf").lr_decay == "none"
    assert default_optimizer("softmax") == default_optimizer("logistic-regression")  # the linear family's rule


@pytest.mark.parametrize("kind, given, want", [
    ("pmf", {"type": "normalized"}, ("normalized", 0.5, "none")),  # another type: its own rate, not AdaGrad's 0.2
    ("softmax", {"type": "adagrad", "learningRate": 0.2}, ("adagrad", 0.2, "none")),
    ("pmf", {"type": "adagrad"}, ("adagrad", 0.2, "none")),  # the model's own type keeps its rate
    ("softmax", {"learningRate": 0.05}, ("normalized", 0.05, "none")),
    ("logistic-regression", {"type": "adam"}, ("adam", 0.001, "none")),
    ("logistic-regression", {"learningRate": 0.2}, ("normalized", 0.2, "none")),
])
def test_an_optimizer_type_named_alone_takes_that_types_rate(kind, given, want):
    from mlless.spec import from_manifest

    job = from_manifest({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "t"},
                         "spec": {"workers": 1, "model": {"type": kind}, "dataset": {"uri": "/data"},
                                  "optimizer": given}})  # one worker: PMF's AdaGrad rate falls with P
    assert (job.optimizer.type, job.optimizer.learning_rate, job.optimizer.lr_decay) == want


def test_adagrad_runs_the_models_per_sample_kernel_and_checkpoints_its_accumulator():
    from mlless.data.batches import RatingsBatch
    from mlless.training.models import build_model

    model = build_model("pmf", {"n_users": 6, "n_items": 4, "mean_rating": 3.0})
    opt = Optimizer(model.size, default_optimizer("pmf"), model.accumulator_size)
    assert opt.state()["g2"].shape == (2 * (6 + 4),) and np.all(opt.state()["g2"] == 1.0)
    batch = RatingsBatch(np.array([0, 1, 0], np.int32), np.array([2, 3, 2], np.int32), np.array([5, 1, 4], np.float32))
    idx, delta, loss_sum, n = opt.update(model, batch, 0.1)
    assert n == 3 and loss_sum > 0 and opt.t == 1
    state = opt.state()
    assert state["g2"][0] > 1.0 and state["g2"][2 * 2] == 1.0  # user 0 was touched, user 2 was not
    restored = Optimizer(model.size, default_optimizer("pmf"), model.accumulator_size)
    restored.load_state(state)
    np.testing.assert_array_equal(restored.state()["g2"], state["g2"])
    with pytest.raises(ValueError, match="per sample"):
        opt.step(model.params, idx, delta)


def test_normalized_updates_run_the_linear_kernel_and_checkpoint_every_accumulator():
    from mlless.data.batches import RatingsBatch, SparseBatch
    from mlless.training.models import build_model

    model = build_model("svm", {"n_features": 5})
    config = OptimizerConfig(type="normalized", learning_rate=0.5)
    opt = Optimizer(model.size, config)
    batch = SparseBatch(np.array([0, 2, 3], np.int64), np.array([0, 4, 1], np.int32),
                        np.array([2.0, 300.0, 1.0], np.float32), np.array([1, 0], np.float32))
    idx, delta, loss_sum, n = opt.update(model, batch, 0.5)
    state = opt.state()
    assert n == 2 and loss_sum > 1.0  # the first row at margin 0 (hinge 1), the second after the bias moved
    assert state["scale"][[0, 4, 1]].tolist() == [2.0, 300.0, 1.0] and state["norm"].tolist() == [5.0, 2.0]
    np.testing.assert_array_equal(np.sort(idx), [0, 1, 4, 5])
    restored = Optimizer(model.size, config)
    restored.load_state(state)
    assert state["rows"][[0, 4, 1, 2]].tolist() == [1, 1, 1, 0]
    for name in ("g2", "scale", "rows", "norm"):
        np.testing.assert_array_equal(restored.state()[name], state[name])
    with pytest.raises(ValueError, match="'norm' has float32"):
        restored.load_state({**state, "norm": state["norm"].astype(np.float32)})
    pmf = build_model("pmf", {"n_users": 2, "n_items": 2, "mean_rating": 3.0})
    with pytest.raises(ValueError, match="pmf has no normalized updates"):
        Optimizer(pmf.size, config).update(pmf, RatingsBatch(np.zeros(1, np.int32), np.zeros(1, np.int32),
                                                              np.ones(1, np.float32)), 0.5)
