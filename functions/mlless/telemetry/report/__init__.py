"""`mlless report`: compare runs from their run directories alone.

A report is a self-contained HTML page (`index.html`) with one PNG per plot
next to it: losses over time, workers over time, loss against cumulative
cost, bytes per step, and the step-time breakdown by phase. These are the
analogues of the MLLess paper's BSP / ISP / ISP+tuner comparisons.

Modules: `runs` reads and checks run directories, `plots` draws the PNGs,
`html` writes the page, `cli` is the subcommand.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from mlless.telemetry.report.rundirs import ReportError, Run, load_run, load_runs

__all__ = ["ReportError", "Run", "load_run", "load_runs", "render_report"]


def render_report(runs: Sequence[Run], out_dir: str | Path, title: str = "mlless training report") -> Path:
    """Write `index.html` and the PNGs into `out_dir` (see `report.html`); returns the page's path.

    Imported on call so that loading run directories does not load matplotlib.
    """
    from mlless.telemetry.report.html import render_report as render

    return render(runs, out_dir, title)
