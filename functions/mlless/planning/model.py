"""LambdaML's analytic model (§5.3) of a job by worker count, fitted on its recorded runs, and the choice of P.

    T(P)    = start-up(P) + steps(P) · step(P) + wind-down
    start-up(P) = a + b·P                        least squares (b ≥ 0) over the runs; one P: its start-up
    wind-down                                    the runs' mean seconds after their last step (final evaluation,
                                                 the model written)
    steps(P)    = N(P) / (P · batch)             N(P): samples until the stop rule fires, N₁·P^β (LambdaML's f(w)),
                                                 β fitted over the runs' P (`steptime.fit_beta`), never past the
                                                 job's step or epoch limit at that P
    step(P)     = a run's mean step at P, at the job's evaluation cadence, through the job's samples to its stop
                  (`RunMeasure.step_through`: past a short run, at its newest steps' pace);
                  at a P without a run, max(path(P), roofline(P), trend(P), shared(P))
                                                 path: `steptime.step_seconds`; σ from the smallest P run (its mean
                                                 step less the model's, so it holds evaluations and every other
                                                 pause), κ from the smallest P > 1 run's write + read + apply;
                                                 roofline: P workers' CPU and the supervisor's on `cores` cores;
                                                 trend: the line (never falling) through the runs' steps at the two
                                                 P nearest. On a machine with fewer cores than processes, a worker's
                                                 own compute slows as P grows, which the path's terms, measured at
                                                 one P, do not see. Through P = 1 and 2, it also carries on the rise
                                                 where the exchange begins, which can overstate a large P on many cores;
                                                 shared: the same line through the steps divided by the
                                                 contention c(P) = max(1, (P + 1)/cores), P workers and the
                                                 supervisor time-sharing the cores, times c at P: on fewer cores
                                                 than processes the step grows faster than the line. With cores to
                                                 spare, c = 1 and it is the line
    cost(P)     = `telemetry.cost.job_cost` at the job's prices: P workers and the supervisor billed T(P), the
                  services T(P); Perf/$ = 1/(T · cost) (`perf_per_dollar`)

N at a run's P comes from its own loss curve (`stoprule.samples_when_stop_fires`: the stop rule's projection,
`stopping.forecast.project_stop`, in samples), its evaluations spaced as the job's would be
(`RunMeasure.evaluation_spacing`: patience counts evaluations). Where the job has `stop.maxSeconds`
or `stop.budgetUSD` and the model says it would run past them, T stops there.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from mlless.planning.measures import PlanError, RunMeasure
from mlless.planning.steptime import fit_beta, fit_kappa, step_seconds
from mlless.planning.stoprule import samples_when_stop_fires
from mlless.spec import TrainingJob
from mlless.stopping.forecast import MIN_EVALUATIONS
from mlless.telemetry.cost import job_cost, perf_per_dollar

#: Without a step or epoch limit, the fitted curve is followed this many times past the longest run's samples.
EXTRAPOLATION_LIMIT = 100.0
#: A stop predicted further past its run than this many times the run's samples gets a note: the pilots whose
#: predicted stops came out late were those extrapolated this far.
FAR_EXTRAPOLATION = 4.0
#: What ends the job in a prediction, besides its loss rule ("loss rule").
LOSS_RULE, LENGTH_LIMIT, MAX_SECONDS, BUDGET = "loss rule", "step/epoch limit", "max seconds", "budget"


@dataclass(frozen=True)
class Link:
    """One hop to where the services are, and the wire's bandwidth (bytes/s; inf: the embedded transport)."""

    latency: float
    bandwidth: float
    where: str


@dataclass(frozen=True)
class Prediction:
    workers: int
    seconds: float  # from the job's start to its stop
    cost_usd: float
    perf_per_dollar: float | None
    steps: float
    epochs: float
    startup: float
    step_seconds: float
    bound: str  # where the step comes from: "run" (measured at this P), or the largest of "path", "cores", "trend",
    # "shared"
    stops_on: str
    measured: bool  # a run at this P is among those fitted


