"""spec.model.augment: a random crop with zero padding and a horizontal flip of the training images
(data/augment.py), applied by each worker to the batches it trains on, never to the images evaluated."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mlless.data.augment import Augment
from mlless.data.batches import ImageBatch
from mlless.spec import SpecError, TrainingJob, from_manifest
from test_prepare_images import noise


def batch(rows: int = 32, channels: int = 3, height: int = 6, width: int = 5) -> ImageBatch:
    return ImageBatch(noise(rows, channels, height, width), np.arange(rows, dtype=np.int32) % 4)


def placements(original: np.ndarray, augmented: np.ndarray, crop: int) -> list[tuple[int, int, bool]]:
    """Every (top, left, mirrored) of the zero-padded `original` that gives `augmented`."""
    _, height, width = original.shape
    padded = np.zeros((original.shape[0], height + 2 * crop, width + 2 * crop), np.uint8)
    padded[:, crop:crop + height, crop:crop + width] = original
    windows = {(top, left): padded[:, top:top + height, left:left + width]
               for top in range(2 * crop + 1) for left in range(2 * crop + 1)}
    return [(top, left, mirrored) for (top, left), window in windows.items() for mirrored in (False, True)
            if np.array_equal(window[..., ::-1] if mirrored else window, augmented)]


def test_crop_keeps_the_shape_and_takes_a_window_of_the_padded_image():
    b = batch()
    before = b.images.copy()
    out = Augment(crop=2).apply(b, np.random.default_rng(0))
    assert out.images.shape == b.images.shape and out.images.dtype == np.uint8
    assert np.array_equal(out.labels, b.labels) and np.array_equal(b.images, before)  # the batch is left as it is
    found = [placements(b.images[i], out.images[i], 2) for i in range(len(b))]
    assert all(any(not mirrored for _, _, mirrored in p) for p in found)
    offsets = {p[0][:2] for p in found}
    assert len(offsets) > 5 and any(o != (2, 2) for o in offsets)  # the images move, each its own way


def test_flip_mirrors_about_half_the_images_and_nothing_else():
    b = batch(rows=200)
    out = Augment(flip=True).apply(b, np.random.default_rng(1)).images
    mirrored = [np.array_equal(out[i], b.images[i, :, :, ::-1]) for i in range(len(b))]
    kept = [np.array_equal(out[i], b.images[i]) for i in range(len(b))]
    assert all(m != k for m, k in zip(mirrored, kept))
    assert 70 < sum(mirrored) < 130


def test_each_step_draws_from_the_seed_the_rank_and_the_step_alone():
    b, aug = batch(), Augment(crop=3, flip=True)
    first = aug.step(b, 7, 1, 10).images
    assert np.array_equal(first, aug.step(b, 7, 1, 10).images)  # a rerun, or a resumed worker, draws the same
    for other in ((8, 1, 10), (7, 2, 10), (7, 1, 11)):
        assert not np.array_equal(first, aug.step(b, *other).images), other
    assert Augment().step(b, 7, 1, 10) is b and not Augment()


def manifest(model: dict) -> dict:
    return {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "a"},
            "spec": {"workers": 1, "model": {"type": "neural-net", **model}, "dataset": {"uri": "/data"}}}


def test_the_manifest_fills_the_defaults_it_leaves_out_and_the_job_crosses_processes():
    job = from_manifest(manifest({"augment": {"crop": 4}}))
    assert job.model.options["augment"] == {"crop": 4, "flip": False}
    assert TrainingJob.from_json(job.to_json()) == job
    assert "augment" not in from_manifest(manifest({})).model.options


@pytest.mark.parametrize("augment, says", [
    ({"crop": -1}, "spec.model.augment.crop: -1 is less than the minimum of 0"),
    ({"crop": 400}, "spec.model.augment.crop: 400 is greater than the maximum of 64"),
    ({"flip": "yes"}, "spec.model.augment.flip: 'yes' is not of type 'boolean'"),
    ({"rotate": 10}, "spec.model.augment: Additional properties are not allowed ('rotate' was unexpected)"),
])
def test_a_bad_augment_is_refused_naming_the_field(augment, says):
    with pytest.raises(SpecError) as exc:
        from_manifest(manifest({"augment": augment}))
    assert says in str(exc.value), str(exc.value)


@pytest.mark.slow
def test_a_job_trains_on_augmented_batches_and_evaluates_the_images_as_prepared(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from pathlib import Path

    import augment_probe
    from mlless.cli import main
    from mlless.contract import ENV_PLUGINS
    from mlless.data.dataset import Dataset

    np.savez(tmp_path / "in.npz", X=noise(240, 8, 8, 3), y=np.arange(240) % 3)
    assert main(["prepare", "--quiet", "--format", "npz", str(tmp_path / "in.npz"), "--out", str(tmp_path / "ds"),
                 "--batch-size", "16"]) == 0
    job = manifest({"network": "mlp", "hiddenSizes": [6], "augment": {"crop": 2, "flip": True}})
    job["spec"] |= {"dataset": {"uri": str(tmp_path / "ds")}, "stop": {"maxSteps": 6},
                    "evaluation": {"everySteps": 3}}
    (tmp_path / "job.yaml").write_text(json.dumps(job))
    probe = tmp_path / "probe"
    probe.mkdir()
    monkeypatch.setenv(ENV_PLUGINS, str(Path(augment_probe.__file__)))
    monkeypatch.setenv(augment_probe.ENV, str(probe))
    assert main(["train", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "run"), "-q"]) == 0

    ds = Dataset.open(str(tmp_path / "ds"))
    stored = [ds.batch(i) for i in range(ds.n_batches)]
    trained = augment_probe.recorded(probe, "gradient")
    assert len(trained) >= 6
    for images, labels in trained:
        # One of the prepared batches, its labels in their order, each image cropped and flipped.
        source = next(b for b in stored if np.array_equal(b.labels, labels) and len(b) == len(labels))
        assert images.shape == source.images.shape
        assert not any(np.array_equal(images, b.images) for b in stored)
    validation = ds.validation()
    evaluated = augment_probe.recorded(probe, "evaluate")
    assert evaluated and all(np.array_equal(images, validation.images[:len(images)]) for images, _ in evaluated)
