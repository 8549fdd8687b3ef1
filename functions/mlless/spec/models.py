"""Model types as a TrainingJob sees them: one kernel-free `ModelType` each.

A model is its module in `mlless.training.models` (the maths, over its kernel) plus its `ModelType` here: what
validating and resolving a manifest needs, without loading a kernel (the CLI and the operator validate). The
schema's `model.type` enum and its description, which protocols a model admits (`traits`), each model's default
optimizer and sync settings, and how its loss is reported are read from the registered types, so nothing else
branches on a model's name.

A type registered outside the package (a test's, a user's; `mlless.plugins` loads them in every process of the
job) is admitted by manifest validation in that process; the CRD lists the built-in ones. This module imports
nothing of mlless but the schema's node builders and the registry, so that the schema can read it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from mlless.spec.nodes import Schema, boolean, choice, integer, integers, obj, string
from mlless.spec.registry import Registry

__all__ = ["ADAMW_WEIGHT_DECAY", "BUILT_IN", "FUNCTION_MEMORY", "LOSS_METRICS", "MODEL_TYPES", "ModelType", "OptimizerDefaults",
           "model_type", "register"]

#: How a loss sum over n samples is reported, by the metric's name: RMSE is √(sse/n), the others are means.
LOSS_METRICS: dict[str, Callable[[float, int], float]] = {
    "rmse": lambda total, n: math.sqrt(max(total, 0.0) / n),
    "bce": lambda total, n: total / n,
    "hinge": lambda total, n: total / n,
    "cross-entropy": lambda total, n: total / n,
    # k-means: the mean squared Euclidean distance of a row to its nearest centroid (scikit-learn's inertia / n).
    "inertia": lambda total, n: total / n,
}

# ISP's v. The papers' 0.7 was set for mini-batch updates. PMF's default optimizer is per-sample AdaGrad, whose
# updates are large relative to the parameters, so at 0.7 about half of BSP's entries pass the filter; v = 3 sends a
# fraction of BSP's bytes and ended at a lower validation RMSE. The linear models keep 0.7: at 3 LR needed several
# times BSP's steps.
#: The step size of an optimizer type that a job names instead of its model's: the one its best-known implementation
#: starts from (Vowpal Wabbit's 0.5 for its normalized updates, LIBMF's 0.1 for AdaGrad, Kingma and Ba's 0.001 for
#: Adam), with no decay. A model's own rate and decay belong to its own type: another type's rate left normalized
#: updates short of VW's loss.
TYPE_LEARNING_RATES = {"normalized": 0.5, "adagrad": 0.1, "adam": 0.001, "adamw": 0.001, "sgd": 0.01,
                       "momentum": 0.01, "nesterov": 0.01}
#: spec.model.l2 under optimizer adamw when the manifest sets none, for a model whose l2 is decoupled weight decay
#: (`ModelType.l2_in_loss` False): PyTorch's AdamW default. adam and adamw run one kernel (kernels/optim.pyx, whose
#: decay is decoupled already); adamw is the name under which a job gets this decay without asking for it.
ADAMW_WEIGHT_DECAY = 0.01


def type_rates() -> str:
    """`TYPE_LEARNING_RATES` as `optimizer.learningRate`'s description gives them."""
    return ", ".join(f"{kind} {rate:g}" for kind, rate in TYPE_LEARNING_RATES.items())

PAPERS_V = 0.7
PMF_V = 3.0
#: Memory per worker function on Kubernetes when neither spec.function.memory nor the model type says otherwise:
#: the papers' 2 GB functions.
FUNCTION_MEMORY = "2Gi"


@dataclass(frozen=True)
class OptimizerDefaults:
    """A model's optimizer when the job names none (`OptimizerConfig` fields), for P workers."""

    type: str
    learning_rate: float
    lr_decay: str = "none"
    #: Beyond this many workers the learning rate shrinks as 1/P (None: never): rows that every worker touches in
    #: a step move P-fold under the sum of updates.
    full_rate_workers: int | None = None

    def fields(self, workers: int) -> dict[str, Any]:
        scale = 1.0 if self.full_rate_workers is None else min(1.0, self.full_rate_workers / max(1, workers))
        return {"type": self.type, "learning_rate": self.learning_rate * scale, "lr_decay": self.lr_decay}


