"""The report's plots, one PNG each, one line (or bar) per run on shared axes.

Drawn with matplotlib's object API on an Agg canvas, never `pyplot`: no global
figure state and no GUI backend, so reports render headless, in threads, and
in a process that also uses pyplot elsewhere. A run keeps its colour in every
plot so the reader can follow it from figure to figure.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter, MaxNLocator

from mlless.contract import STEP_PHASES
from mlless.telemetry.report.rundirs import Run
from mlless.telemetry.rows import evaluated

#: Bytes per step spanning more than this ratio (max / min) get a log axis.
LOG_RATIO = 30.0
_SIZE = (8.0, 4.5)
_DPI = 110
_RUN_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan")
_PHASE_COLOURS = dict(zip(STEP_PHASES, ("#8dd3c7", "#e6ab02", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69")))


@dataclass(frozen=True)
class Plot:
    """One figure of the report: its file name, title and what it shows."""

    filename: str
    title: str
    caption: str
    draw: Callable[[Figure, Sequence[Run]], None]


def colour(index: int) -> str:
    return _RUN_COLOURS[index % len(_RUN_COLOURS)]


def loss_metric(runs: Sequence[Run]) -> str:
    """The loss name for an axis label: `rmse`/`bce` if all runs agree, else just `loss`."""
    metrics = {r.summary.get("loss_metric") for r in runs}
    return f"loss ({metrics.pop().upper()})" if len(metrics) == 1 and None not in metrics else "loss"


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over `window` points: per-step training loss is one mini-batch each, so it is noisy."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _train_curve(run: Run, x_key: str) -> tuple[list[float], list[float]]:
    points = [(row[x_key], row["loss"]) for row in run.rows if row["loss"] is not None and math.isfinite(row["loss"])]
    return [p[0] for p in points], [p[1] for p in points]


def _validation_points(run: Run, x_key: str) -> tuple[list[float], list[float]]:
    """Each new evaluation once, where it reached the record."""
    points = [(row[x_key], row["validation_loss"]) for row, new in zip(run.rows, evaluated(run.rows)) if new]
    return [x for x, _ in points], [y for _, y in points]


def _final_point(run: Run, x_key: str) -> tuple[float, float] | None:
    """The final merged model's validation loss, placed at the run's end."""
    v = run.summary.get("validation_loss")
    x = run.summary.get({"time": "wall_seconds", "cost_usd": "cost_usd"}[x_key])
    if isinstance(v, (int, float)) and isinstance(x, (int, float)):
        return float(x), float(v)
    return None


def _loss_lines(fig: Figure, runs: Sequence[Run], x_key: str, xlabel: str) -> None:
    ax = fig.add_subplot()
    for i, run in enumerate(runs):
        xs, ys = _train_curve(run, x_key)
        window = max(1, len(ys) // 40)
        if ys:
            ax.plot(xs, ys, color=colour(i), alpha=0.2, linewidth=0.8)
            ax.plot(xs, moving_average(ys, window), color=colour(i), linewidth=1.8)
        vx, vy = _validation_points(run, x_key)
        if vx:
            ax.plot(vx, vy, color=colour(i), linestyle="--", marker="o", markersize=3.5)
        final = _final_point(run, x_key)
        if final:
            ax.plot(*final, color=colour(i), marker="*", markersize=12, markeredgecolor="black", linestyle="none")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(loss_metric(runs))
    ax.grid(True, alpha=0.3)
    if not ax.has_data():
        _no_data(ax)
        return
    # Two legends instead of runs x curves entries: colour says which run, style says which loss.
    by_run = [Line2D([], [], color=colour(i), linewidth=2, label=run.name) for i, run in enumerate(runs)]
    by_style = [
        Line2D([], [], color="black", linewidth=1.8, label="train (moving average)"),
        Line2D([], [], color="black", linestyle="--", marker="o", markersize=3.5, label="validation (snapshot)"),
        Line2D([], [], color="gray", marker="*", markersize=11, markeredgecolor="black", linestyle="none", label="final model, validation"),
    ]
    ax.add_artist(ax.legend(handles=by_run, title="run", fontsize="small", loc="upper right"))
    ax.legend(handles=by_style, fontsize="small", loc="lower left")


def draw_loss(fig: Figure, runs: Sequence[Run]) -> None:
    _loss_lines(fig, runs, "time", "wall time since the supervisor started (s)")


def draw_cost_loss(fig: Figure, runs: Sequence[Run]) -> None:
    _loss_lines(fig, runs, "cost_usd", "cumulative cost (USD)")
    fig.axes[0].xaxis.set_major_formatter(lambda x, _pos: f"${x:.4g}")


def draw_workers(fig: Figure, runs: Sequence[Run]) -> None:
    ax = fig.add_subplot()
    styles = ("-", "--", ":", "-.")
    top = 1
    for i, run in enumerate(runs):
        xs, ys = [row["time"] for row in run.rows], [row["workers"] for row in run.rows]
        if xs:
            # Runs with the same worker count would hide each other; the line style tells them apart.
            ax.step(xs, ys, where="post", color=colour(i), linestyle=styles[i % len(styles)], linewidth=2, label=run.name)
            top = max(top, *ys)
    ax.set_xlabel("wall time since the supervisor started (s)")
    ax.set_ylabel("live workers")
    ax.set_ylim(0, top + 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    _legend(ax)


def draw_bytes(fig: Figure, runs: Sequence[Run]) -> None:
    ax = fig.add_subplot()
    positive = []
    for i, run in enumerate(runs):
        xs, ys = [row["step"] for row in run.rows], [row["bytes_sent"] for row in run.rows]
        if xs:
            ax.plot(xs, ys, color=colour(i), linewidth=1.2, label=run.name)
            positive += [y for y in ys if y > 0]
    if positive and max(positive) / min(positive) > LOG_RATIO:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(EngFormatter(unit="B"))
    ax.set_xlabel("step")
    ax.set_ylabel("update bytes published per step (all workers)")
    ax.grid(True, alpha=0.3, which="both")
    _legend(ax)


def phase_medians(run: Run) -> dict[str, float]:
    """Median seconds per phase over the run's steps (0 for a phase never recorded)."""
    return {p: (median(s) if (s := run.phase_samples(p)) else 0.0) for p in STEP_PHASES}


