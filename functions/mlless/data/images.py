"""Image inputs of `mlless prepare` (`--format npz`, `--sample digits`; the other formats' readers are in
`mlless.data.image_formats`), read into one checked `ImageSet`.

Pixels become uint8, channels first, as `ImageBatch` holds them: uint8 or any integers in [0, 255] as they are,
floats in [0, 1] scaled by 255 and rounded. Floats are not read on the 0-255 scale as well, since a set whose
largest value is below 1 would then be ambiguous. Labels become classes 0 … K − 1 in the sorted order of the
input's labels (integers, or words), which the manifest lists (`feature_stats.label_values`), as
`--labels classes` numbers a CSV's (`mlless.data.classes`). A validation input (`--validation`) is numbered by the
training input's classes; its images of a label the training input lacks are dropped and counted, as a ratings
validation split's unseen users are. With `--labels real` (`REAL`) a label is a number to regress on instead, kept
as float32, as `--labels real` keeps a CSV's: any finite number, none dropped.
An image input is read whole into memory: CIFAR-10's 50,000 32×32 colour images are 150 MB as uint8.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np

from mlless.data.manifest import IMAGE_LABEL_KINDS, MAX_CHANNELS, MAX_CLASSES, MAX_IMAGE_SIDE, MAX_PIXEL
from mlless.data.npz import load_npz_bytes
from mlless.data.errors import PrepareError

#: Channel counts of ordinary images (gray, gray and alpha, RGB, RGBA): an array whose second axis is one of these
#: and whose last is not is taken for channels-first and refused, not read as images of many channels.
_COMMON_CHANNELS = (1, 2, 3, 4)
#: An image set's label kinds (`IMAGE_LABEL_KINDS`): classes, or real numbers to regress on.
CLASSES, REAL = IMAGE_LABEL_KINDS


@dataclass(frozen=True)
class ImageSet:
    """Labelled images ready to split and batch; `description` is the manifest's `source`."""

    images: np.ndarray  # uint8, (rows, channels, height, width)
    labels: np.ndarray  # int32 classes 0 … K − 1, or float32 real targets (`REAL`)
    label_values: list[int | str]  # the input's label of each class, in class order; none for real targets
    description: dict[str, Any]
    #: The last this many images are the input's own validation split (`--validation`); None: none is given, and
    #: `prepare_images` holds out a seeded fraction.
    given_validation: int | None = None
    #: Images of the given validation split left out: their label is none of the training images'.
    dropped_validation: int = 0

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def label_kind(self) -> str:
        """`CLASSES` or `REAL`, as the manifest's `source.labels` records it."""
        return REAL if self.labels.dtype.kind == "f" else CLASSES


Labelled = tuple[np.ndarray, np.ndarray, str]
"""Images, their labels, and where they were read (for messages), as `image_set` takes a validation input."""


def image_set(x: np.ndarray, y: np.ndarray, description: dict[str, Any], where: str,
              validation: Labelled | None = None, channels_first: bool = False, labels: str = CLASSES) -> ImageSet:
    """`x` of shape (rows, height, width), grayscale, or (rows, height, width, channels) (with `channels_first`,
    (rows, channels, height, width)), and one label a row in `y`, checked and converted, read as `labels` (one of
    `IMAGE_LABEL_KINDS`, which the description records); with `validation`, images of the same shape and their labels
    that are the validation split. PrepareError naming `where` (or the validation input's) and the problem otherwise."""
    if labels not in IMAGE_LABEL_KINDS:
        raise PrepareError(f"{where}: images take labels {' or '.join(IMAGE_LABEL_KINDS)}, not {labels!r}")
    description = {**description, "labels": labels}
    images = _images(x, where, channels_first)
    held = None
    if validation is not None:
        vx, vy, vwhere = validation
        held = _images(vx, vwhere, channels_first)
        if held.shape[1:] != images.shape[1:]:
            raise PrepareError(f"{vwhere}: images of {_shape(held)}, and the training images of {where} are "
                               f"{_shape(images)}")
    if labels == REAL:
        targets = _targets(y, len(images), where)
        if held is None:
            return ImageSet(images, targets, [], description)
        return ImageSet(np.concatenate([images, held]), np.concatenate([targets, _targets(vy, len(held), vwhere)]),
                        [], description, given_validation=len(held))
    train_y = _label_array(y, len(images), where)
    classes, values = _classes(train_y, where)
    if held is None:
        return ImageSet(images, classes, values, description)
    held_y = _label_array(vy, len(held), vwhere)
    if (held_y.dtype.kind == "U") != (train_y.dtype.kind == "U"):
        raise PrepareError(f"{vwhere}: its labels are {'words' if held_y.dtype.kind == 'U' else 'numbers'}, and "
                           f"those of {where} are not")
    known = np.unique(train_y)  # the classes, in order
    at = np.minimum(np.searchsorted(known, held_y), len(known) - 1)
    seen = known[at] == held_y
    return ImageSet(np.concatenate([images, held[seen]]), np.concatenate([classes, at[seen].astype(np.int32)]),
                    values, description, given_validation=int(seen.sum()), dropped_validation=int((~seen).sum()))


def _shape(images: np.ndarray) -> str:
    return "×".join(map(str, images.shape[1:]))