@dataclass(frozen=True)
class ModelType:
    """What a TrainingJob needs to know of a model type."""

    name: str
    #: The phrase `model.type`'s description gives it: "biased matrix factorisation".
    summary: str
    #: The kind of data set (`mlless prepare`'s manifest "kind") it trains on.
    dataset_kind: str
    #: How its loss is reported: a name in `LOSS_METRICS`.
    loss_metric: str
    optimizer: OptimizerDefaults
    #: Its protocol when the job names none.
    protocol: str = "isp"
    #: ISP's v for it when the job names none.
    significance_threshold: float = PAPERS_V
    #: What protocols need of a model (`mlless.spec.pairings.NEEDS`): "blocks" (rows of users and items to split),
    #: "convex" (a convex loss), "gradients" (a mini-batch gradient trains it).
    traits: frozenset[str] = field(default_factory=frozenset)
    #: The kinds of labels it fits (`mlless prepare --labels`, `mlless.data.manifest.LABEL_KINDS`); a ratings
    #: data set's reads as binary.
    labels: frozenset[str] = frozenset({"binary"})
    #: The `spec.model` fields it reads besides `type` and `l2`, by their manifest names, with their schema
    #: (`mlless.spec.nodes`); the schema lists every built-in type's, and `ModelConfig` carries them.
    fields: Mapping[str, Schema] = field(default_factory=dict)
    #: Those of `fields` that may not exceed the training rows (`dataset_errors`): k-means's clusters.
    per_row: tuple[str, ...] = ()
    #: The `spec.optimizer.type`s it trains with; None: every one. A model with an update rule of its own
    #: (`Model.own_step`) admits the one whose learning rate scales it.
    optimizers: frozenset[str] | None = None
    #: Its spec.model.l2 is a penalty inside its loss (pmf's, kernels/pmf.pyx), not decoupled weight decay the
    #: optimizer applies (`Model.weight_decay`): adamw's default decay (`ADAMW_WEIGHT_DECAY`) does not set it.
    l2_in_loss: bool = False
    #: Modules its workers import that take seconds (torch and torchvision: 3-8 s on this 2-core machine), which a
    #: local job's zygote imports once before it forks the workers (launch/zygote.py), instead of each worker.
    imports: tuple[str, ...] = ()
    #: Memory per worker function on Kubernetes when spec.function.memory is unset (a Kubernetes quantity): the
    #: operator reads it here, so that no part of it branches on the model's name.
    function_memory: str = FUNCTION_MEMORY
    #: The package extra its processes import (`pip install 'mlless[EXTRA]'`, pyproject.toml); None: the core
    #: install. On Kubernetes the job's supervisor and workers run on the image given for that extra, if any
    #: (the operator's MLLESS_OPERATOR_EXTRA_IMAGES, the chart's operator.extraImages).
    extra: str | None = None

    def __post_init__(self) -> None:
        if self.loss_metric not in LOSS_METRICS:
            raise ValueError(f"model type {self.name}: loss metric {self.loss_metric!r} is not one of {tuple(LOSS_METRICS)}")

    def loss(self, total: float, n: int) -> float:
        """A loss sum over `n` samples as the reported metric (NaN without samples)."""
        return LOSS_METRICS[self.loss_metric](total, n) if n > 0 else float("nan")

    def dataset_errors(self, values: Mapping[str, Any], dataset: Any) -> list[str]:
        """One line per way a prepared `dataset` (`mlless.data.dataset.Dataset`) does not fit this model type with
        the hyper-parameters `values` (`ModelConfig`'s fields): its kind, its labels, a field of `per_row` above its
        training rows."""
        if dataset.kind != self.dataset_kind:
            return [f"spec.model.type {self.name} trains on a {self.dataset_kind} dataset, and {dataset.uri} holds "
                    f"{dataset.kind} (see `mlless prepare --help`)"]
        errors = [] if dataset.fits(self.labels) else [
            f"spec.model.type {self.name} fits {' or '.join(sorted(self.labels))} labels, and {dataset.uri} holds "
            f"{dataset.label_set()} (mlless prepare --labels)"]
        rows = dataset.manifest.n_train
        return errors + [f"spec.model.{name}: {values[name]} is more than the {rows} training rows of {dataset.uri}"
                         for name in self.per_row if values[name] > rows]


