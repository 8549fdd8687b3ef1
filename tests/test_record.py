"""The run record's export (`RunRecord.export`): what outlives the run directory at spec.output.uri."""
from __future__ import annotations

import json

from mlless.telemetry.record import EXPORTED, NATIVE_FILES, RunRecord


def run_dir(tmp_path, native: list[str]):
    """A run directory as a supervisor leaves it: the record, model.npz, and the native files the summary lists."""
    run = tmp_path / "run"
    record = RunRecord(run)
    record.start()
    record.summary({"validation_loss": 0.5, NATIVE_FILES: native})
    for name in ("model.npz", "model.pt", "job.json", "status.json"):
        (run / name).write_bytes(name.encode())
    return record


def test_export_copies_the_record_the_model_and_the_native_files_the_summary_lists(tmp_path):
    record = run_dir(tmp_path, ["model.pt"])
    uri = record.export(str(tmp_path / "out"))
    assert uri == f"{tmp_path / 'out'}/model.npz"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([*EXPORTED, "model.pt"])
    assert (tmp_path / "out" / "model.pt").read_bytes() == b"model.pt"


def test_export_leaves_out_what_the_summary_does_not_list(tmp_path):
    """model.pt of an earlier run in the same directory is not this model's; without a summary nothing native goes."""
    record = run_dir(tmp_path, [])
    record.export(str(tmp_path / "out"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(EXPORTED)
    (record.run_dir / "summary.json").unlink()
    assert record.exported() == ["model.npz", "metrics.jsonl"]


def test_a_listed_name_never_reaches_out_of_the_run_directory(tmp_path):
    (tmp_path / "secret").write_text("x")
    record = run_dir(tmp_path, ["../secret", "/etc/passwd", "missing.pt", "model.pt"])
    assert record.exported() == [*EXPORTED, "model.pt"]
    assert json.loads((record.run_dir / "summary.json").read_text())[NATIVE_FILES][0] == "../secret"
