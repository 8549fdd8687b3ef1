"""The per-step row of the run record: one line of `metrics.jsonl` per closed step.

The supervisor builds it when it closes a step; the run record writes it. The
barrier phases (wait, read, apply) of a step arrive with the reports of the
next one, so a row is completed and written one step late, and the last
row's barrier phases stay null.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass
class StepRow:
    step: int
    time: float  # seconds since the supervisor started
    epoch: float
    loss: float  # training loss of the step's reports
    validation_loss: float | None  # of the newest evaluated snapshot
    workers: int
    samples: int
    bytes_sent: int  # update frames written, merged ones included (spec.sync.exchange), summed over the workers
    bytes_filtered: int  # 8 bytes (index and value) per entry the significance filter held back
    entries_sent: int
    entries_pending: int
    cost_usd: float
    phases: dict[str, float | None]  # mean seconds over the step's workers; None until known
    # Update frames read at the step's close, summed over the workers; None until known (and in older records).
    bytes_read: int | None = None
    # The most steps any worker trained this one ahead of the closes its replica had applied (`Report.staleness`).
    staleness: int | None = None
    # The step the newest evaluated snapshot was taken at: a row shows an evaluation from the step it arrived at, a
    # step or a round after it was asked for (None before the first, and in older records).
    validation_step: int | None = None

    def as_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict, which deep-copies every value: a third of a step's accounting (0.1 ms).
        return {f.name: getattr(self, f.name) for f in FIELDS} | {"phases": dict(self.phases)}


FIELDS = dataclasses.fields(StepRow)


def evaluated(rows: Sequence[Mapping[str, Any]]) -> list[bool]:
    """Whether each row of a run record (`metrics.jsonl`, as dicts) brought a new evaluation: a row repeats the
    newest one's step and loss until the next (a record without `validation_step`, from an older mlless, by its loss
    alone)."""
    key = "validation_step" if rows and "validation_step" in rows[0] else "validation_loss"
    return [r.get("validation_loss") is not None and (k == 0 or r.get(key) != rows[k - 1].get(key))
            for k, r in enumerate(rows)]
