"""PyTorch networks over images (`spec.model.type: neural-net`, and `neural-net-regression`), trained as any other
replica.

The network (training/networks.py: a built-in architecture or the user's module) keeps all its state in its
parameters, and each parameter's tensor is a view (`torch.from_numpy`) of its slice of the replica's flat float32
vector, in `module.parameters()` order: the optimizer's step, a peer's update and `set_params` change the network
in place, and the exchange sees one vector. The gradient is dense: every index, every step.

Pixels reach the network as (pixel − mean) / std per channel, with the training set's statistics (`dims`:
pixel_mean, pixel_std, 0-255 scale). `NeuralNet`'s loss is cross-entropy over the classes 0 … K − 1;
`NeuralNetRegression`'s, the squared error of one real target an image, whose prediction is label_mean +
label_std × the network's one output (the training targets' statistics): a fresh network predicts about the mean with
about the targets' spread, whatever their units, as its fresh logits sit near 0 for pixels normalised alike. L2 is
decoupled weight decay applied by the optimizer (AdamW's under adam), none unless `spec.model.l2` sets it.

torch is imported only when a network is built: the package, and every process of a job on another model,
runs without it (`pip install 'mlless[torch]'`).
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

import numpy as np

from mlless.contract import ENV_CPU_CORES
from mlless.data.batches import Batch, ImageBatch
from mlless.spec.config import ModelConfig
from mlless.spec.models import model_type
from mlless.training.models.base import Model, expect_batch, register, required_dim

if TYPE_CHECKING:
    import torch

#: Rows a forward pass takes at once when evaluating (bounds the activations' memory on a large validation set).
EVAL_ROWS = 512
#: Top-k accuracy besides top-1 once there are this many classes (ImageNet's and CIFAR-100's top-5).
TOP_K, TOP_K_CLASSES = 5, 10
#: The network's PyTorch state_dict in the run directory, beside model.npz (`save_native`).
NATIVE_FILE = "model.pt"
#: What `from_dims` reads of `Dataset.dims()`: the images' shape and pixel statistics, and the classes...
DIMS = ("channels", "height", "width", "n_classes", "pixel_mean", "pixel_std")
#: ...or, for a regression, the training targets' mean and standard deviation.
REGRESSION_DIMS = ("channels", "height", "width", "label_mean", "label_std", "pixel_mean", "pixel_std")


def torch_threads(workers: int, env: Mapping[str, str] | None = None) -> int:
    """A worker's torch threads: the cores its function was given (`ENV_CPU_CORES`, set by the operator from the
    CPU request), else, when `workers` replicas share this machine's cores, its share; at least 1.

    In a pod the affinity lists the node's cores, which the pods on it share by their requests: the request is the
    share (more threads than that would contend with the neighbours, or be throttled under a CPU limit)."""
    given = (os.environ if env is None else env).get(ENV_CPU_CORES, "").strip()
    if given:
        try:
            return max(1, int(given))
        except ValueError:
            raise ValueError(f"{ENV_CPU_CORES}: {given!r} is not a whole number of cores") from None
    return max(1, len(os.sched_getaffinity(0)) // max(1, workers))


@register
class NeuralNet(Model):
    """A torch.nn.Module over `ImageBatch`es; loss metric mean cross-entropy."""

    type = model_type("neural-net")
    shape_dims = ("channels", "height", "width", "n_classes")
    #: What `from_dims` reads.
    needs: ClassVar[tuple[str, ...]] = DIMS

    @classmethod
    def from_dims(cls, dims: Mapping[str, Any], config: ModelConfig | None, seed: int) -> NeuralNet:
        """Needs the images' shape, the per-channel pixel statistics and the classes (`needs`)."""
        return cls({key: required_dim(dims, key, cls.kind) for key in cls.needs}, config, seed)

    def __init__(self, dims: Mapping[str, Any], config: ModelConfig | None = None, seed: int = 0) -> None:
        try:
            import torch
        except ImportError:
            raise ImportError(f"spec.model.type {self.kind} needs torch and torchvision: "
                              f"pip install 'mlless[{self.type.extra}]'") from None

        from mlless.training import networks

        config = config or ModelConfig(self.kind)
        self.options = dict(config.options)
        self.l2 = 0.0 if config.l2 is None else float(config.l2)
        self.shape = (int(dims["channels"]), int(dims["height"]), int(dims["width"]))
        if min(self.shape) < 1:
            raise ValueError(f"{self.kind} needs images of at least 1×1×1, got {self.shape}")
        self.outputs = self._read_labels(dims)
        mean, std = (np.asarray(dims[key], np.float32).reshape(-1) for key in ("pixel_mean", "pixel_std"))
        if mean.size != self.shape[0] or std.size != self.shape[0] or not np.all(std > 0):
            raise ValueError(f"{self.kind} needs pixel_mean and a positive pixel_std for each of the "
                             f"{self.shape[0]} channels, got {mean.tolist()} and {std.tolist()}")
        self.pixel_mean, self.pixel_std = mean, std
        with torch.random.fork_rng(devices=[]):  # the same initial network on every worker, whatever ran before
            torch.manual_seed(seed)
            self.net = networks.build(self.options["network"], self.options["hiddenSizes"], self.options.get("module"),
                                      self.shape, self.outputs)
        tensors = list(self.net.parameters())
        super().__init__(sum(p.numel() for p in tensors))
        self._slices: list[tuple[torch.nn.Parameter, slice]] = []
        start = 0
        for p in tensors:
            view = slice(start, start + p.numel())
            self.params[view] = p.detach().reshape(-1).numpy()
            p.data = torch.from_numpy(self.params[view]).view_as(p)  # the parameter now lives in the replica
            self._slices.append((p, view))
            start = view.stop
        self._indices = np.arange(self.size, dtype=np.int32)

    @property
    def weight_decay(self) -> float:
        return self.l2

    def segments(self) -> np.ndarray:
        """Each parameter tensor's slice, in `module.parameters()` order."""
        return np.array([0] + [view.stop for _, view in self._slices], np.int64)

    def share_cores(self, workers: int) -> None:
        import torch

        torch.set_num_threads(torch_threads(workers))

    def _read_labels(self, dims: Mapping[str, Any]) -> int:
        """What the model needs of the labels in `dims`: the classes; returns the network's outputs, one a class."""
        self.classes = int(dims["n_classes"])
        if self.classes < 2:
            raise ValueError(f"{self.kind} needs 2 or more classes, got {self.classes}")
        return self.classes

    def _targets(self, labels: np.ndarray) -> torch.Tensor:
        """A batch's labels as the loss takes them: class ids, int64."""
        import torch

        if labels.dtype.kind not in "iu":
            raise ValueError(f"{self.kind} trains on class ids, got {labels.dtype} labels (real targets: "
                             "neural-net-regression)")
        if len(labels) and int(labels.max()) >= self.classes:
            raise ValueError(f"label {int(labels.max())} is none of the model's {self.classes} classes")
        return torch.from_numpy(labels.astype(np.int64))

    def _loss_sum(self, out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch's summed loss: cross-entropy of the logits."""
        import torch.nn.functional as F

        return F.cross_entropy(out, targets, reduction="sum")

    def _inputs(self, batch: ImageBatch) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        if batch.images.shape[1:] != self.shape:
            raise ValueError(f"{self.kind} was built for {self.shape} images, got {batch.images.shape[1:]}")
        targets = self._targets(batch.labels)
        pixels = (batch.images.astype(np.float32) - self.pixel_mean[:, None, None]) / self.pixel_std[:, None, None]
        return torch.from_numpy(pixels), targets

    def gradient(self, batch: Batch) -> tuple[np.ndarray, np.ndarray, float, int]:
        import torch

        b = expect_batch(batch, ImageBatch, self.kind)
        grad = np.zeros(self.size, dtype=np.float32)
        for p, view in self._slices:  # backward adds into existing gradients in place: into `grad`
            p.grad = torch.from_numpy(grad[view]).view_as(p)
        x, y = self._inputs(b)
        loss = self._loss_sum(self.net.train()(x), y)
        (loss / max(1, len(b))).backward()
        return self._indices, grad, float(loss.detach()), len(b)

    def logits(self, batch: Batch) -> np.ndarray:
        """The network's (rows, outputs): logits, one a class (a regression's one output); in evaluation mode (no
        dropout), `EVAL_ROWS` at a time."""
        import torch

        x, _ = self._inputs(expect_batch(batch, ImageBatch, self.kind))
        self.net.eval()
        try:
            with torch.no_grad():
                return torch.cat([self.net(x[i:i + EVAL_ROWS]) for i in range(0, len(x), EVAL_ROWS)]
                                 or [torch.zeros((0, self.outputs))]).numpy()
        finally:
            self.net.train()

    def evaluate(self, batch: Batch) -> tuple[float, int]:
        b = expect_batch(batch, ImageBatch, self.kind)
        z = self.logits(b).astype(np.float64)
        top = z.max(axis=1)
        lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
        return float((lse - z[np.arange(len(b)), b.labels]).sum()), len(b)

    def scores(self, batch: Batch) -> dict[str, float]:
        """Top-1 accuracy, and top-5 with 10 or more classes."""
        b = expect_batch(batch, ImageBatch, self.kind)
        z = self.logits(b)
        out = {"accuracy": float(np.mean(z.argmax(axis=1) == b.labels))}
        if self.classes >= TOP_K_CLASSES:
            best = np.argpartition(-z, TOP_K - 1, axis=1)[:, :TOP_K]
            out[f"top{TOP_K}_accuracy"] = float(np.mean((best == b.labels[:, None]).any(axis=1)))
        return out

    def predict(self, batch: Batch) -> np.ndarray:
        """The (rows, K) class probabilities."""
        z = self.logits(batch)
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return (p / p.sum(axis=1, keepdims=True)).astype(np.float32)

    def save_native(self, directory: str | os.PathLike[str]) -> list[str]:
        """The network's `state_dict` as `NATIVE_FILE`: `torch.load` it into the same architecture
        (`mlless.training.networks.build`, or the user's module) to predict with plain PyTorch, on pixels normalised
        as `_inputs` does (a regression's prediction: label_mean + label_std × its output)."""
        import torch

        torch.save({key: value.clone() for key, value in self.net.state_dict().items()},
                   os.path.join(directory, NATIVE_FILE))
        return [NATIVE_FILE]

    def _label_dims(self) -> dict[str, Any]:
        return {"n_classes": self.classes}

    def dims(self) -> dict[str, Any]:
        channels, height, width = self.shape
        return {"channels": channels, "height": height, "width": width, **self._label_dims(),
                "pixel_mean": self.pixel_mean.tolist(), "pixel_std": self.pixel_std.tolist()}

    def config(self) -> ModelConfig:
        return ModelConfig(self.kind, self.l2, options=self.options)


@register
class NeuralNetRegression(NeuralNet):
    """The same networks with one output, label_mean + label_std × which predicts a real target; loss metric RMSE."""

    type = model_type("neural-net-regression")
    shape_dims = ("channels", "height", "width")
    needs = REGRESSION_DIMS

    def _read_labels(self, dims: Mapping[str, Any]) -> int:
        """The training targets' mean and a positive deviation; one output."""
        self.label_mean, self.label_std = float(dims["label_mean"]), float(dims["label_std"])
        if not (np.isfinite(self.label_mean) and np.isfinite(self.label_std) and self.label_std > 0):
            raise ValueError(f"{self.kind} needs a finite label_mean and a positive label_std, got "
                             f"{self.label_mean} and {self.label_std}")
        return 1

    def _targets(self, labels: np.ndarray) -> torch.Tensor:
        import torch

        if labels.dtype.kind != "f":
            raise ValueError(f"{self.kind} trains on real targets, got {labels.dtype} labels (class ids: neural-net)")
        return torch.from_numpy(labels.astype(np.float32))

    def _loss_sum(self, out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch's squared error, in the targets' units (RMSE is reported from it, as linear-regression's)."""
        return ((out[:, 0] * self.label_std + self.label_mean - targets) ** 2).sum()

    def values(self, batch: Batch) -> np.ndarray:
        """Each image's predicted target, float64."""
        return self.logits(batch)[:, 0].astype(np.float64) * self.label_std + self.label_mean

    def evaluate(self, batch: Batch) -> tuple[float, int]:
        b = expect_batch(batch, ImageBatch, self.kind)
        error = self.values(b) - b.labels
        return float(error @ error), len(b)

    def scores(self, batch: Batch) -> dict[str, float]:
        """None besides the loss, as linear-regression's."""
        return {}

    def predict(self, batch: Batch) -> np.ndarray:
        """The (rows,) predicted targets."""
        return self.values(batch).astype(np.float32)

    def _label_dims(self) -> dict[str, Any]:
        return {"label_mean": self.label_mean, "label_std": self.label_std}