def draw_phases(fig: Figure, runs: Sequence[Run]) -> None:
    ax = fig.add_subplot()
    names = [run.name for run in runs]
    medians = [phase_medians(run) for run in runs]
    bottoms = [0.0] * len(runs)
    for phase in STEP_PHASES:
        heights = [m[phase] for m in medians]
        ax.bar(names, heights, bottom=bottoms, color=_PHASE_COLOURS[phase], edgecolor="white", width=0.6, label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    for x, total in enumerate(bottoms):
        ax.annotate(EngFormatter(unit="s", places=1)(total) if total > 0 else "no timings", (x, total), ha="center", va="bottom",
                    xytext=(0, 3), textcoords="offset points", fontsize="small")
    ax.yaxis.set_major_formatter(EngFormatter(unit="s"))
    ax.set_ylabel("median seconds per step (mean over workers)")
    ax.set_ylim(0, max(bottoms + [1e-6]) * 1.15)
    ax.grid(True, axis="y", alpha=0.3)
    # Reversed, so the legend lists the phases top-down in the order they are stacked on the bars.
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], title="phase", fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if len(runs) > 4:
        ax.tick_params(axis="x", labelrotation=20)


def _legend(ax) -> None:
    """The runs' legend, or a note that none of them recorded anything to draw."""
    if ax.has_data():
        ax.legend(fontsize="small")
    else:
        _no_data(ax)


def _no_data(ax) -> None:
    ax.text(0.5, 0.5, "no data recorded", transform=ax.transAxes, ha="center", va="center", color="gray")


PLOTS: tuple[Plot, ...] = (
    Plot("loss.png", "Training and validation loss over time",
         "Training loss per step (faint) and its moving average; dashed: validation loss of the periodic "
         "replica snapshots; star: the final merged model.", draw_loss),
    Plot("workers.png", "Workers over time",
         "Live workers in the step barrier; a drop is a worker removed by the auto-tuner or lost.", draw_workers),
    Plot("cost_loss.png", "Loss against cumulative cost",
         "What each dollar buys: the further left a curve reaches a given loss, the cheaper that accuracy.", draw_cost_loss),
    Plot("bytes.png", "Update bytes per step",
         "Bytes of updates all workers published to Redis at each step; ISP publishes only significant entries.", draw_bytes),
    Plot("phases.png", "Step-time breakdown",
         "Median seconds of each phase of a step (mean over the workers); wait is time at the barrier.", draw_phases),
)


def render(plot: Plot, runs: Sequence[Run], path: Path) -> Path:
    """Draw one plot into a PNG at `path`."""
    fig = Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    plot.draw(fig, runs)
    fig.suptitle(plot.title, fontsize="large")
    fig.savefig(path, format="png")
    return path


def render_all(runs: Sequence[Run], out_dir: Path, plots: Sequence[Plot] = PLOTS) -> list[tuple[Plot, Path]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return [(plot, render(plot, runs, out_dir / plot.filename)) for plot in plots]
