"""The precisions an update's values travel in (`spec.sync.precision`): float32, float16 or bfloat16.

An `Update` frame says its precision in its header (bits 2-3 of the flags, `framing.PRECISION_MASK`); its values
are 4 or 2 bytes each, and are widened back to float32 on receipt. A replica only ever holds float32: what a
narrow precision changes is which float32 values a frame can carry, those whose 16-bit form is exact (`rounded`).
A worker rounds what it publishes before anything else sees it (`sync/base.py`, `WorkerHalf.publish`), so every
replica, the sender's too, applies the same rounded values, and what rounding left out stays the sender's
pending update (a gradient's is dropped: `sync/protocols/gradients.py`). The partitions allreduce and scatter-reduce
merge travel in float32 (sync/exchanges/reduce.py says why).

float16 keeps 11 significant bits over ±65504, with gradual underflow below 6.1e-5 (its smallest value is
6e-8); bfloat16 keeps 8 significant bits over float32's range. A value beyond float16's range is refused, not
clipped: a gradient or an update that large means the training diverged, and a clipped one would hide that
(`Precision.rounded` raises a FrameError naming the value, which the worker turns into TrainingDiverged).

numpy has no bfloat16: it is the upper half of a float32, rounded to nearest, ties to even, as torch rounds it.

Measured on the digits (examples/digits-cnn.yaml: 151,306 parameters, P = 2, 30 epochs, 375 steps; seeds 0 and 1;
validation loss and accuracy of the model kept, on 200 images):

    gradient averaging   bytes/step    val. loss       accuracy       replica_spread
    float32              1,210,532     0.080 0.060     0.975 0.970    0
    float16                605,308     0.080 0.058     0.975 0.965    0
    bfloat16               605,308     0.080 0.061     0.975 0.970    0
    norm-isp 0.1 (seed 0)
    float32                117 k       0.070           0.980
    float16                 66 k       0.070           0.980
    bfloat16                60 k       0.065           0.975

A dense frame is its values but for 42 bytes (header, counts, one index run): half precision halves it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from mlless.contract import PRECISIONS
from mlless.protocol.framing import FrameError

_F4, _F2, _U2, _U4 = np.dtype("<f4"), np.dtype("<f2"), np.dtype("<u2"), np.dtype("<u4")


def _to_bfloat16(values: np.ndarray) -> np.ndarray:
    """The bfloat16 bits (uint16) of finite float32 `values`, rounded to nearest, ties to even."""
    bits = np.ascontiguousarray(values, _F4).view(_U4)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(_U2)


def _from_bfloat16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(_U4) << np.uint32(16)).view(_F4)


@dataclass(frozen=True)
class Precision:
    """One precision: its name (`spec.sync.precision`), its code in a frame's header, how its values are stored."""

    name: str
    code: int
    wire: np.dtype
    #: The largest magnitude it holds (float16's 65504); None: float32's, beyond any value a frame may carry.
    largest: float | None
    narrow: Callable[[np.ndarray], np.ndarray]
    widen: Callable[[np.ndarray], np.ndarray]

    @property
    def exact(self) -> bool:
        """Whether it carries float32 values as they are."""
        return self.wire == _F4

    def check_range(self, values: np.ndarray) -> None:
        """FrameError naming the largest value if one is beyond this precision's range."""
        if self.largest is not None and values.size:
            lo, hi = float(values.min()), float(values.max())
            if max(hi, -lo) > self.largest:
                raise FrameError(f"values reach {hi if hi > -lo else lo:.7g}, beyond {self.name}'s largest "
                                 f"{self.largest:g} (spec.sync.precision)")

    def rounded(self, values: np.ndarray) -> np.ndarray:
        """Finite float32 `values` as a frame of this precision carries them (float32 again); FrameError if one is
        beyond its range."""
        values = np.ascontiguousarray(values, _F4)
        if self.exact:
            return values
        self.check_range(values)
        return self.widen(self.narrow(values))


_ALL = (
    Precision("float32", 0, _F4, None, lambda v: np.ascontiguousarray(v, _F4), lambda w: w),
    Precision("float16", 1, _F2, float(np.finfo(np.float16).max), lambda v: v.astype(_F2), lambda w: w.astype(_F4)),
    Precision("bfloat16", 2, _U2, None, _to_bfloat16, _from_bfloat16),
)
#: Every precision by its name, `spec.sync.precision`'s values (`mlless.contract.PRECISIONS`).
BY_NAME: dict[str, Precision] = {p.name: p for p in _ALL}
#: ... and by its code in a frame's header.
BY_CODE: dict[int, Precision] = {p.code: p for p in _ALL}
FLOAT32 = BY_NAME["float32"]
assert tuple(BY_NAME) == PRECISIONS, "spec.sync.precision and the codecs name the same precisions"


def precision(name: str) -> Precision:
    """The precision called `name`; FrameError naming the known ones otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise FrameError(f"unknown precision {name!r} (known: {', '.join(BY_NAME)})") from None
