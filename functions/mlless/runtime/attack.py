"""Attack injection, a robustness-testing tool: one worker publishes corrupted updates (`mlless train --attack`).

`mlless train JOB --attack RANK=KIND` hands the attack to the local workers in their environment (`ENV_ATTACK`);
the worker of that rank then publishes, after every step, its update turned by KIND instead of the update itself,
sealed as any frame is (it holds the job's key: a Byzantine worker is an insider). KIND is one of:

* `sign-flip`: the update negated;
* `scale:FACTOR`: the update times FACTOR (`scale:-10` is a scaled sign flip);
* `gaussian:SIGMA`: Gaussian noise of standard deviation SIGMA on the entries the update carries.

The attacker's replica then holds what it published, as an honest replica holds its own update, so the replicas
stay consistent and any of them may serve the supervisor's evaluation. It exists to test the aggregation rules
(`spec.sync.aggregation`, docs/robustness.md); it is not part of a TrainingJob, and a worker running in a Kubernetes
pod refuses it, so it cannot reach a job the operator runs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from mlless.contract import ENV_ATTACK
from mlless.training.replica import StepResult

#: Set in every Kubernetes pod: a worker that sees it refuses an attack.
IN_A_POD = "KUBERNETES_SERVICE_HOST"
#: Each kind of attack: its values from the update's, given the kind's parameter and a random generator.
KINDS: dict[str, Callable[[np.ndarray, float, np.random.Generator], np.ndarray]] = {
    "sign-flip": lambda values, _, rng: -values,
    "scale": lambda values, factor, rng: values * factor,
    "gaussian": lambda values, sigma, rng: rng.normal(0.0, sigma, len(values)),
}
#: The kinds that take a parameter (KIND:VALUE).
PARAMETRISED = ("scale", "gaussian")
USAGE = "RANK=sign-flip, RANK=scale:FACTOR or RANK=gaussian:SIGMA"


@dataclass(frozen=True)
class Attack:
    rank: int
    kind: str
    parameter: float = 0.0

    def corrupt(self, result: StepResult, rng: np.random.Generator) -> StepResult:
        """`result` with its published values attacked; the worker's protocol half then holds them in place of the
        honest ones (`WorkerHalf.hold`)."""
        if not len(result.indices):
            return result
        values = KINDS[self.kind](result.values.astype(np.float64), self.parameter, rng).astype(np.float32)
        return dataclasses.replace(result, values=values)


def parse(text: str) -> Attack:
    """`RANK=KIND[:VALUE]` as an Attack; ValueError with one line saying what is wrong."""
    rank, _, spec = text.partition("=")
    kind, _, value = spec.partition(":")
    if not rank.strip().isdigit() or kind not in KINDS or bool(value) != (kind in PARAMETRISED):
        raise ValueError(f"--attack {text}: expected {USAGE}")
    try:
        parameter = float(value) if value else 0.0
    except ValueError:
        raise ValueError(f"--attack {text}: {value} is not a number") from None
    if not np.isfinite(parameter) or (kind == "gaussian" and parameter <= 0):
        raise ValueError(f"--attack {text}: {kind} needs a finite{' positive' if kind == 'gaussian' else ''} value")
    return Attack(int(rank), kind, parameter)


def from_env(env: Mapping[str, str], rank: int) -> Attack | None:
    """The attack this worker of `rank` makes, if `mlless train --attack` named it; ValueError in a pod."""
    text = env.get(ENV_ATTACK)
    if not text:
        return None
    if IN_A_POD in env:
        raise ValueError(f"{ENV_ATTACK} is set in a Kubernetes pod: attack injection is a local robustness-testing "
                         "tool (mlless train --attack), refused on the operator's path")
    attack = parse(text)
    return attack if attack.rank == rank else None


ATTACK_HELP = (f"robustness testing: the worker of rank RANK publishes attacked updates ({USAGE}), sealed like any "
               "frame, to see what spec.sync.aggregation withstands (docs/robustness.md); local runs only")


class AttackError(ValueError):
    """`--attack` names no attack this job can run."""


def checked_attack(text: str | None, workers: int) -> str | None:
    """`text` if it names an attack by a worker of a job of `workers`; AttackError (one line) otherwise."""
    if text is None:
        return None
    try:
        attack = parse(text)
    except ValueError as exc:
        raise AttackError(str(exc)) from None
    if attack.rank >= workers:
        raise AttackError(f"--attack {text}: the job's workers are ranks 0 to {workers - 1}")
    return text
