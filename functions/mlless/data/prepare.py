"""`mlless prepare`: turn raw ratings or click logs into shuffled mini-batch files.

Two streaming passes with bounded memory (see `shuffle.py`):

1. Read the input in blocks, parse, and send each row to validation or
   train by a seeded hash of its line number (so the split does not depend
   on chunking or on skipped lines).  Train rows go to random shuffle
   buckets on local temp disk; statistics (distinct ids, rating mean, label
   rate, integer min/max) are accumulated on the way.
2. Load one bucket at a time, permute it, and emit batches of exactly B rows
   (the remainder is carried into the next bucket); re-index ids, transform
   integer features, write `train/batch-NNNNNN.npz`, then `validation.npz`,
   `ids.npz` (ratings) and finally `manifest.json` with every checksum.

Re-indexing (ratings): users and items are numbered 0..n-1 in increasing
order of their raw id among the *training* rows.  Validation ratings whose
user or item never occurs in training are dropped (a model has no factors
for them) and counted in `n_validation_dropped`.

Memory: pass 1 buffers at most `flush_bytes` (64 MB) of rows; pass 2 holds
one bucket (~64 MB) and its permuted copy; the distinct-id maps are small.
The validation split is held in memory once at the end; cap it with
`max_validation_rows` for huge inputs (Criteo at 10% is ~1.3 GB).
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mlless.data.batches import RatingsBatch, SparseBatch
from mlless.data.chunks import RatingsChunk, SparseChunk
from mlless.data.formats import CRITEO_INT_COLUMNS, LibsvmOptions
from mlless.data.hashing import hash_ints, unit_interval
from mlless.data.manifest import (
    FORMAT_VERSION,
    IDS_NAME,
    MANIFEST_NAME,
    VALIDATION_NAME,
    Manifest,
    batch_name,
)
from mlless.data.npz import npz_bytes
from mlless.data.output import OutputDir
from mlless.progress import Progress
from mlless.data.shuffle import DEFAULT_BUCKET_BYTES, SpillBuckets, choose_buckets, shuffled_batches
from mlless.data.csvfile import CsvError, CsvLayout, CsvOptions, csv_columns, csv_layout
from mlless.data.sources import (
    PrepareError, Source, criteo_source, csv_source, libsvm_source, movielens_source,
)
from mlless.data.user_shards import USER_SHARDS, UserShardWriter
from mlless.data.text import ErrorLog

DEFAULT_BATCH_SIZE = 6250
DEFAULT_SAMPLE_BATCH_SIZE = 1000
DEFAULT_VALIDATION_FRACTION = 0.1
DEFAULT_HASH_BITS = 18
_SPLIT_SALT = 0x53504C4954
_BUCKET_SALT = 0x4255434B


@dataclass(frozen=True)
class PrepareOptions:
    batch_size: int = DEFAULT_BATCH_SIZE
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION
    seed: int = 0
    hash_bits: int = DEFAULT_HASH_BITS
    on_error: str = "fail"  # "fail" | "skip"
    integer_transform: str = "log1p"  # "log1p" | "minmax" (Criteo / synthetic LR)
    max_validation_rows: int | None = None
    progress: bool = True
    tmp_dir: str | None = None
    bucket_bytes: int = DEFAULT_BUCKET_BYTES  # memory knob: shuffle bucket size and pass-1 write buffer
    rating_range: tuple[float, float] | None = None  # MovieLens: plausible ratings; None infers it from the data

    def check(self) -> None:
        if self.batch_size < 1:
            raise PrepareError(f"batch size must be >= 1, got {self.batch_size}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise PrepareError(f"validation fraction must be in [0, 1), got {self.validation_fraction}")
        if not 4 <= self.hash_bits <= 30:
            raise PrepareError(f"hash bits must be in [4, 30], got {self.hash_bits}")
        if self.on_error not in ("fail", "skip"):
            raise PrepareError(f"on_error must be 'fail' or 'skip', got {self.on_error!r}")
        if self.integer_transform not in ("log1p", "minmax"):
            raise PrepareError(f"integer transform must be 'log1p' or 'minmax', got {self.integer_transform!r}")
        if self.rating_range is not None and not (
                all(math.isfinite(x) for x in self.rating_range) and self.rating_range[0] < self.rating_range[1]):
            raise PrepareError(f"rating range must be two finite numbers MIN < MAX, got {self.rating_range}")


@dataclass
class _Stats:
    """Running pass-1 statistics over training rows."""

    rows_seen: int = 0
    user_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    item_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    rating_sum: float = 0.0
    rating_min: float = float("inf")
    rating_max: float = float("-inf")
    nnz: int = 0
    #: The training labels' sum, as the batches hold them (class labels by their class).
    label_sum: float = 0.0
    max_index: int = -1
    int_min: np.ndarray = field(default_factory=lambda: np.full(CRITEO_INT_COLUMNS, np.inf))
    int_max: np.ndarray = field(default_factory=lambda: np.full(CRITEO_INT_COLUMNS, -np.inf))


# --------------------------------------------------------------------- core


def prepare(source: Source, out: str, options: PrepareOptions, log: Callable[[str], None] | None = None,
            validation: Source | None = None) -> Manifest:
    """Run both passes for `source` and write the dataset under `out` (path or fsspec URL). With `validation`, a
    file of the user's own split, every row of `source` trains and every row of `validation` validates."""
    options.check()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True) if options.progress else None)
    errors = ErrorLog(options.on_error)
    output = OutputDir(out)
    output.clear_stale()
    n_buckets = choose_buckets(source.estimated_bytes, options.bucket_bytes)
    progress = Progress("prepare", options.progress)
    stats = _Stats()
    with tempfile.TemporaryDirectory(prefix="mlless-prepare-", dir=options.tmp_dir) as tmp:
        train = SpillBuckets(Path(tmp), "train", source.kind, n_buckets, flush_bytes=options.bucket_bytes)
        val = SpillBuckets(Path(tmp), "validation", source.kind, 1, flush_bytes=options.bucket_bytes)
        split = None if validation is None else False
        for chunk in source.chunks(errors):
            _pass1_chunk(chunk, source, options, stats, train, val, n_buckets, split)
            progress.update(stats.rows_seen, "read")
        if source.classes is not None:  # a class seen first in a validation file is none the model learns
            source.classes.freeze()
        if validation is not None:
            trained = stats.max_index
            for chunk in validation.chunks(errors):
                if source.n_features is None and isinstance(chunk, SparseChunk):
                    chunk = _within_features(chunk, trained, _describe(validation),
                                             int(validation.description.get("index_base", 0)), errors)
                _pass1_chunk(chunk, source, options, stats, train, val, n_buckets, True)
                progress.update(stats.rows_seen, "read")
        read_seconds = progress.elapsed()
        if train.rows == 0:
            raise PrepareError(f"no training rows in {_describe(source)} (all {val.rows} rows went to validation or were skipped)")
        shards = UserShardWriter(Path(tmp), len(stats.item_ids), options.bucket_bytes) if source.kind == "ratings" else None
        manifest = _pass2(source, options, stats, train, val, output, errors, progress, shards)
    total = progress.elapsed()
    rate = stats.rows_seen / max(read_seconds, 1e-9)
    summary = (
        f"prepared {_describe(source)} -> {out}: {manifest.n_train:,} train rows in {manifest.n_batches:,} batches of "
        f"{manifest.batch_size:,}, {manifest.n_validation:,} validation rows"
        + (f" ({manifest.n_validation_dropped:,} dropped: unseen user/item)" if manifest.n_validation_dropped else "")
        + f", {manifest.skipped_lines:,} malformed lines skipped; read {rate:,.0f} rows/s, total {total:.1f} s"
    )
    for example in errors.examples:
        log(f"skipped {example}")
    log(summary)
    return manifest


