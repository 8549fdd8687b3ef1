"""`mlless report SWEEPDIR`: a sweep's trials, each curve with the point where the sweep stopped it, and each
parameter against the trials' final loss. It reads only the sweep directory's files (status.json, and each trial's
run directory under trials/), as the run report reads only run directories."""
from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from mlless.contract import SWEEP_FILE, SWEEP_STATUS_FILE, SWEEP_TRIALS_DIR
from mlless.telemetry.report.html import render_report
from mlless.telemetry.report.plots import LOG_RATIO, Plot, colour, loss_metric
from mlless.telemetry.report.rundirs import ReportError, Run, load_run, read_summary


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / SWEEP_FILE).is_file()


def load_sweep_dir(path: str | Path) -> tuple[dict[str, Any], list[Run]]:
    """The sweep's status and its trials that wrote a record (a trial not started has none)."""
    path = Path(path)
    status = read_summary(path / SWEEP_STATUS_FILE)
    rows = status.get("trials")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in rows):
        raise ReportError(f"{path / SWEEP_STATUS_FILE}: 'trials' should be a list of trials with names")
    runs = [load_run(path / SWEEP_TRIALS_DIR / r["name"], r["name"]) for r in rows
            if (path / SWEEP_TRIALS_DIR / r["name"] / "summary.json").exists()]
    if not runs:
        raise ReportError(f"{path}: no trial of this sweep has finished yet")
    return status, runs


def _trials(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in status["trials"]}


def curves_plot(status: dict[str, Any]) -> Plot:
    trials = _trials(status)

    def draw(fig: Figure, runs: Sequence[Run]) -> None:
        ax = fig.add_subplot()
        for i, run in enumerate(runs):
            points = [(r["step"], r["validation_loss"]) for r in run.rows if r.get("validation_loss") is not None]
            if not points:
                continue
            xs, ys = zip(*points)
            best = run.name == status.get("bestTrial")
            ax.plot(xs, ys, color=colour(i), linewidth=2.4 if best else 1.2, label=run.name + (" (best)" if best else ""))
            if trials.get(run.name, {}).get("killedAt") is not None:
                ax.plot(xs[-1], ys[-1], color=colour(i), marker="X", markersize=10, markeredgecolor="black",
                        linestyle="none")
        ax.set_xlabel("step")
        ax.set_ylabel(f"validation {loss_metric(runs)}")
        ax.grid(True, alpha=0.3)
        handles, _ = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], color="gray", marker="X", markersize=9, markeredgecolor="black",
                              linestyle="none", label="stopped by the sweep"))
        ax.legend(handles=handles, fontsize="small", loc="upper right", ncols=2)

    return Plot("trials.png", "Each trial's validation loss",
                "The validation loss of each trial's snapshots by step; X: where the sweep's early stopping (ASHA) "
                "stopped the trial; thick: the best trial.", draw)


def parameter_plot(status: dict[str, Any], name: str, index: int) -> Plot:
    trials = _trials(status)

    def draw(fig: Figure, runs: Sequence[Run]) -> None:
        ax = fig.add_subplot()
        points = [(row["parameters"].get(name), row["bestValidationLoss"], row.get("killedAt") is not None)
                  for row in trials.values() if row.get("bestValidationLoss") is not None]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v, _, _ in points)
        labels = sorted({str(v) for v, _, _ in points})
        for stopped, marker in ((False, "o"), (True, "X")):
            xs = [v if numeric else labels.index(str(v)) for v, _, s in points if s == stopped]
            ys = [loss for _, loss, s in points if s == stopped]
            ax.plot(xs, ys, marker=marker, linestyle="none", color=colour(index), markersize=8,
                    markeredgecolor="black", label="stopped by the sweep (best before it)" if stopped else "ran to its end")
        values = [v for v, _, _ in points]
        if numeric and values and min(values) > 0 and max(values) / min(values) > LOG_RATIO / 3:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(labels)), labels)
        ax.set_xlabel(name)
        ax.set_ylabel(f"best validation {loss_metric(runs)}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")

    return Plot(f"param-{index}.png", f"{name} against the final loss",
                f"Each trial's best validation loss by its {name}.", draw)


def trials_table(status: dict[str, Any]) -> str:
    """The status's trials table as HTML."""
    e = html.escape
    rows = status["trials"]
    params = list(rows[0]["parameters"]) if rows else []
    head = "".join(f"<th>{e(h)}</th>" for h in ["trial", *params, "state", "best validation", "cost (USD)",
                                                 "killed at step", "stop reason"])

    def num(value: Any, spec: str) -> str:
        return "-" if not isinstance(value, (int, float)) or not math.isfinite(value) else format(value, spec)

    body = []
    for row in rows:
        cells = [row["name"] + (" (best)" if row["name"] == status.get("bestTrial") else ""),
                 *(str(row["parameters"].get(p)) for p in params), row.get("state", "-"),
                 num(row.get("bestValidationLoss"), ".4f"), num(row.get("costUSD"), ".5f"),
                 str(row.get("killedAt", "-")), row.get("stopReason", "-")]
        body.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
    best = status.get("bestTrial")
    lead = (f"<p>Best trial <b>{e(best)}</b>, validation {num(status.get('bestValidationLoss'), '.4f')}; "
            f"sweep cost ${num(status.get('costUSD'), '.5f')}.</p>\n" if best else "")
    return (f"<h2>Trials</h2>\n{lead}<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body)
            + "\n</tbody>\n</table>\n")


def render_sweep_report(path: str | Path, out_dir: str | Path, title: str) -> tuple[Path, int]:
    """The sweep's page in `out_dir`; returns its path and the number of trials drawn."""
    status, runs = load_sweep_dir(path)
    params = list(status["trials"][0]["parameters"])
    plots = [curves_plot(status), *(parameter_plot(status, name, i) for i, name in enumerate(params))]
    return render_report(runs, out_dir, title, plots, trials_table(status)), len(runs)
