"""The report page: a summary table per run and the plots, as one self-contained HTML file.

Self-contained means no scripts, fonts or stylesheets from elsewhere: the
page opens from a copied directory or a CI artifact. The PNGs sit next to it
and are referenced relatively. Every piece of text from a run (names, stop
reasons, labels) is escaped, since run directories come from anywhere.
"""
from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlless.telemetry.report.plots import PLOTS, Plot, render_all
from mlless.telemetry.report.rundirs import Run

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td.text, th.text { text-align: left; }
figure { margin: 2em 0; } figcaption { color: #555; font-size: 0.9em; max-width: 880px; }
img { max-width: 100%; border: 1px solid #eee; }
.note { color: #555; font-size: 0.85em; }
"""


def _num(spec: str) -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
            return "-" if value is None else str(value)
        return format(value, spec)

    return fmt


def _bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def _workers(summary: dict[str, Any]) -> str:
    start, end = summary.get("workers_initial"), summary.get("workers_final")
    return f"{'-' if start is None else start} → {'-' if end is None else end}"


#: (header, value of a summary, is it text): the columns of the summary table.
COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str], bool], ...] = (
    ("protocol", lambda s: str(s.get("protocol") or "-"), True),
    ("validation loss", lambda s: _num(".4f")(s.get("validation_loss")), False),
    ("train loss", lambda s: _num(".4f")(s.get("train_loss")), False),
    ("loss metric", lambda s: str(s.get("loss_metric") or "-"), True),
    ("validation scores", lambda s: ", ".join(f"{k} {v:.4f}" for k, v in (s.get("validation_scores") or {}).items())
     or "-", True),
    ("steps", lambda s: _num("d")(s.get("steps")), False),
    ("epochs", lambda s: _num(".2f")(s.get("epochs")), False),
    ("wall seconds", lambda s: _num(".1f")(s.get("wall_seconds")), False),
    ("cost (USD)", lambda s: _num(".5f")(s.get("cost_usd")), False),
    ("workers", _workers, False),
    ("bytes sent", lambda s: _bytes(s.get("bytes_sent")), False),
    ("stop reason", lambda s: str(s.get("stop_reason") or "-"), True),
    # Perf/$ = 1 / (wall seconds x cost in USD), as summary.json holds it (telemetry/cost.py).
    ("Perf/$", lambda s: _num(".4g")(s.get("perf_per_dollar")), False),
)


def summary_table(runs: Sequence[Run]) -> str:
    e = html.escape
    cls = {True: ' class="text"', False: ""}
    head = '<th class="text">run</th>' + "".join(f"<th{cls[text]}>{e(name)}</th>" for name, _, text in COLUMNS)
    body = []
    for run in runs:
        cells = "".join(f"<td{cls[text]}>{e(get(run.summary))}</td>" for _, get, text in COLUMNS)
        body.append(f'<tr><td class="text" title="{e(str(run.path))}">{e(run.name)}</td>{cells}</tr>')
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody>\n</table>"


def _figure(plot: Plot, path: Path) -> str:
    e = html.escape
    return (
        f'<figure id="{e(path.stem)}">\n<img src="{e(path.name)}" alt="{e(plot.title)}">\n'
        f"<figcaption><b>{e(plot.title)}.</b> {e(plot.caption)}</figcaption>\n</figure>"
    )


def page(runs: Sequence[Run], figures: Sequence[tuple[Plot, Path]], title: str, intro: str = "") -> str:
    """The page; `intro` is HTML (escaped by its maker) put before the runs' summary."""
    e = html.escape
    dropped = [
        f"{run.name}: worker {d.get('rank')} dropped at step {d.get('step')} ({d.get('reason')})"
        for run in runs
        for d in (run.summary.get("dropped_workers") or [])
        if isinstance(d, dict)
    ]
    notes = "".join(f"<li>{e(text)}</li>" for text in dropped)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{e(title)}</h1>\n"
        f'<p class="note">{len(runs)} run(s), generated {e(time.strftime("%Y-%m-%d %H:%M:%S"))} by <code>mlless report</code>. '
        "Perf/$ = 1 / (wall seconds × cost in USD): higher is better.</p>\n"
        + intro + "<h2>Summary</h2>\n" + summary_table(runs) + "\n"
        + (f"<h3>Dropped workers</h3>\n<ul>{notes}</ul>\n" if notes else "")
        + "<h2>Plots</h2>\n" + "\n".join(_figure(plot, path) for plot, path in figures)
        + "\n</body>\n</html>\n"
    )


def render_report(runs: Sequence[Run], out_dir: str | Path, title: str = "mlless training report",
                  plots: Sequence[Plot] = PLOTS, intro: str = "") -> Path:
    """Write the PNGs of `plots` and `index.html` into `out_dir`; returns the page's path."""
    out_dir = Path(out_dir)
    figures = render_all(runs, out_dir, plots)
    index = out_dir / "index.html"
    index.write_text(page(runs, figures, title, intro), encoding="utf-8")
    return index