def _within_features(chunk: SparseChunk, largest: int, path: str, base: int, errors: ErrorLog) -> SparseChunk:
    """`chunk` without its rows with a feature index beyond `largest`, the training file's, each a bad line (the
    model has no weight for it) showing the index as the file writes it (from `base`)."""
    beyond = chunk.indices > largest
    if not beyond.any():
        return chunk
    rows = np.searchsorted(chunk.indptr, np.flatnonzero(beyond), side="right") - 1
    bad = np.zeros(len(chunk), bool)
    bad[rows] = True
    for r in np.flatnonzero(bad):
        at = slice(chunk.indptr[r], chunk.indptr[r + 1])
        errors.bad(path, int(chunk.keys[r]), f"a feature index beyond the training file's largest, {largest + base}",
                   f"{int(chunk.indices[at].max()) + base}")
    return chunk.take(~bad)


def _describe(source: Source) -> str:
    d = source.description
    return str(d.get("path") or d.get("sample") or f"synthetic {d.get('synthetic')}")


def _pass1_chunk(
    chunk: RatingsChunk | SparseChunk,
    source: Source,
    options: PrepareOptions,
    stats: _Stats,
    train: SpillBuckets,
    val: SpillBuckets,
    n_buckets: int,
    to_validation: bool | None = None,
) -> None:
    """Count `chunk` in `stats` and spill it, split by a seeded hash of its keys, or all of it to validation
    (`to_validation` True) or to training (False)."""
    if not len(chunk):
        return
    stats.rows_seen += len(chunk)
    if isinstance(chunk, SparseChunk):
        if chunk.indices.dtype != np.int32:
            if len(chunk.indices) and int(chunk.indices.max()) >= np.iinfo(np.int32).max:
                raise PrepareError(f"{_describe(source)}: feature index {int(chunk.indices.max())} does not fit int32")
            chunk.indices = chunk.indices.astype(np.int32)
        if len(chunk.indices):
            stats.max_index = max(stats.max_index, int(chunk.indices.max()))
        if source.n_features is not None and stats.max_index >= source.n_features:
            raise PrepareError(f"internal error: feature index {stats.max_index} >= n_features {source.n_features}")
    is_val = held_out(chunk.keys, options, val.rows, to_validation)
    if is_val.any():
        v = chunk.take(is_val)
        val.add(v, np.zeros(len(v), dtype=np.int64))
        t = chunk.take(~is_val)
    else:
        t = chunk
    if not len(t):
        return
    buckets = (hash_ints(t.keys, options.seed ^ _BUCKET_SALT) % np.uint64(n_buckets)).astype(np.int64)
    if isinstance(t, RatingsChunk):
        stats.user_ids = np.union1d(stats.user_ids, np.unique(t.users))
        stats.item_ids = np.union1d(stats.item_ids, np.unique(t.items))
        stats.rating_sum += float(t.ratings.astype(np.float64).sum())
        stats.rating_min = min(stats.rating_min, float(t.ratings.min()))
        stats.rating_max = max(stats.rating_max, float(t.ratings.max()))
    else:
        stats.nnz += len(t.indices)
        if source.integer_columns and options.integer_transform == "minmax":
            for j in range(source.integer_columns):
                vals = t.values[t.indices == j]
                if len(vals):
                    stats.int_min[j] = min(stats.int_min[j], float(vals.min()))
                    stats.int_max[j] = max(stats.int_max[j], float(vals.max()))
    train.add(t, buckets)


