"""Where a job's replicas start: from its seed, or from an earlier job's model (`spec.model.initFrom`, a warm start).

Every worker builds its replica and the supervisor its evaluation model with `initial_model`, so they all start
from the same parameters, as they do from the same seed. The file is read through fsspec like the dataset (a path,
or a URL such as s3://), and may be named by its directory (an earlier job's `output.uri` or run directory, which
hold model.npz). It must describe a model of the job's type and shape: anything else is refused with one line
naming the field, before any worker starts (the supervisor builds its model first).
"""
from __future__ import annotations

import io
import posixpath

import fsspec

from mlless.data.dataset import Dataset
from mlless.spec import SpecError, TrainingJob
from mlless.training.models import Model, ModelFileError, build_model, load_model

#: The model file a run directory and an output.uri hold (`Evaluation.final_model`).
MODEL_FILE = "model.npz"
FIELD = "spec.model.initFrom"


class WarmStartError(SpecError):
    """`spec.model.initFrom` names no usable model for the job; the message names the field."""


def read_start(uri: str) -> Model:
    """The model at `uri`: a model.npz, or a directory holding one."""
    try:
        fs, path = fsspec.core.url_to_fs(uri)
        if fs.isdir(path):
            path = posixpath.join(path.rstrip("/"), MODEL_FILE)
        data = fs.cat_file(path)
    except FileNotFoundError:
        raise WarmStartError(f"{FIELD}: {uri}: no model file there") from None
    except (OSError, ValueError, ImportError) as exc:
        raise WarmStartError(f"{FIELD}: {uri}: cannot read ({exc})") from None
    try:
        return load_model(io.BytesIO(data), name=uri)
    except ModelFileError as exc:
        raise WarmStartError(f"{FIELD}: {exc}") from None


def initial_model(job: TrainingJob, dataset: Dataset) -> Model:
    """The model a replica of `job` on `dataset` starts from: seeded (and initialised from the data, as k-means's
    centroids are: `Model.initialise`), or `spec.model.initFrom`'s.

    A warm start keeps the file's model whole, the statistics among its dimensions too (PMF's mean rating, which
    the new ratings may shift): its predictions are the earlier job's. Its counted dimensions (users, items,
    features, classes) and its parameter count must be the job's."""
    if job.model.init_from is None:
        return build_model(job.model.type, dataset.dims(), job.model, job.seed, dataset)
    model = build_model(job.model.type, dataset.dims(), job.model, job.seed)
    start = read_start(job.model.init_from)
    if start.kind != model.kind:
        raise WarmStartError(f"{FIELD}: {job.model.init_from} holds a {start.kind} model, the job trains "
                             f"{model.kind}")
    counted = [k for k, v in model.dims().items() if not isinstance(v, float)]
    theirs = {k: start.dims().get(k) for k in counted} | {"parameters": start.size}
    ours = {k: model.dims()[k] for k in counted} | {"parameters": model.size}
    if theirs != ours:
        raise WarmStartError(f"{FIELD}: {job.model.init_from} has dimensions {theirs}, the job's dataset and model "
                             f"need {ours}")
    model = build_model(job.model.type, start.dims(), job.model, job.seed)
    model.set_params(start.params)
    return model


def started_from(job: TrainingJob) -> str:
    """Where `job` started, for summary.json: the model it was warm-started from, or its seed."""
    return job.model.init_from or f"seed {job.seed}"
