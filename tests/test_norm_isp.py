"""norm-isp (sync/protocols/norm.py): SPIRT's norm-based significance filter (training/norm_filter.py) sends a
worker's accumulated update once the sum of its relative norms passes the threshold, whole or per parameter tensor,
and every replica adds it divided by the workers."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mlless.protocol.messages import Update
from mlless.runtime.local import Services, train_local
from mlless.spec.schema import choices
from mlless.sync.protocols.norm import SCOPES
from mlless.training.norm_filter import NormFilter

from test_training import QUIET, job_for


def trained(f: NormFilter, x: np.ndarray, step: int, idx: list[int], delta: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """One local step: the replica moves by `delta` at `idx`, then the filter selects what to send."""
    i, d = np.array(idx, np.int32), np.array(delta, np.float32)
    x[i] += d
    return f.step(i, d, step)


def test_the_whole_model_is_sent_once_the_sum_of_relative_norms_passes():
    x = np.array([6, 8, 0, 0], np.float32)  # ||x|| = 10
    f = NormFilter(x, 0.25)
    # step 1: delta (0, 0, .6, .8), ||delta|| = 1, ||x|| = sqrt(101): 0.0995
    assert len(trained(f, x, 1, [2, 3], [0.6, 0.8])[0]) == 0
    assert f.sums[0] == pytest.approx(1 / np.sqrt(101), rel=1e-5)
    # step 2: delta accumulated (0, 0, 1.2, 1.6), norm 2, ||x|| = sqrt(104): 0.1961 alone stays below 0.25, and the
    # sum 0.2956 passes: the accumulated update goes out whole
    idx, values = trained(f, x, 2, [2, 3], [0.6, 0.8])
    np.testing.assert_array_equal(idx, [2, 3])
    np.testing.assert_allclose(values, [1.2, 1.6], rtol=1e-6)
    assert f.sums[0] == 0 and f.pending_count() == 0
    # the sum starts again from the send: one step of norm 1 (0.097) is not enough
    assert len(trained(f, x, 3, [0, 1], [0.6, 0.8])[0]) == 0


def test_a_higher_threshold_waits_for_the_sum_of_three_steps():
    x = np.array([6, 8, 0, 0], np.float32)
    f = NormFilter(x, 0.3)
    sent = [len(trained(f, x, t, [2, 3], [0.6, 0.8])[0]) for t in (1, 2, 3)]
    # sums 0.0995, 0.2956 (below 0.3), then + 3 / sqrt(109) = 0.5829
    assert sent == [0, 0, 2]


def test_per_layer_each_tensor_is_measured_and_sent_on_its_own():
    # two groups: a layer of norm 10 that barely moves, and a layer of zeros (a fresh bias)
    x = np.array([6, 8, 0, 0], np.float32)
    whole, layers = NormFilter(x.copy(), 0.25), NormFilter(x.copy(), 0.25, np.array([0, 2, 4]))
    xs = [whole.x, layers.x]
    # step 1: the second layer moves from 0 to (.6, .8): its own ratio is 1, the whole model's 0.0995
    assert len(trained(whole, xs[0], 1, [2, 3], [0.6, 0.8])[0]) == 0
    idx, values = trained(layers, xs[1], 1, [2, 3], [0.6, 0.8])
    np.testing.assert_array_equal(idx, [2, 3])
    # step 2: both layers move; the first by (.06, .08), 0.1 / ||(6.06, 8.08)|| = 0.0099, stays pending, the second
    # (1.2, 1.6) / 2.0 = 0.5... is sent again
    idx, values = trained(layers, xs[1], 2, [0, 1, 2, 3], [0.06, 0.08, 0.6, 0.8])
    np.testing.assert_array_equal(idx, [2, 3])
    np.testing.assert_allclose(values, [0.6, 0.8], rtol=1e-6)
    pending_idx, pending_values = layers.pending()
    np.testing.assert_array_equal(pending_idx, [0, 1])
    np.testing.assert_allclose(pending_values, [0.06, 0.08], rtol=1e-4)
    assert layers.sums[0] == pytest.approx(0.1 / np.hypot(6.06, 8.08), rel=1e-4) and layers.sums[1] == 0
    # the whole model's sum passes at step 2 with every entry, the first layer's too
    idx, _ = trained(whole, xs[0], 2, [0, 1, 2, 3], [0.06, 0.08, 0.6, 0.8])
    np.testing.assert_array_equal(idx, [0, 1, 2, 3])


def test_threshold_zero_sends_every_step_and_a_peers_update_is_not_this_workers():
    x = np.array([1, 2, 3], np.float32)
    f = NormFilter(x, 0.0)
    assert len(trained(f, x, 1, [0], [0.5])[0]) == 1
    x[1] += 5  # a peer's update: shared state, not pending
    f.touched(np.array([1], np.int32), np.array([5], np.float32))
    assert len(trained(f, x, 2, [2], [0.0])[0]) == 0 and f.sums[0] == 0


def test_a_network_exposes_its_parameter_tensors_and_other_models_one_segment():
    torch = pytest.importorskip("torch")  # noqa: F841
    from test_gradients import network

    net = network()
    bounds = net.segments()
    assert bounds[0] == 0 and bounds[-1] == net.size
    assert np.diff(bounds).tolist() == [p.numel() for p in net.net.parameters()]
    from mlless.training.models import build_model

    pmf = build_model("pmf", {"n_users": 3, "n_items": 4, "mean_rating": 3.5})
    np.testing.assert_array_equal(pmf.segments(), [0, pmf.size])
    assert set(SCOPES) == set(choices("sync.normScope"))


def test_a_bad_threshold_or_segmentation_is_refused():
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="threshold"):
        NormFilter(x, -1)
    with pytest.raises(ValueError, match="bounds"):
        NormFilter(x, 1, np.array([0, 3]))


def norm_job(digits_dir, **sync):
    return job_for(digits_dir, workers=2, model={"type": "neural-net", "network": "mlp", "hiddenSizes": [32]},
                   sync=sync, stop={"maxSteps": 40})


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["model", "layer"])
def test_norm_isp_learns_conserves_updates_and_sends_less_than_gradient_averaging(digits_dir, tmp_path, redis_url,
                                                                                  amqp_url, audit, scope):
    from test_gradients import assert_conserved_steps

    services = Services(redis_url, amqp_url)
    summary = train_local(norm_job(digits_dir, protocol="norm-isp", normScope=scope), tmp_path / "norm", services, QUIET)
    assert summary["steps"] == 40 and summary["rejected_frames"] == 0 and summary["workers_final"] == 2
    assert summary["replica_spread"] > 0  # replicas differ by their pending updates...
    assert_conserved_steps(summary)  # ...and by nothing else
    assert summary["validation_scores"]["accuracy"] > 0.5, summary["validation_scores"]  # chance is 0.1
    ga = train_local(norm_job(digits_dir, protocol="gradient-averaging"), tmp_path / "ga", services, QUIET)
    assert ga["steps"] == 40
    assert summary["bytes_sent"] < 0.6 * ga["bytes_sent"], (summary["bytes_sent"], ga["bytes_sent"])


def test_every_replica_adds_a_sent_update_divided_by_the_workers_and_its_sender_keeps_that_share():
    from mlless.protocol.messages import Close
    from mlless.spec.config import OptimizerConfig, SyncConfig
    from mlless.sync.exchanges.base import Published
    from mlless.sync.protocols.norm import NormHalf, NormIsp
    from mlless.training.models import build_model
    from mlless.training.replica import Replica

    model = build_model("logistic-regression", {"n_features": 3})
    model.params[:] = x0 = np.array([1, 2, 3, 4], np.float32)
    replica = Replica(model, OptimizerConfig(type="sgd", learning_rate=0.1), 0.0, audit=True,
                      accumulator=NormIsp(SyncConfig(protocol="norm-isp")).accumulator(model))
    own = np.array([0.4, 0.8], np.float32)
    model.params[[0, 1]] += own  # this worker's step, which it sent whole
    replica.contribution[[0, 1]] += own
    replica.filter.step(np.array([0, 1], np.int32), own, 1)
    exchange = SimpleNamespace(precision="float32", outbox=[Published(1, "k", b"", np.array([0, 1], np.int32), own)])
    half = NormHalf(NormIsp(SyncConfig(protocol="norm-isp")), 0, replica, exchange, None)  # type: ignore[arg-type]
    peer = Update(1, 1, np.array([1, 2], np.int32), np.array([2.0, -1.0], np.float32))
    # a third worker is in the job though it sent nothing: every sent update counts a third
    half.combine(Close(-1, 1, 2, 0, (0, 1, 2), (0, 1)), [peer])
    np.testing.assert_allclose(model.params, x0 + np.array([0.4, 0.8 + 2.0, -1.0, 0]) / 3, rtol=1e-6)
    np.testing.assert_allclose(replica.contribution, np.array([0.4, 0.8, 0, 0]) / 3, rtol=1e-6)
    assert replica.pending_count() == 0 and not len(replica.filter.pending()[0])


@pytest.mark.slow
def test_a_leavers_pending_update_reaches_the_survivors_and_nothing_is_lost(digits_dir, tmp_path, redis_url, amqp_url,
                                                                           audit):
    from test_gradients import assert_conserved_steps
    from test_training import _supervise_with, _when_step

    def scale_in(supervisor, launcher):
        _when_step(supervisor, 10)
        supervisor.request_workers(2)

    job = job_for(digits_dir, workers=3, model={"type": "neural-net", "network": "mlp", "hiddenSizes": [32]},
                  sync={"protocol": "norm-isp", "precision": "bfloat16"}, stop={"maxSteps": 40})
    summary = _supervise_with(job, tmp_path, redis_url, amqp_url, scale_in)
    assert summary["workers_final"] == 2 and summary["dropped_workers"] == [] and summary["rejected_frames"] == 0
    audit = summary["audit"]
    assert audit["leavers"] == 1 and audit["leaver_pending_entries"] > 0
    # losing the leaver's pending update, or adding it twice, would leave an error as large as it is
    assert audit["leaver_pending_max"] > 100 * audit["max_error"], audit
    assert_conserved_steps(summary)
