"""The typed sections of a TrainingJob, with their defaults taken from the schema.

Every static default is written once, as a `default:` in `mlless.spec.schema`; the dataclasses read it from
there. What cannot be static lives here beside them: the optimizer's defaults depend on the model type and
the number of workers (`default_optimizer`), the protocol and ISP's threshold on the model type (`default_sync`),
each read from the type's `mlless.spec.models.ModelType`. Nothing here
imports the training code, so validating a manifest (the CLI, the operator) loads no compiled kernel.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping

from jsonschema import Draft4Validator
from jsonschema.exceptions import best_match

from mlless.spec.models import ADAMW_WEIGHT_DECAY, PAPERS_V, TYPE_LEARNING_RATES, model_type
from mlless.spec.schema import choices, default

OPTIMIZERS = choices("optimizer.type")
LR_DECAYS = choices("optimizer.lrDecay")
KNEE_METHODS = choices("autoscaler.knee.method")
KneeMethod = Literal["slope", "kneedle"]


@dataclass(frozen=True)
class ModelConfig:
    """Model hyper-parameters; ``l2=None`` picks the model's default.

    ``options`` holds the `spec.model` fields the type declares (`ModelType.fields`), by their manifest names,
    defaults filled in (one without a default only when set): ``rank`` for PMF, ``clusters`` for k-means, a plugin
    type's own; a field another type declares is not the model's and is left out.  ``init_from`` is
    ``spec.model.initFrom``, resolved.  For PMF ``l2`` is a per-rating L2 penalty inside the loss (see
    `mlless.training.kernels.pmf`); for logistic regression it is decoupled weight decay handed to the optimizer
    (`Model.weight_decay`).
    """

    type: str
    l2: float | None = None
    #: A model file every replica starts from instead of the seed (`mlless.training.warm_start`).
    init_from: str | None = None
    #: A plain dict, so that `TrainingJob.to_json` writes it; left out of the hash (a dict has none).
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        declared = model_type(self.type).fields  # a ValueError naming the known types
        if not isinstance(self.options, Mapping):  # a resolved job from another process (TrainingJob.from_json)
            raise ValueError(f"model options must be an object, got {type(self.options).__name__}")
        given = {name: _filled(self.options.get(name, node.get("default")), node) for name, node in declared.items()}
        options = {name: value for name, value in given.items() if value is not None}  # unset, with no default
        for name, value in options.items():
            if (error := best_match(Draft4Validator(declared[name]).iter_errors(value))) is not None:
                raise ValueError(f"spec.model.{name}: {error.message}")
        object.__setattr__(self, "options", options)
        if self.l2 is not None and not (self.l2 >= 0 and math.isfinite(self.l2)):
            raise ValueError(f"l2 must be a finite value >= 0, got {self.l2}")

    @classmethod
    def of(cls, type: str, l2: float | None = None, init_from: str | None = None, **options: Any) -> ModelConfig:
        """A config with the type's fields as keywords: ``ModelConfig.of("pmf", rank=8)``."""
        return cls(type, l2, init_from, options)


def _filled(value: Any, node: Mapping[str, Any]) -> Any:
    """An object field's value with the defaults of the fields it leaves out (`spec.model.augment`'s crop, flip)."""
    if isinstance(value, Mapping) and "properties" in node:
        return {**{name: child["default"] for name, child in node["properties"].items() if "default" in child},
                **value}
    return value


