"""The arrays inside replica and checkpoint frames: their names, and how they are assembled and read back.

A replica frame (a `messages.Tensors`) is what a worker publishes as a snapshot,
a final replica or a leaver's replica: the parameters, the unsent
accumulated entries of its significance filter and, under MLLESS_AUDIT, the
sum of every update it computed. Replicas of one job differ only by those
unsent entries (replica − pending is what every peer shares), which is why
the pending entries always travel beside the parameters.

A worker checkpoint adds the optimizer's state and where the worker stands
in the job; the job checkpoint a suspended job, or a supervisor's successor,
resumes from is a replica frame with no pending entries and the job's
position (a successor's also holds the best snapshot so far), and under a
protocol whose replicas step one optimizer state (`SyncStrategy.share_optimizer`)
that state too. Every producer and
reader of these frames goes through this module, so a name is written once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from mlless.protocol.messages import check_bounded

PARAMS = "params"
PENDING_INDICES = "pending_indices"
PENDING_VALUES = "pending_values"
#: Under MLLESS_AUDIT: the sum of every update the replica computed, for the conservation check.
CONTRIBUTION = "contribution"
#: A worker checkpoint's optimizer state: one array per state name, after this prefix.
OPTIMIZER_PREFIX = "optimizer."
#: Where a checkpoint stands in the job (see `WorkerPosition` and `JobPosition`).
POSITION = "position"
#: A worker checkpoint: the ranks of the last step-close the worker applied.
LIVE = "live"
#: A job checkpoint a successor supervisor resumes from: the best snapshot's parameters, and its step and loss.
BEST = "best"
BEST_SCORE = "best_score"

Arrays = Mapping[str, np.ndarray]


def no_pending() -> tuple[np.ndarray, np.ndarray]:
    """The pending entries of a replica that holds nothing back (empty int32 indices, float32 values)."""
    return np.zeros(0, np.int32), np.zeros(0, np.float32)


def replica_arrays(
    params: np.ndarray,
    pending: tuple[np.ndarray, np.ndarray],
    contribution: np.ndarray | None = None,
    optimizer_state: Arrays | None = None,
) -> dict[str, np.ndarray]:
    """A replica frame's arrays; with `optimizer_state`, enough to resume training exactly."""
    arrays = {PARAMS: params, PENDING_INDICES: pending[0], PENDING_VALUES: pending[1]}
    if contribution is not None:
        arrays[CONTRIBUTION] = contribution
    if optimizer_state is not None:
        arrays |= {OPTIMIZER_PREFIX + name: value for name, value in optimizer_state.items()}
    return arrays


def pending(arrays: Arrays) -> tuple[np.ndarray, np.ndarray]:
    """A replica's unsent entries (indices, values); ValueError if the frame lacks them."""
    indices, values = arrays.get(PENDING_INDICES), arrays.get(PENDING_VALUES)
    if indices is None or values is None:
        raise ValueError(f"expected a replica's unsent entries ({PENDING_INDICES!r}, {PENDING_VALUES!r})")
    return indices, values


def model_of(replicas: Sequence[Arrays]) -> np.ndarray:
    """The model the replicas of one job stand for: their shared part (a replica minus its pending entries),
    averaged, plus every replica's pending entries, which is what the shared state becomes once each replica has
    sent them: no update lost or counted twice, what a resumed job continues from. Averaging the replicas would
    count a pending entry 1/P times (blocked's home rows, only ever pending on their owner, would shrink by P)."""
    shared = np.zeros(replicas[0][PARAMS].shape, np.float64)
    unsent = np.zeros(replicas[0][PARAMS].shape, np.float64)
    for arrays in replicas:
        own = arrays[PARAMS].astype(np.float64)
        idx, val = pending(arrays)
        own[idx] -= val
        shared += own
        unsent[idx] += val  # a replica's pending entries never repeat an index
    return (shared / len(replicas) + unsent).astype(np.float32)


