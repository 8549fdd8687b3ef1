"""The supervisor's Prometheus metrics.

The supervisor is the one process that sees every step close, so it is the
one that exposes the job's metrics; the auto-tuner, dashboards and the
operator read them from its `/metrics` endpoint. Each `SupervisorMetrics`
owns a private `CollectorRegistry` rather than the process-global one, so
several jobs (or tests) in one process never collide on metric names.

Names follow the Prometheus conventions: an `mlless_` prefix, `_total` on
counters, base units (seconds, bytes). The one exception is cost, exposed
in US dollars (`mlless_cost_usd`): there is no base unit for money, and
`_usd` is the established convention for it.

Every series carries a `job` label (the TrainingJob). A Prometheus server
that scrapes with the default `honor_labels: false` renames it to
`exported_job`, keeping its own scrape-config `job` label beside it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from mlless.contract import STEP_PHASES
from mlless.spec import PricingConfig

#: Step phases last from ~0.1 ms (an in-memory apply) to seconds (a cold fetch from S3),
#: so the buckets are spaced logarithmically (1-2.5-5 per decade) over 0.1 ms .. 10 s.
PHASE_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05,
    0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)

TUNER_OUTCOMES: tuple[str, ...] = ("remove", "keep", "no-decision")
COST_COMPONENTS: tuple[str, ...] = ("workers", "supervisor", "redis", "rabbitmq")


def billed_units(seconds: float, granularity: float) -> int:
    """Whole billing units of an invocation of `seconds` (every started unit is billed).

    The same rounding as `mlless.telemetry.cost.billed_seconds`, kept in integer units so
    that repeated increments of a counter never accumulate float error.
    """
    return max(math.ceil(round(seconds / granularity, 9)), 0)


class SupervisorMetrics:
    """The metrics of one training job, fed by explicit calls from the supervisor.

    `memory_gb` and `granularity` are the job's pricing (function memory and
    billing granularity in seconds), needed to turn invocation durations into
    billed seconds and GB-seconds.
    """

    def __init__(
        self,
        job: str,
        registry: CollectorRegistry | None = None,
        memory_gb: float = 2.0,
        granularity: float = 0.1,
    ) -> None:
        if granularity <= 0:
            raise ValueError(f"billing granularity must be positive, got {granularity}")
        self.job = job
        self.registry = registry if registry is not None else CollectorRegistry()
        self.memory_gb = memory_gb
        self.granularity = granularity
        self._last_step = 0
        # Billing units already counted for the current invocation of each (worker, pod).
        self._billed: dict[tuple[str, str], int] = {}
        self._server: Any = None
        r = self.registry

        self.steps = Counter("mlless_steps_total", "Training steps closed by the supervisor.", ["job"], registry=r)
        self.train_loss = Gauge(
            "mlless_train_loss", "Training loss of the newest closed step (RMSE for pmf, BCE for logistic regression).", ["job"], registry=r
        )
        self.validation_loss = Gauge(
            "mlless_validation_loss", "Validation loss of the newest replica snapshot evaluated by the supervisor.", ["job"], registry=r
        )
        self.active_workers = Gauge("mlless_active_workers", "Workers in the step barrier (live workers).", ["job"], registry=r)
        self.staleness = Gauge("mlless_step_staleness", "Steps the stalest worker trained the last step ahead of the "
                               "closes its replica had applied (0 under BSP).", ["job"], registry=r)
        self.update_bytes = Counter(
            "mlless_update_bytes_total", "Bytes of model updates the workers published to Redis.", ["job"], registry=r
        )
        self.filtered_entries = Counter(
            "mlless_filtered_entries_total",
            "Update entries the ISP significance filter held back, summed over workers and steps.",
            ["job"],
            registry=r,
        )
        self.step_phase = Histogram(
            "mlless_step_phase_seconds",
            "Seconds a step spends in each phase (mean over the live workers of that step).",
            ["job", "phase"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.billed_seconds = Counter(
            "mlless_worker_billed_seconds_total",
            "Billed seconds of a worker function: invocation time rounded up to the billing granularity.",
            ["job", "worker", "pod"],
            registry=r,
        )
        self.billed_gb_seconds = Counter(
            "mlless_worker_billed_gigabyte_seconds_total",
            "Billed GB-seconds of a worker function: billed seconds times function memory.",
            ["job", "worker", "pod"],
            registry=r,
        )
        self.cost_usd = Gauge(
            "mlless_cost_usd",
            "Cost of the job so far in US dollars, by component (workers, supervisor, redis, rabbitmq, total).",
            ["job", "component"],
            registry=r,
        )
        self.progress = Gauge("mlless_progress_ratio", "Fraction done of the stop limit nearest to ending the job "
                              "(runtime/supervisor/eta.py).", ["job"], registry=r)
        self.eta = Gauge("mlless_eta_seconds", "Seconds until the nearest stop limit ends the job (NaN while not known).",
                         ["job"], registry=r)
        self.eta_band = Gauge("mlless_eta_band_seconds", "The ETA of a projected stop (targetLoss, patience) in its "
                              "futures' early (bound=low) and late tenth (bound=high); NaN for a limit known in "
                              "advance.", ["job", "bound"], registry=r)
        self.projected_cost = Gauge("mlless_projected_cost_usd", "The job's cost at its end, projected, in US dollars "
                                    "(NaN while not known).", ["job"], registry=r)
        self.tuner_decisions = Counter(
            "mlless_tuner_decisions_total", "Scale-in auto-tuner decisions, by outcome.", ["job", "outcome"], registry=r
        )
        self.tuner_knee = Gauge(
            "mlless_tuner_knee_step", "Step at which the auto-tuner detected the knee of the loss curve.", ["job"], registry=r
        )
        self.rejected = Counter(
            "mlless_rejected_frames_total", "Malformed or unexpected frames rejected by the supervisor and workers.", ["job"], registry=r
        )

        # Initialise the bounded label sets to 0, so that a series exists (and rate() works)
        # before its first event rather than appearing out of nowhere.
        for metric in (self.steps, self.update_bytes, self.filtered_entries, self.rejected):
            metric.labels(job)
        for phase in STEP_PHASES:
            self.step_phase.labels(job, phase)
        for outcome in TUNER_OUTCOMES:
            self.tuner_decisions.labels(job, outcome)

    # ---- serving -------------------------------------------------------------------------------


    @classmethod
    def for_job(cls, job_id: str, pricing: PricingConfig) -> SupervisorMetrics:
        """Metrics of one job, billed with its pricing's function memory and granularity."""
        return cls(job_id, memory_gb=pricing.function_memory_gb, granularity=pricing.billing_granularity_seconds)
    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Expose this registry over HTTP (`/metrics`) in a daemon thread; returns the bound port.

        Port 0 binds any free port, which is what tests and several jobs per host want.
        """
        if self._server is not None:
            raise RuntimeError("metrics are already being served")
        server, _thread = start_http_server(port, addr, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        """Stop the HTTP server started by `serve` (no-op if none)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- events --------------------------------------------------------------------------------

    def step_closed(
        self,
        *,
        step: int,
        train_loss: float,
        workers: int,
        bytes_published: int,
        entries_filtered: int,
        phases: Mapping[str, float | None],
        staleness: int = 0,
    ) -> None:
        """Record a closed step.

        `mlless_steps_total` advances to `step` (so it equals the number of
        closed steps even if a call was skipped, and never goes back).
        `phases` maps phase name to seconds; a phase whose timing is not known
        yet (None, e.g. the barrier phases of the last step) is left out.
        """
        if step > self._last_step:
            self.steps.labels(self.job).inc(step - self._last_step)
            self._last_step = step
        self.train_loss.labels(self.job).set(train_loss)
        self.active_workers.labels(self.job).set(workers)
        self.staleness.labels(self.job).set(staleness)
        self.update_bytes.labels(self.job).inc(max(bytes_published, 0))
        self.filtered_entries.labels(self.job).inc(max(entries_filtered, 0))
        for phase, seconds in phases.items():
            if seconds is None or math.isnan(seconds):
                continue
            if phase not in STEP_PHASES:
                raise ValueError(f"unknown step phase {phase!r}; expected one of {STEP_PHASES}")
            self.step_phase.labels(self.job, phase).observe(seconds)

    def validation(self, loss: float) -> None:
        self.validation_loss.labels(self.job).set(loss)

    def worker_invocation_started(self, worker: int, pod: str) -> None:
        """A new invocation of `worker` on `pod` begins: its billing restarts from zero.

        The counters keep what earlier invocations were billed; the new one adds on top.
        """
        self._billed[(str(worker), pod)] = 0
        # Create the series now so a scrape shows the worker before its first billed unit.
        self.billed_seconds.labels(self.job, str(worker), pod)
        self.billed_gb_seconds.labels(self.job, str(worker), pod)

    def worker_billed(self, worker: int, pod: str, invocation_seconds: float) -> None:
        """The current invocation of `worker` has now lasted `invocation_seconds` in total.

        Called repeatedly as the invocation runs; the counters grow by the
        billing units started since the previous call. A shorter duration than
        before adds nothing (counters never go down); a re-invocation must be
        announced with `worker_invocation_started`. The first call for a
        (worker, pod) implicitly starts its first invocation.
        """
        key = (str(worker), pod)
        units = billed_units(invocation_seconds, self.granularity)
        new_units = units - self._billed.get(key, 0)
        if new_units <= 0:
            if key not in self._billed:
                self.worker_invocation_started(worker, pod)
            return
        self._billed[key] = units
        seconds = new_units * self.granularity
        self.billed_seconds.labels(self.job, *key).inc(seconds)
        self.billed_gb_seconds.labels(self.job, *key).inc(seconds * self.memory_gb)

    def cost(self, breakdown: Mapping[str, float]) -> None:
        """Set the cost gauges from a breakdown such as `CostBreakdown.as_dict()`.

        `total` is the sum of the components unless the breakdown gives it.
        """
        for component, usd in breakdown.items():
            self.cost_usd.labels(self.job, component).set(usd)
        if "total" not in breakdown:
            self.cost_usd.labels(self.job, "total").set(sum(breakdown.values()))

    def outlook(self, progress: float, eta_seconds: float | None, projected_cost_usd: float | None,
                eta_band: tuple[float, float] | None = None) -> None:
        """Set the progress, ETA (and its band) and projected cost gauges; an unknown figure is NaN."""
        self.progress.labels(self.job).set(progress)
        self.eta.labels(self.job).set(math.nan if eta_seconds is None else eta_seconds)
        for bound, seconds in zip(("low", "high"), eta_band or (math.nan, math.nan)):
            self.eta_band.labels(self.job, bound).set(seconds)
        self.projected_cost.labels(self.job).set(math.nan if projected_cost_usd is None else projected_cost_usd)

    def tuner_decision(self, outcome: str) -> None:
        if outcome not in TUNER_OUTCOMES:
            raise ValueError(f"unknown tuner outcome {outcome!r}; expected one of {TUNER_OUTCOMES}")
        self.tuner_decisions.labels(self.job, outcome).inc()

    def knee(self, step: int) -> None:
        self.tuner_knee.labels(self.job).set(step)

    def rejected_frames(self, n: int) -> None:
        """Add `n` newly rejected frames (an increment, not the running total)."""
        if n > 0:
            self.rejected.labels(self.job).inc(n)

