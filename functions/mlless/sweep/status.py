"""A sweep's trials table and status: the same object in the TrainingSweep's status and in the local sweep
directory's status.json (`mlless.spec.sweep.SWEEP_STATUS_SCHEMA`)."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from mlless.contract import SWEEP_STATUS_FILE as STATUS_FILE
from mlless.sweep.asha import TrialProgress


@dataclass
class Trial:
    name: str
    parameters: dict[str, Any]
    state: str = "Pending"
    step: int = 0
    best_validation_loss: float | None = None
    cost_usd: float = 0.0
    rung: int = 0
    rung_losses: list[float] = field(default_factory=list)
    killed_at: int | None = None
    stop_reason: str | None = None
    model_uri: str | None = None

    def as_status(self) -> dict[str, Any]:
        """The trial's row in the status (camelCase; unset fields left out)."""
        return {_camel(f.name): value for f in dataclasses.fields(self)
                if (value := getattr(self, f.name)) is not None}

    @classmethod
    def from_status(cls, row: dict[str, Any]) -> Trial:
        names = {_camel(f.name): f.name for f in dataclasses.fields(cls)}
        return cls(**{names[key]: value for key, value in row.items() if key in names})

    def progress(self) -> TrialProgress:
        return TrialProgress(self.name, self.state == "Running", self.rung, list(self.rung_losses))

    def observe_loss(self, loss: float | None) -> None:
        if loss is not None and math.isfinite(loss) and (self.best_validation_loss is None
                                                         or loss < self.best_validation_loss):
            self.best_validation_loss = loss


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join("USD" if part == "usd" else "URI" if part == "uri" else part.title() for part in rest)


def best_trial(trials: Iterable[Trial]) -> Trial | None:
    """The trial with the lowest best validation loss among those that did not fail."""
    scored = [t for t in trials if t.state != "Failed" and t.best_validation_loss is not None]
    return min(scored, key=lambda t: t.best_validation_loss, default=None)


def sweep_status(phase: str, trials: list[Trial], message: str | None = None) -> dict[str, Any]:
    best = best_trial(trials)
    status: dict[str, Any] = {
        "phase": phase,
        "trialsCreated": sum(t.state != "Pending" for t in trials),
        "trialsRunning": sum(t.state == "Running" for t in trials),
        "costUSD": sum(t.cost_usd for t in trials),
        "trials": [t.as_status() for t in trials],
    }
    if message:
        status["message"] = message
    if best is not None:
        status |= {"bestTrial": best.name, "bestValidationLoss": best.best_validation_loss}
        if best.model_uri:
            status["bestModelURI"] = best.model_uri
    return status


def copy_record(source: str, target: str) -> str:
    """Copy a run's model and record from directory or URL `source` to `target` (fsspec); the model's URI there."""
    import fsspec

    from mlless.telemetry.record import EXPORTED

    src_fs, src = fsspec.core.url_to_fs(source)
    dst_fs, dst = fsspec.core.url_to_fs(target)
    dst_fs.makedirs(dst, exist_ok=True)
    for name in EXPORTED:
        path = f"{src.rstrip('/')}/{name}"
        if src_fs.exists(path):
            with src_fs.open(path, "rb") as fin, dst_fs.open(f"{dst.rstrip('/')}/{name}", "wb") as fout:
                fout.write(fin.read())
    return f"{target.rstrip('/')}/model.npz"


def write_status(sweep_dir: Path, status: dict[str, Any]) -> None:
    """status.json, replaced whole (written aside, then renamed) so a reader never sees half of it."""
    tmp = sweep_dir / f".{STATUS_FILE}.tmp"
    tmp.write_text(json.dumps(status, indent=2) + "\n")
    tmp.replace(sweep_dir / STATUS_FILE)


def table(status: dict[str, Any], metric: str = "loss") -> str:
    """The trials table as text, best trial marked."""
    rows = status["trials"]
    params = list(rows[0]["parameters"]) if rows else []
    head = ["trial", *params, "state", f"best val {metric}", "cost $", "killed at"]
    body = []
    for row in rows:
        best = row.get("bestValidationLoss")
        body.append([row["name"] + (" *" if row["name"] == status.get("bestTrial") else ""),
                     *(_short(row["parameters"][p]) for p in params), row["state"],
                     "-" if best is None else f"{best:.4f}", f"{row.get('costUSD', 0):.5f}",
                     str(row.get("killedAt", "-"))])
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in [head, *body])


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