@dataclass(frozen=True)
class OptimizerConfig:
    """Hyper-parameters of one optimizer and its learning-rate schedule; validated on construction.

    `type` and `learning_rate` have no schema default: a job's come from `default_optimizer`. The values
    here serve a bare `OptimizerConfig(...)` in library use. `weight_decay` is derived, not a manifest field: a
    replica sets it to its model's (`Model.weight_decay`, from spec.model.l2, whose default adamw changes:
    `default_l2`). So is `horizon_epochs`: cosine's horizon, spec.stop.maxEpochs, which `from_manifest` copies here
    because the workers' replicas see the optimizer's config and not the stop rule.
    """

    type: str = "sgd"
    learning_rate: float = 0.01
    momentum: float = default("optimizer.momentum")
    beta1: float = default("optimizer.beta1")
    beta2: float = default("optimizer.beta2")
    epsilon: float = default("optimizer.epsilon")
    weight_decay: float = 0.0
    lr_decay: str = "none"
    warmup_epochs: float = default("optimizer.warmupEpochs")
    decay_epochs: float | None = None
    gamma: float = default("optimizer.gamma")
    horizon_epochs: float | None = None

    def __post_init__(self) -> None:
        if self.type not in OPTIMIZERS:
            raise ValueError(f"optimizer type must be one of {OPTIMIZERS}, got {self.type!r}")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"lr_decay must be one of {LR_DECAYS}, got {self.lr_decay!r}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError("beta1 and beta2 must be in [0, 1)")
        if not self.epsilon > 0:
            raise ValueError("epsilon must be positive")
        if not self.weight_decay >= 0:
            raise ValueError("weight_decay must be >= 0")
        if not (self.warmup_epochs >= 0 and math.isfinite(self.warmup_epochs)):
            raise ValueError(f"warmup_epochs must be a finite value >= 0, got {self.warmup_epochs}")
        if not 0 < self.gamma < 1:
            raise ValueError(f"gamma must be in (0, 1), got {self.gamma}")
        if self.lr_decay == "step" and not (self.decay_epochs is not None and self.decay_epochs > 0):
            raise ValueError(f"lr_decay step needs decay_epochs > 0, got {self.decay_epochs}")
        if self.lr_decay == "cosine" and not (self.horizon_epochs is not None
                                              and self.warmup_epochs < self.horizon_epochs < math.inf):
            raise ValueError(f"lr_decay cosine needs horizon_epochs (spec.stop.maxEpochs) finite and above "
                             f"warmup_epochs {self.warmup_epochs:g}, got {self.horizon_epochs}")

    def replace(self, **changes: Any) -> OptimizerConfig:
        return OptimizerConfig(**{**asdict(self), **changes})

    def lr_at(self, epoch: float) -> float:
        """The learning rate at a 1-based, fractional `epoch`: 1 is the start of training, 2.5 halfway through the
        second pass over the training batches. A worker passes the job's progress halfway through the step's
        mini-batch (`mlless.data.feed.Schedule.progress`), so the rate follows the step, and its integer part is
        the epoch the batch belongs to.

        The rate rises linearly from 0 over `warmup_epochs`, times the decay: none; lr/√⌊epoch⌋ (the papers' LR
        schedule); cosine, ½(1 + cos(π·s)) with s the fraction of the epochs from the warm-up's end to
        `horizon_epochs` behind (0 from the horizon on); step, gamma^⌊(epochs since the warm-up's end) /
        decay_epochs⌋. The one place the rate is computed.
        """
        done = max(0.0, float(epoch) - 1.0)  # passes over the training batches before this point
        after = max(0.0, done - self.warmup_epochs)
        rate = self.learning_rate
        if self.lr_decay == "sqrt-epoch":
            rate /= math.sqrt(max(1, math.floor(epoch)))
        elif self.lr_decay == "cosine":
            assert self.horizon_epochs is not None  # __post_init__
            rate *= 0.5 * (1.0 + math.cos(math.pi * min(1.0, after / (self.horizon_epochs - self.warmup_epochs))))
        elif self.lr_decay == "step":
            assert self.decay_epochs is not None  # __post_init__
            rate *= self.gamma ** math.floor(after / self.decay_epochs)
        if done < self.warmup_epochs:
            rate *= done / self.warmup_epochs
        return rate


def default_optimizer(model: str, workers: int = 1, kind: str | None = None) -> OptimizerConfig:
    """The optimizer of a job of `workers` workers that names none, or names only its type `kind`: its model type's
    (`ModelType.optimizer`, chosen by seconds to a target validation loss), or for another type, that type's
    `TYPE_LEARNING_RATES`."""
    defaults = model_type(model).optimizer
    if kind is None or kind == defaults.type:
        return OptimizerConfig(**defaults.fields(workers))
    return OptimizerConfig(type=kind, learning_rate=TYPE_LEARNING_RATES[kind])


def default_l2(model: str, optimizer: str) -> float | None:
    """spec.model.l2 of a job that sets none: `ADAMW_WEIGHT_DECAY` under adamw, for a model whose l2 is decoupled
    weight decay (`ModelType.l2_in_loss`); else None, the model's own default (`Model.weight_decay`)."""
    return ADAMW_WEIGHT_DECAY if optimizer == "adamw" and not model_type(model).l2_in_loss else None


@dataclass(frozen=True)
class SyncConfig:
    """How replicas exchange updates. A job's `significance_threshold` comes from `default_sync`; the value
    here serves a bare `SyncConfig(...)` in library use."""

    protocol: str = "isp"
    significance_threshold: float = PAPERS_V
    slack: int = default("sync.slack")
    local_steps: int = default("sync.localSteps")
    rho: float = default("sync.rho")
    exchange: str = default("sync.exchange")
    aggregation: str = default("sync.aggregation")
    trim: float = default("sync.trim")
    norm_threshold: float = default("sync.normThreshold")
    norm_scope: str = default("sync.normScope")
    precision: str = default("sync.precision")


