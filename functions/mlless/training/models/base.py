"""The model contract shared by workers, the supervisor and checkpoints.

A replica is ONE contiguous float32 vector (`Model.params`); models expose
named numpy views into it.  The optimizer, the ISP significance filter and the
wire format all address parameters by flat int32 index into that vector, so a
remote update is applied with ``model.params[idx] += values``.  Never rebind
``params`` (that would detach the views); copy into it with `set_params`.
"""
from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from operator import attrgetter
from typing import Any, BinaryIO, ClassVar, Mapping, Protocol, TypeVar

import numpy as np

from mlless.data.batches import Batch
from mlless.spec.config import ModelConfig
from mlless.spec.models import MODEL_TYPES, ModelType
from mlless.spec.registry import Registry
from mlless.training.kernels import optim as _optim

FORMAT_VERSION = 1



class TrainingData(Protocol):
    """What a model may read of its training set to start from (`Model.initialise`): `mlless.data.dataset.Dataset`."""

    @property
    def n_batches(self) -> int: ...

    def batch(self, i: int) -> Batch: ...


class ModelFileError(ValueError):
    """A saved model file is unreadable or does not describe a valid model."""


class Model(ABC):
    """One replica: parameters in a flat float32 vector plus the maths over batches."""

    #: Its type as a TrainingJob sees it: a built-in's from `mlless.spec.models.model_type`, a plugin's its own.
    type: ClassVar[ModelType]
    #: Its type's name, how its loss is reported and the kind of data set (`mlless prepare`'s manifest "kind") it
    #: trains on: its type's, set by `register`.
    kind: ClassVar[str]
    loss_metric: ClassVar[str]
    dataset_kind: ClassVar[str]
    #: The dimensions (of `dims()`) that fix the length of the parameter vector.
    shape_dims: ClassVar[tuple[str, ...]]

    @classmethod
    @abstractmethod
    def from_dims(cls, dims: Mapping[str, Any], config: ModelConfig | None, seed: int) -> Model:
        """A fresh replica for a dataset of these dimensions (`Dataset.dims()`); raises ValueError naming a
        missing dimension."""

    def __init__(self, size: int) -> None:
        self.params = np.zeros(int(size), dtype=np.float32)
        self._marks: np.ndarray | None = None  # `apply_update`'s workspace, allocated on first use

    @property
    def size(self) -> int:
        return int(self.params.shape[0])

    def initialise(self, data: TrainingData, seed: int) -> None:
        """Start from the training data rather than from `from_dims`'s parameters alone (k-means's seeds): the same
        on every worker and the supervisor for one `seed`. Nothing by default."""

    def share_cores(self, workers: int) -> None:
        """Compute on this process's share of the machine's cores, `workers` replicas training on it at once, or on
        the cores its function was given (`mlless.contract.ENV_CPU_CORES`) (a network's torch threads); nothing by
        default."""

    @property
    def weight_decay(self) -> float:
        """Decoupled weight decay the optimizer should apply (0 when L2 lives in the loss)."""
        return 0.0

    def segments(self) -> np.ndarray:
        """The bounds [0, b_1, ..., size] of the model's parameter groups, each a slice of `params` (a network's
        parameter tensors): norm-isp's per-layer filter measures each on its own (training/norm_filter.py). One
        group, the whole vector, by default."""
        return np.array([0, self.size], np.int64)

    def apply_update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Add a peer's update (int32 indices, float32 values) to the replica, all or nothing.

        Raises ValueError naming the first index that is out of range or repeated.
        """
        if self._marks is None:
            self._marks = np.zeros(self.size, dtype=np.uint8)
        bad = _optim.scatter_add(self.params, indices, values, self._marks)
        if bad >= 0:
            raise ValueError(f"update index {int(indices[bad])} at position {bad} is out of range for "
                             f"{self.size} parameters or repeated")

    def set_params(self, values: np.ndarray) -> None:
        """Copy ``values`` into the replica (keeps the named views valid)."""
        values = np.asarray(values)
        if values.shape != self.params.shape:
            raise ValueError(f"params have shape {values.shape}, model expects {self.params.shape}")
        self.params[:] = values

    @abstractmethod
    def gradient(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, float, int]:
        """(idx int32 unique, grad float32, loss_sum, n): gradient of the batch's mean loss.

        Only touched parameters appear in ``idx``.  ``loss_sum`` is the sum of
        per-sample losses (squared error / BCE) at the parameters before any update.
        """

    @property
    def accumulator_size(self) -> int:
        """Length of the AdaGrad accumulator `adagrad_step` takes: one per parameter unless the model says less."""
        return self.size

    def adagrad_step(self, batch: Batch, g2: np.ndarray, lr: float, weight_decay: float) -> tuple[np.ndarray, np.ndarray, float, int]:
        """Per-sample AdaGrad over ``batch``, in place: (idx int32 unique, applied delta float32, loss_sum, n).

        ``loss_sum`` is progressive: each sample's loss just before its own update. A model whose kernel has no
        such loop trains with the mini-batch optimizers only.
        """
        raise ValueError(f"{self.kind} has no per-sample AdaGrad: set spec.optimizer.type to sgd, momentum, "
                         "nesterov or adam")

    def normalized_step(self, batch: Batch, state: Mapping[str, np.ndarray], lr: float, weight_decay: float,
                        workers: int) -> tuple[np.ndarray, np.ndarray, float, int]:
        """Per-sample normalized adaptive updates (Vowpal Wabbit's) over ``batch``, in place, with the optimizer's
        ``state`` (per-parameter g2, scale and rows, and norm = [N, t]), shared among ``workers`` summed replicas
        (`kernels/linear.pyx` and `kernels/softmax.pyx`, `normalized_step`): as `adagrad_step`. Only the linear models
        and softmax have the kernel."""
        raise ValueError(f"{self.kind} has no normalized updates: set spec.optimizer.type to sgd, momentum, "
                         "nesterov or adam")

    def own_step(self, batch: Batch, lr: float, workers: int) -> tuple[np.ndarray, np.ndarray, float, int] | None:
        """The model's own update rule over ``batch``, in place, for a model that trains by no optimizer's rule
        (k-means's per-centroid rates, Sculley 2010; its `ModelType.optimizers` admits the type whose ``lr`` scales
        it): as `adagrad_step`, with the steps of ``workers`` replicas summed. None (the default): the optimizer's."""
        return None

    @abstractmethod
    def evaluate(self, batch: Batch) -> tuple[float, int]:
        """(loss_sum, n) on held-out data, without updating anything."""

    def scores(self, batch: Batch) -> dict[str, float]:
        """Figures of the model on held-out data besides its loss (`mlless evaluate`, summary.json): accuracy
        and AUC for a binary classifier, accuracy for a multiclass one; none by default."""
        return {}

    @abstractmethod
    def predict(self, batch: Batch) -> np.ndarray:
        """Predictions: ratings for PMF, probabilities for LR, margins for the SVM, labels for linear regression."""

    @abstractmethod
    def dims(self) -> dict[str, Any]:
        """The dimensions needed to rebuild an identically shaped model."""

    @abstractmethod
    def config(self) -> ModelConfig:
        """The resolved hyper-parameters (defaults filled in)."""

    def loss(self, loss_sum: float, n: int) -> float:
        """Turn a loss sum into the reported metric (`ModelType.loss`): RMSE = √(sse/n), the others means."""
        return self.type.loss(loss_sum, n)

    def metadata(self) -> dict[str, Any]:
        cfg = self.config()
        return {**cfg.options, "kind": self.kind, "dims": self.dims(), "l2": cfg.l2, "version": FORMAT_VERSION}

    def save(self, path: str | os.PathLike[str], metadata: dict[str, Any] | None = None) -> None:
        """Write params + JSON metadata to ``path`` (.npz, loadable without pickle).

        ``metadata`` adds caller fields (job id, step, ...); the model's own
        fields (kind, dims, l2, version, and its type's `spec.model` fields such as rank) always win.
        """
        meta = {**(metadata or {}), **self.metadata()}
        with open(path, "wb") as fh:  # a file object stops np.savez from appending ".npz"
            np.savez(fh, params=self.params, metadata=np.array(json.dumps(meta, sort_keys=True)))

    def save_native(self, directory: str | os.PathLike[str]) -> list[str]:
        """Write the model in its own library's format into `directory`, beside the model.npz `save` writes there
        (a network's PyTorch state_dict, model.pt), for use without mlless; returns the files' names. None by
        default: the other models are their numpy parameters, which model.npz holds."""
        return []


M = TypeVar("M", bound="type[Model]")

#: Every model by its type's name; `mlless.training.models` imports the built-in ones.
MODELS: Registry[type[Model]] = Registry("model", None, attrgetter("kind"))


def register(cls: M) -> M:
    """Register the model `cls` (a class decorator) and its `type`, whose name it takes as `kind`: a new model is one
    module (and its kernel) plus its `ModelType`, which the schema, the CRD and the defaults read."""
    if not isinstance(cls.__dict__.get("type"), ModelType):
        raise TypeError(f"model {cls.__name__}: its `type` must be a ModelType (mlless.spec.models)")
    MODEL_TYPES.register(cls.type)
    cls.kind, cls.loss_metric, cls.dataset_kind = cls.type.name, cls.type.loss_metric, cls.type.dataset_kind
    return MODELS.register(cls)


def binary_scores(margins: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Accuracy (a positive margin is class 1) and AUC (the Mann-Whitney statistic, ties counted half) of
    margins against labels 0/1; AUC is NaN when one class is absent."""
    positive = labels == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    auc = float("nan")
    if n_pos and n_neg:
        ranks = _average_ranks(margins)
        auc = float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return {"accuracy": float(np.mean((margins > 0) == positive)), "auc": auc}


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of `x`, ties given their mean rank (scipy.stats.rankdata's default; scipy.stats takes 1-2 s
    to import, a worker's whole start-up, for this one function)."""
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]  # each tie group's first place
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], x.size]
    ranks = np.empty(x.size, np.float64)
    ranks[order] = ((starts + ends + 1) / 2.0)[np.cumsum(first) - 1]
    return ranks