#: The network model types' built-in architectures (`spec.model.network`; training/networks.py builds them).
NETWORKS = ("mlp", "lenet", "cnn", "mobilenet_v3_small", "resnet18")
#: The network model types, as their fields' descriptions name them.
_NETS = "neural-net and neural-net-regression"
#: The `spec.model` fields both network types read: one schema a name (`mlless.spec.schema.model_fields`).
NETWORK_FIELDS: Mapping[str, Schema] = {
    "network": choice(f"Built-in architecture ({_NETS}): mlp, a LeNet-5 CNN, a small 3×3 CNN (cnn), or torchvision's "
                      "mobilenet_v3_small or resnet18 (no pretrained weights; GroupNorm for BatchNorm).",
                      list(NETWORKS), default="cnn"),
    "hiddenSizes": integers(f"Hidden layer widths of the mlp network ({_NETS}).", 1, 65536, default=[128]),
    # The usual CIFAR recipe is crop 4 and flip; the crop's bound only keeps a typo (400) out.
    "augment": obj(f"Augmentation of the training images ({_NETS}), drawn anew each step from the job's seed, the "
                   "worker's rank and the step; validation images are never augmented. Unset: no augmentation. Under "
                   "neural-net-regression a target must hold for the augmented image too (a flip moves a band on the "
                   "left to the right).",
                   {"crop": integer("Pixels of zero padding on each side, then a random crop back to the image's "
                                    "size; 0: no crop.", 0, 64, default=0),
                    "flip": boolean("Mirror each image left to right with probability 1/2.", False)}),
    "module": {**string(f"The user's own network instead of a built-in one ({_NETS}): \"package.module:build\", a "
                        "callable importable in every worker, taking the input shape (channels, height, width) and "
                        "the number of outputs (the classes; 1 for neural-net-regression) and returning a "
                        "torch.nn.Module."), "minLength": 3},
}
#: The network types' optimizer (the comment in `BUILT_IN` says why).
NETWORK_OPTIMIZER = OptimizerDefaults("adam", TYPE_LEARNING_RATES["adam"])
#: The network types' functions get 3 GB, what LambdaML trained MobileNet in (torch alone takes a few hundred MB).
NETWORK_MEMORY = "3Gi"
#: What the network types' workers import (`ModelType.imports`).
NETWORK_IMPORTS = ("torch", "torchvision.models")

#: The linear family's optimizer (the comment in `BUILT_IN` says why).
LINEAR_OPTIMIZER = OptimizerDefaults("normalized", TYPE_LEARNING_RATES["normalized"])