def default_sync(model: str) -> SyncConfig:
    """The protocol and ISP's threshold of a job of this model type that names none (`ModelType`)."""
    kind = model_type(model)
    return SyncConfig(protocol=kind.protocol, significance_threshold=kind.significance_threshold)


@dataclass(frozen=True)
class StopConfig:
    target_loss: float | None = None
    target_steps: int = default("stop.targetSteps")
    max_steps: int | None = None
    max_epochs: float | None = None
    max_seconds: float | None = None
    budget_usd: float | None = None
    patience: int = default("stop.patience")  # evaluations; 0: off
    min_delta: float = default("stop.minDelta")

    def has_length_limit(self) -> bool:
        """A step, epoch or seconds limit: the user said how long to train."""
        return any(v is not None for v in (self.max_steps, self.max_epochs, self.max_seconds))


@dataclass(frozen=True)
class PricingConfig:
    """Prices for the cost estimate; the defaults are the papers' IBM Cloud prices (2021)."""

    function_memory_gb: float = default("pricing.functionMemoryGB")
    price_per_gb_second: float = default("pricing.pricePerGBSecond")
    billing_granularity_seconds: float = default("pricing.billingGranularitySeconds")
    redis_per_hour: float = default("pricing.redisPerHour")
    rabbitmq_per_hour: float = default("pricing.rabbitmqPerHour")
    vm_per_hour: float | None = None


@dataclass(frozen=True)
class KneeConfig:
    """How the auto-tuner finds the knee of the loss curve.

    method: "slope" (the papers') | "kneedle" (pluggable alternative).
    span: EWMA span for both smoothings (the original's 20).
    slope: relative threshold; the knee is where the smoothed slope of the EWMA loss divided by the loss
        scale (the first smoothed loss) rises above −slope, i.e. the loss now drops by less than this
        fraction of its initial value per step. Default 1e−3, chosen on a recorded PMF/MovieLens run (4
        workers, tests/data/movielens_pmf_loss.json): there the smoothed relative slope is about −5e−4 ±
        3.5e−4 (noise) during the long slow descent, so thresholds ≤ 5e−4 fire on noise somewhere in it and
        the knee moves with ``stable_checks`` (1e−4: step 131 with 5 checks, step 601 with 10), while 1e−3
        lands on the elbow at step 59 (epoch 2.6) for stable_checks = 5, 10 and 20 alike. Note the unit is
        per *step*: a job with many tiny steps per epoch may want a smaller value.
    stable_checks: the candidate must hold for this many consecutive checks (the original's 5).
    """

    method: KneeMethod = default("autoscaler.knee.method")
    span: int = default("autoscaler.knee.span")
    slope: float = default("autoscaler.knee.slope")
    stable_checks: int = default("autoscaler.knee.stableChecks")

    def __post_init__(self) -> None:
        if self.method not in KNEE_METHODS:
            raise ValueError(f"knee method must be one of {KNEE_METHODS}, got {self.method!r}")
        if self.span < 1:
            raise ValueError(f"knee span must be >= 1, got {self.span}")
        if not (self.slope >= 0 and math.isfinite(self.slope)):
            raise ValueError(f"knee slope threshold must be a finite number >= 0, got {self.slope}")
        if self.stable_checks < 1:
            raise ValueError(f"knee stable_checks must be >= 1, got {self.stable_checks}")


@dataclass(frozen=True)
class TunerConfig:
    """Auto-tuner settings (the papers' values as defaults: interval 20 s, Δ = 10 s, S = 15 %)."""

    enabled: bool = default("autoscaler.enabled")
    interval_seconds: float = default("autoscaler.intervalSeconds")
    horizon_seconds: float = default("autoscaler.horizonSeconds")
    threshold: float = default("autoscaler.threshold")
    min_workers: int = default("autoscaler.minWorkers")
    knee: KneeConfig = field(default_factory=KneeConfig)

    def __post_init__(self) -> None:
        if not (self.interval_seconds > 0 and math.isfinite(self.interval_seconds)):
            raise ValueError(f"interval_seconds must be > 0, got {self.interval_seconds}")
        if not (self.horizon_seconds > 0 and math.isfinite(self.horizon_seconds)):
            raise ValueError(f"horizon_seconds must be > 0, got {self.horizon_seconds}")
        if not math.isfinite(self.threshold):
            raise ValueError(f"threshold must be finite, got {self.threshold}")
        if self.min_workers < 1:
            raise ValueError(f"min_workers must be >= 1, got {self.min_workers}")
