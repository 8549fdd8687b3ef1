"""Gradient averaging (sync/protocols/gradients.py): every replica steps by the mean of the workers' gradients, so
P workers train as one optimizer on their union batch, the replicas stay equal under every exchange pattern, and
every step is applied once (MLLESS_AUDIT)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from mlless.runtime.local import Services, train_local
from mlless.spec import SpecError
from mlless.spec.config import ModelConfig, OptimizerConfig
from mlless.spec.schema import pairing_errors
from mlless.training.replica import Replica

from test_training import QUIET, _supervise_with, _when_step, job_for

torch = pytest.importorskip("torch")
from mlless.data.batches import ImageBatch  # noqa: E402
from mlless.training.models import build_model  # noqa: E402
from test_network import dims, learnable  # noqa: E402


def network(seed: int = 0):
    return build_model("neural-net", dims(), ModelConfig("neural-net", options={"network": "mlp", "hiddenSizes": [6]}),
                       seed)


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
def test_two_replicas_averaging_gradients_step_as_one_optimizer_on_their_union_batch(kind):
    optimizer = OptimizerConfig(type=kind, learning_rate=0.05)
    pair = [Replica(network(), optimizer, 0.0) for _ in range(2)]
    single = Replica(network(), optimizer, 0.0)
    for step in range(1, 6):
        halves = [learnable(8, dims(), seed=10 * step + k) for k in range(2)]
        grads = [r.gradient(b, step) for r, b in zip(pair, halves)]
        mean = (grads[0].values + grads[1].values) / 2
        for r in pair:
            r.descend(grads[0].indices, mean, 1, appliers=2)
        union = ImageBatch(np.concatenate([b.images for b in halves]), np.concatenate([b.labels for b in halves]))
        single.step(union, 1, step)
    np.testing.assert_array_equal(pair[0].params, pair[1].params)
    np.testing.assert_allclose(pair[0].params, single.params, rtol=1e-5, atol=1e-6)
    assert np.abs(pair[0].params - network().params).max() > 1e-3  # it moved


def test_the_schema_pairs_gradient_averaging_with_mini_batch_optimizers(movielens_dir):
    errors = lambda spec: list(pairing_errors(spec))  # noqa: E731
    assert errors({"model": {"type": "neural-net"}}) == []  # its default protocol and optimizer
    assert errors({"model": {"type": "logistic-regression"}, "sync": {"protocol": "gradient-averaging"},
                   "optimizer": {"type": "adam"}}) == []
    # the linear family's default optimizer is per-sample, as is pmf's; k-means moves by its own rule
    [line] = errors({"model": {"type": "logistic-regression"}, "sync": {"protocol": "gradient-averaging"}})
    assert line.startswith("spec.optimizer.type: normalized updates per sample") and "adam" in line
    [line] = errors({"model": {"type": "kmeans"}, "sync": {"protocol": "gradient-averaging"}})
    assert line.startswith("spec.sync.protocol: gradient-averaging needs spec.model.type")
    with pytest.raises(SpecError, match="spec.optimizer.type: adagrad updates per sample"):
        job_for(movielens_dir, sync={"protocol": "gradient-averaging"})


def assert_conserved_steps(summary):
    """Every replica is the initial network plus every step, each counted once among the replicas that took it (Adam
    at 0.001 moves a weight by hundredths in 30 steps: `assert_conserved`'s scale is PMF's)."""
    audit = summary["audit"]
    assert audit["checked"] and audit["update_scale"] > 0.005 and audit["max_error"] < 1e-5, audit


def digits_job(digits_dir, **spec):
    return job_for(digits_dir, model={"type": "neural-net", "network": "mlp", "hiddenSizes": [32]},
                   **{"stop": {"maxSteps": 30}, **spec})


@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["all-to-all", "allreduce", "scatter-reduce", "in-store"])
def test_replicas_stay_equal_and_learn_under_every_exchange(digits_dir, tmp_path, redis_url, amqp_url, audit, exchange):
    # A warm-up changes the rate every step: every replica steps the mean at the rate of the step's union batch, not
    # each at its own batch's (which made them drift apart).
    job = digits_job(digits_dir, workers=3, sync={"exchange": exchange}, optimizer={"warmupEpochs": 0.5})
    assert job.sync.protocol == "gradient-averaging"
    summary = train_local(job, tmp_path, Services(redis_url, amqp_url), QUIET)
    assert summary["steps"] == 30 and summary["rejected_frames"] == 0 and summary["workers_final"] == 3
    # One optimizer, one mean: bit for bit under all-to-all; a merged frame's float32 sum rounds a last bit
    # differently where a worker takes its own share back out (sync/exchanges/reduce.py).
    assert summary["replica_spread"] < 1e-6
    assert_conserved_steps(summary)
    assert summary["validation_scores"]["accuracy"] > 0.5, summary["validation_scores"]  # chance is 0.1


@pytest.mark.slow
def test_a_joiner_takes_its_donors_optimizer_state_and_a_leaver_loses_nothing(digits_dir, tmp_path, redis_url,
                                                                            amqp_url, audit):
    def out_then_in(supervisor, launcher):
        _when_step(supervisor, 5)
        supervisor.request_workers(3)
        deadline = time.monotonic() + 120  # starting a process (and importing torch) takes many steps
        while (2 not in supervisor.live or supervisor.closed < joined_at(supervisor) + 10) and time.monotonic() < deadline:
            time.sleep(0.01)
        supervisor.request_workers(2)
        while len(supervisor.live) > 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        _when_step(supervisor, supervisor.closed + 10)
        supervisor.request_stop("test done")

    def joined_at(supervisor):
        return next((e["step"] for e in supervisor.scaling.events if e["event"] == "join"), 10**9)

    summary = _supervise_with(digits_job(digits_dir, workers=2, stop={"maxSteps": 100000, "patience": 0}), tmp_path, redis_url,
                              amqp_url, out_then_in)
    assert [e["event"] for e in summary["scaling_events"]][:2] == ["launch", "join"]
    assert summary["workers_final"] == 2 and summary["dropped_workers"] == [] and summary["rejected_frames"] == 0
    # Adam's moments came with the parameters: without them the joiner's steps differ and the replicas drift apart.
    assert summary["replica_spread"] == 0.0
    assert_conserved_steps(summary)
