"""Which values of one TrainingJob field need which of another: a protocol a model's trait (`NEEDS`), an optimizer
the model types that train with it, gradient averaging a mini-batch optimizer. `mlless.spec.schema.pairing_errors`
checks a manifest against them, and `cel_rules` gives the API server the same checks as CEL rules."""
from __future__ import annotations

from typing import Iterable, Iterator

from mlless.spec import models, schedule, sync_fields
from mlless.spec.nodes import Schema

#: What a protocol needs of a model, as one of `ModelType.traits` (mlless.spec.models). `mlless validate` and
#: `mlless train` refuse a model without it (`pairing_errors`), and so does the API server, by the CEL rules
#: `cel_rules` puts in the spec's schema (CEL, which the CLI's JSON Schema validator ignores).
NEEDS: dict[str, str] = {
    # Blocks of users and items exist only in ratings data (sync/protocols/blocked.py).
    "blocked": "blocks",
    # Consensus ADMM needs a convex loss; PMF's is not (sync/protocols/admm.py).
    "admm": "convex",
    # Gradient averaging needs a model a mini-batch gradient trains; k-means moves by its own rule.
    "gradient-averaging": "gradients",
}
#: The protocols that publish a mini-batch gradient rather than an update (sync/protocols/gradients.py): the
#: optimizers that update per sample inside the batch (`PER_SAMPLE_OPTIMIZERS`) have none to publish.
MINI_BATCH_PROTOCOLS = ("gradient-averaging",)
#: The `spec.optimizer.type`s that update the replica after every sample of a mini-batch, with a kernel of the
#: model's (training/optim.py).
PER_SAMPLE_OPTIMIZERS = ("adagrad", "normalized")


#: `spec.optimizer.type`'s values; a model type may admit fewer (`ModelType.optimizers`).
OPTIMIZER_TYPES = ["adagrad", "normalized", "sgd", "momentum", "nesterov", "adam", "adamw"]


def pairings(types: Iterable[models.ModelType]) -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    """(field, value, other field, its admitted values): each protocol of `NEEDS`, and the `types` it admits; each
    optimizer type some of the `types` do not train with, and those that do."""
    types = tuple(types)
    for protocol, trait in NEEDS.items():
        yield "sync.protocol", protocol, "model.type", tuple(t.name for t in types if trait in t.traits)
    for kind in OPTIMIZER_TYPES:
        admitted = tuple(t.name for t in types if t.optimizers is None or kind in t.optimizers)
        if len(admitted) < len(types):
            yield "optimizer.type", kind, "model.type", admitted


def pairing_message(field: str, value: str, other: str, admitted: tuple[str, ...]) -> str:
    return f"spec.{field}: {value} needs spec.{other} {' or '.join(admitted)}"


def cel_rules() -> list[Schema]:
    """The built-in models' pairings, the schedule's needs (`schedule.errors`) and the precision's
    (`sync_fields.errors`) as the CRD's `x-kubernetes-validations` on the spec (CEL; Kubernetes 1.25+)."""
    rules = []
    for field, value, other, admitted in pairings(models.BUILT_IN):
        section, name = field.split(".")
        absent = f"!has(self.{section}) || !has(self.{field})"
        rules.append({"rule": f"{absent} || self.{field} != '{value}' || self.{other} in {list(admitted)}",
                      "message": pairing_message(field, value, other, admitted)})
    return rules + schedule.cel_rules() + sync_fields.cel_rules()
