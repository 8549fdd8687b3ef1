"""Models: PMF and sparse logistic regression over one flat float32 replica each.

`build_model` creates a fresh (seeded, hence identical on every worker) replica;
`load_model` restores one written by `Model.save`.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from mlless.training.models.base import FORMAT_VERSION, MODEL_KINDS, Model, ModelConfig, ModelFileError, read_model_file
from mlless.training.models.logreg import LogisticRegression
from mlless.training.models.pmf import PMF

__all__ = ["Model", "ModelConfig", "ModelFileError", "PMF", "LogisticRegression", "build_model", "load_model",
           "MODEL_KINDS", "FORMAT_VERSION"]


def _dim(dims: Mapping[str, Any], key: str, kind: str) -> Any:
    if key not in dims:
        raise ValueError(f"{kind} needs dims[{key!r}]; got {sorted(dims)}")
    return dims[key]


def build_model(kind: str, dims: Mapping[str, Any], config: ModelConfig | None = None, seed: int = 0) -> Model:
    """Create a model of ``kind`` ("pmf" | "logistic-regression").

    dims: PMF needs ``n_users``, ``n_items``, ``mean_rating`` (optional
    ``rating_min``/``rating_max`` for clipping predictions, ``n_ratings`` for
    the default L2); LR needs ``n_features``.
    """
    if config is not None and config.type != kind:
        raise ValueError(f"config is for {config.type!r}, model kind is {kind!r}")
    if kind == "pmf":
        return PMF(int(_dim(dims, "n_users", kind)), int(_dim(dims, "n_items", kind)),
                   float(_dim(dims, "mean_rating", kind)), config, seed,
                   rating_min=dims.get("rating_min"), rating_max=dims.get("rating_max"), n_ratings=dims.get("n_ratings"))
    if kind == "logistic-regression":
        return LogisticRegression(int(_dim(dims, "n_features", kind)), config, seed)
    raise ValueError(f"unknown model kind {kind!r}; expected one of {MODEL_KINDS}")


def load_model(path: str | os.PathLike[str]) -> Model:
    """Load a model saved by `Model.save`; raises `ModelFileError` naming the file if malformed."""
    name = os.fspath(path)
    params, meta = read_model_file(name)
    try:
        config = ModelConfig(meta["kind"], rank=int(meta.get("rank", 20)), l2=meta.get("l2"))
        model = build_model(meta["kind"], meta["dims"], config)
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelFileError(f"{name}: invalid model metadata ({exc})") from exc
    if params.shape != model.params.shape:
        raise ModelFileError(f"{name}: params have {params.shape[0]} values, "
                             f"metadata describes a model of {model.size}")
    model.set_params(params)
    return model