def held_out(keys: np.ndarray, options: PrepareOptions, held: int = 0, to_validation: bool | None = None) -> np.ndarray:
    """Which rows, by their keys, validate: those a seeded hash of the key picks, or all (`to_validation` True) or
    none (False), without more than `max_validation_rows` in all when `held` already do."""
    if to_validation is None:
        is_val = unit_interval(keys, options.seed ^ _SPLIT_SALT) < options.validation_fraction
    else:
        is_val = np.full(len(keys), to_validation)
    if options.max_validation_rows is not None:
        is_val[np.flatnonzero(is_val)[max(options.max_validation_rows - held, 0):]] = False
    return is_val


def _transform(values: np.ndarray, indices: np.ndarray, columns: int, options: PrepareOptions, stats: _Stats) -> np.ndarray:
    """Apply the integer-column transform to entries with index < columns (others untouched)."""
    if not columns:
        return values
    values = values.copy()
    is_int = indices < columns
    col = indices[is_int]
    raw = values[is_int].astype(np.float64)
    if options.integer_transform == "log1p":
        values[is_int] = np.log1p(np.maximum(raw, 0.0))
    else:
        lo = np.where(np.isfinite(stats.int_min), stats.int_min, 0.0)[col]
        hi = np.where(np.isfinite(stats.int_max), stats.int_max, 1.0)[col]
        span = np.where(hi > lo, hi - lo, 1.0)
        values[is_int] = np.clip((raw - lo) / span, 0.0, 1.0)
    return values


