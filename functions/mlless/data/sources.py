"""The inputs `mlless prepare` reads, each a `Source`: a MovieLens, Criteo, LIBSVM or CSV file, a bundled sample, or
synthetic ratings, clicks, Higgs-like rows or Gaussian blobs (`mlless.data.synthetic`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from mlless.data.chunks import RatingsChunk, SparseChunk
from mlless.data.classes import ClassLabels
from mlless.data.csvfile import CsvLayout, CsvOptions, read_csv
from mlless.data.formats import (
    CRITEO_INT_COLUMNS, LibsvmOptions, read_criteo, read_libsvm, read_movielens, within_rating_range,
)
from mlless.data.sample import SAMPLES, Sample
from mlless.data.synthetic import (
    CLICK_TASKS, HIGGS_FEATURES, BlobsParams, HiggsParams, LrParams, PmfParams, generate_blobs, generate_higgs,
    generate_lr, generate_pmf,
)
from mlless.data.text import ErrorLog


class PrepareError(ValueError):
    """Preparation cannot proceed (bad option, bad input); the message says why."""


@dataclass
class Source:
    """What pass 1 consumes: chunks plus facts about the feature space."""

    kind: str  # "ratings" | "sparse"
    description: dict[str, Any]
    chunks: Callable[[ErrorLog], Iterable[RatingsChunk | SparseChunk]]
    estimated_bytes: int
    integer_columns: int = 0  # leading feature indices that are raw integers to transform
    n_features: int | None = None  # fixed feature space; None = max index + 1 ("keep")
    hash_bits: int | None = None
    #: With class labels: their numbering, which the chunks' labels are (`mlless.data.classes`).
    classes: ClassLabels | None = None


def _file_size(path: str) -> int:
    try:
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        size = int(fs.size(p) or 0)
    except Exception:  # noqa: BLE001 - size is only an estimate for bucket count
        return 1 << 30
    return size * 5 if path.endswith((".gz", ".bz2", ".xz", ".zst")) else size


def movielens_source(path: str, rating_range: tuple[float, float] | None = None) -> Source:
    description: dict[str, Any] = {"format": "movielens", "path": path}
    if rating_range is not None:
        description["rating_range"] = list(rating_range)

    def found(bounds: tuple[float, float]) -> None:
        description["rating_range"] = list(bounds)

    # 20 spilled bytes per rating vs ~25 text bytes per line.
    return Source("ratings", description,
                  lambda e: within_rating_range(read_movielens(path, e), path, e, rating_range, found), _file_size(path))


def criteo_source(path: str, hash_bits: int) -> Source:
    # ~300 spilled bytes per row vs ~250 text bytes per line.
    return Source(
        "sparse",
        {"format": "criteo", "path": path},
        lambda e: read_criteo(path, e, hash_bits),
        int(_file_size(path) * 1.3),
        integer_columns=CRITEO_INT_COLUMNS,
        n_features=1 << hash_bits,
        hash_bits=hash_bits,
    )


def libsvm_source(path: str, options: LibsvmOptions) -> Source:
    hashed = options.indices == "hash"
    return Source(
        "sparse",
        {"format": "libsvm", "path": path, "index_base": options.base, "indices": options.indices,
         "labels": options.labels},
        lambda e: read_libsvm(path, e, options),
        _file_size(path) * 2,
        n_features=(1 << options.hash_bits) if hashed else None,
        hash_bits=options.hash_bits if hashed else None,
        classes=options.classes,
    )


def csv_source(path: str, options: CsvOptions, layout: CsvLayout) -> Source:
    hashed = bool(layout.categorical)
    return Source("sparse", {"format": "csv", "path": path, "labels": options.labels, **layout.describe()},
                  lambda e: read_csv(path, e, options, layout), _file_size(path) * 2, n_features=layout.n_features,
                  hash_bits=options.hash_bits if hashed else None, classes=options.classes)


def sample_source(name: str) -> Source:
    if name not in SAMPLES:
        raise PrepareError(f"unknown sample {name!r}; available: {', '.join(SAMPLES)}")
    sample = SAMPLES[name]
    if not isinstance(sample, Sample):
        raise PrepareError(f"the {name} sample is of images, which `mlless.data.prepare_images` prepares")
    return Source("ratings", {"sample": name, "via": sample.via}, lambda e: sample.load(), 2 << 20)


def synthetic_pmf_source(params: PmfParams, seed: int) -> Source:
    return Source("ratings", params.describe(), lambda e: generate_pmf(params, seed), params.rows * 20)


def synthetic_lr_source(params: LrParams, seed: int) -> Source:
    classes = ClassLabels() if CLICK_TASKS[params.task] == "classes" else None

    def chunks(e: ErrorLog) -> Iterable[SparseChunk]:
        for chunk in generate_lr(params, seed):
            if classes is not None:  # numbered as a file's classes are
                chunk.labels = classes.number(chunk.labels, f"synthetic {params.task}")
            yield chunk

    return Source(
        "sparse",
        params.describe(),
        chunks,
        params.rows * 300,
        integer_columns=CRITEO_INT_COLUMNS,
        n_features=1 << params.hash_bits,
        hash_bits=params.hash_bits,
        classes=classes,
    )


def synthetic_higgs_source(params: HiggsParams, seed: int) -> Source:
    return Source("sparse", params.describe(), lambda e: generate_higgs(params, seed), params.rows * HIGGS_FEATURES * 8,
                  n_features=HIGGS_FEATURES)


def synthetic_blobs_source(params: BlobsParams, seed: int) -> Source:
    return Source("sparse", params.describe(), lambda e: generate_blobs(params, seed),
                  params.rows * params.features * 8, n_features=params.features)
