"""Augmenting training images (`spec.model.augment`): a random crop with zero padding and a horizontal flip.

The usual CIFAR recipe (pad 4, crop back to 32 × 32, flip half the images), applied by a worker to each training
batch it takes (runtime/worker.py), on the uint8 pixels before the network normalises them; the validation split
and every evaluation see the images as prepared. Each step draws from a generator seeded by the job's seed, the
worker's rank and the step, so a run reproduces, and a worker that resumes from a checkpoint draws as it would have.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlless.data.batches import Batch, ImageBatch

#: Keeps the augmentation's draws apart from every other stream seeded by the job's seed.
_SALT = 0x41554747


@dataclass(frozen=True)
class Augment:
    """`crop`: pixels of zero padding on each side, then a random crop of the image's size (0: none); `flip`: mirror
    each image left to right with probability 1/2."""

    crop: int = 0
    flip: bool = False

    def __post_init__(self) -> None:
        if self.crop < 0:
            raise ValueError(f"augment crop must be >= 0, got {self.crop}")

    def __bool__(self) -> bool:
        return self.crop > 0 or self.flip

    def step(self, batch: Batch, seed: int, rank: int, step: int) -> Batch:
        """`batch`, augmented as worker `rank` of a job seeded `seed` augments it at `step`."""
        if not self or not isinstance(batch, ImageBatch):
            return batch
        return self.apply(batch, np.random.default_rng([seed, _SALT, rank, step]))

    def apply(self, batch: ImageBatch, rng: np.random.Generator) -> ImageBatch:
        """A new batch of the images cropped and flipped by `rng`'s draws; `batch` is left as it is (it may be
        cached)."""
        images = batch.images
        rows, channels, height, width = images.shape
        p = self.crop
        padded = np.zeros((rows, channels, height + 2 * p, width + 2 * p), np.uint8)  # np.pad took 5 times as long
        padded[:, :, p:p + height, p:p + width] = images
        top, left = rng.integers(0, 2 * p + 1, size=(2, rows))
        mirrored = rng.random(rows) < 0.5 if self.flip else np.zeros(rows, bool)
        out = np.empty_like(images)
        # One slice an image: at 64 CIFAR images a batch, half the time of one gather through a window view.
        for i in range(rows):
            window = padded[i, :, top[i]:top[i] + height, left[i]:left[i] + width]
            out[i] = window[..., ::-1] if mirrored[i] else window
        return ImageBatch(out, batch.labels)
