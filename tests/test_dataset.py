"""Tests for the Dataset reader: validation of manifest and batches, corruption, caching."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from mlless.data.batches import RatingsBatch, SparseBatch
from mlless.data.dataset import Dataset, DatasetError
from mlless.data.npz import npz_bytes, sha256
from mlless.data.prepare import PrepareOptions, prepare
from mlless.data.sources import synthetic_lr_source, synthetic_pmf_source
from mlless.data.synthetic import LrParams, PmfParams

OPTS = PrepareOptions(batch_size=100, validation_fraction=0.2, progress=False)


@pytest.fixture()
def ratings_dir(tmp_path: Path) -> Path:
    out = tmp_path / "ratings"
    prepare(synthetic_pmf_source(PmfParams(rows=1050, users=40, items=30, rank=3), 0), str(out), OPTS)
    return out


@pytest.fixture()
def sparse_dir(tmp_path: Path) -> Path:
    out = tmp_path / "sparse"
    prepare(synthetic_lr_source(LrParams(rows=450, hash_bits=10), 0), str(out), OPTS)
    return out


def edit_manifest(root: Path, **changes: object) -> None:
    path = root / "manifest.json"
    data = json.loads(path.read_text())
    for k, v in changes.items():
        if v is KeyError:
            del data[k]
        else:
            data[k] = v
    path.write_text(json.dumps(data))


def test_open_and_read(ratings_dir: Path, sparse_dir: Path) -> None:
    ds = Dataset.open(str(ratings_dir))
    assert ds.kind == "ratings" and ds.n_batches == len(ds) == ds.manifest.n_batches
    b = ds.batch(0)
    assert isinstance(b, RatingsBatch) and len(b) == 100
    assert len(ds.batch(ds.n_batches - 1)) == ds.manifest.n_train - 100 * (ds.n_batches - 1)
    assert set(ds.dims()) == {"n_users", "n_items", "mean_rating", "rating_min", "rating_max", "n_ratings"}
    assert sum(len(x) for x in ds) == ds.manifest.n_train
    sp = Dataset.open(str(sparse_dir))
    assert isinstance(sp.batch(0), SparseBatch) and set(sp.dims()) == {"n_features", "mean_label", "classes"}
    assert isinstance(sp.validation(), SparseBatch) and len(sp.validation()) == sp.manifest.n_validation
    with pytest.raises(IndexError):
        ds.batch(ds.n_batches)


def test_missing_dataset_and_manifest_fields(tmp_path: Path, ratings_dir: Path) -> None:
    with pytest.raises(DatasetError, match="manifest.json: not found"):
        Dataset.open(str(tmp_path / "nowhere"))
    edit_manifest(ratings_dir, n_users=KeyError)
    with pytest.raises(DatasetError, match=r"manifest\.json: missing field 'n_users'"):
        Dataset.open(str(ratings_dir))
    edit_manifest(ratings_dir, n_users=None)
    with pytest.raises(DatasetError, match="'n_users' must not be null"):
        Dataset.open(str(ratings_dir))
    edit_manifest(ratings_dir, n_users="40")
    with pytest.raises(DatasetError, match="'n_users' must be an integer"):
        Dataset.open(str(ratings_dir))
    edit_manifest(ratings_dir, n_users=40, format_version=2)
    with pytest.raises(DatasetError, match="format_version"):
        Dataset.open(str(ratings_dir))
    edit_manifest(ratings_dir, format_version=1, n_batches=3)
    with pytest.raises(DatasetError, match="n_batches"):
        Dataset.open(str(ratings_dir))
    (ratings_dir / "manifest.json").write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        Dataset.open(str(ratings_dir))
    assert issubclass(DatasetError, ValueError)


@pytest.mark.parametrize("changes, says", [
    ({"n_users": 10**12}, "'n_users' is 1000000000000; at most the"),  # a reader would allocate the model first
    ({"mean_rating": float("nan")}, "'mean_rating' is nan, not a finite number"),
    ({"rating_min": 5.0, "rating_max": 1.0}, "'rating_min' <= 'mean_rating' <= 'rating_max' do not hold"),
    ({"n_train": 10**30, "n_batches": 10**28}, "'n_train' out of range"),  # the checksum loop would not end
    ({"n_train": 10**11, "n_batches": 10**9}, "268 checksums for 1000000000 batches"),  # 256 user shards among them
    ({"user_shards": 10**9}, "'user_shards' is 1000000000; a ratings set has up to 4096"),
    ({"validation_fraction": 1.5}, "'validation_fraction' is 1.5"),
])
def test_an_implausible_manifest_is_refused_naming_the_field(ratings_dir: Path, changes, says) -> None:
    path = ratings_dir / "manifest.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))  # NaN as JSON's NaN, as json writes it
    with pytest.raises(DatasetError, match=r"manifest\.json: (fields? )?" + re.escape(says)):
        Dataset.open(str(ratings_dir))


def test_flipped_bytes_detected_by_checksum(ratings_dir: Path) -> None:
    path = ratings_dir / "train" / "batch-000002.npz"
    data = bytearray(path.read_bytes())
    data[-200] ^= 0xFF
    path.write_bytes(bytes(data))
    ds = Dataset.open(str(ratings_dir))
    ds.batch(1)
    with pytest.raises(DatasetError, match=r"batch-000002\.npz: sha256"):
        ds.batch(2)


def _replace_batch(root: Path, name: str, arrays: dict[str, np.ndarray]) -> None:
    """Write a batch and patch the manifest checksum, so only the content checks can catch it."""
    _replace_file(root, name, npz_bytes(arrays))


def _replace_file(root: Path, name: str, data: bytes) -> None:
    """Write `data` as the data set's file `name`, its checksum in the manifest patched to match."""
    (root / name).write_bytes(data)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["checksums"][name] = sha256(data)
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_wrong_dtype_and_out_of_range_ids(ratings_dir: Path) -> None:
    good = Dataset.open(str(ratings_dir)).batch(0).arrays()
    name = "train/batch-000000.npz"
    _replace_batch(ratings_dir, name, {**good, "users": good["users"].astype(np.int64)})
    with pytest.raises(DatasetError, match=r"batch-000000\.npz: array 'users' must be int32"):
        Dataset.open(str(ratings_dir)).batch(0)
    bad = good["items"].copy()
    bad[5] = 10_000
    _replace_batch(ratings_dir, name, {**good, "items": bad})
    with pytest.raises(DatasetError, match=r"batch-000000\.npz: item id 10000 >= n_items"):
        Dataset.open(str(ratings_dir)).batch(0)
    _replace_batch(ratings_dir, name, {k: v[:50] for k, v in good.items()})
    with pytest.raises(DatasetError, match="has 50 rows"):
        Dataset.open(str(ratings_dir)).batch(0)
    _replace_batch(ratings_dir, name, {"users": good["users"]})
    with pytest.raises(DatasetError, match="missing array 'items'"):
        Dataset.open(str(ratings_dir)).batch(0)