def mean_of(replicas: Sequence[Arrays]) -> np.ndarray:
    """The replicas' parameters averaged: each replica is a whole model, the shared state plus its own pending
    entries."""
    return np.mean([arrays[PARAMS] for arrays in replicas], axis=0, dtype=np.float64).astype(np.float32)


def optimizer_state(arrays: Arrays) -> dict[str, np.ndarray]:
    """The optimizer's state in a checkpoint's arrays (empty for a plain replica frame)."""
    return {k.removeprefix(OPTIMIZER_PREFIX): v for k, v in arrays.items() if k.startswith(OPTIMIZER_PREFIX)}


def check_params(arrays: Arrays, like: np.ndarray) -> np.ndarray:
    """The frame's parameters; ValueError unless they have the shape and dtype of the model's `like` and are within
    `messages.MAX_MAGNITUDE` (a FrameError, which is a ValueError)."""
    params = arrays.get(PARAMS)
    if params is None:
        raise ValueError(f"expected a replica (arrays with {PARAMS!r})")
    if params.shape != like.shape or params.dtype != like.dtype:
        raise ValueError(f"replica is {params.dtype}{params.shape}, the model is {like.dtype}{like.shape}")
    check_bounded(PARAMS, params)
    return params


@dataclass(frozen=True)
class WorkerPosition:
    """Where a worker checkpointed: its own step, and the last step-close it applied (closed, cursor, live)."""

    step: int
    closed: int
    cursor: int
    rejected_frames: int
    live: tuple[int, ...]

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            POSITION: np.array([self.step, self.closed, self.cursor, self.rejected_frames], np.int64),
            LIVE: np.array(self.live, np.int64),
        }

    @classmethod
    def read(cls, arrays: Arrays) -> WorkerPosition:
        """ValueError if the checkpoint lacks a well-formed position."""
        position, live = arrays.get(POSITION), arrays.get(LIVE)
        if position is None or position.shape != (4,) or live is None or live.ndim != 1:
            raise ValueError("the checkpoint lacks its position in the job")
        step, closed, cursor, rejected = (int(v) for v in position)
        return cls(step, closed, cursor, rejected, tuple(int(r) for r in live))


@dataclass(frozen=True)
class JobPosition:
    """Where a suspended job stands: the steps it has closed in all its runs, and its mini-batch cursor."""

    steps: int
    cursor: int

    def checkpoint_arrays(self, params: np.ndarray, optimizer_state: Arrays | None = None) -> dict[str, np.ndarray]:
        """The job checkpoint: the merged model, read by a worker like any replica (it has no unsent entries), with
        the `optimizer_state` its replicas share, if they share one."""
        return replica_arrays(params, no_pending(), optimizer_state=optimizer_state) | {
            POSITION: np.array([self.steps, self.cursor], np.int64)}

    @classmethod
    def read(cls, arrays: Arrays) -> JobPosition:
        """ValueError if the job checkpoint lacks a well-formed position."""
        position = arrays.get(POSITION)
        if position is None or position.shape != (2,):
            raise ValueError("the job checkpoint lacks its position")
        steps, cursor = (int(v) for v in position)
        return cls(steps, cursor)


def best_arrays(step: int, loss: float, params: np.ndarray) -> dict[str, np.ndarray]:
    """The best snapshot, as a job checkpoint carries it for a successor supervisor."""
    return {BEST: params, BEST_SCORE: np.array([step, loss], np.float64)}


def read_best(arrays: Arrays, like: np.ndarray) -> tuple[int, float, np.ndarray] | None:
    """(step, loss, params) of the best snapshot in a job checkpoint, None if it has none; ValueError if malformed."""
    params, score = arrays.get(BEST), arrays.get(BEST_SCORE)
    if params is None and score is None:
        return None
    if params is None or score is None or score.shape != (2,) or score[0] < 0 or score[0] != int(score[0]):
        raise ValueError("the job checkpoint's best snapshot is malformed")
    return int(score[0]), float(score[1]), check_params({PARAMS: params}, like)
