"""Early stopping on the validation loss and the best model: `ValidationWatch`, then whole jobs."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from mlless.contract import STOP_DIVERGED, STOP_MAX_EPOCHS, STOP_MAX_STEPS, STOP_NO_IMPROVEMENT
from mlless.smoothing import RecentEwma, ewma
from mlless.data.dataset import Dataset
from mlless.training.models import load_model
from mlless.runtime.local import Services, train_local
from mlless.progress import Progress
from mlless.protocol import keys, layouts
from mlless.protocol.framing import decode, encode
from mlless.protocol.messages import Left, Tensors
from mlless.runtime.supervisor.evaluation import EVALUATION_SHARE, Evaluation
from mlless.stopping import forecast
from mlless.runtime.supervisor.loop import Supervisor
from mlless.stopping.rules import SMOOTHING_SPAN, Standing, StopRules, ValidationWatch
from mlless.spec.config import StopConfig
from mlless.spec import from_manifest

from test_training import job_for


def smoothed_losses(losses: list[float]) -> list[float]:
    """The smoothed validation loss the stop rules read after each of `losses` (finite evaluations, in order)."""
    window = RecentEwma(SMOOTHING_SPAN)
    return [window.update(x) for x in losses]


def feed(watch: ValidationWatch, losses: list[float], every: int = 10) -> None:
    for k, loss in enumerate(losses, start=1):
        watch.observe(k * every, loss, np.full(3, float(k), np.float32))


def test_best_snapshot_is_kept_and_copied():
    watch = ValidationWatch(patience=None, target_loss=None, target_steps=10)
    params = np.zeros(3, np.float32)
    watch.observe(10, 0.9, params)
    params[:] = 7  # the caller reuses its buffer: the kept best must not change with it
    watch.observe(20, 0.95, params)
    assert watch.best is not None and watch.best.step == 10 and watch.best.loss == 0.9
    np.testing.assert_array_equal(watch.best.params, 0)
    feed(watch, [0.8, 0.7, 0.75, 0.72])
    assert watch.best.step == 20 and watch.best.loss == 0.7
    np.testing.assert_array_equal(watch.best.params, 2)


@pytest.mark.parametrize("seed", range(40))
def test_the_eta_s_futures_stop_where_a_watch_fed_them_stops_and_leave_the_watch_as_it_was(seed):
    # forecast._replay counts a projected future with the watch's own rules but no watch of its own: it must stop
    # at the evaluation where a watch fed the same history and future through `observe` stops, by the same rule.
    rng = np.random.default_rng(seed)
    kwargs = dict(patience=int(rng.integers(1, 6)), target_loss=[None, 0.72][seed % 2],
                  target_steps=int(rng.choice([1, 10, 40])), min_delta=float(rng.choice([0.0, 0.001, 0.01])))
    history = (0.7 + 0.3 / np.arange(1, int(rng.integers(2, 12)))).tolist()
    watch = ValidationWatch(**kwargs)
    feed(watch, history)
    first = 10 * len(history)
    before = (watch.evaluations.copy(), watch.stale, watch.smoothed.value, watch.best, watch.below_since)
    rows = 0.7 + 0.3 / np.arange(len(history) + 1, len(history) + 31) + rng.normal(0, 0.02, (8, 30))
    steps = [first + 10 * k for k in range(1, 31)]
    for row, smoothed in zip(rows, watch.smoothed.following(rows).tolist()):
        got = forecast._replay(watch, first, steps, smoothed, 10, steps[-1])
        fed = ValidationWatch(**kwargs)
        feed(fed, history)
        want = (math.inf, "")
        for step, loss in zip([first, *steps], [None, *row]):
            if loss is not None:
                fed.observe(step, loss, np.zeros(0, np.float32))
            held = None if fed.below_since is None else max(step, fed.below_since + fed.target_steps)
            if fed.target_held(step + 9) and held <= steps[-1]:  # read at each step close until the next evaluation
                want = (held, "targetLoss")
                break
            if fed.patience_exhausted():
                want = (step, "patience")
                break
        assert got == want
    assert (watch.evaluations, watch.stale, watch.smoothed.value, watch.best, watch.below_since) == before


@pytest.mark.parametrize("span", [1, SMOOTHING_SPAN, 6])
def test_a_window_s_following_values_are_its_updates_to_the_bit_and_leave_it_as_it_was(span):
    rng = np.random.default_rng(span)
    for held, width in [(h, w) for h in range(span + 2) for w in (0, 1, 2, 9)]:
        window = RecentEwma(span)
        for x in rng.normal(1.0, 0.1, held):
            window.update(x)
        rows = rng.normal(1.0, 0.1, (4, width))
        state = (list(window._recent), window.value)
        got = window.following(rows)
        assert (list(window._recent), window.value) == state
        for row, values in zip(rows, got):
            fed = RecentEwma(span)
            for x in list(window._recent)[::-1]:
                fed.update(x)
            assert values.tolist() == [fed.update(x) for x in row]


@pytest.mark.parametrize("patience", [1, 3])
def test_patience_counts_evaluations_without_smoothed_improvement(patience):
    losses = [1.0, 0.9, 0.8, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0]
    smoothed = np.array(smoothed_losses(losses))
    # reference: evaluations since the running minimum of the smoothed curve last fell
    stale = [i - max(j for j in range(i + 1) if smoothed[j] == smoothed[: i + 1].min()) for i in range(len(losses))]
    expected = [s >= patience for s in stale]
    watch = ValidationWatch(patience=patience, target_loss=None, target_steps=10)
    seen = []
    for k, loss in enumerate(losses):
        watch.observe(10 * k, loss, np.zeros(1, np.float32))
        seen.append(watch.patience_exhausted())
    assert seen == expected
    assert not any(seen[:5]) and seen[-1]


def test_a_loss_wandering_around_its_best_by_a_hair_exhausts_patience_with_min_delta():
    # the quickstart's shape (#24): the smoothed loss keeps setting new bests by about 0.0001 around 0.868
    losses = [0.95, 0.90, 0.875, 0.8685, 0.8682, 0.8684, 0.8680, 0.8683, 0.8678, 0.8681, 0.8676, 0.8679, 0.8674]
    stopped = {}
    for min_delta in (0.0, 0.001):
        watch = ValidationWatch(patience=3, target_loss=None, target_steps=10, min_delta=min_delta)
        stopped[min_delta] = next((k for k, loss in enumerate(losses)
                                   if (watch.observe(k, loss, np.zeros(1, np.float32)), watch.patience_exhausted())[1]),
                                  None)
    assert stopped[0.0] is None  # every dip restarts the count
    assert stopped[0.001] == 8, stopped  # three evaluations after its last 0.1 % gain (the 6th)
    # small improvements still add up: a steady 0.05 % a step passes 0.1 % every other step and never stops
    watch = ValidationWatch(patience=3, target_loss=None, target_steps=10, min_delta=0.001)
    for k in range(40):
        watch.observe(k, 0.9 * 0.9995 ** k, np.zeros(1, np.float32))
        assert not watch.patience_exhausted()


def test_one_noisy_evaluation_does_not_stop_a_job_that_improves():
    watch = ValidationWatch(patience=2, target_loss=None, target_steps=10)
    feed(watch, [1.0, 0.8, 0.95, 0.7, 0.6, 0.55])
    assert not watch.patience_exhausted()


def test_target_must_hold_for_target_steps_on_the_smoothed_loss():
    watch = ValidationWatch(patience=None, target_loss=0.5, target_steps=15)
    feed(watch, [0.9, 0.45])  # smoothed (0.9, 0.45) -> 0.6: a single good snapshot is not enough
    assert not watch.target_held(100)
    feed(watch, [0.4, 0.4, 0.4])  # smoothed: 0.50 at step 10 (the first at or below), then lower
    assert smoothed_losses([0.9, 0.45, 0.4])[-1] <= 0.5 < smoothed_losses([0.9, 0.45])[-1]
    assert not watch.target_held(10 + 14)
    assert watch.target_held(10 + 15)
    watch.observe(110, 2.0, np.zeros(1, np.float32))  # back above: the streak starts again
    assert not watch.target_held(200)


def test_the_smoothing_is_the_ewma_of_the_newest_evaluations_only():
    losses = [0.9, 0.45, 0.4, 0.42, 0.41]
    ours = smoothed_losses(losses)
    np.testing.assert_allclose(ours[:SMOOTHING_SPAN], ewma(losses[:SMOOTHING_SPAN], SMOOTHING_SPAN))
    for k in range(SMOOTHING_SPAN, len(losses)):
        assert ours[k] == pytest.approx(ewma(losses[k + 1 - SMOOTHING_SPAN: k + 1], SMOOTHING_SPAN)[-1])


#: (step of the snapshot, validation BCE) of `benchmarks/scaling.py --quick`'s SSP run at P = 3 on the 200k clicks
#: (#22): the first snapshot lands in SSP's warm-up oscillation, the model is at or below the target (VW + 0.005)
#: at steps 50 and 100, and from then on it overfits (to 0.79 by maxSeconds).
SSP_CLICKS = [(25, 0.7442), (50, 0.5896), (75, 0.5962), (100, 0.5863), (131, 0.5912), (159, 0.5956), (184, 0.5994),
              (221, 0.6070), (273, 0.6168), (320, 0.6259), (357, 0.6327), (384, 0.6376), (412, 0.6420)]
SSP_CLICKS_TARGET = 0.590272278289391


def test_a_warm_up_evaluation_does_not_keep_the_smoothed_loss_above_a_target_the_model_reached():
    """#22: the target rule fires after the third evaluation at or below the target, not never."""
    watch = ValidationWatch(patience=None, target_loss=SSP_CLICKS_TARGET, target_steps=10)
    fired = None
    for (step, loss), following in zip(SSP_CLICKS, [s for s, _ in SSP_CLICKS[1:]] + [10_000]):
        watch.observe(step, loss, np.full(3, step, np.float32))
        fired = next((at for at in range(step + 1, following + 1) if watch.target_held(at)), None)
        if fired is not None:
            break
    assert fired == 100 + 10
    assert watch.best is not None and watch.best.step == 100