BatchT = TypeVar("BatchT", bound=Batch)


def expect_batch(batch: Batch, kind: type[BatchT], model: str) -> BatchT:
    """`batch`, if it is the `kind` of batch `model` trains on; a TypeError naming both otherwise."""
    if not isinstance(batch, kind):
        raise TypeError(f"{model} trains on {kind.__name__}, got {type(batch).__name__}")
    return batch


def required_dim(dims: Mapping[str, Any], key: str, kind: str) -> Any:
    if key not in dims:
        raise ValueError(f"{kind} needs dims[{key!r}]; got {sorted(dims)}")
    return dims[key]


def contiguous(arr: np.ndarray, dtype: type) -> np.ndarray:
    """The array as the C-contiguous `dtype` buffer a kernel's typed memoryview takes (no copy if it is one)."""
    return np.ascontiguousarray(arr, dtype=dtype)


def read_model_file(path: str | os.PathLike[str] | BinaryIO, name: str | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Read and validate the container layout (of a file, or a binary file object called `name`); model-specific
    checks happen in the loader."""
    name = name or os.fspath(path)  # type: ignore[arg-type]
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):
                raise ModelFileError(f"{name}: not an .npz archive")
            missing = {"params", "metadata"} - set(npz.files)
            if missing:
                raise ModelFileError(f"{name}: missing array(s) {sorted(missing)}")
            params = np.array(npz["params"])
            raw = npz["metadata"]
    except ModelFileError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc):  # numpy's guess for anything that is neither .npy nor .npz
            raise ModelFileError(f"{name}: not a model file (mlless models are .npz archives)") from None
        raise ModelFileError(f"{name}: cannot read model file ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - any read failure is a malformed file
        raise ModelFileError(f"{name}: cannot read model file ({type(exc).__name__}: {exc})") from exc
    if params.dtype != np.float32 or params.ndim != 1:
        raise ModelFileError(f"{name}: params must be 1-D float32, got {params.dtype}{params.shape}")
    if raw.dtype.kind != "U" or raw.size != 1:
        raise ModelFileError(f"{name}: metadata must be one JSON string")
    try:
        meta = json.loads(str(raw.reshape(-1)[0]))
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{name}: metadata is not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise ModelFileError(f"{name}: metadata must be a JSON object")
    if meta.get("version") != FORMAT_VERSION:
        raise ModelFileError(f"{name}: unsupported model format version {meta.get('version')!r}")
    if meta.get("kind") not in MODEL_TYPES:
        raise ModelFileError(f"{name}: unknown model kind {meta.get('kind')!r}")
    if not isinstance(meta.get("dims"), dict):
        raise ModelFileError(f"{name}: metadata lacks 'dims'")
    if not np.all(np.isfinite(params)):
        raise ModelFileError(f"{name}: params contain non-finite values")
    return params, meta
