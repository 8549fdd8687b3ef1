"""Reading a prepared dataset: what workers and the supervisor use every step.

`Dataset.open(uri)` reads and validates `manifest.json`; `batch(i)` fetches
one `.npz` with `allow_pickle=False`, checks its sha256 against the manifest
(once per file: batches are immutable, so later reads skip the hash;
the supervisor checks them all at start-up, `verify_in_background`),
validates dtypes and shapes through `from_arrays`, and checks ids and feature
indices against the manifest's dimensions so a corrupt batch can never index
outside the model.  Every problem is a `DatasetError` naming the file.
"""
from __future__ import annotations

import posixpath
import threading
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

import fsspec
from fsspec import AbstractFileSystem

from mlless.data.batches import BATCH_TYPES, Batch, BatchError, ImageBatch, RatingsBatch
from mlless.data.manifest import (
    IMAGE_LABEL_KINDS, LABEL_KINDS, MANIFEST_NAME, USER_COUNTS_NAME, VALIDATION_NAME, DatasetError, Manifest, batch_name,
    user_shard_name,
)
from mlless.data.npz import load_npz_bytes, sha256

__all__ = ["Dataset", "DatasetError", "Manifest"]


class Dataset:
    """A prepared dataset at a local path or fsspec URL."""

    def __init__(self, fs: AbstractFileSystem, root: str, uri: str, manifest: Manifest, cache_batches: int = 0):
        self.fs = fs
        self.root = root
        self.uri = uri
        self.manifest = manifest
        self._verified: set[str] = set()
        self._cache: OrderedDict[str, Batch] = OrderedDict()
        self._cache_size = int(cache_batches)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, uri: str, cache_batches: bool | int = False) -> Dataset:
        """Open and validate a dataset; `cache_batches` keeps that many (True: 64) batches in an LRU."""
        try:
            fs, root = fsspec.core.url_to_fs(uri)
        except (ValueError, ImportError) as exc:
            raise DatasetError(f"{uri}: cannot open ({exc})") from None
        root = root.rstrip("/") or root
        path = posixpath.join(root, MANIFEST_NAME)
        where = f"{uri.rstrip('/')}/{MANIFEST_NAME}"
        try:
            text = fs.cat_file(path)
        except FileNotFoundError:
            raise DatasetError(f"{where}: not found (is {uri} a directory written by 'mlless prepare'?)") from None
        except OSError as exc:
            raise DatasetError(f"{where}: cannot read ({exc})") from None
        manifest = Manifest.from_json(text, where)
        size = 64 if cache_batches is True else int(cache_batches or 0)
        return cls(fs, root, uri, manifest, size)

    # ------------------------------------------------------------ properties

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def n_batches(self) -> int:
        return self.manifest.n_batches

    def __len__(self) -> int:
        return self.manifest.n_batches

    @property
    def labels(self) -> str:
        """What the data set's labels are, one of `LABEL_KINDS` (`mlless prepare --labels`): a sparse set's binary
        before it was recorded, an image set's classes (or real: `IMAGE_LABEL_KINDS`)."""
        unrecorded = IMAGE_LABEL_KINDS[0] if self.kind == ImageBatch.kind else LABEL_KINDS[0]
        return str(self.manifest.source.get("labels", unrecorded))

    def fits(self, kinds: frozenset[str]) -> bool:
        """Whether a model that fits labels of `kinds` (`ModelType.labels`) can train on these: a set of two classes
        (numbered 0 and 1, `mlless.data.classes`) is binary too."""
        classes = self.manifest.feature_stats.get("label_classes")
        return self.labels in kinds or ("binary" in kinds and self.labels == "classes" and classes == [0, 1])

    def label_set(self) -> str:
        """What the labels are, as a refusal names them: "real labels", "binary labels" or "3 classes (cat, dog,
        fish)"."""
        values = self.manifest.feature_stats.get("label_values") or self.manifest.feature_stats.get("label_classes")
        if self.labels != "classes" or not isinstance(values, list):
            return f"{self.labels} labels"
        shown = ", ".join(map(str, values[:5])) + (", …" if len(values) > 5 else "")
        return f"{len(values)} classes ({shown})"

    def dims(self) -> dict[str, Any]:
        """Model dimensions: n_users, n_items, mean_rating and the rating range (ratings), or n_features, the
        training labels' mean (data sets prepared before it was recorded have none) and the classes, the sorted
        distinct labels (sparse; [0, 1] for binary labels, none for real ones), or an image's channels, height and
        width, each channel's pixel_mean and pixel_std on the 0-255 scale, and n_classes, or of real labels the
        training targets' label_mean and label_std (images)."""
        m = self.manifest
        if m.kind == ImageBatch.kind:
            assert m.pixel_mean is not None and m.pixel_std is not None
            labels = ({"label_mean": float(m.feature_stats["label_mean"]),
                       "label_std": float(m.feature_stats["label_std"])} if self.labels == "real"
                      else {"n_classes": m.n_classes})
            return {"channels": m.channels, "height": m.height, "width": m.width, **labels,
                    "pixel_mean": [float(v) for v in m.pixel_mean], "pixel_std": [float(v) for v in m.pixel_std]}
        if m.kind == "ratings":
            assert m.n_users is not None and m.n_items is not None and m.mean_rating is not None
            dims: dict[str, int | float] = {"n_users": m.n_users, "n_items": m.n_items, "mean_rating": m.mean_rating,
                                            "n_ratings": m.n_train}
            if m.rating_min is not None and m.rating_max is not None:
                # Predictions are clipped to the range the data can hold.
                dims |= {"rating_min": m.rating_min, "rating_max": m.rating_max}
            return dims
        assert m.n_features is not None
        mean = m.feature_stats.get("label_mean")
        classes = m.feature_stats.get("label_classes") if self.labels == "classes" else [0.0, 1.0]
        return ({"n_features": m.n_features} | ({"mean_label": float(mean)} if isinstance(mean, (int, float)) else {})
                | ({"classes": classes} if self.labels != "real" else {}))

    # ------------------------------------------------------------ reading

    def batch(self, i: int) -> Batch:
        """Training batch i (0 <= i < n_batches); validated, checksum-verified on first read."""
        if not 0 <= i < self.manifest.n_batches:
            raise IndexError(f"batch {i} out of range [0, {self.manifest.n_batches})")
        batch = self._read(batch_name(i))
        expected = self.manifest.batch_rows(i)
        if len(batch) != expected:
            raise DatasetError(f"{self._where(batch_name(i))}: has {len(batch)} rows, manifest implies {expected}")
        return batch

    def validation(self) -> Batch:
        """The whole validation split as one batch."""
        batch = self._read(VALIDATION_NAME)
        if len(batch) != self.manifest.n_validation:
            raise DatasetError(f"{self._where(VALIDATION_NAME)}: has {len(batch)} rows, manifest says {self.manifest.n_validation}")
        return batch

    def user_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Each user shard's and each item's number of training ratings (`mlless.data.user_shards`)."""
        m, where = self.manifest, self._where(USER_COUNTS_NAME)
        try:
            arrays = load_npz_bytes(self._fetch(USER_COUNTS_NAME), where)
        except (ValueError, OSError, EOFError) as exc:
            raise DatasetError(f"{where}: not a readable npz without pickles ({exc})") from None
        counts = []
        for name, length in (("shard_rows", m.user_shards), ("item_counts", m.n_items)):
            a = arrays.get(name)
            if a is None or a.dtype != np.int64 or a.shape != (length,) or (length and a.min() < 0) \
                    or int(a.sum()) != m.n_train:
                raise DatasetError(f"{where}: '{name}' must be {length} non-negative int64 counts summing to n_train")
            counts.append(a)
        return counts[0], counts[1]

    def user_shard(self, s: int, rows: int) -> RatingsBatch:
        """The training ratings of user shard `s`, of which `user_counts` says there are `rows`; not cached."""
        if not 0 <= s < self.manifest.user_shards:
            raise IndexError(f"user shard {s} out of range [0, {self.manifest.user_shards})")
        shard = self._read(user_shard_name(s), cache=False)
        if len(shard) != rows:
            raise DatasetError(f"{self._where(user_shard_name(s))}: has {len(shard)} rows, {USER_COUNTS_NAME} says {rows}")
        assert isinstance(shard, RatingsBatch)
        return shard

    def __iter__(self):
        return (self.batch(i) for i in range(self.n_batches))

    def _where(self, name: str) -> str:
        return f"{self.uri.rstrip('/')}/{name}"

    def _read(self, name: str, cache: bool = True) -> Batch:
        cache = cache and bool(self._cache_size)
        if cache:
            with self._lock:
                hit = self._cache.get(name)
                if hit is not None:
                    self._cache.move_to_end(name)
                    return hit
        where = self._where(name)
        data = self._fetch(name)
        try:
            arrays = load_npz_bytes(data, where)
        except (ValueError, OSError, EOFError) as exc:
            raise DatasetError(f"{where}: not a readable npz without pickles ({exc})") from None
        try:
            batch = BATCH_TYPES[self.manifest.kind].from_arrays(arrays, where)
        except BatchError as exc:
            raise DatasetError(str(exc)) from None
        self._check_ranges(batch, where)
        if cache:
            with self._lock:
                self._cache[name] = batch
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return batch

    def _fetch(self, name: str) -> bytes:
        """The bytes of file `name`, checked against the manifest's checksum on the first read."""
        where = self._where(name)
        try:
            data = self.fs.cat_file(posixpath.join(self.root, name))
        except FileNotFoundError:
            raise DatasetError(f"{where}: not found") from None
        except OSError as exc:
            raise DatasetError(f"{where}: cannot read ({exc})") from None
        if name not in self._verified:
            digest = sha256(data)
            if digest != self.manifest.checksums.get(name):
                raise DatasetError(f"{where}: sha256 {digest[:12]}... does not match the manifest (corrupt or replaced file)")
            with self._lock:
                self._verified.add(name)
        return data

    def verify_in_background(self) -> Callable[[], None]:
        """Start checking every file of the data set against its checksum on a thread of its own (reading and
        hashing release the GIL, so it runs beside the workers' start); the function returned waits for it and
        raises the DatasetError it found. A corrupt batch is then found before the first step, not when first read."""
        found: list[DatasetError] = []

        def check() -> None:
            try:
                for name in self.manifest.checksums:
                    self._fetch(name)
            except DatasetError as exc:
                found.append(exc)

        thread = threading.Thread(target=check, name="mlless-verify-batches", daemon=True)
        thread.start()

        def wait() -> None:
            thread.join()
            if found:
                raise found[0]

        return wait

    def _check_ranges(self, batch: Batch, where: str) -> None:
        m = self.manifest
        if isinstance(batch, ImageBatch):
            shape = (m.channels, m.height, m.width)
            if batch.images.shape[1:] != shape:
                raise DatasetError(f"{where}: images of shape {batch.images.shape[1:]}, the manifest says {shape} "
                                   f"(channels, height, width)")
            if (batch.labels.dtype == np.float32) != (self.labels == "real"):
                raise DatasetError(f"{where}: labels of {batch.labels.dtype}, and the manifest's source says "
                                   f"{self.labels} labels (" + ("float32" if self.labels == "real" else "int32") + ")")
            if m.n_classes is not None and len(batch) and int(batch.labels.max()) >= m.n_classes:
                raise DatasetError(f"{where}: class id {int(batch.labels.max())} >= n_classes {m.n_classes}")
        elif isinstance(batch, RatingsBatch):
            if len(batch):
                assert m.n_users is not None and m.n_items is not None
                if int(batch.users.max()) >= m.n_users:
                    raise DatasetError(f"{where}: user id {int(batch.users.max())} >= n_users {m.n_users}")
                if int(batch.items.max()) >= m.n_items:
                    raise DatasetError(f"{where}: item id {int(batch.items.max())} >= n_items {m.n_items}")
        else:
            assert m.n_features is not None
            if len(batch.indices) and int(batch.indices.max()) >= m.n_features:
                raise DatasetError(f"{where}: feature index {int(batch.indices.max())} >= n_features {m.n_features}")
            if self.labels == "binary" and not np.all((batch.labels == 0) | (batch.labels == 1)):
                raise DatasetError(f"{where}: labels must be 0 or 1 (the manifest's source says binary labels)")