def _images(x: np.ndarray, where: str, channels_first: bool) -> np.ndarray:
    """`x` as uint8 (rows, channels, height, width), checked."""
    if x.ndim not in (3, 4):
        raise PrepareError(f"{where}: X must have shape (n, height, width) or (n, height, width, channels), got {x.shape}")
    if not channels_first and x.ndim == 4 and x.shape[1] in _COMMON_CHANNELS and x.shape[3] not in _COMMON_CHANNELS:
        raise PrepareError(f"{where}: X of shape {x.shape} looks channels-first; give it channels-last, "
                           f"(n, height, width, channels)")
    images = x[:, None] if x.ndim == 3 else x if channels_first else x.transpose(0, 3, 1, 2)
    rows, channels, height, width = images.shape
    if rows == 0:
        raise PrepareError(f"{where}: X holds no images")
    if not (1 <= channels <= MAX_CHANNELS and 1 <= height <= MAX_IMAGE_SIDE and 1 <= width <= MAX_IMAGE_SIDE):
        raise PrepareError(f"{where}: images of {channels} channels of {height}×{width} are beyond the bounds "
                           f"({MAX_CHANNELS} channels, sides of {MAX_IMAGE_SIDE})")
    return np.ascontiguousarray(_pixels(images, where))


def _pixels(images: np.ndarray, where: str) -> np.ndarray:
    if images.dtype == np.uint8:
        return images
    if images.dtype.kind in "iu":
        low, high = int(images.min()), int(images.max())
        if low < 0 or high > MAX_PIXEL:
            raise PrepareError(f"{where}: integer pixels must be in [0, {MAX_PIXEL}], got values in [{low}, {high}]")
        return images.astype(np.uint8)
    if images.dtype.kind == "f":
        if not np.all(np.isfinite(images)):
            raise PrepareError(f"{where}: X holds a pixel that is not a finite number")
        low, high = float(images.min()), float(images.max())
        if low < 0 or high > 1:
            raise PrepareError(f"{where}: float pixels must be in [0, 1], got values in [{low:g}, {high:g}] "
                               f"(pixels on the 0-{MAX_PIXEL} scale: give X as uint8)")
        return np.rint(images * MAX_PIXEL).astype(np.uint8)
    raise PrepareError(f"{where}: X must be uint8, integers in [0, {MAX_PIXEL}] or floats in [0, 1], got {images.dtype}")


def _label_array(y: np.ndarray, rows: int, where: str) -> np.ndarray:
    """`y` as integers or words, one a row; PrepareError otherwise."""
    _one_a_row(y, rows, where)
    if y.dtype.kind == "b":
        return y.astype(np.int64)
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y) & (y == np.round(y))):
            raise PrepareError(f"{where}: y must hold class labels, integers or words; it holds a fractional number "
                               "(real targets to regress on: --labels real)")
        return y.astype(np.int64)
    if y.dtype.kind == "S":
        return np.char.decode(y, "utf-8", "replace")
    if y.dtype.kind not in "iuU":
        raise PrepareError(f"{where}: y must hold class labels, integers or words, got {y.dtype}")
    return y


def _one_a_row(y: np.ndarray, rows: int, where: str) -> None:
    if y.shape != (rows,):
        raise PrepareError(f"{where}: y must hold one label per image, shape ({rows},), got {y.shape}")


def _targets(y: np.ndarray, rows: int, where: str) -> np.ndarray:
    """`y` as float32 real targets, one a row: numbers, each finite (as float32 too); PrepareError otherwise."""
    _one_a_row(y, rows, where)
    if y.dtype.kind not in "iuf":
        raise PrepareError(f"{where}: y must hold real targets, numbers, got {y.dtype} (class labels: --labels "
                           f"{CLASSES})")
    with np.errstate(over="ignore"):  # a number beyond float32's range becomes inf, refused below
        targets = y.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(targets))
    if len(bad):
        raise PrepareError(f"{where}: y[{int(bad[0])}] is {float(y[bad[0]])}, not a finite float32 number; every "
                           f"target must be one ({len(bad):,} are not)")
    return targets


def _classes(y: np.ndarray, where: str) -> tuple[np.ndarray, list[int | str]]:
    """Each label's class, and the labels in class order."""
    values, labels = np.unique(y, return_inverse=True)
    if not 2 <= len(values) <= MAX_CLASSES:
        raise PrepareError(f"{where}: y holds {len(values)} distinct labels; a set of classes has 2 to {MAX_CLASSES}")
    return labels.reshape(-1).astype(np.int32), values.tolist()  # JSON's types


def read_bytes(path: str) -> bytes:
    """The whole file at `path` (a local path or fsspec URL); PrepareError naming it if it cannot be read."""
    try:
        fs, local = fsspec.core.url_to_fs(path)
        return fs.cat_file(local)
    except FileNotFoundError:
        raise PrepareError(f"input file not found: {path}") from None
    except IsADirectoryError:
        raise PrepareError(f"{path}: a directory, not a file") from None
    except (OSError, ValueError) as exc:
        raise PrepareError(f"{path}: cannot read ({exc})") from None


def npz_images(path: str) -> Labelled:
    """The arrays `X` and `y` of an npz file (`image_set` says what they may hold)."""
    data = read_bytes(path)
    try:
        arrays = load_npz_bytes(data, path)
    except ValueError as exc:
        raise PrepareError(f"{path}: not a readable npz without pickles ({exc})") from None
    missing = [name for name in ("X", "y") if name not in arrays]
    if missing:
        raise PrepareError(f"{path}: no array {' or '.join(map(repr, missing))}; --format npz reads X (the images) "
                           f"and y (their labels), it holds {', '.join(sorted(arrays)) or 'none'}")
    return arrays["X"], arrays["y"], path