def test_a_warm_up_evaluation_still_counts_while_it_is_among_the_newest():
    """One lucky snapshot right after the warm-up does not fire the target rule either."""
    watch = ValidationWatch(patience=None, target_loss=0.5, target_steps=1)
    feed(watch, [0.9, 0.49, 0.52])
    assert not any(watch.target_held(s) for s in range(30, 100))


def test_patience_stops_an_ssp_job_that_overfits_after_a_warm_up():
    """The same evaluations with patience 3 and no target: the job stops 3 evaluations after the smoothed minimum."""
    watch = ValidationWatch(patience=3, target_loss=None, target_steps=10)
    stopped = None
    for step, loss in SSP_CLICKS:
        watch.observe(step, loss, np.zeros(1, np.float32))
        if watch.patience_exhausted():
            stopped = step
            break
    smooth = smoothed_losses([loss for _, loss in SSP_CLICKS])
    minimum = int(np.argmin(smooth))
    assert stopped == SSP_CLICKS[minimum + 3][0]


def test_a_non_finite_or_exploding_evaluation_means_diverged_and_is_never_best():
    watch = ValidationWatch(patience=2, target_loss=1.0, target_steps=1)
    feed(watch, [0.5])
    assert not watch.diverged
    watch.observe(20, math.nan, np.zeros(3, np.float32))
    assert watch.diverged and watch.best is not None and watch.best.loss == 0.5
    assert not watch.target_held(100)
    # Overfitting moves the loss by percents, and is not divergence; a loss several times its best is.
    watch = ValidationWatch(patience=None, target_loss=None, target_steps=1)
    feed(watch, [1.0, 0.6, 0.5, 0.55, 0.6, 0.7, 0.8])
    assert not watch.diverged
    feed(watch, [5.0, 9.0, 20.0])
    assert watch.diverged and watch.best.loss == 0.5
    rules = StopRules(StopConfig(max_steps=1000), evaluate_every=10)
    rules.watch = watch
    assert rules.check(Standing(100, 0, 10, 1.0, 1.0), lambda: 0.0) == STOP_DIVERGED