def _pass2(
    source: Source,
    options: PrepareOptions,
    stats: _Stats,
    train: SpillBuckets,
    val: SpillBuckets,
    output: OutputDir,
    errors: ErrorLog,
    progress: Progress,
    shards: UserShardWriter | None,
) -> Manifest:
    """Write the batches, then the validation split, the ids and the user shards (`shards`, ratings only), and
    the manifest last."""
    B = options.batch_size
    # Class labels: the chunks hold each class's first-seen number, the batches its place among the sorted labels.
    classes = None if source.classes is None else source.classes.final()[1]
    n_batches = 0
    written = 0
    for batch in shuffled_batches(train, B, options.seed):
        if isinstance(batch, RatingsChunk):
            dense = RatingsBatch(
                np.searchsorted(stats.user_ids, batch.users).astype(np.int32),
                np.searchsorted(stats.item_ids, batch.items).astype(np.int32),
                batch.ratings.astype(np.float32),
            )
            assert shards is not None
            shards.add(dense)
            arrays = dense.arrays()
        else:
            values = _transform(batch.values, batch.indices, source.integer_columns, options, stats)
            labels = _labels(batch.labels, classes)
            stats.label_sum += float(labels.astype(np.float64).sum())
            arrays = SparseBatch(batch.indptr, batch.indices.astype(np.int32), values.astype(np.float32), labels).arrays()
        output.put(batch_name(n_batches), npz_bytes(arrays))
        n_batches += 1
        written += len(batch)
        progress.update(written, "write")
    assert written == train.rows, (written, train.rows)

    val.flush()
    vchunk = val.load(0) if val.rows else None
    dropped = 0
    if source.kind == "ratings":
        if vchunk is None:
            v_arrays = RatingsBatch(np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.float32)).arrays()
        else:
            assert isinstance(vchunk, RatingsChunk)
            u = np.searchsorted(stats.user_ids, vchunk.users)
            i = np.searchsorted(stats.item_ids, vchunk.items)
            known = (u < len(stats.user_ids)) & (i < len(stats.item_ids))
            known[known] &= (stats.user_ids[u[known]] == vchunk.users[known]) & (stats.item_ids[i[known]] == vchunk.items[known])
            dropped = int((~known).sum())
            v_arrays = RatingsBatch(u[known].astype(np.int32), i[known].astype(np.int32), vchunk.ratings[known]).arrays()
        n_val = len(v_arrays["ratings"])
        output.put(IDS_NAME, npz_bytes({"user_ids": stats.user_ids, "item_ids": stats.item_ids}))
    else:
        if vchunk is None:
            v_arrays = SparseBatch(np.zeros(1, np.int64), np.empty(0, np.int32), np.empty(0, np.float32), np.empty(0, np.float32)).arrays()
        else:
            assert isinstance(vchunk, SparseChunk)
            values = _transform(vchunk.values, vchunk.indices, source.integer_columns, options, stats)
            v_arrays = SparseBatch(vchunk.indptr, vchunk.indices.astype(np.int32), values.astype(np.float32),
                                   _labels(vchunk.labels, classes)).arrays()
            stats.max_index = max(stats.max_index, int(vchunk.indices.max(initial=-1)))
        n_val = len(v_arrays["labels"])
    output.put(VALIDATION_NAME, npz_bytes(v_arrays))
    if shards is not None:
        shards.write(output)

    manifest = _manifest(source, options, stats, n_batches, train.rows, n_val, dropped, errors, output.checksums)
    output.put(MANIFEST_NAME, manifest.to_json().encode(), checksum=False)
    return manifest


def _labels(labels: np.ndarray, classes: np.ndarray | None) -> np.ndarray:
    """Labels as a batch holds them: class labels (first-seen numbers) as their class, others as they are."""
    return labels if classes is None else classes[labels.astype(np.int64)]


