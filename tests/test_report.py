"""`mlless report` on run directories written by real (short) BSP and ISP jobs, and on broken ones."""
from __future__ import annotations

import argparse
import json
import shutil
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from mlless.contract import STOP_INTERRUPTED
from mlless.telemetry.report import ReportError, load_run, render_report
from mlless.telemetry.report.cli import add_report_parser
from mlless.telemetry.report.plots import PLOTS, moving_average, phase_medians
from mlless.contract import STEP_PHASES as PHASES
from mlless.runtime.local import Services, train_local
from mlless.progress import Progress
from mlless.spec import from_manifest
from mlless.telemetry import cost
from mlless.telemetry.rows import evaluated

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def perf_per_dollar(summary: dict) -> float | None:
    """The papers' Perf/$ of a run, from its wall time and cost."""
    return cost.perf_per_dollar(summary["wall_seconds"], summary["cost_usd"])


def run_report(*argv: str) -> int:
    """The subcommand as the main CLI will run it: registered on a parser's subparsers."""
    parser = argparse.ArgumentParser(prog="mlless")
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *argv])
    return args.func(args)


@pytest.fixture(scope="module")
def runs(movielens_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A BSP and an ISP run of 30 steps on the MovieLens sample, on the embedded transport."""
    base = tmp_path_factory.mktemp("runs")
    out = {}
    for protocol in ("bsp", "isp"):
        job = from_manifest({
            "apiVersion": "mlless.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": f"report-{protocol}"},
            "spec": {
                "workers": 2,
                "model": {"type": "pmf"},
                "dataset": {"uri": str(movielens_dir)},
                "sync": {"protocol": protocol},
                "stop": {"maxSteps": 30},
                "evaluation": {"everySteps": 10},
            },
        })
        run_dir = base / protocol
        summary = train_local(job, run_dir, Services(), Progress(enabled=False))
        assert summary["steps"] == 30
        out[protocol] = run_dir
    return out


class _Page(HTMLParser):
    """The image sources and the table cells of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.cells: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        self._in_cell = tag in ("td", "th")

    def handle_endtag(self, tag):
        self._in_cell = False

    def handle_data(self, data):
        if self._in_cell:
            self.cells.append(data)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_report_of_bsp_and_isp(runs: dict[str, Path], tmp_path: Path, capsys):
    out = tmp_path / "report"
    assert run_report(str(runs["bsp"]), str(runs["isp"]), "--out", str(out)) == 0
    index = out / "index.html"
    assert str(index) in capsys.readouterr().out
    page = _Page()
    page.feed(index.read_text())

    # Every plot is referenced, relatively, and is a real, non-trivial PNG.
    assert sorted(page.images) == sorted(p.filename for p in PLOTS)
    assert len(PLOTS) == 5
    for name in page.images:
        assert "/" not in name
        width, height = png_size(out / name)
        assert width >= 600 and height >= 300
        assert (out / name).stat().st_size > 10_000, name

    # The summary table holds each run's values.
    cells = page.cells
    for protocol, run_dir in runs.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert protocol in cells  # run name = directory name, and the protocol column
        assert f"{summary['validation_loss']:.4f}" in cells
        assert f"{summary['train_loss']:.4f}" in cells
        assert f"{summary['cost_usd']:.5f}" in cells
        assert f"{summary['wall_seconds']:.1f}" in cells
        assert f"{summary['workers_initial']} → {summary['workers_final']}" in cells
        assert f"{perf_per_dollar(summary):.4g}" in cells
        assert summary["stop_reason"] in cells
    assert "30" in cells and "rmse" in cells
    for header in ("validation loss", "train loss", "loss metric", "steps", "epochs", "wall seconds",
                   "cost (USD)", "workers", "bytes sent", "stop reason", "Perf/$"):
        assert header in cells


def test_labels_override_names_and_are_escaped(runs: dict[str, Path], tmp_path: Path):
    out = tmp_path / "labelled"
    assert run_report(str(runs["bsp"]), str(runs["isp"]), "--out", str(out),
                      "--label", "BSP <b>&", "--label", "ISP", "--title", "x<script>") == 0
    text = (out / "index.html").read_text()
    assert "BSP &lt;b&gt;&amp;" in text and "<b>&" not in text
    assert "x&lt;script&gt;" in text and "<script>" not in text
    assert run_report(str(runs["bsp"]), str(runs["isp"]), "--out", str(out), "--label", "only-one") == 2


def test_single_run_and_same_named_dirs(runs: dict[str, Path], tmp_path: Path):
    assert run_report(str(runs["isp"]), "--out", str(tmp_path / "one")) == 0
    twin = tmp_path / "copy" / "isp"
    shutil.copytree(runs["isp"], twin)
    loaded = [load_run(runs["isp"]), load_run(twin)]
    assert loaded[0].name == loaded[1].name == "isp"
    assert run_report(str(runs["isp"]), str(twin), "--out", str(tmp_path / "twins")) == 0
    text = (tmp_path / "twins" / "index.html").read_text()
    assert str(twin) in text  # colliding names fall back to the paths


def test_missing_optional_fields(tmp_path: Path):
    """No validation yet, null phases, a summary cut down to almost nothing: still a report."""
    run = tmp_path / "partial"
    run.mkdir()
    rows = [
        {"step": s, "time": 0.5 * s, "loss": 1.0 / s, "workers": 3 if s < 4 else 2, "bytes_sent": 100 * s,
         "cost_usd": 0.001 * s, "validation_loss": None,
         "phases": None if s == 5 else {**dict.fromkeys(PHASES, 0.001), "wait": None}}
        for s in range(1, 6)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    (run / "summary.json").write_text(json.dumps({"job": "partial", "stop_reason": STOP_INTERRUPTED}))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    (empty / "summary.json").write_text("{}")
    assert run_report(str(run), str(empty), "--out", str(tmp_path / "out")) == 0
    text = (tmp_path / "out" / "index.html").read_text()
    assert STOP_INTERRUPTED in text and "partial" in text
    medians = phase_medians(load_run(run))
    assert medians["compute"] == 0.001 and medians["wait"] == 0.0
    for plot in PLOTS:
        png_size(tmp_path / "out" / plot.filename)


@pytest.mark.parametrize(
    "metrics, summary, message",
    [
        (None, "{}", r"metrics\.jsonl: not found"),
        ('{"step": 1}\n', None, r"summary\.json: not found"),
        ('{"step": 1, "time": 1, "loss": 1, "workers": 1, "bytes_sent": 1, "cost_usd": 0}\n{"step": 2, "time"\n', "{}",
         r"metrics\.jsonl:2: not valid JSON"),
        ('\n\n{"step": 1, "time": 1, "loss": 1, "workers": 1, "cost_usd": 0}\n', "{}", r"metrics\.jsonl:3: missing field 'bytes_sent'"),
        ('{"step": 1, "time": "soon", "loss": 1, "workers": 1, "bytes_sent": 1, "cost_usd": 0}\n', "{}",
         r"metrics\.jsonl:1: field 'time' should be a number"),
        ('[1, 2]\n', "{}", r"metrics\.jsonl:1: expected a JSON object"),
        ('{"step": 1, "time": 1, "loss": 1, "workers": 1, "bytes_sent": 1, "cost_usd": 0, "phases": [1]}\n', "{}",
         r"metrics\.jsonl:1: field 'phases'"),
        ("", '{"job": "x",\n "steps": }', r"summary\.json:2: not valid JSON"),
        ("", "[]", r"summary\.json: expected a JSON object"),
    ],
)
def test_malformed_input_is_a_clear_error(tmp_path: Path, capsys, metrics, summary, message):
    run = tmp_path / "bad"
    run.mkdir()
    if metrics is not None:
        (run / "metrics.jsonl").write_text(metrics)
    if summary is not None:
        (run / "summary.json").write_text(summary)
    with pytest.raises(ReportError, match=message):
        render_report([load_run(run)], tmp_path / "out")
    assert run_report(str(run), "--out", str(tmp_path / "out")) == 2
    err = capsys.readouterr().err
    assert err.startswith("mlless: error: ") and str(run) in err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "index.html").exists()


def test_not_a_directory(tmp_path: Path, capsys):
    assert run_report(str(tmp_path / "nope"), "--out", str(tmp_path / "out")) == 2
    assert "not a directory" in capsys.readouterr().err


def test_moving_average():
    assert moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([], 3) == []


def test_each_evaluation_is_read_once_from_the_rows_that_repeat_it():
    # Two evaluations can score the same loss: a new snapshot step tells them apart; an older record without
    # `validation_step` has only its loss to go by.
    rows = [{"validation_loss": None, "validation_step": None}, {"validation_loss": 0.9, "validation_step": 5},
            {"validation_loss": 0.9, "validation_step": 5}, {"validation_loss": 0.9, "validation_step": 10},
            {"validation_loss": 0.8, "validation_step": 15}]
    assert evaluated(rows) == [False, True, False, True, True]
    older = [{k: v for k, v in r.items() if k != "validation_step"} for r in rows]
    assert evaluated(older) == [False, True, False, False, True]