# ---- whole jobs ---------------------------------------------------------------------------------------------

QUIET = Progress(enabled=False)


def lr_job(dataset: Path, **spec):
    return from_manifest({
        "apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "stop"},
        "spec": {"workers": 2, "model": {"type": "logistic-regression"},
                 "dataset": {"uri": str(dataset), "cacheBatches": True}, "evaluation": {"everySteps": 5}, **spec},
    })


def test_workers_that_handed_in_their_final_replicas_before_the_finish_are_merged(synthetic_lr_dir, tmp_path,
                                                                                 monkeypatch):
    """After the final close, the loop's liveness check may see the workers' processes end and take in their Done
    before the finish begins (a loaded machine: CI saw it once): their final replicas are the model all the same."""
    check = Supervisor._check_liveness

    def late_check(self: Supervisor) -> None:
        if self.stop_reason is not None:  # the final close is out: let every worker hand in its replica and end
            deadline = time.monotonic() + 10
            while len(self.launcher.exited()) < len(self.workers) and time.monotonic() < deadline:
                time.sleep(0.01)
        check(self)
        if self.stop_reason is not None:
            assert not self.live  # the race: their Done came in here, before the finish

    monkeypatch.setattr(Supervisor, "_check_liveness", late_check)
    summary = train_local(lr_job(synthetic_lr_dir, stop={"maxSteps": 30}), tmp_path, Services(), QUIET)
    assert (summary["stop_reason"], summary["workers_final"]) == (STOP_MAX_STEPS, 2)
    assert summary["final_validation_loss"] is not None and summary["replica_spread"] is not None


