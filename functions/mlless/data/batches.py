"""The mini-batch shapes that flow from `mlless prepare` to the models: ratings, sparse rows, images.

Both are plain numpy arrays with fixed dtypes, so a batch can be written with
`np.savez` and read back with `allow_pickle=False`; `from_arrays` validates
what was read so a corrupt file is rejected by name instead of training on
garbage.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


class BatchError(ValueError):
    """A mini-batch file or array set does not have the expected layout."""


def _array(arrays: Mapping[str, np.ndarray], name: str, dtype: type, source: str) -> np.ndarray:
    if name not in arrays:
        raise BatchError(f"{source}: missing array '{name}'")
    arr = np.asarray(arrays[name])
    if arr.ndim != 1:
        raise BatchError(f"{source}: array '{name}' must be 1-D, got shape {arr.shape}")
    if arr.dtype != dtype:
        raise BatchError(f"{source}: array '{name}' must be {np.dtype(dtype)}, got {arr.dtype}")
    return np.ascontiguousarray(arr)


@dataclass(frozen=True)
class RatingsBatch:
    """(user, item, rating) triples for matrix factorisation; ids are re-indexed from 0."""

    users: np.ndarray  # int32
    items: np.ndarray  # int32
    ratings: np.ndarray  # float32

    kind = "ratings"

    def __len__(self) -> int:
        return int(self.ratings.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        return {"users": self.users, "items": self.items, "ratings": self.ratings}

    def head(self, n: int) -> RatingsBatch:
        """The first `n` rows (views, no copy)."""
        return RatingsBatch(self.users[:n], self.items[:n], self.ratings[:n])

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], source: str = "batch") -> RatingsBatch:
        users = _array(arrays, "users", np.int32, source)
        items = _array(arrays, "items", np.int32, source)
        ratings = _array(arrays, "ratings", np.float32, source)
        if not (len(users) == len(items) == len(ratings)):
            raise BatchError(f"{source}: users, items and ratings differ in length")
        if len(users) and (users.min() < 0 or items.min() < 0):
            raise BatchError(f"{source}: negative user or item id")
        if not np.all(np.isfinite(ratings)):
            raise BatchError(f"{source}: non-finite rating")
        return cls(users, items, ratings)


@dataclass(frozen=True)
class SparseBatch:
    """Labelled rows of a CSR matrix of hashed features, for logistic regression."""

    indptr: np.ndarray  # int64, len = rows + 1
    indices: np.ndarray  # int32 feature ids
    values: np.ndarray  # float32
    labels: np.ndarray  # float32: 0/1, or any finite numbers in a data set of real labels or classes (`Dataset.labels`)

    kind = "sparse"

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        return {"indptr": self.indptr, "indices": self.indices, "values": self.values, "labels": self.labels}

    def head(self, n: int) -> SparseBatch:
        """The first `n` rows (views, no copy)."""
        n = min(n, len(self))
        end = int(self.indptr[n])
        return SparseBatch(self.indptr[: n + 1], self.indices[:end], self.values[:end], self.labels[:n])

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], source: str = "batch") -> SparseBatch:
        indptr = _array(arrays, "indptr", np.int64, source)
        indices = _array(arrays, "indices", np.int32, source)
        values = _array(arrays, "values", np.float32, source)
        labels = _array(arrays, "labels", np.float32, source)
        if len(indptr) != len(labels) + 1 or indptr[0] != 0 or indptr[-1] != len(indices):
            raise BatchError(f"{source}: indptr does not describe {len(labels)} rows of {len(indices)} entries")
        if np.any(np.diff(indptr) < 0):
            raise BatchError(f"{source}: indptr is not non-decreasing")
        if len(indices) != len(values):
            raise BatchError(f"{source}: indices and values differ in length")
        if len(indices) and indices.min() < 0:
            raise BatchError(f"{source}: negative feature index")
        if not np.all(np.isfinite(values)):
            raise BatchError(f"{source}: non-finite feature value")
        if not np.all(np.isfinite(labels)):
            raise BatchError(f"{source}: non-finite label")
        return cls(indptr, indices, values, labels)


@dataclass(frozen=True)
class ImageBatch:
    """Labelled images for a network: uint8 pixels, channels first, and each image's class, or its real target in a
    data set of real labels (`Dataset.labels`)."""

    images: np.ndarray  # uint8, shape (rows, channels, height, width)
    labels: np.ndarray  # int32 class ids, 0 .. classes - 1; or float32 real targets, each finite

    kind = "images"

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def arrays(self) -> dict[str, np.ndarray]:
        return {"images": self.images, "labels": self.labels}

    def head(self, n: int) -> ImageBatch:
        """The first `n` rows (views, no copy)."""
        return ImageBatch(self.images[:n], self.labels[:n])

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], source: str = "batch") -> ImageBatch:
        if "images" not in arrays:
            raise BatchError(f"{source}: missing array 'images'")
        images = np.asarray(arrays["images"])
        if images.ndim != 4 or images.dtype != np.uint8:
            raise BatchError(f"{source}: array 'images' must be uint8 of shape (rows, channels, height, width), got "
                             f"{images.dtype} {images.shape}")
        real = "labels" in arrays and np.asarray(arrays["labels"]).dtype == np.float32
        if "labels" in arrays and not real and np.asarray(arrays["labels"]).dtype != np.int32:
            raise BatchError(f"{source}: array 'labels' must be int32 class ids or float32 real targets, got "
                             f"{np.asarray(arrays['labels']).dtype}")
        labels = _array(arrays, "labels", np.float32 if real else np.int32, source)
        if len(labels) != len(images):
            raise BatchError(f"{source}: images and labels differ in length")
        if real and not np.all(np.isfinite(labels)):
            raise BatchError(f"{source}: non-finite label")
        if not real and len(labels) and labels.min() < 0:
            raise BatchError(f"{source}: negative class id")
        return cls(np.ascontiguousarray(images), labels)


Batch = RatingsBatch | SparseBatch | ImageBatch

BATCH_TYPES: dict[str, type[RatingsBatch] | type[SparseBatch] | type[ImageBatch]] = {
    "ratings": RatingsBatch, "sparse": SparseBatch, "images": ImageBatch}
