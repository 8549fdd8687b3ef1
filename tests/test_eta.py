"""Progress, ETA and projected cost (runtime/supervisor/eta.py) and the stop rule's projection (forecast.py).

The projection is checked against where the supervisor's own `ValidationWatch` stops on the whole curve, given only
its first part; the curves are synthetic SGD-like ones, 0.5 + 0.5/(1 + t/200), with Gaussian evaluation noise.
The estimator is driven by hand with a fake clock; status.json is checked as a reader polling it would see it.
"""
from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pytest

from mlless.runtime.supervisor.eta import Estimator
from mlless.stopping.forecast import MIN_EVALUATIONS, project_stop
from mlless.stopping.rules import Standing, ValidationWatch
from mlless.spec.config import StopConfig
from mlless.telemetry.record import STATUS_FILE, RunRecord

EVERY = 25
STEPS = np.arange(1, 801) * EVERY


def curve(sigma: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 0.5 + 0.5 / (1 + STEPS / 200) + rng.normal(0.0, sigma, STEPS.size)


def real_stop(losses: np.ndarray, stop: StopConfig) -> int:
    """The step close at which the supervisor's rules stop a job evaluated every EVERY steps with these losses."""
    watch = ValidationWatch(stop.patience, stop.target_loss, stop.target_steps, stop.min_delta)
    for k, (step, loss) in enumerate(zip(STEPS.tolist(), losses.tolist())):
        watch.observe(step, loss, np.zeros(0))
        for at in range(step, step + EVERY):  # the rules are read at every step close until the next evaluation
            if watch.target_held(at) or watch.patience_exhausted():
                return at
    raise AssertionError("the curve never stops")


def errors_at_half(sigma: float, stop: StopConfig, rule: str, seeds: int) -> list[float]:
    """For each seed: |projected - real stop| / real steps left, projected from the curve up to half the real stop."""
    errors = []
    for seed in range(seeds):
        losses = curve(sigma, seed)
        real = real_stop(losses, stop)
        seen = max(MIN_EVALUATIONS, int(np.searchsorted(STEPS, real / 2)))
        projected = project_stop(STEPS[:seen], losses[:seen], stop, EVERY)
        assert projected is None or (projected.rule == rule and projected.curve is not None)
        errors.append(math.inf if projected is None else abs(projected.step - real) / (real - STEPS[seen - 1]))
    return errors


@pytest.mark.parametrize("sigma, bound", [(0.0, 0.2), (0.002, 0.2), (0.005, 0.3)])  # noise of 1 % is projected less closely
def test_a_target_loss_stop_is_projected_from_the_first_half_of_the_curve(sigma, bound):
    errors = errors_at_half(sigma, StopConfig(target_loss=0.56, target_steps=10, patience=0), "targetLoss", 5)
    assert np.median(errors) <= bound, errors


@pytest.mark.parametrize("sigma", [0.001, 0.003])
def test_a_patience_stop_is_projected_from_the_first_half_of_the_curve(sigma):
    errors = errors_at_half(sigma, StopConfig(patience=5, min_delta=0.001), "patience", 8)
    # A patience stop is where noise happens to hold the best for `patience` evaluations: single runs scatter
    # (benchmarks/forecast.py measures real ones).
    assert np.median(errors) <= 0.5, errors


def test_the_band_of_a_patience_stop_holds_the_projection_and_most_real_stops():
    stop, held, widths = StopConfig(patience=5, min_delta=0.001), 0, []
    for seed in range(20):
        losses = curve(0.002, seed)
        real = real_stop(losses, stop)
        seen = max(MIN_EVALUATIONS, int(np.searchsorted(STEPS, real / 2)))
        projected = project_stop(STEPS[:seen], losses[:seen], stop, EVERY)
        assert projected is not None and projected.band is not None
        early, late = projected.band
        assert early <= projected.step <= late
        held += early <= real <= late
        widths.append((late - early) / (real - STEPS[seen - 1]))
    # The futures' 10th to 90th percentile stops: 14 of these 20 held the real stop. A band that held only the
    # projection, or everything, fails one of the two.
    assert held >= 12 and np.median(widths) < 1.0, (held, widths)


def test_a_noise_free_curve_stops_on_patience_only_where_its_fall_is_under_min_delta():
    losses = curve(0.0, 0)
    early = project_stop(STEPS[:40], losses[:40], StopConfig(patience=5, min_delta=0.01), EVERY)
    late = project_stop(STEPS[:40], losses[:40], StopConfig(patience=5, min_delta=0.001), EVERY)
    assert early is not None and late is not None and early.step < late.step


def test_no_projection_without_a_rule_enough_evaluations_or_before_the_limit():
    losses = curve(0.002, 1)
    assert project_stop(STEPS[:40], losses[:40], StopConfig(max_steps=1000, patience=0), EVERY) is None
    assert project_stop(STEPS[:MIN_EVALUATIONS - 1], losses[:MIN_EVALUATIONS - 1], StopConfig(patience=5), EVERY) is None
    assert project_stop(STEPS[:40], losses[:40], StopConfig(target_loss=0.56, patience=0), EVERY, until_step=1100) is None
    assert project_stop(STEPS[:40], losses[:40], StopConfig(target_loss=0.1, patience=0), EVERY) is None  # under the asymptote


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def standing(steps: int, seconds: float, n_batches: int = 100) -> Standing:
    return Standing(steps=steps, cursor=2 * steps, n_batches=n_batches, train_loss=1.0, elapsed=seconds)


def test_progress_and_eta_follow_the_nearest_limit_at_the_jobs_pace():
    estimator = Estimator(StopConfig(max_steps=1000, max_seconds=200.0, budget_usd=1.0, patience=0), 0, Clock())
    first = estimator.estimate(standing(1, 2.0), 0.001, [])
    assert first.limit == "maxSeconds" and first.eta_seconds == 198.0 and first.projected_cost_usd is None
    # 10 steps and $0.001 a second: 1000 steps in 100 s, the budget in 1000 s, the clock at 200 s.
    out = estimator.estimate(standing(101, 12.0), 0.011, [])
    assert out.limit == "maxSteps" and out.progress == pytest.approx(0.101)
    assert out.eta_seconds == pytest.approx(89.9) and out.projected_cost_usd == pytest.approx(0.011 + 0.0899)
    out = estimator.estimate(standing(201, 182.0), 0.181, [])  # the pace fell: maxSeconds is nearer now
    assert out.limit == "maxSeconds" and out.progress == pytest.approx(0.91) and out.eta_seconds == pytest.approx(18.0)
    assert estimator.finished(0.1, completed=True).progress == 1.0 and estimator.finished(0.1, True).eta_seconds == 0.0
    suspended = estimator.finished(0.1, completed=False)
    assert suspended.progress == pytest.approx(0.91) and suspended.eta_seconds is None


def test_epochs_count_mini_batches_and_the_projection_joins_the_limits():
    clock = Clock()
    stop = StopConfig(max_epochs=100.0, patience=5, min_delta=0.001)
    estimator = Estimator(stop, EVERY, clock)
    losses = curve(0.001, 3)
    estimator.estimate(standing(0, 1.0), 0.0, [])
    seen = 40
    evaluations = list(zip(STEPS[:seen].tolist(), losses[:seen].tolist()))
    at = standing(int(STEPS[seen - 1]), 1.0 + STEPS[seen - 1] / 100)  # 100 steps, 200 mini-batches a second
    out = estimator.estimate(at, 0.0, evaluations)
    # the epochs limit is 5000 steps away at this pace: the estimator projects up to there
    projected = project_stop(STEPS[:seen], losses[:seen], stop, EVERY, until_step=5000)
    assert projected is not None and projected.step < 5000  # 100 epochs are 5000 steps here
    assert out.limit == "patience" and out.progress == pytest.approx(at.steps / projected.step)
    assert out.eta_seconds == pytest.approx((projected.step - at.steps) / 100, rel=1e-3)
    assert projected.band is not None and out.eta_band == pytest.approx(
        [(step - at.steps) / 100 for step in projected.band], rel=1e-3)
    # An epochs limit between the median and the late futures ends the late ones: the band's top is its ETA.
    limit = (projected.step + projected.band[1]) // 2
    capped = Estimator(StopConfig(max_epochs=limit / 50, patience=5, min_delta=0.001), EVERY, clock)
    capped.estimate(standing(0, 1.0), 0.0, [])
    out = capped.estimate(at, 0.0, evaluations)
    assert out.limit == "patience" and out.eta_band is not None
    assert out.eta_band[1] == pytest.approx((limit - at.steps) / 100, rel=1e-3)
    no_rule = Estimator(StopConfig(max_epochs=100.0, patience=0), EVERY, clock)
    no_rule.estimate(standing(0, 1.0), 0.0, [])
    out = no_rule.estimate(at, 0.0, evaluations)
    assert out.limit == "maxEpochs" and out.progress == pytest.approx(2 * at.steps / 10000)
    assert out.eta_band is None and not out.at_most  # a limit known in advance: no futures, and nothing sooner
    with_rule = Estimator(StopConfig(max_epochs=100.0, patience=5), EVERY, clock)
    with_rule.estimate(standing(0, 1.0), 0.0, [])
    out = with_rule.estimate(at, 0.0, evaluations[:MIN_EVALUATIONS - 1])  # too few to fit, nothing stale yet
    assert out.limit == "maxEpochs" and out.at_most  # patience may end it sooner


def test_status_json_is_replaced_whole(tmp_path):
    record = RunRecord(tmp_path)
    record.status({"step": 1, "progress": 0.1})
    record.status({"step": 2, "progress": 0.2})
    assert json.loads((tmp_path / STATUS_FILE).read_text()) == {"step": 2, "progress": 0.2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATUS_FILE]  # no temporary file left behind


@pytest.mark.slow
@pytest.mark.services
def test_a_local_job_shows_its_progress_eta_and_cost_in_status_json(movielens_dir, tmp_path, redis_url, amqp_url):
    from mlless.runtime.local import new_job_id
    from test_platform import RecordingPlatform, run
    from test_training import job_for

    platform, run_dir, seen = RecordingPlatform(), tmp_path / "run", []
    done = threading.Event()

    def watch() -> None:  # as a user's `watch cat status.json` would: every read is a whole status
        while not done.is_set():
            if (run_dir / STATUS_FILE).exists():
                status = json.loads((run_dir / STATUS_FILE).read_text())
                if not seen or status != seen[-1]:
                    seen.append(status)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        summary = run(job_for(movielens_dir, workers=2, stop={"maxSteps": 400}), new_job_id("eta"), run_dir,
                      redis_url, amqp_url, platform)
    finally:
        done.set()
        watcher.join()
    final = json.loads((run_dir / STATUS_FILE).read_text())
    merged: dict = {}
    for status, _ in platform.published:
        merged = {k: v for k, v in (merged | status).items() if v is not None}
    assert final == merged  # the object the platform (the TrainingJob's status) was sent, merged as a patch is
    assert final["progress"] == 1.0 and final["etaSeconds"] == 0.0 and final["progressLimit"] == "maxSteps"
    assert final["projectedCostUSD"] == final["costUSD"] == pytest.approx(summary["cost_usd"], abs=1e-6)
    assert len(seen) >= 3, seen  # rewritten as the job went, not only at its end
    training = [s for s, final in platform.published if not final and s["step"] > 1]
    assert [s["progress"] for s in training] == sorted(s["progress"] for s in training)
    assert [s["progress"] for s in seen] == sorted(s["progress"] for s in seen)
    assert training[0]["progress"] == pytest.approx(training[0]["step"] / 400, abs=1e-4)
    etas = [s["etaSeconds"] for s in training]
    # The pace of a shared machine wobbles, so the ETA may tick up a little, but it falls to the end. (Its first
    # figures, from a pace over the first few steps, may be below the middle's: beside other tests the job slowed.)
    assert etas[-1] < etas[len(etas) // 2] and etas[-1] < etas[0]
    assert sum(b <= a for a, b in zip(etas, etas[1:])) >= 0.8 * (len(etas) - 1)
    assert all(s["projectedCostUSD"] >= s["costUSD"] for s in training)


def test_before_a_fit_a_patience_already_counting_is_projected_to_run_out():
    # the clicks overfit after 4 evaluations and stop after 9, before a curve of 8 can be fitted (benchmarks/forecast.py)
    losses = [0.5955, 0.5785, 0.5751, 0.57485, 0.5769, 0.5772]
    steps = [25 * (k + 1) for k in range(len(losses))]
    stop = StopConfig(patience=5, min_delta=0.001)
    projected = project_stop(steps, losses, stop, EVERY)
    assert projected is not None and projected.rule == "patience" and projected.curve is None
    assert projected.step == 150 + 3 * EVERY  # two stale evaluations seen, three to go
    assert project_stop(steps[:5], losses[:5], stop, EVERY) is None  # one: as often noise on a curve still falling
    assert project_stop(steps[:4], losses[:4], stop, EVERY) is None  # improving


def test_the_progress_line_names_the_limit_its_eta_counts_towards():
    import io

    from mlless.progress import Progress

    def line(*outlook) -> str:
        out = io.StringIO()
        progress = Progress(stream=out)
        progress.outlook(*outlook)
        progress.status(step=10, epoch=0.5, train_loss=0.9, validation_loss=None, workers=2, bytes_per_step=1024,
                        elapsed=3.0, cost=0.0001)
        return out.getvalue().rstrip("\n")

    assert line(0.42, 65.0, 0.00123, "patience").endswith("  42%  eta 1m05s to patience  -> $0.00123")
    assert line(0.42, 65.0, 0.00123, "patience", (40.0, 130.0)).endswith(
        "  42%  eta 1m05s (40s-2m10s) to patience  -> $0.00123")
    assert line(0.9, 0.43, 0.00123, "patience", (0.2, 0.71)).endswith(
        "  90%  eta 0.4s (0.2s-0.7s) to patience  -> $0.00123")
    assert line(0.1, 12.0, 0.00123, "maxEpochs", None, True).endswith("  10%  eta ≤12s to maxEpochs  -> $0.00123")
    assert line(0.0, None, None, None).endswith("   0%  eta -  -> $-")  # before the pace is known


def test_the_status_holds_a_projected_stops_band_and_drops_it_for_a_limit_known_in_advance():
    from mlless.runtime.supervisor.eta import Outlook
    from mlless.runtime.supervisor.status import StatusBoard

    band = Outlook(0.5, 10.0, 0.01, "patience", (6.0, 15.5))
    projected = StatusBoard.fields(standing(10, 1.0), 0.001, 0.9, 2, band)
    assert (projected["etaLowSeconds"], projected["etaSeconds"], projected["etaHighSeconds"]) == (6.0, 10.0, 15.5)
    fixed = StatusBoard.fields(standing(10, 1.0), 0.001, 0.9, 2, Outlook(0.5, 10.0, 0.01, "maxSteps"))
    assert fixed["etaLowSeconds"] is None and fixed["etaHighSeconds"] is None  # a patch of null removes them


def test_status_json_is_rewritten_at_most_every_write_seconds_but_at_once_with_a_new_evaluation(tmp_path):
    from mlless.progress import Progress
    from mlless.launch.platform import Platform
    from mlless.runtime.supervisor.status import WRITE_SECONDS, StatusBoard
    from mlless.spec import from_manifest
    from mlless.telemetry.metrics import SupervisorMetrics

    now = [0.0]
    job = from_manifest({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "s"},
                         "spec": {"model": {"type": "pmf"}, "dataset": {"uri": str(tmp_path)}}})
    watch = ValidationWatch(job.stop.patience, None, 0, job.stop.min_delta)
    board = StatusBoard(job, RunRecord(tmp_path), Platform(), SupervisorMetrics.for_job("s", job.pricing),
                        Progress(enabled=False), watch, clock=lambda: now[0])

    def publish(step: int, validation: float | None, at: float) -> int:
        now[0] = at
        board.publish(standing(step, at), 0.001 * step, validation, 2)
        return json.loads((tmp_path / STATUS_FILE).read_text())["step"]

    assert publish(1, None, 0.0) == 1
    assert publish(2, None, WRITE_SECONDS / 4) == 1  # too soon
    assert publish(3, 0.9, WRITE_SECONDS / 2) == 3  # a new evaluation: at once
    assert publish(4, 0.9, WRITE_SECONDS * 3 / 4) == 3
    assert publish(5, 0.9, WRITE_SECONDS * 2) == 5


def test_the_fits_keep_to_their_share_of_the_time_past_a_burst():
    from mlless.runtime.supervisor import eta

    now = [0.0]
    cost = eta.REFIT_BURST / 4
    fitted = []

    def clock() -> float:
        return now[0]

    estimator = Estimator(StopConfig(patience=5), 10, clock)
    with pytest.MonkeyPatch.context() as patch:
        def projection(steps, *args, **kwargs):
            fitted.append(len(steps))
            now[0] += cost
            return None
        patch.setattr(eta, "project_stop", projection)
        evaluations = []
        for k in range(1, 400):  # an evaluation at every step close, one every millisecond
            evaluations.append((10 * k, 1.0 / k))
            now[0] += 1e-3
            estimator.estimate(standing(10 * k, now[0]), 0.0, evaluations)
    # The burst's worth at their evaluations (the first estimate has no pace, so no projection), while credit is
    # left; then one each time the share has paid for one, tens of evaluations apart.
    assert fitted[:5] == [2, 3, 4, 5, 6] and fitted[5] > 50
    spent, elapsed = cost * len(fitted), now[0]
    assert spent <= eta.REFIT_BURST + eta.REFIT_SHARE * elapsed + cost
    assert spent >= eta.REFIT_SHARE * elapsed - cost


@pytest.mark.parametrize("cost", [0.004, 0.02])
def test_the_eta_holds_the_fits_to_come_and_the_pace_leaves_them_out(cost):
    """100 steps a second of training, an evaluation every 10 steps, and from the 8th evaluation on a fit at each
    that takes `cost` seconds of the supervisor (the step close waits on it): 4 % of the time, under the share, or
    20 %, over it. The ETA is the training left at 100 steps a second plus the fits it will hold."""
    from mlless.runtime.supervisor import eta

    clock = Clock()
    estimator = Estimator(StopConfig(max_steps=1000, patience=5), 10, clock)
    with pytest.MonkeyPatch.context() as patch:
        def projection(steps, *args, **kwargs):
            clock.now += cost if len(steps) >= 8 else 0.0
            return None
        patch.setattr(eta, "project_stop", projection)
        evaluations = []
        for step in range(1, 201):
            clock.now += 0.01
            if step % 10 == 0:
                evaluations.append((step, 1.0 / step))
            out = estimator.estimate(standing(step, clock.now), 0.0, evaluations)
            assert out.limit == ("maxSteps" if step > 1 else None)  # the first step close has no pace yet
            if 1 < step < 80:  # no fit has cost anything yet: the training left alone
                assert out.eta_seconds == pytest.approx((1000 - step) / 100)
    training = (1000 - 200) / 100
    if cost * 100 / 10 < eta.REFIT_SHARE:  # a fit at each of the 80 evaluations to come
        assert out.eta_seconds == pytest.approx(training + 80 * cost)
    else:  # as many as the share pays for
        assert training + eta.REFIT_SHARE * training / (1 - eta.REFIT_SHARE) <= out.eta_seconds + 1e-9
        assert out.eta_seconds <= training + (eta.REFIT_BURST + eta.REFIT_SHARE * training) / (1 - eta.REFIT_SHARE)


def test_status_json_is_rewritten_at_once_when_the_projection_is_fitted_after_its_evaluation(tmp_path, monkeypatch):
    # Fits may take only eta.REFIT_SHARE of the supervisor's time (past a burst), so the one after an evaluation can
    # come some step closes later, with no new validation loss: the file must show it then, not a WRITE_SECONDS
    # later.
    from mlless.progress import Progress
    from mlless.launch.platform import Platform
    from mlless.runtime.supervisor import eta
    from mlless.runtime.supervisor.status import WRITE_SECONDS, StatusBoard
    from mlless.spec import from_manifest
    from mlless.telemetry.metrics import SupervisorMetrics

    now = [0.0]
    fit_seconds = eta.REFIT_BURST + WRITE_SECONDS / 4 * eta.REFIT_SHARE  # the next fit: WRITE_SECONDS / 4 after

    def slow_projection(*args, **kwargs):
        now[0] += fit_seconds
        return project_stop(*args, **kwargs)

    monkeypatch.setattr(eta, "project_stop", slow_projection)
    job = from_manifest({"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "s"},
                         "spec": {"model": {"type": "pmf"}, "dataset": {"uri": str(tmp_path)}}})
    watch = ValidationWatch(job.stop.patience, None, 0, job.stop.min_delta)
    board = StatusBoard(job, RunRecord(tmp_path), Platform(), SupervisorMetrics.for_job("s", job.pricing),
                        Progress(enabled=False), watch, clock=lambda: now[0])
    rng = np.random.default_rng(0)

    def publish(step: int, at: float, evaluate: bool) -> tuple[int, int]:
        if evaluate:
            watch.observe(step, 0.8 + 1.0 / step + rng.normal(0, 1e-3), np.zeros(0, np.float32))
        now[0] = at
        board.publish(standing(step, at), 0.001 * step, watch.evaluations[-1][1], 2)
        return json.loads((tmp_path / STATUS_FILE).read_text())["step"], board.estimator.projected_from

    apart = 2 * fit_seconds / eta.REFIT_SHARE  # the credit refills between these
    for k in range(1, MIN_EVALUATIONS + 1):  # projected at each evaluation, the 8th by a fitted curve
        assert publish(10 * k, apart * k, True) == (10 * k, k if k > 1 else 0)  # a pace needs two
    assert board.estimator._projection is not None and board.estimator._projection.curve is not None
    start, step = apart * MIN_EVALUATIONS, 10 * MIN_EVALUATIONS
    assert publish(step + 10, start + WRITE_SECONDS / 8, True) == (step + 10, MIN_EVALUATIONS)  # written, not fitted
    assert publish(step + 11, start + WRITE_SECONDS / 6, False) == (step + 10, MIN_EVALUATIONS)  # neither
    assert publish(step + 12, start + WRITE_SECONDS / 3, False) == (step + 12, MIN_EVALUATIONS + 1)  # the refit
