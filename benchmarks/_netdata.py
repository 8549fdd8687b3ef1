"""The image sets the networks suite trains on: a CIFAR-shaped generator ("shapes") and scikit-learn's digits.

`generate` draws images of 10 classes, each class a glyph of its own: a random 4×4 field, smoothed and thresholded
at its median, blown up to half the image's side. An image is its class's glyph, mirrored left to right with
probability 1/2, at a uniformly random position, in a random foreground colour on a random background colour (their
brightness at least `contrast` apart), plus Gaussian pixel noise of `noise` (on the 0-1 scale). Colour and
position say nothing of the class; only the shape does, as in CIFAR a network has to learn position- and
colour-invariant shapes. The glyphs are fixed (`GLYPH_SEED`), so the training and validation parts, drawn with
different seeds, share the classes.

Why glyphs: a first version with class-dependent colours and grating orientations was learnt by the small `cnn`
but not by MobileNetV3-small, whose GroupNorm layers normalise a colour shift away; on the glyphs, MobileNetV3-small
with Adam at 0.001, batch 64 and one thread starts from chance (2.30) and passes a validation loss of 1.5 and 39 %
accuracy after about 200 steps, climbing on through the next epochs, much as it does on CIFAR-10.

`prepared_set` writes the parts as npz files (X: (n, H, W, 3) uint8, y: the class) and runs `mlless prepare
--format npz TRAIN --validation VALIDATION` into the suites' data directory, once.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import _common

#: The glyphs' seed: every set of one side has the same classes.
GLYPH_SEED = 12345
#: The glyphs' coarse field before it is blown up (cells per side).
GLYPH_CELLS = 4


@dataclass(frozen=True)
class ImageSet:
    """A generated set (`generate`'s parameters), or the digits sample when `sample` is set."""

    key: str
    title: str
    side: int = 32
    train: int = 0
    validation: int = 0
    batch: int = 64
    noise: float = 0.25
    contrast: float = 0.4
    sample: str | None = None


SETS = {
    "shapes32": ImageSet("shapes32", "glyphs 32×32×3, 10 classes, 12,800 training images", 32, 12_800, 1_000),
    "shapes32-b8": ImageSet("shapes32-b8", "glyphs 32×32×3, 512 training images in batches of 8 (exchange)", 32,
                            512, 64, batch=8),
    "digits": ImageSet("digits", "scikit-learn's digits, 8×8, 10 classes", sample="digits"),
}


def glyphs(classes: int, size: int, seed: int = GLYPH_SEED) -> np.ndarray:
    """(classes, size, size) 0/1 glyphs: a random coarse field, blown up, smoothed by a 3×3 mean, thresholded."""
    rng = np.random.default_rng(seed)
    cell = -(-size // GLYPH_CELLS)
    out = np.empty((classes, size, size), np.float32)
    for k in range(classes):
        big = np.kron(rng.standard_normal((GLYPH_CELLS, GLYPH_CELLS)), np.ones((cell, cell)))[:size, :size]
        padded = np.pad(big, 1, mode="edge")
        smooth = sum(padded[i:i + size, j:j + size] for i in range(3) for j in range(3)) / 9
        out[k] = smooth > np.median(smooth)
    return out


def generate(n: int, side: int = 32, classes: int = 10, seed: int = 0, noise: float = 0.25,
             contrast: float = 0.4) -> tuple[np.ndarray, np.ndarray]:
    """`n` images (n, side, side, 3) uint8 and their classes (n,) int64, as the module's docstring says."""
    if side < 4 or n < 1 or classes < 2:
        raise ValueError(f"need side >= 4, n >= 1 and classes >= 2, got side {side}, n {n}, classes {classes}")
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    size = side // 2
    shapes = glyphs(classes, size)
    fg, bg = rng.uniform(0, 1, (n, 3)), rng.uniform(0, 1, (n, 3))
    sign = np.where(fg.mean(1) >= bg.mean(1), 1.0, -1.0)[:, None]  # push the two apart by `contrast`
    fg, bg = np.clip(fg + sign * contrast / 2, 0, 1), np.clip(bg - sign * contrast / 2, 0, 1)
    masks = shapes[y]
    flip = rng.random(n) < 0.5
    masks[flip] = masks[flip][:, :, ::-1]
    ox, oy = rng.integers(0, side - size + 1, n), rng.integers(0, side - size + 1, n)
    canvas = np.zeros((n, side, side), np.float32)
    rows = oy[:, None] + np.arange(size)  # (n, size)
    cols = ox[:, None] + np.arange(size)
    canvas[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]] = masks
    images = (bg[:, None, None, :] + (fg - bg)[:, None, None, :] * canvas[..., None]).astype(np.float32)
    images += noise * rng.standard_normal(images.shape, dtype=np.float32)
    return np.clip(images * 255 + 0.5, 0, 255).astype(np.uint8), y.astype(np.int64)


def write_npz(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, X=images, y=labels)
    tmp.rename(path)
    return path


def prepared_set(data_dir: Path, key: str) -> Path:
    """Set `key` of `SETS` prepared under `data_dir` (generated and prepared once)."""
    s = SETS[key]
    out = data_dir / f"net-{key}"
    if s.sample:
        return _common.prepare(out, "--sample", s.sample, "--batch-size", str(s.batch))
    if (out / "manifest.json").exists():
        return out
    raw = data_dir / "net-raw"
    train = write_npz(raw / f"{key}-train.npz", *generate(s.train, s.side, seed=1, noise=s.noise, contrast=s.contrast))
    val = write_npz(raw / f"{key}-validation.npz",
                    *generate(s.validation, s.side, seed=2, noise=s.noise, contrast=s.contrast))
    return _common.prepare(out, "--format", "npz", str(train), "--validation", str(val), "--batch-size", str(s.batch))
