"""The run record: `metrics.jsonl`, `summary.json` and `status.json`.

Everything a later report needs is in these files, so a run can be analysed
without Prometheus or the process that produced it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, TextIO

import fsspec

from mlless.telemetry.rows import StepRow

#: What `export` copies: everything `mlless report` and `mlless evaluate` need.
EXPORTED = ("model.npz", "summary.json", "metrics.jsonl")
#: The summary's list of the files the model was also saved as in its own library's format, beside model.npz
#: (`Model.save_native`: a network's model.pt); `export` copies them too.
NATIVE_FILES = "native_model_files"
#: The job's newest status in the run directory (`RunRecord.status`).
STATUS_FILE = "status.json"


class RunRecord:
    """`on_row` sees every row as it is written (a successor supervisor's copy of them), and so does each callback
    given to `listen` (a sweep judging its trials as their rows come)."""

    def __init__(self, run_dir: Path, on_row: Callable[[str], None] | None = None) -> None:
        self.run_dir = run_dir
        self._listeners: list[Callable[[str], None]] = [] if on_row is None else [on_row]
        self.rows = 0
        run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics: TextIO | None = None  # opened by start, by continue_after, or by the first row

    def start(self) -> None:
        """A new job: an earlier run's rows in the same directory go."""
        self._metrics = (self.run_dir / "metrics.jsonl").open("w", buffering=1)

    def continue_after(self, step: int, stored: list[str]) -> list[str]:
        """A resumed job: keep the rows of steps up to `step` (from the run directory, else `stored`), append after them;
        returns the rows kept.

        Rows past `step` were trained from a model the job no longer has, so they are trained again.
        """
        path = self.run_dir / "metrics.jsonl"
        lines = path.read_text().splitlines(keepends=True) if path.exists() else stored
        kept = [line for line in lines if _row_step(line) <= step]
        path.write_text("".join(kept))
        self.rows = len(kept)
        self._metrics = path.open("a", buffering=1)
        return kept

    def step(self, row: StepRow) -> None:
        line = json.dumps(row.as_dict(), allow_nan=False) + "\n"
        if self._metrics is None:
            self.start()
        self._metrics.write(line)
        self.rows += 1
        for listener in self._listeners:
            listener(line)

    def listen(self, on_row: Callable[[str], None]) -> None:
        """Call `on_row` with each row written from now on, in the writing thread."""
        self._listeners.append(on_row)

    def summary(self, summary: dict[str, Any]) -> None:
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")

    def status(self, status: dict[str, Any]) -> None:
        """Rewrite `status.json` (the job's status, as the TrainingJob's `status` has it) whole or not at all: a reader
        polling it sees the old status or the new one, never half of one (a temporary file renamed over it)."""
        path = self.run_dir / STATUS_FILE
        temporary = path.with_name(f".{STATUS_FILE}.tmp")
        temporary.write_text(json.dumps(status, indent=2, allow_nan=False) + "\n")
        os.replace(temporary, path)

    def exported(self) -> list[str]:
        """The names `export` copies that the run directory holds: `EXPORTED`, and the model's native files that
        summary.json lists (`NATIVE_FILES`)."""
        names = list(EXPORTED)
        summary = self.run_dir / "summary.json"
        if summary.exists():
            native = json.loads(summary.read_text()).get(NATIVE_FILES) or []
            # A name is a file beside model.npz, never a path out of the run directory.
            names += [name for name in native if name == Path(name).name and name not in names]
        return [name for name in names if (self.run_dir / name).is_file()]

    def export(self, uri: str) -> str:
        """Copy the model, in every format it was saved in, and the record to `uri` (a directory or fsspec URL);
        returns the model's URI there.

        On Kubernetes the run directory dies with the supervisor pod; this is what outlives it.
        """
        if self._metrics is not None:
            self._metrics.flush()
        fs, root = fsspec.core.url_to_fs(uri)
        fs.makedirs(root, exist_ok=True)
        for name in self.exported():
            fs.put_file(str(self.run_dir / name), f"{root.rstrip('/')}/{name}")
        return f"{uri.rstrip('/')}/model.npz"

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()


def _row_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")  # not a row: dropped

