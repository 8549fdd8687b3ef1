"""A plugin (MLLESS_PLUGINS) that records the images a neural-net trains on and evaluates, for test_augment.py.

Loaded in every worker and in the supervisor (plugins load in every process of a job), it wraps `NeuralNet.gradient`
(a worker's training step) and `NeuralNet.evaluate` (the supervisor's evaluations): while AUGMENT_PROBE names a
folder, each call saves its batch's images and labels there as ROLE-PID-N.npz. Without it they run as they were.
"""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np

from mlless.training.models.network import NeuralNet

ENV = "AUGMENT_PROBE"
_calls = itertools.count()


def _recording(role: str, method):
    def wrapped(self, batch):
        folder = os.environ.get(ENV)
        if folder:
            np.savez(Path(folder) / f"{role}-{os.getpid()}-{next(_calls)}.npz", images=batch.images,
                     labels=batch.labels)
        return method(self, batch)
    wrapped.probed = True
    return wrapped


if not getattr(NeuralNet.gradient, "probed", False):  # loaded again in the same process: wrapped once
    NeuralNet.gradient = _recording("gradient", NeuralNet.gradient)
    NeuralNet.evaluate = _recording("evaluate", NeuralNet.evaluate)


def recorded(folder: Path, role: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (images, labels) each call of `role` recorded in `folder`."""
    out = []
    for path in sorted(folder.glob(f"{role}-*.npz")):
        with np.load(path) as f:
            out.append((f["images"], f["labels"]))
    return out