@dataclass
class Fit:
    """The model's constants, fitted on a job's runs."""

    startup: tuple[float, float]  # a, b of a + b·P
    wind_down: float
    sigma: float
    kappa: float
    link: Link
    cores: int
    pattern: str
    batch: float
    batches_per_epoch: float
    local: dict[int, float]  # by measured P
    steps: dict[int, float]  # the runs' mean step at the job's evaluation cadence, by measured P
    sent: dict[int, float]
    samples_to_stop: dict[int, float]
    stopped_by_rule: dict[int, bool]
    n1: float | None  # N(P) = n1·P^β over the runs stopped by the loss rule; None if none was
    beta: float
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"startup_seconds": {"a": self.startup[0], "b_per_worker": self.startup[1]},
                "wind_down_seconds": self.wind_down, "sigma_seconds": self.sigma,
                "kappa_seconds_per_byte": self.kappa, "latency_seconds": self.link.latency,
                "bandwidth_bytes_per_second": self.link.bandwidth if math.isfinite(self.link.bandwidth) else None,
                "link": self.link.where, "cores": self.cores, "beta": self.beta, "samples_to_stop_p1": self.n1,
                "batch": self.batch, "batches_per_epoch": self.batches_per_epoch,
                "measured_workers": sorted(self.local)}


def _by_p(runs: Sequence[RunMeasure], attr: str) -> dict[int, float]:
    return _by_p_of(runs, lambda r: getattr(r, attr))


def _by_p_of(runs: Sequence[RunMeasure], value: Callable[[RunMeasure], float]) -> dict[int, float]:
    """The mean of `value` over the runs at each P."""
    out: dict[int, list[float]] = {}
    for r in runs:
        out.setdefault(r.workers, []).append(float(value(r)))
    return {p: statistics.fmean(v) for p, v in sorted(out.items())}


def _trend(values: dict[int, float], P: int) -> float:
    """The line through the values at the two measured P nearest to P, at P, its slope clamped at 0 (0 with one)."""
    if len(values) < 2:
        return 0.0
    (p0, v0), (p1, v1) = sorted(sorted(values.items(), key=lambda pv: (abs(pv[0] - P), -pv[0]))[:2])
    return v0 + max(0.0, (v1 - v0) / (p1 - p0)) * (P - p0)


def _contention(P: int, cores: int) -> float:
    """Processes per core when P workers and the supervisor share `cores` cores, at least 1: how much slower each
    one's part of a step runs than on a core of its own."""
    return max(1.0, (P + 1) / max(1, cores))


def _nearest(values: dict[int, float], P: int) -> float:
    """The value at P if measured, else at the measured P nearest to it on the same side of 1 (a lone worker
    sends and filters nothing, so P = 1 says nothing of P > 1)."""
    if P in values:
        return values[P]
    same = [p for p in values if (p > 1) == (P > 1)] or list(values)
    return values[min(same, key=lambda p: (abs(p - P), -p))]


def limit_samples(job: TrainingJob, P: int, batch: float, batches_per_epoch: float) -> float:
    """Samples the job's step or epoch limit lets P workers train (inf without one)."""
    stop = job.stop
    limits = [math.inf]
    if stop.max_epochs is not None:
        limits.append(stop.max_epochs * batches_per_epoch * batch)
    if stop.max_steps is not None:
        limits.append(stop.max_steps * P * batch)
    return min(limits)


def _fit_startup(points: dict[int, float]) -> tuple[float, float]:
    if len(points) < 2:
        return next(iter(points.values())), 0.0
    mx, my = statistics.fmean(points), statistics.fmean(points.values())
    den = sum((p - mx) ** 2 for p in points)
    b = max(0.0, sum((p - mx) * (t - my) for p, t in points.items()) / den)
    return my - b * mx, b


def _extrapolation_note(run: RunMeasure, samples: float) -> str | None:
    """A note on a stop predicted past `run` on a curve too short to say it firmly, or None."""
    why = []
    if samples > run.samples and len(run.evaluations) < MIN_EVALUATIONS:
        why.append(f"from {len(run.evaluations)} evaluations, fewer than the {MIN_EVALUATIONS} the reference curve "
                   "needs (a protocol with rounds evaluates at their ends only)")
    if samples > FAR_EXTRAPOLATION * run.samples:
        why.append(f"to {samples / run.samples:.1f}x the run's samples (a curve still falling cannot show where it "
                   "flattens)")
    if not why:
        return None
    return (f"{run.run_dir}: its stop is extrapolated {' and '.join(why)}: a longer run (a pilot's --pilot-seconds, "
            "or a run given with --from) predicts it more firmly")


