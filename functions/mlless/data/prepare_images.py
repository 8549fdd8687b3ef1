"""`mlless prepare` for images: an `ImageSet` (`mlless.data.images`) written as shuffled `ImageBatch` files.

The split is the other kinds' (`held_out`: a seeded hash of each image's position in the input, or the input's
own validation images, `ImageSet.given_validation`, capped by `max_validation_rows` alike), the training
images are shuffled by a seeded permutation and cut into batches of `batch_size`, and the manifest records the
image shape, the classes (or of real labels, the training targets' mean and standard deviation, which a regression
network scales its output by) and each channel's pixel mean and standard deviation over the training images, which a
network normalises its input by. The set is in memory already, so there is no spilling to disk.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np

from mlless.data.batches import ImageBatch
from mlless.data.images import REAL, ImageSet
from mlless.data.manifest import FORMAT_VERSION, MANIFEST_NAME, VALIDATION_NAME, Manifest, batch_name
from mlless.data.npz import npz_bytes
from mlless.data.output import OutputDir
from mlless.data.prepare import PrepareOptions, held_out
from mlless.data.errors import PrepareError
from mlless.progress import Progress

#: Images a batch unless `--batch-size` says otherwise: a network takes a step on each batch, and such steps
#: are commonly taken on tens to hundreds of images.
DEFAULT_IMAGE_BATCH_SIZE = 64
_SHUFFLE_SALT = 0x494D4147
#: Images summed at a time for the pixel statistics (as int64, 8 bytes a pixel).
_STATS_ROWS = 4096


def prepare_images(data: ImageSet, out: str, options: PrepareOptions,
                   log: Callable[[str], None] | None = None) -> Manifest:
    """Split, shuffle and write `data` under `out` (a path or fsspec URL); the manifest is written last."""
    options.check()
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True) if options.progress else None)
    progress = Progress("prepare", options.progress)
    where = str(data.description.get("path") or data.description.get("sample"))
    is_val = split(data, options)
    train = np.flatnonzero(~is_val)
    if not len(train):
        raise PrepareError(f"no training images in {where} (all {len(data)} went to validation)")
    mean, std = channel_moments(data.images, train)
    if not np.all(std > 0):
        c = int(np.flatnonzero(std == 0)[0])
        raise PrepareError(f"{where}: every training pixel of channel {c} is {mean[c]:g}: no image differs from another")
    real = data.label_kind == REAL
    label_stats: dict[str, Any]
    if real:
        targets = data.labels[train].astype(np.float64)
        label_stats = {"label_mean": float(targets.mean()), "label_std": float(targets.std())}
        labels = f"real targets of mean {label_stats['label_mean']:g} and deviation {label_stats['label_std']:g}"
        if not label_stats["label_std"] > 0:
            raise PrepareError(f"{where}: every training target is {label_stats['label_mean']:g}: there is nothing to "
                               "learn")
    else:
        labels = f"{len(data.label_values)} classes"
        # As a sparse set of classes records them (`mlless.data.classes`), so `Dataset.label_set` names them alike.
        label_stats = {"label_classes": list(range(len(data.label_values))), "label_values": data.label_values}

    output = OutputDir(out)
    output.clear_stale()
    order = train[np.random.default_rng([options.seed, _SHUFFLE_SALT]).permutation(len(train))]
    B = options.batch_size
    n_batches = -(-len(order) // B)
    for i in range(n_batches):
        rows = order[i * B: (i + 1) * B]
        output.put(batch_name(i), npz_bytes(ImageBatch(data.images[rows], data.labels[rows]).arrays()))
        progress.update((i + 1) * B if i + 1 < n_batches else len(order), "write")
    validation = np.flatnonzero(is_val)
    output.put(VALIDATION_NAME, npz_bytes(ImageBatch(data.images[validation], data.labels[validation]).arrays()))

    _, channels, height, width = data.images.shape
    manifest = Manifest(
        format_version=FORMAT_VERSION, kind=ImageBatch.kind, source=data.description, seed=options.seed,
        batch_size=B, n_batches=n_batches, n_train=len(train), n_validation=len(validation),
        validation_fraction=options.validation_fraction, n_validation_dropped=data.dropped_validation,
        n_users=None, n_items=None, mean_rating=None, rating_min=None, rating_max=None, n_features=None, hash_bits=None,
        feature_stats=label_stats, skipped_lines=0, skipped_examples=[], checksums=dict(sorted(output.checksums.items())),
        channels=channels, height=height, width=width, n_classes=None if real else len(data.label_values),
        pixel_mean=[float(m) for m in mean], pixel_std=[float(s) for s in std],
    )
    output.put(MANIFEST_NAME, manifest.to_json().encode(), checksum=False)
    log(f"prepared {where} -> {out}: {len(train):,} training images of {channels}×{height}×{width} in {n_batches:,} "
        f"batches of {B:,}, {len(validation):,} validation images"
        + (f" ({data.dropped_validation:,} dropped: a class the training images lack)" if data.dropped_validation
           else "") + f", {labels}; total {progress.elapsed():.1f} s")
    return manifest


def split(data: ImageSet, options: PrepareOptions) -> np.ndarray:
    """Which images validate: a seeded fraction, or the input's own validation images, at most
    `max_validation_rows` either way (the rest train, as with the other kinds)."""
    positions = np.arange(len(data), dtype=np.int64)
    if data.given_validation is None:
        return held_out(positions, options)
    first = len(data) - data.given_validation
    is_val = np.zeros(len(data), bool)
    is_val[first:] = held_out(positions[first:], options, to_validation=True)
    return is_val


def channel_moments(images: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each channel's pixel mean and standard deviation over `images[rows]`, from exact integer sums."""
    channels = images.shape[1]
    sums = np.zeros(channels, np.int64)
    squares = np.zeros(channels, np.int64)
    for start in range(0, len(rows), _STATS_ROWS):
        block = images[rows[start: start + _STATS_ROWS]].astype(np.int64)
        sums += block.sum(axis=(0, 2, 3))
        squares += (block * block).sum(axis=(0, 2, 3))
    n = len(rows) * images.shape[2] * images.shape[3]
    # Python integers: n * squares - sums**2 is exact, so a channel of one value has a deviation of exactly 0.
    mean = np.array([int(s) / n for s in sums])
    var = np.array([(n * int(q) - int(s) ** 2) / n**2 for s, q in zip(sums, squares)])
    return mean, np.sqrt(var)