def test_a_worker_that_leaves_after_the_last_close_is_merged_but_not_counted_among_the_final_workers(
        synthetic_lr_dir, tmp_path, monkeypatch, audit):
    """A scale-in near the job's end whose Left comes only after the final close (held back here, as a loaded
    machine can: CI saw it): no survivor merged the leaver's replica, so the finish takes it in, but the worker left."""
    handle, receive, close, held = Supervisor._handle, Supervisor._receive, Supervisor._close, []

    def hold_left(self: Supervisor, body: bytes) -> None:
        if self.stop_reason is None and isinstance(decode(body), Left):
            held.append(body)
        else:
            handle(self, body)

    def release_after_the_final_close(self: Supervisor, within: float = 0.2) -> None:
        if self.stop_reason is not None and held:
            handle(self, held.pop(0))
        else:
            receive(self, within)

    def evict_near_the_end(self: Supervisor, step: int, reports):
        if step == 27:
            self.scaling.remove_worst(step, "test")
        return close(self, step, reports)

    monkeypatch.setattr(Supervisor, "_handle", hold_left)
    monkeypatch.setattr(Supervisor, "_receive", release_after_the_final_close)
    monkeypatch.setattr(Supervisor, "_close", evict_near_the_end)
    summary = train_local(lr_job(synthetic_lr_dir, workers=3, stop={"maxSteps": 30}), tmp_path, Services(), QUIET)
    assert [e["event"] for e in summary["scaling_events"]] == ["leave"] and summary["dropped_workers"] == []
    assert summary["audit"]["replicas"] == 3  # the leaver's replica is in the model...
    assert (summary["workers_initial"], summary["workers_final"]) == (3, 2)  # ...and the leaver is not a worker


@pytest.mark.slow
def test_a_job_without_limits_stops_when_validation_stops_improving_and_keeps_the_best(synthetic_lr_dir, tmp_path):
    """The small LR set overfits within a few epochs: patience stops it, and model.npz is the best snapshot."""
    job = lr_job(synthetic_lr_dir)
    assert job.stop.patience == 5 and job.stop.max_epochs == 50
    summary = train_local(job, tmp_path, Services(), QUIET)
    assert summary["stop_reason"] == STOP_NO_IMPROVEMENT
    assert summary["epochs"] < 50
    best = summary["best_validation"]
    assert summary["validation_loss"] == pytest.approx(min(best["loss"], summary["final_validation_loss"]))
    assert summary["validation_loss"] <= summary["final_validation_loss"]
    # What was saved is what was reported: re-evaluate model.npz on the validation split.
    model = load_model(tmp_path / "model.npz")
    val = Dataset.open(str(synthetic_lr_dir)).validation()
    assert model.loss(*model.evaluate(val)) == pytest.approx(summary["validation_loss"], rel=1e-5)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r["validation_loss"] for r in rows if r["validation_loss"] is not None]
    assert min(evaluated) == pytest.approx(best["loss"])
    assert summary["model_step"] in (best["step"], summary["steps"])