def test_feature_index_out_of_range_and_pickles_refused(sparse_dir: Path) -> None:
    good = Dataset.open(str(sparse_dir)).batch(0).arrays()
    name = "train/batch-000000.npz"
    idx = good["indices"].copy()
    idx[0] = 1024
    _replace_batch(sparse_dir, name, {**good, "indices": idx})
    with pytest.raises(DatasetError, match="feature index 1024 >= n_features 1024"):
        Dataset.open(str(sparse_dir)).batch(0)
    buf = io.BytesIO()
    np.savez(buf, indptr=good["indptr"], indices=np.array([{"a": 1}], dtype=object), values=good["values"], labels=good["labels"])
    _replace_file(sparse_dir, name, buf.getvalue())
    with pytest.raises(DatasetError, match=r"batch-000000\.npz"):
        Dataset.open(str(sparse_dir)).batch(0)


def test_truncated_file(sparse_dir: Path) -> None:
    path = sparse_dir / "validation.npz"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError, match=r"validation\.npz"):
        Dataset.open(str(sparse_dir)).validation()
    path.unlink()
    with pytest.raises(DatasetError, match=r"validation\.npz: not found"):
        Dataset.open(str(sparse_dir)).validation()
    # Truncated, with a checksum that matches: zipfile's BadZipFile used to escape without the file's name.
    name = "train/batch-000001.npz"
    _replace_file(sparse_dir, name, (sparse_dir / name).read_bytes()[:-40])
    with pytest.raises(DatasetError, match=r"batch-000001\.npz: not a readable npz"):
        Dataset.open(str(sparse_dir)).batch(1)


def test_checksum_verified_once_and_lru_cache(ratings_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlless.data.dataset as dataset_mod

    calls = []
    real = dataset_mod.sha256
    monkeypatch.setattr(dataset_mod, "sha256", lambda d: calls.append(1) or real(d))
    ds = Dataset.open(str(ratings_dir))
    a = ds.batch(0)
    b = ds.batch(0)
    assert len(calls) == 1 and a is not b  # verified once, re-read from storage
    cached = Dataset.open(str(ratings_dir), cache_batches=2)
    x = cached.batch(0)
    assert cached.batch(0) is x
    cached.batch(1), cached.batch(2)
    assert cached.batch(0) is not x  # evicted (capacity 2)
    np.testing.assert_array_equal(cached.batch(0).ratings, x.ratings)


def test_memory_url(tmp_path: Path) -> None:
    prepare(synthetic_pmf_source(PmfParams(rows=500, users=20, items=10, rank=2), 1), "memory://ds-test/x", OPTS)
    ds = Dataset.open("memory://ds-test/x")
    assert sum(len(b) for b in ds) == ds.manifest.n_train
    with pytest.raises(DatasetError, match="memory://ds-test/missing/manifest.json"):
        Dataset.open("memory://ds-test/missing")