def fit(job: TrainingJob, runs: Sequence[RunMeasure], link: Link, cores: int) -> Fit:
    """The model's constants from the job's runs (PlanError if they cannot support it)."""
    if not runs:
        raise PlanError("no runs to fit: give --from RUNDIR, or let the pilot run")
    for r in runs:
        if r.model != job.model.type:
            raise PlanError(f"{r.run_dir}: a {r.model} run, and the job trains {job.model.type}")
    batch = statistics.fmean(r.batch for r in runs)
    per_epoch = statistics.fmean(r.batches_per_epoch for r in runs)
    local, sent, read = _by_p(runs, "local"), _by_p(runs, "sent"), _by_p(runs, "read")
    notes: list[str] = []
    measured_ps = sorted(local)
    multi = [p for p in measured_ps if p > 1]
    kappa = 0.0
    if multi:
        two = [r for r in runs if r.workers == multi[0] and r.exchange is not None]
        if two:
            kappa = fit_kappa(statistics.fmean(r.exchange for r in two), sent[multi[0]], read[multi[0]],
                              link.latency, link.bandwidth)
    else:
        notes.append("no run at P > 1: the exchange is not measured, and P > 1 is predicted without it")
    samples: dict[int, list[float]] = {}
    trained: dict[Path, float] = {}  # samples to the stop, by run
    by_rule: dict[int, bool] = {}
    unfit: list[str] = []
    # Without evaluations the loss rules read the training loss (`StopRules`), which the runs do not extrapolate.
    stop = job.stop if job.evaluate_every else dataclasses.replace(job.stop, patience=0, target_loss=None)
    if stop is not job.stop and job.stop.target_loss is not None:
        notes.append("evaluation is off: the target on the training loss is left out; the job's limits stop it")
    for r in runs:
        cap = limit_samples(job, r.workers, batch, per_epoch)
        interval = r.evaluation_spacing(job.evaluate_every or 1) * r.workers * batch
        try:
            n, rule = samples_when_stop_fires(
                stop, r.evaluations, samples_per_step=r.workers * batch, interval_samples=interval,
                same_cadence=r.evaluate_every == job.evaluate_every,
                limit_samples=cap if math.isfinite(cap) else EXTRAPOLATION_LIMIT * max(x.samples for x in runs))
        except ValueError as exc:
            unfit.append(f"{r.run_dir} ({exc})")
            continue
        if not rule and not math.isfinite(cap):
            raise PlanError(f"{r.run_dir}: the stop rule does not fire on its fitted loss curve within "
                            f"{EXTRAPOLATION_LIMIT:g}x the runs' samples, and the job has no step or epoch limit")
        if rule and (note := _extrapolation_note(r, n)):
            notes.append(note)
        samples.setdefault(r.workers, []).append(n)
        trained[r.run_dir] = n
        by_rule[r.workers] = by_rule.get(r.workers, False) or rule
    if not samples:
        raise PlanError(f"cannot tell when the stop rule fires from the runs' loss curves: {'; '.join(unfit)}; "
                        "run longer or evaluate more often")
    notes += [f"left out of the samples to stop, its loss curve too short: {u}" for u in unfit]
    measured_steps = _by_p_of(runs, lambda r: r.step_through(trained.get(r.run_dir, r.samples), job.evaluate_every))
    smallest = measured_ps[0]
    path0 = step_seconds(P=smallest, local=local[smallest], sigma=0.0, kappa=kappa, s=sent[smallest],
                         pattern=job.sync.exchange, L=link.latency, B=link.bandwidth)["step"]
    sigma = max(0.0, measured_steps[smallest] - path0)
    to_stop = {p: statistics.fmean(v) for p, v in samples.items()}
    ruled = [(p, n) for p, n in to_stop.items() if by_rule[p]]
    beta = fit_beta(ruled)
    n1 = None
    if ruled:
        p0, n0 = min(ruled)
        n1 = n0 / p0 ** beta
    if len(ruled) < 2 and ruled:
        notes.append("the stop rule fired at one P only: samples to stop are taken as the same at every P (β = 0)")
    return Fit(startup=_fit_startup(_by_p(runs, "startup")), wind_down=statistics.fmean(r.wind_down for r in runs),
               sigma=sigma, kappa=kappa, link=link, cores=cores,
               pattern=job.sync.exchange, batch=batch, batches_per_epoch=per_epoch, local=local, steps=measured_steps,
               sent=sent, samples_to_stop=to_stop, stopped_by_rule=by_rule, n1=n1, beta=beta, notes=notes)


