"""Models on one flat float32 replica each: one module per family, each model a `Model` subclass registered with
`base.register` under its type (`base.MODELS`), a plugin's too once `mlless.plugins` imported it.

Importing the package registers the built-ins. `build_model` creates a fresh (seeded, hence identical on every
worker) replica; `load_model` restores one written by `Model.save`.
"""
from __future__ import annotations

import os
from typing import Any, BinaryIO, Mapping

from mlless.plugins import load_plugins
from mlless.spec.config import ModelConfig
from mlless.spec.models import model_type
# network imports torch only when a network is built
from mlless.training.models import kmeans, linear, network, pmf, softmax  # noqa: F401  the built-ins register on import
from mlless.training.models.base import MODELS, Model, ModelFileError, TrainingData, read_model_file, register

__all__ = ["Model", "ModelFileError", "build_model", "load_model", "model_class", "register"]


def model_class(kind: str) -> type[Model]:
    """The registered model of type ``kind`` (a plugin's too: `mlless.plugins`)."""
    load_plugins()
    return MODELS.named(kind)


def build_model(kind: str, dims: Mapping[str, Any], config: ModelConfig | None = None, seed: int = 0,
                data: TrainingData | None = None) -> Model:
    """Create a model of type ``kind`` for a dataset of dimensions ``dims`` (`Dataset.dims()`); with its training
    ``data``, the replica a job starts from (`Model.initialise`)."""
    if config is not None and config.type != kind:
        raise ValueError(f"config is for {config.type!r}, model kind is {kind!r}")
    model = model_class(kind).from_dims(dims, config, seed)
    if data is not None:
        model.initialise(data, seed)
    return model


def load_model(path: str | os.PathLike[str] | BinaryIO, name: str | None = None) -> Model:
    """Load a model saved by `Model.save` from a file, or from a binary file object called `name` in messages;
    raises `ModelFileError` naming the file if malformed."""
    load_plugins()  # the file may hold a model type a plugin registers
    name = name or os.fspath(path)  # type: ignore[arg-type]
    params, meta = read_model_file(path, name)
    try:
        kind = model_type(meta["kind"])
        config = ModelConfig(kind.name, meta.get("l2"), options={k: meta[k] for k in kind.fields if k in meta})
        # Every user, item, feature, factor and centroid has a parameter of its own: sizes beyond the file's
        # parameter count are refused before the model they describe is allocated (a few bytes could ask for
        # terabytes).
        sizes = {k: v for k, v in {**config.options, **dict(meta["dims"])}.items() if isinstance(v, int)}
        for key, value in sizes.items():
            if value > params.shape[0]:
                raise ValueError(f"{key} {value} is more than the file's {params.shape[0]} parameters")
        model = build_model(meta["kind"], meta["dims"], config)
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelFileError(f"{name}: invalid model metadata ({exc})") from exc
    if params.shape != model.params.shape:
        raise ModelFileError(f"{name}: params have {params.shape[0]} values, "
                             f"metadata describes a model of {model.size}")
    model.set_params(params)
    return model
