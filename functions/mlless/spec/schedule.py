"""The learning-rate schedule's fields of `spec.optimizer`, and what they need of the rest of a job.

A schedule is a linear warm-up (`warmupEpochs`) followed by a decay (`lrDecay`): none, the papers' lr/sqrt(epoch),
cosine down to 0 at `spec.stop.maxEpochs`, or a drop by `gamma` every `decayEpochs`. `OptimizerConfig.lr_at`
(mlless/spec/config.py) is the one place the rate is computed. The schedule reads the job's progress in epochs, the
shared batch cursor over the batches of an epoch (mlless/data/feed.py, `Schedule.progress`), so the rate changes
every step, follows scale-in and scale-out (a step of P workers consumes P batches), and is where it was after a
resume: the cursor is part of every checkpoint. This module imports nothing of mlless but the schema's node
builders, so that the schema can read it.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

from mlless.spec.nodes import Schema, choice, number

#: `spec.optimizer.lrDecay`'s values.
DECAYS = ["none", "sqrt-epoch", "cosine", "step"]

FIELDS: dict[str, Schema] = {
    "lrDecay": choice("Learning-rate decay after the warm-up: none keeps the rate; sqrt-epoch divides it by "
                      "sqrt(epoch), as the papers do for LR; cosine lowers it along half a cosine to 0 at "
                      "spec.stop.maxEpochs (which it needs); step multiplies it by gamma every decayEpochs. The "
                      "rate is computed at every step, at the job's progress halfway through the step's "
                      "mini-batch (the epochs status.epoch counts), so warm-up and cosine change it each step.",
                      DECAYS),
    "warmupEpochs": number("Linear warm-up: the rate rises from 0 to learningRate over this many epochs (0.5: half "
                           "a pass over the training batches), then lrDecay applies; cosine and step count from "
                           "the warm-up's end.", 0, default=0.0),
    "decayEpochs": number("step: the epochs between two drops of the rate by gamma. Needed by lrDecay step.", 0,
                          exclusive=True),
    "gamma": number("step: the factor each drop multiplies the rate by.", 0, exclusive=True, below=1, default=0.1),
}

COSINE = "spec.optimizer.lrDecay: cosine needs spec.stop.maxEpochs, the epoch at which its rate reaches 0"
STEP = "spec.optimizer.lrDecay: step needs spec.optimizer.decayEpochs, the epochs between two drops"
WARMUP = "spec.optimizer.warmupEpochs must be below spec.stop.maxEpochs"


def _section(spec: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    node = spec.get(name)
    return node if isinstance(node, Mapping) else {}


def errors(spec: Mapping[str, Any]) -> Iterator[str]:
    """One line per schedule field of the parsed manifest's `spec` that the rest of the job cannot honour."""
    optimizer, stop = _section(spec, "optimizer"), _section(spec, "stop")
    decay, horizon, warmup = optimizer.get("lrDecay"), stop.get("maxEpochs"), optimizer.get("warmupEpochs", 0)
    if decay == "cosine" and horizon is None:
        yield COSINE
    if decay == "step" and "decayEpochs" not in optimizer:
        yield STEP
    if horizon is not None and warmup > 0 and warmup >= horizon:
        yield f"spec.optimizer.warmupEpochs: {warmup:g} is not below spec.stop.maxEpochs {horizon:g}"


def cel_rules() -> list[Schema]:
    """`errors` as the CRD's `x-kubernetes-validations` on the spec (CEL), for the API server."""
    def decay_is_not(value: str) -> str:
        return f"!has(self.optimizer) || !has(self.optimizer.lrDecay) || self.optimizer.lrDecay != '{value}'"
    return [
        {"rule": f"{decay_is_not('cosine')} || (has(self.stop) && has(self.stop.maxEpochs))", "message": COSINE},
        {"rule": f"{decay_is_not('step')} || has(self.optimizer.decayEpochs)", "message": STEP},
        {"rule": "!has(self.optimizer) || !has(self.optimizer.warmupEpochs) || !has(self.stop) || "
                 "!has(self.stop.maxEpochs) || self.optimizer.warmupEpochs == 0.0 || "
                 "self.optimizer.warmupEpochs < self.stop.maxEpochs", "message": WARMUP},
    ]
