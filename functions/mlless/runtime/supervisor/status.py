"""What a job shows of itself while it runs: one status, mirrored wherever the job is watched.

At every step close the supervisor's status (step, losses, epoch, cost, workers, and from `eta.py` the progress,
ETA and projected cost) goes to the platform (on Kubernetes, the TrainingJob's `status`, `kubectl get tj`), to
`status.json` in the run directory, to the Prometheus gauges and to the progress line. `status.json` holds the
same object the platform is sent, merged as the TrainingJob's status merges the supervisor's patches (a field
set to nothing is gone); it is rewritten at most every `WRITE_SECONDS` while the job trains, at once when a new
evaluation arrives (a new validation loss) or the projection is fitted again (a fit may come some step closes
after its evaluation: `eta.REFIT_SHARE`), and always at its end.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

from mlless.progress import Progress
from mlless.launch.platform import Platform
from mlless.runtime.supervisor.eta import Estimator, Outlook
from mlless.stopping.rules import Standing, ValidationWatch
from mlless.spec import TrainingJob
from mlless.telemetry.metrics import SupervisorMetrics
from mlless.telemetry.record import RunRecord

#: The least time between two rewrites of status.json while the job trains (the platform keeps its own pace).
WRITE_SECONDS = 0.2


def _number(value: float | None, digits: int | None = None) -> float | None:
    """Plain JSON: a float (rounded to `digits`), or None for what is not known (NaN, inf)."""
    return None if value is None or not math.isfinite(value) else round(float(value), digits) if digits else float(value)


class StatusBoard:
    def __init__(self, job: TrainingJob, record: RunRecord, platform: Platform, metrics: SupervisorMetrics,
                 progress: Progress, watch: ValidationWatch, clock: Callable[[], float] = time.monotonic) -> None:
        self.record = record
        self.platform = platform
        self.metrics = metrics
        self.progress = progress
        self.watch = watch
        self.clock = clock
        self.estimator = Estimator(job.stop, job.evaluate_every or 0, clock)
        self.status: dict[str, Any] = {}  # what status.json holds
        self._written = -math.inf
        self._written_news: tuple[float | None, int] = (None, 0)  # the validation loss and projection written

    def publish(self, at: Standing, cost_usd: float, validation_loss: float | None, workers: int,
                end: dict[str, Any] | None = None, completed: bool = False) -> None:
        """The status at a step close; with `end`, the job's last one, `end`'s fields added (done if `completed`)."""
        if end is None:
            outlook = self.estimator.estimate(at, cost_usd, self.watch.evaluations)
        else:
            outlook = self.estimator.finished(cost_usd, completed)
        fields = self.fields(at, cost_usd, validation_loss, workers, outlook) | (end or {})
        self.platform.publish(fields, final=end is not None)
        self.metrics.outlook(outlook.progress, outlook.eta_seconds, outlook.projected_cost_usd, outlook.eta_band)
        self.progress.outlook(outlook.progress, outlook.eta_seconds, outlook.projected_cost_usd, outlook.limit,
                              outlook.eta_band, outlook.at_most)
        self.status.update(fields)
        self.status = {k: v for k, v in self.status.items() if v is not None}
        now = self.clock()
        news = (fields["validationLoss"], self.estimator.projected_from)
        if end is not None or news != self._written_news or now - self._written >= WRITE_SECONDS:
            self._written, self._written_news = now, news
            self.record.status(self.status)

    @staticmethod
    def fields(at: Standing, cost_usd: float, validation_loss: float | None, workers: int,
               outlook: Outlook) -> dict[str, Any]:
        """The status fields, as the TrainingJob's status schema names them (mlless.spec.schema.STATUS_SCHEMA)."""
        return {
            "step": at.steps,
            "epoch": round(at.cursor / at.n_batches, 4),
            "trainLoss": _number(at.train_loss),
            "validationLoss": _number(validation_loss),
            "costUSD": round(cost_usd, 6),
            "workers": workers,
            "progress": round(outlook.progress, 4),
            "progressLimit": outlook.limit,
            "etaSeconds": _number(outlook.eta_seconds, 2),
            "etaLowSeconds": None if outlook.eta_band is None else _number(outlook.eta_band[0], 2),
            "etaHighSeconds": None if outlook.eta_band is None else _number(outlook.eta_band[1], 2),
            "projectedCostUSD": _number(outlook.projected_cost_usd, 6),
        }