#: A safety cap far beyond the small LR set's plateau (a few epochs, seconds): the job must not come near it.
SAFETY_CAP_SECONDS = 600.0


@pytest.mark.slow
def test_a_seconds_cap_keeps_the_default_patience(synthetic_lr_dir, tmp_path):
    """Issue #47: a user who adds maxSeconds as a safety cap keeps early stopping, and the job ends at its plateau."""
    job = lr_job(synthetic_lr_dir, stop={"maxSeconds": SAFETY_CAP_SECONDS})
    summary = train_local(job, tmp_path, Services(), QUIET)
    assert summary["stop_reason"] == STOP_NO_IMPROVEMENT
    assert summary["model_step"] < summary["steps"]  # it stopped past its best, which is the model handed back


@pytest.mark.slow
def test_patience_0_runs_to_the_limit(synthetic_lr_dir, tmp_path):
    """Past the epochs where the default patience stops this set (4.5 in the test above, the same job), patience 0
    trains on to the limit."""
    epochs = 12.0
    summary = train_local(lr_job(synthetic_lr_dir, stop={"maxEpochs": epochs, "patience": 0}), tmp_path, Services(),
                          QUIET)
    assert summary["stop_reason"] == STOP_MAX_EPOCHS
    assert summary["epochs"] >= epochs


def test_evaluations_are_spaced_in_time_when_a_rounds_closes_come_together(movielens_dir):
    """Evaluation.due: every evaluation.everySteps closes, and no more often than the evaluations' cost allows
    (EVALUATION_SHARE of the time), in seconds: under averaging or blocked a round's closes arrive within a
    millisecond of each other, and a step time averaged over them would stretch the interval by the round."""
    class Store(dict):  # the keys a request empties (so polling reads no stale frame), nothing else
        def put(self, key, value):
            self[key] = value

    job = job_for(movielens_dir, evaluation={"everySteps": 5})
    store = Store()
    evaluation = Evaluation(job, Dataset.open(str(movielens_dir)), store, ValidationWatch(None, None, 1),
                            lambda loss: None, lambda n: None)
    assert not evaluation.due(4) and evaluation.due(5)
    evaluation.request_snapshot(5, 0, peers=(0, 1))
    assert store == {keys.snapshot(): b"", keys.snapshot_pending(0): b"", keys.snapshot_pending(1): b""}
    evaluation.evaluation_seconds.update(0.05)
    assert not evaluation.due(40)  # 35 closes later, but within a millisecond
    evaluation.snapshot_requested -= 0.05 / EVALUATION_SHARE
    assert evaluation.due(40) and not evaluation.due(9)


def test_an_evaluations_cost_is_its_own_work_not_the_wait_for_its_snapshot(movielens_dir):
    """Under rounds a worker reads a snapshot request at its round's end; counting that wait as the evaluation's
    cost stretched the interval between evaluations tenfold, and a job reached its target unnoticed."""
    class Store(dict):
        def put(self, key, value):
            self[key] = value

        def get_many(self, names):
            return [self.get(name) for name in names]

    job = job_for(movielens_dir, evaluation={"everySteps": 5})
    store = Store()
    evaluation = Evaluation(job, Dataset.open(str(movielens_dir)), store, ValidationWatch(None, None, 1),
                            lambda loss: None, lambda n: None)
    evaluation.request_snapshot(5, 0)
    assert evaluation.evaluate_snapshot(0) is None  # not put yet
    time.sleep(0.3)  # the rest of the donor's round
    store.put(keys.snapshot(), encode(Tensors(0, 5, {layouts.PARAMS: evaluation.model.params.copy()})))
    assert evaluation.evaluate_snapshot(0) is not None
    assert evaluation.evaluation_seconds.value < 0.3 / 2