def _manifest(
    source: Source,
    options: PrepareOptions,
    stats: _Stats,
    n_batches: int,
    n_train: int,
    n_val: int,
    dropped: int,
    errors: ErrorLog,
    checksums: dict[str, str],
) -> Manifest:
    ratings = source.kind == "ratings"
    feature_stats: dict[str, Any]
    if ratings:
        feature_stats = {}
        n_features = None
    else:
        n_features = source.n_features if source.n_features is not None else stats.max_index + 1
        transform: dict[str, Any] = {"columns": source.integer_columns}
        if source.integer_columns:
            transform["kind"] = options.integer_transform
            if options.integer_transform == "minmax":
                transform["min"] = [float(x) if np.isfinite(x) else None for x in stats.int_min]
                transform["max"] = [float(x) if np.isfinite(x) else None for x in stats.int_max]
        else:
            transform["kind"] = "none"
        # Class labels: the batches hold classes 0 … K − 1 (label_classes), which are the file's label_values.
        values = None if source.classes is None else source.classes.final()[0]
        feature_stats = {
            "nnz_per_row_mean": stats.nnz / n_train,
            "label_mean": stats.label_sum / n_train,  # binary labels: the rate of positives
            **({"label_classes": list(range(len(values))), "label_values": values} if values is not None else {}),
            "integer_transform": transform,
        }
    return Manifest(
        format_version=FORMAT_VERSION,
        kind=source.kind,
        source=source.description,
        seed=options.seed,
        batch_size=options.batch_size,
        n_batches=n_batches,
        n_train=n_train,
        n_validation=n_val,
        validation_fraction=options.validation_fraction,
        n_validation_dropped=dropped,
        n_users=len(stats.user_ids) if ratings else None,
        n_items=len(stats.item_ids) if ratings else None,
        mean_rating=stats.rating_sum / n_train if ratings else None,
        rating_min=stats.rating_min if ratings else None,
        rating_max=stats.rating_max if ratings else None,
        n_features=n_features,
        hash_bits=source.hash_bits,
        feature_stats=feature_stats,
        skipped_lines=errors.skipped,
        skipped_examples=list(errors.examples),
        checksums=dict(sorted(checksums.items())),
        user_shards=USER_SHARDS if ratings else 0,
    )


# --------------------------------------------------------------------- entry points


def file_source(fmt: str, path: str, options: PrepareOptions, libsvm: LibsvmOptions | None = None,
                csv: CsvOptions | None = None, layout: CsvLayout | None = None) -> Source:
    """The rows of one input file of format 'movielens', 'criteo', 'libsvm' or 'csv' (a CSV file is read by `layout`,
    its training file's, when one is given)."""
    if "://" not in path and not os.path.exists(path):
        raise PrepareError(f"input file not found: {path}")
    if fmt == "movielens":
        return movielens_source(path, options.rating_range)
    if fmt == "criteo":
        return criteo_source(path, options.hash_bits)
    if fmt == "libsvm":
        return libsvm_source(path, replace(libsvm or LibsvmOptions(), hash_bits=options.hash_bits))
    if fmt == "csv":
        csv = _csv_options(csv, options)
        if layout is None:
            return csv_source(path, csv, _csv_layout(path, csv))
        try:
            columns = csv_columns(path, csv.delimiter)
        except CsvError as exc:
            raise PrepareError(str(exc)) from None
        if columns != layout.columns:
            raise PrepareError(f"{path}: its header ({', '.join(columns[:8])}, …) is not the training file's "
                               f"({', '.join(layout.columns[:8])}, …)")
        return csv_source(path, csv, layout)
    raise PrepareError(f"unknown format {fmt!r}; expected movielens, criteo, libsvm or csv")


def _csv_options(csv: CsvOptions | None, options: PrepareOptions) -> CsvOptions:
    if csv is None:
        raise PrepareError("--format csv needs --label COL, the label column")
    return replace(csv, hash_bits=options.hash_bits)


def _csv_layout(path: str, csv: CsvOptions) -> CsvLayout:
    try:
        return csv_layout(path, csv)
    except CsvError as exc:
        raise PrepareError(str(exc)) from None


def prepare_file(fmt: str, path: str, out: str, options: PrepareOptions, libsvm: LibsvmOptions | None = None,
                 validation_path: str | None = None, csv: CsvOptions | None = None) -> Manifest:
    """Prepare one input file of format 'movielens', 'criteo', 'libsvm' or 'csv'; with `validation_path`, a file of
    the same format that is the validation split (the input then trains whole; a CSV one is read as the input's
    columns are)."""
    source = file_source(fmt, path, options, libsvm, csv)
    if validation_path is None:
        return prepare(source, out, options)
    layout = _csv_layout(path, _csv_options(csv, options)) if fmt == "csv" else None
    source = replace(source, description={**source.description, "validation": validation_path})
    return prepare(source, out, options, validation=file_source(fmt, validation_path, options, libsvm, csv, layout))