#: The model types of the package, in the order the schema lists them.
BUILT_IN = (
    # Per-sample AdaGrad (LIBMF's rule) at 0.2, 0.4/P beyond 2 workers: 0.2 reached the target in the fewest epochs
    # at P = 1 and 2, and at P = 4 0.1 was as fast or faster and ended lower. Blocked: the shortest time to target at
    # P >= 2, where ISP took about twice as long, and the lowest validation RMSE.
    ModelType("pmf", "biased matrix factorisation", "ratings", "rmse",
              OptimizerDefaults("adagrad", 0.2, full_rate_workers=2),
              protocol="blocked", significance_threshold=PMF_V, traits=frozenset({"blocks", "gradients"}), l2_in_loss=True,
              fields={"rank": integer("Latent factors per user and item (pmf).", 1, 1024, default=20)}),
    # The linear family learns by Vowpal Wabbit's rule: per-coordinate normalized adaptive updates with the
    # importance-invariant step (kernels/linear.pyx, `normalized_step`), at VW's 0.5. It is scale-free: a column
    # a user gives in raw units (clock times, distances) learns as its log1p'd self, where Adam diverged at P >= 2
    # and per-sample AdaGrad at P >= 3 (the sum of P workers' moves on the dense columns overshoots P-fold); the
    # P-safe rule divides a move by the workers expected to make it. It reached VW's one-pass loss sooner than Adam
    # at P = 1 and 2, and the SVM met VW's hinge accuracy in one epoch at P = 1 and 2, which Adam missed; linear
    # regression ended closer to Ridge than per-sample AdaGrad at 0.3.
    ModelType("logistic-regression", "sparse logistic regression on hashed features", "sparse", "bce",
              LINEAR_OPTIMIZER, traits=frozenset({"convex", "gradients"})),
    ModelType("svm", "linear SVM, hinge loss, on hashed features, labels 0/1", "sparse", "hinge",
              LINEAR_OPTIMIZER, traits=frozenset({"convex", "gradients"})),
    # Linear regression solves its normal equations while a worker has seen few features (a table's columns): on
    # raw real tables the normalized rule ended 5-27 % above Ridge and drifted, the exact step met Ridge from the
    # first epoch at P = 1 and 2 (benchmarks/RESULTS.md, "Linear regression against Ridge").
    ModelType("linear-regression", "linear regression, squared loss, on hashed features", "sparse", "rmse",
              LINEAR_OPTIMIZER, traits=frozenset({"convex", "gradients"}), labels=frozenset({"binary", "real"}),
              fields={"exactFeatures": integer(
                  "linear-regression: while a worker's rows hold at most this many distinct features, it solves "
                  "the normal equations of the rows it has seen (a dense d×d system, ridge 1 on features scaled by "
                  "their largest magnitude) instead of taking the optimizer's steps; beyond it, and with 0, the "
                  "optimizer trains.", 0, 4096, default=512)}),
    # Cirrus's softmax: K weights a feature, by the linear family's rule (kernels/softmax.pyx, `normalized_step`:
    # a feature's K weights share its scale, and the importance-invariant step follows the cross-entropy's flow).
    # Adam at 0.01 with lr/√epoch, its default before, needed scaled features: on scikit-learn's wine and breast
    # cancer tables with raw columns it ended 0.78 and 0.90 in accuracy after 20 epochs (0.93 and 0.92-0.94 by this
    # rule, and the same with the columns ×1000, where Adam moved).
    ModelType("softmax", "multinomial logistic regression on hashed features, one class a distinct label", "sparse",
              "cross-entropy", LINEAR_OPTIMIZER, traits=frozenset({"convex", "gradients"}),
              labels=frozenset({"binary", "classes"})),
    # Sculley's mini-batch k-means (training/models/kmeans.py): each centroid moves by its own rate, 1 / (its rows
    # so far), which the learning rate scales (1: Sculley's). Labels of any kind are ignored. Neither convex nor
    # made of blocks: admm and blocked do not apply.
    ModelType("kmeans", "mini-batch k-means, k-means++ seeds, on feature rows (labels ignored)", "sparse", "inertia",
              OptimizerDefaults("sgd", 1.0), protocol="bsp", labels=frozenset({"binary", "real", "classes"}),
              fields={"clusters": integer("Clusters k (kmeans); at most the training rows.", 1, 4096, default=8)},
              per_row=("clusters",), optimizers=frozenset({"sgd"})),
    # A PyTorch network over images (training/models/network.py, architectures in training/networks.py): Adam at
    # Kingma and Ba's 0.001, the rate the papers' networks train with; gradient averaging each step, the way
    # LambdaML found steady for MobileNet (sync/protocols/gradients.py says what bsp cost). Not convex and not made
    # of blocks: admm and blocked do not apply.
    ModelType("neural-net", "a PyTorch network over images, one class a label", "images", "cross-entropy",
              NETWORK_OPTIMIZER, protocol="gradient-averaging", traits=frozenset({"gradients"}),
              labels=frozenset({"classes"}), fields=NETWORK_FIELDS, imports=NETWORK_IMPORTS,
              function_memory=NETWORK_MEMORY, extra="torch"),
    # The same networks with one output and the squared error, as linear-regression is to logistic-regression
    # (training/models/network.py, `NeuralNetRegression`): its own type, since a type reports one loss metric.
    ModelType("neural-net-regression", "a PyTorch network over images, one real target a label", "images", "rmse",
              NETWORK_OPTIMIZER, protocol="gradient-averaging", traits=frozenset({"gradients"}),
              labels=frozenset({"real"}), fields=NETWORK_FIELDS, imports=NETWORK_IMPORTS,
              function_memory=NETWORK_MEMORY, extra="torch"),
)

#: Every registered model type by name: the built-ins, and those registered outside the package.
MODEL_TYPES: Registry[ModelType] = Registry("model type", "model.type")
for _builtin in BUILT_IN:
    MODEL_TYPES.register(_builtin)

#: Register a model type defined outside the package (a `Model` subclass's `type`: `mlless.training.models.register`
#: calls it); a later one of the same name replaces it.
register = MODEL_TYPES.register


def model_type(name: str) -> ModelType:
    """The registered model type `name`; ValueError naming the known ones otherwise."""
    return MODEL_TYPES.named(name)


def function_memory_defaults() -> str:
    """spec.function.memory's default as its description gives it: `FUNCTION_MEMORY`, and the built-in types that
    default to another."""
    others = [f"{t.name} {t.function_memory}" for t in BUILT_IN if t.function_memory != FUNCTION_MEMORY]
    return FUNCTION_MEMORY + (f" ({', '.join(others)})" if others else "")
