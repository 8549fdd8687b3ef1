"""Reading run directories for a report, with errors that name the file and line.

A report is often made from runs copied off a cluster, possibly cut short, so
input is checked here once: every later stage can rely on the fields it uses
having the right types, and a bad file is reported as `path:line: problem`
instead of a traceback from deep inside matplotlib.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


#: Row fields every plot relies on, and whether they may be null.
_REQUIRED: dict[str, bool] = {"step": False, "time": False, "loss": True, "workers": False, "bytes_sent": False, "cost_usd": False}


class ReportError(Exception):
    """A run directory cannot be reported on; the message names the file (and line)."""


@dataclass
class Run:
    """One run directory: its summary and its per-step rows, in step order."""

    name: str
    path: Path
    summary: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def column(self, key: str) -> list[float | None]:
        return [row.get(key) for row in self.rows]

    def phase_samples(self, phase: str) -> list[float]:
        """The recorded seconds of one phase; a step whose timing never arrived (null) is skipped."""
        out = []
        for row in self.rows:
            value = (row.get("phases") or {}).get(phase)
            if _is_number(value) and math.isfinite(value):
                out.append(float(value))
        return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ReportError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key, nullable in _REQUIRED.items():
        if key not in row:
            raise ReportError(f"{where}: missing field {key!r}")
        value = row[key]
        if not (_is_number(value) or (nullable and value is None)):
            raise ReportError(f"{where}: field {key!r} should be a number, got {value!r}")
    validation = row.get("validation_loss")
    if validation is not None and not _is_number(validation):
        raise ReportError(f"{where}: field 'validation_loss' should be a number or null, got {validation!r}")
    phases = row.get("phases")
    if phases is not None:
        if not isinstance(phases, dict):
            raise ReportError(f"{where}: field 'phases' should be an object or null, got {phases!r}")
        for phase, seconds in phases.items():
            if seconds is not None and not _is_number(seconds):
                raise ReportError(f"{where}: phase {phase!r} should be a number or null, got {seconds!r}")
    return row


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a `metrics.jsonl`, sorted by step; blank lines are ignored."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ReportError(f"{path}: not found (is this a run directory?)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReportError(f"{where}: not valid JSON: {exc.msg} (column {exc.colno})") from None
        rows.append(_check_row(row, where))
    rows.sort(key=lambda r: r["step"])
    return rows


def read_summary(path: Path) -> dict[str, Any]:
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path}: not found (the run may not have finished)") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from None
    if not isinstance(summary, dict):
        raise ReportError(f"{path}: expected a JSON object, got {type(summary).__name__}")
    return summary


def load_run(path: str | Path, name: str | None = None) -> Run:
    """A run directory, named `name` or after the directory."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path}: not a directory")
    summary = read_summary(path / "summary.json")
    rows = read_rows(path / "metrics.jsonl")
    return Run(name=name or path.resolve().name, path=path, summary=summary, rows=rows)


def load_runs(paths: list[str | Path], labels: list[str] | None = None) -> list[Run]:
    """Several runs; with no labels, names that would collide fall back to the path as given."""
    if labels and len(labels) != len(paths):
        raise ReportError(f"got {len(labels)} --label for {len(paths)} run directories; give one per run or none")
    runs = [load_run(p, labels[i] if labels else None) for i, p in enumerate(paths)]
    names = [r.name for r in runs]
    for run, path in zip(runs, paths):
        if names.count(run.name) > 1 and not labels:
            run.name = str(path)
    return runs