def predict(model: Fit, job: TrainingJob, P: int) -> Prediction:
    """Time to stop, cost and Perf/$ at P workers."""
    cap = limit_samples(job, P, model.batch, model.batches_per_epoch)
    if model.n1 is not None:
        n, stops_on = model.n1 * P ** model.beta, LOSS_RULE
        if n >= cap:
            n, stops_on = cap, LENGTH_LIMIT
    else:
        n, stops_on = cap, LENGTH_LIMIT
    steps = n / (P * model.batch)
    local = _nearest(model.local, P)
    sent = _nearest(model.sent, P) if P > 1 else 0.0
    m = step_seconds(P=P, local=local, sigma=model.sigma, kappa=model.kappa, s=sent, pattern=model.pattern,
                     L=model.link.latency, B=model.link.bandwidth)
    roof = (P * m["worker_cpu"] + model.sigma) / max(1, model.cores)
    if P in model.steps:
        step, bound = model.steps[P], "run"
    else:
        shared = _trend({p: v / _contention(p, model.cores) for p, v in model.steps.items()}, P)
        step, bound = max((m["step"], "path"), (roof, "cores"), (_trend(model.steps, P), "trend"),
                          (shared * _contention(P, model.cores), "shared"))
    startup = model.startup[0] + model.startup[1] * P
    seconds = startup + steps * step + model.wind_down
    if job.stop.max_seconds is not None and seconds > job.stop.max_seconds:
        seconds, stops_on = job.stop.max_seconds, MAX_SECONDS
    cost = job_cost(job.pricing, [seconds] * P, seconds).total
    if job.stop.budget_usd is not None and cost > job.stop.budget_usd:
        seconds, cost, stops_on = seconds * job.stop.budget_usd / cost, job.stop.budget_usd, BUDGET
    return Prediction(workers=P, seconds=seconds, cost_usd=cost, perf_per_dollar=perf_per_dollar(seconds, cost),
                      steps=steps, epochs=n / (model.batches_per_epoch * model.batch), startup=startup,
                      step_seconds=step, bound=bound, stops_on=stops_on,
                      measured=P in model.local)


def choose(predictions: Sequence[Prediction], deadline: float | None,
           budget: float | None) -> tuple[Prediction | None, str]:
    """The P to run, and why in one line: the cheapest within the deadline (and budget), or the fastest within the
    budget; None when no P meets them, and the line says which comes nearest."""
    span = f"P = {predictions[0].workers}-{predictions[-1].workers}"
    ok = [p for p in predictions if (deadline is None or p.seconds <= deadline)
          and (budget is None or p.cost_usd <= budget)]
    if not ok:
        fastest = min(predictions, key=lambda p: p.seconds)
        cheapest = min(predictions, key=lambda p: p.cost_usd)
        if deadline is not None and fastest.seconds > deadline:
            return None, (f"no worker count in {span} meets the {deadline:g} s deadline: the fastest, "
                           f"P = {fastest.workers}, is predicted to take {fastest.seconds:.1f} s")
        if budget is not None and cheapest.cost_usd > budget:
            return None, (f"no worker count in {span} stays within the ${budget:g} budget: the cheapest, "
                           f"P = {cheapest.workers}, is predicted to cost ${cheapest.cost_usd:.5f}")
        return None, f"no worker count in {span} meets both the {deadline:g} s deadline and the ${budget:g} budget"
    if deadline is not None:
        pick = min(ok, key=lambda p: (p.cost_usd, p.seconds))
        why = (f"P = {pick.workers}: the cheapest worker count predicted to stop within {deadline:g} s"
               + (f" and ${budget:g}" if budget is not None else "")
               + f" ({pick.seconds:.1f} s, ${pick.cost_usd:.5f}; {len(ok)} of {len(predictions)} in {span} do)")
    else:
        pick = min(ok, key=lambda p: (p.seconds, p.cost_usd))
        why = (f"P = {pick.workers}: the fastest worker count predicted to cost at most ${budget:g} "
               f"({pick.seconds:.1f} s, ${pick.cost_usd:.5f}; {len(ok)} of {len(predictions)} in {span} do)")
    return pick, why

