"""The networks suite (benchmarks/networks.py and its helpers): the generated images, the jobs it writes, how it
reads runs and states verdicts, and that its PyTorch peer trains what mlless trains. No timings asserted (the
benchmark's business)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pytest

# The benchmarks are a package at the repository's root (`python -m benchmarks`).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import _netdata, _netfigures, _netruns, _runs, networks  # noqa: E402

PHASES = {"fetch": 0.001, "compute": 0.100, "filter": 0.0, "write": 0.002, "wait": 0.003, "read": 0.002,
          "apply": 0.004}


# ---- the images ------------------------------------------------------------------------------------------------------

def test_the_generator_is_seeded_and_cifar_shaped():
    X, y = _netdata.generate(200, seed=3)
    assert X.shape == (200, 32, 32, 3) and X.dtype == np.uint8 and y.dtype == np.int64
    assert set(np.unique(y)) == set(range(10))
    again, y2 = _netdata.generate(200, seed=3)
    assert np.array_equal(X, again) and np.array_equal(y, y2)
    assert not np.array_equal(X, _netdata.generate(200, seed=4)[0])


def test_the_class_is_the_glyph_wherever_and_whatever_colour_it_is():
    """Without noise and at full contrast, each image is its class's glyph (or its mirror) somewhere, in two
    colours; every seed draws the same glyphs, so a training and a validation part share the classes."""
    side, size = 16, 8
    shapes = _netdata.glyphs(10, size)
    assert len({s.tobytes() for s in shapes}) == 10  # ten different classes
    X, y = _netdata.generate(60, side=side, seed=7, noise=0.0, contrast=1.0)
    for image, label in zip(X.astype(float), y):
        found = False
        for oy in range(side - size + 1):
            for ox in range(side - size + 1):
                window = image[oy:oy + size, ox:ox + size]
                for glyph in (shapes[label], shapes[label][:, ::-1]):
                    fg, bg = window[glyph == 1], window[glyph == 0]
                    outside = np.ones((side, side), bool)
                    outside[oy:oy + size, ox:ox + size] = False
                    if (np.ptp(fg, axis=0).max() == 0 and np.ptp(bg, axis=0).max() == 0 and
                            np.abs(fg[0] - bg[0]).max() > 0 and (image[outside] == bg[0]).all()):
                        found = True
        assert found, f"an image of class {label} is not its glyph"


def test_a_set_is_written_as_npz_and_prepared_once(tmp_path, monkeypatch):
    monkeypatch.setitem(_netdata.SETS, "tiny", _netdata.ImageSet("tiny", "tiny", 8, 48, 16, batch=16))
    out = _netdata.prepared_set(tmp_path, "tiny")
    from mlless.data.dataset import Dataset

    ds = Dataset.open(str(out))
    assert ds.n_batches == 3 and ds.manifest.n_validation == 16 and ds.dims()["channels"] == 3
    stamp = (out / "manifest.json").stat().st_mtime_ns
    assert _netdata.prepared_set(tmp_path, "tiny") == out and (out / "manifest.json").stat().st_mtime_ns == stamp


# ---- the jobs ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sync", [None, {"protocol": "gradient-averaging"}, {"protocol": "averaging", "localSteps": 4},
                                  *({"protocol": "gradient-averaging", "exchange": e} for e in networks.EXCHANGES)])
def test_the_library_accepts_every_job_the_suite_writes(tmp_path, sync):
    doc = _netruns.job_doc("j", tmp_path, "mobilenet_v3_small", 2, {"targetLoss": 0.8, "targetSteps": 1}, 25, sync)
    assert _runs.refusal(doc) is None
    assert doc["spec"]["model"] == {"type": "neural-net", "network": "mobilenet_v3_small"}
    assert doc["spec"]["dataset"]["cacheBatches"] and doc["spec"]["optimizer"] == {"type": "adam", "learningRate": 0.001}


def test_threads_come_from_the_variable_where_the_library_reads_one(monkeypatch):
    monkeypatch.setattr(_netruns, "cpu_cores_variable", lambda: "MLLESS_CPU_CORES")
    assert _netruns.pinning(1, 1)[:2] == ({"MLLESS_CPU_CORES": "1"}, None)
    monkeypatch.setattr(_netruns, "cpu_cores_variable", lambda: None)
    monkeypatch.setattr(_netruns.os, "sched_getaffinity", lambda pid: {0, 1})
    assert _netruns.pinning(2, 1)[:2] == ({}, None)  # each worker's share is one core already
    env, cores, note = _netruns.pinning(1, 1)
    assert env == {} and cores == {0} and "given back" in note


def test_quick_and_full_defaults_and_the_target(monkeypatch):
    args = argparse.Namespace(quick=True, target=None, ddp_workers=None, set=None,
                              **{k: None for k in networks.DEFAULTS if k != "set"})
    networks.settle(args)
    assert args.set == "digits" and args.target == networks.TARGETS["digits"] and args.ddp_workers[0] == 2
    full = argparse.Namespace(quick=False, target=0.5, ddp_workers="2,4", set=None,
                              **{k: None for k in networks.DEFAULTS if k != "set"})
    networks.settle(full)
    assert full.set == "shapes32" and full.target == 0.5 and full.ddp_workers == [2, 4]


# ---- reading runs and stating verdicts -------------------------------------------------------------------------------

def _row(step, t, workers=2, **phases):
    return {"step": step, "time": t, "workers": workers, "bytes_sent": 6_000_000 * workers,
            "bytes_read": 6_000_000 * workers, "phases": {**PHASES, **phases}}


def test_step_figures_skip_the_warm_up_and_keep_the_rest_of_the_step():
    rows = [_row(1, 10.0, compute=5.0), _row(2, 10.2), _row(3, 10.4), _row(4, 10.6, wait=None, read=None, apply=None)]
    f = _netruns.step_figures(rows, 1)
    assert f["step"] == pytest.approx(0.2) and f["steps_timed"] == 3
    assert f["phases"]["compute"] == pytest.approx(0.1)  # the warm-up step's 5 s is left out
    assert f["other"] == pytest.approx(0.2 - sum(PHASES.values()))
    assert f["sent"] == f["read"] == 6_000_000


def _analysis(first, launch, steps, step_s, **phases):
    return {"from_first_step": first, "seconds_to_target": launch, "steps_to_target": steps,
            "step_seconds_median": step_s, "phases_median": {**PHASES, **phases} if phases else {}}


def test_a_met_target_and_a_miss_that_only_start_up_explains():
    assert "**met**" in _netfigures.ratio_line("x", _analysis(9, 12, 100, 0.09), _analysis(10, 11, 100, 0.1), 1.0, True)
    line = _netfigures.ratio_line("x", _analysis(9, 20, 100, 0.09), _analysis(10, 11, 100, 0.1), 1.0, True)
    assert "**met**" in line and "start-up" in line


def test_a_miss_is_bounded_by_convergence_or_by_the_step():
    slow_steps = _netfigures.ratio_line("x", _analysis(20, 25, 200, 0.1, compute=0.09),
                                        _analysis(10, 11, 100, 0.1), 1.0, True)
    assert "**missed**" in slow_steps and "bounded by convergence" in slow_steps
    slow_step = _netfigures.ratio_line("x", _analysis(20, 25, 100, 0.2, compute=0.09),
                                       _analysis(10, 11, 100, 0.1), 1.0, True)
    assert "bounded by the time a step takes" in slow_step and "exchange" in slow_step
    # P = 2 against P = 1: the ideal is half the steps; 60 % of them at the same step time is convergence's miss
    two = _netfigures.ratio_line("x", _analysis(7.0, 8, 60, 0.11), _analysis(10, 11, 100, 0.1), 0.65, False)
    assert "bounded by convergence" in two and "ideal ×0.5" in two
    assert "did not reach" in _netfigures.ratio_line("x", None, _analysis(10, 11, 100, 0.1), 1.0, True)


def test_instability_and_the_curve_by_epoch():
    assert _netfigures.largest_rise([2.3, 1.5, 1.8, 1.2, 1.4]) == pytest.approx(0.3)
    assert _netfigures.largest_rise([2.3, 2.0]) == 0.0 and _netfigures.largest_rise([None]) is None
    assert _netfigures.largest_rise([1.0, math.nan]) == math.inf
    curve = [(1.0, 0.5, 10, 2.0), (2.0, 1.0, 20, 1.5), (3.0, 1.5, 30, 1.2)]
    assert _netfigures.curve_marks(curve, [1, 2]) == [1.5, None]


def test_the_overhead_table_states_the_verdict_and_where_a_miss_goes():
    plain = {"median": {"fetch": 0.001, "forward_backward": 0.2, "optimizer": 0.01, "step": 0.211}}
    side = {"median": {"plain step": 0.21, "mlless step": 0.215, "mlless gradient": 0.2, "mlless descend": 0.015}}
    job = {"step": 0.3, "phases": {**PHASES, "compute": 0.2, "wait": 0.08}, "other": 0.01}
    row = {"network": "cnn", "parameters": 10, "side": side, "plain": [plain, plain], "job": job,
           "threads_note": "n", "load": "1 1 1"}
    text = _netfigures.overhead_table([row], 1.1)
    assert "**missed**" in text and "the close's round trip (wait)" in text
    assert _netfigures.load_robust(side["median"], job) == pytest.approx(0.3 / 0.2 * 0.2 / 0.21)
    fast = {**row, "job": {**job, "step": 0.22, "phases": {**job["phases"], "wait": 0.003}}}
    assert "**met**" in _netfigures.overhead_table([fast], 1.1)


# ---- the peer trains what mlless trains ------------------------------------------------------------------------------

def test_the_plain_loop_trains_mlless_s_network_on_its_batches(tmp_path, monkeypatch):
    """Same initial network, same batches in the same order, same Adam: the loop's losses are mlless's."""
    pytest.importorskip("torch")
    from benchmarks import _torchnet

    monkeypatch.setitem(_netdata.SETS, "tiny", _netdata.ImageSet("tiny", "tiny", 8, 64, 16, batch=16))
    data = _netdata.prepared_set(tmp_path, "tiny")
    doc = _netruns.job_doc("j", data, "mlp", 1, {"maxSteps": 4}, 0)
    out = _torchnet.side_by_side({"job": doc, "data": str(data), "steps": 3, "warmup": 1, "threads": 1})
    plain, mlless = out["losses"]["plain"], out["losses"]["mlless"]
    assert len(plain) == len(mlless) == 4
    assert plain[0] == pytest.approx(mlless[0], rel=1e-5)  # the same network on the same first batch
    assert plain == pytest.approx(mlless, rel=1e-3)  # and the same Adam steps after it
    assert set(out["median"]) >= {"plain step", "mlless step", "mlless gradient", "mlless descend"}
