"""The frame types mlless processes exchange; ``mlless.protocol.framing`` frames them.

Control messages are declared by their field table (``FIELDS``) alone.  The
two bulk messages carry arrays of a length only known at run time, so they pack
and parse their payloads themselves, with the framing's ``Reader``.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

import numpy as np

from mlless.protocol.fields import (
    BOOL,
    FLOAT64,
    I32_MAX,
    INT32,
    INT64,
    NONNEG_FLOAT64,
    RANKS,
    TIMINGS,
    UINT64,
    U32_MAX,
    Field,
    Flags,
    Message,
    Utf8,
    set_field,
)
from mlless.protocol.framing import (
    I4, PRECISION_MASK, PRECISION_SHIFT, U8, U32, FrameError, FrameType, Reader, pack_text,
)
from mlless.protocol.index_runs import COUNTS, pack_indices, read_indices
from mlless.protocol.precision import BY_CODE, FLOAT32, precision

__all__ = [
    "MAX_REASON_BYTES",
    "MAX_MAGNITUDE",
    "check_bounded",
    "CLOSE_SNAPSHOT",
    "CLOSE_FINAL",
    "Update",
    "Tensors",
    "Hello",
    "Report",
    "Close",
    "Leave",
    "Left",
    "Finish",
    "Takeover",
    "Done",
    "Failed",
]

#: Failure reasons are short, human-readable strings; longer ones are truncated
#: at encode time and rejected at decode time.
MAX_REASON_BYTES = 1024
#: ``Close.flags`` bit 0: the first live worker writes a replica snapshot.
CLOSE_SNAPSHOT = 0x01
#: ``Close.flags`` bit 1: this is the last step; workers apply it, then finish.
CLOSE_FINAL = 0x02
#: Bounds on Tensors frames; generous, but they stop absurd counts early.
_MAX_TENSORS = 65535
_MAX_NDIM = 32

_I32_MIN = -(2**31)
_F4 = np.dtype("<f4")


#: Largest magnitude of a model value a frame may carry: an update's values and a replica's parameters.  The
#: models predict ratings (PMF: a sum of k products of factors, which settle near sqrt(rating / k), below 2) or
#: click probabilities (LR: a sigmoid, saturated in float32 beyond |w.x| ~ 88), so trained values stay below a
#: few tens.  Within 1e6, a PMF prediction is at most k * 1e12 and its squared error finite in float32 for any
#: rank k < 1e7, so no accepted frame can by itself make a replica's loss overflow; 1e30, say, does at the first
#: square.  Optimizer state is not bounded, only finite: AdaGrad's accumulators sum squared gradients over the
#: whole job.
MAX_MAGNITUDE = 1e6


def _check_array_finite(name: str, arr: np.ndarray) -> None:
    if arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
        raise FrameError(f"{name} contains NaN or inf")


def check_bounded(name: str, arr: np.ndarray) -> None:
    """FrameError unless every value of the float array ``arr`` is finite and within ``MAX_MAGNITUDE``: min and max
    are two reductions without a temporary, and NaN propagates through both."""
    if not arr.size:
        return
    lo, hi = float(arr.min()), float(arr.max())
    if -MAX_MAGNITUDE <= lo and hi <= MAX_MAGNITUDE:
        return
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise FrameError(f"{name} contains NaN or inf")
    raise FrameError(f"{name} reach {hi if hi > -lo else lo:.7g}, beyond the bound of +-{MAX_MAGNITUDE:g}")


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


# --------------------------------------------------------------------------- bulk


@dataclass(frozen=True, eq=False)
class Update(Message):
    """A worker's significant update for one step: sparse (indices, values).

    Payload: the indices as runs or listed (``mlless.protocol.index_runs``), then ``n`` values (finite, within
    ``MAX_MAGNITUDE``) in its ``precision`` (``mlless.protocol.precision``, which the header's flags name): float32,
    or float16 or bfloat16 at 2 bytes each. ``values`` are always float32, rounded to what the precision carries,
    so an update equals its decoded frame.  Indices are never negative; with ``decode(..., size=N)`` they must also
    be < N and unique, which is what a receiver applying the update into a replica of N parameters needs to trust.
    """

    TYPE: ClassVar[FrameType] = FrameType.UPDATE
    COMPRESSIBLE: ClassVar[bool] = True
    NARROWABLE: ClassVar[bool] = True

    sender: int
    step: int
    indices: np.ndarray
    values: np.ndarray
    precision: str = FLOAT32.name

    def __post_init__(self) -> None:
        super().__post_init__()
        idx = np.asarray(self.indices)
        val = np.asarray(self.values)
        if idx.ndim != 1 or val.ndim != 1:
            raise FrameError(f"indices and values must be 1-D, got shapes {idx.shape} and {val.shape}")
        if idx.shape != val.shape:
            raise FrameError(f"indices ({idx.size}) and values ({val.size}) differ in length")
        if idx.size > U32_MAX:
            raise FrameError("too many entries for one update")
        if idx.size and idx.dtype.kind not in "iu":
            raise FrameError(f"indices must be integers, got {idx.dtype}")
        if idx.size and val.dtype.kind not in "fiu":
            raise FrameError(f"values must be numeric, got {val.dtype}")
        if idx.dtype != I4:
            if idx.size and (int(idx.min()) < _I32_MIN or int(idx.max()) > I32_MAX):
                raise FrameError("indices do not fit in int32")
            idx = idx.astype(I4)
        if val.dtype != _F4:
            with np.errstate(over="ignore", invalid="ignore"):
                val = val.astype(_F4)
        idx = np.ascontiguousarray(idx)
        val = np.ascontiguousarray(val)
        if idx.size and int(idx.min()) < 0:
            raise FrameError("negative index in update")
        check_bounded("values", val)
        set_field(self, "indices", idx)
        set_field(self, "values", precision(self.precision).rounded(val))

    def check_size(self, size: int) -> None:
        """Raise FrameError unless every index is in [0, size) and indices are unique."""
        idx = self.indices
        if idx.size == 0:
            return
        if int(idx.max()) >= size:
            raise FrameError(f"index {int(idx.max())} out of range for {size} parameters")
        if size <= 8 * idx.size:  # bitmap count is O(n + size): cheap when dense
            dup = int(np.bincount(idx, minlength=size).max()) > 1
        else:
            s = np.sort(idx)
            dup = bool((s[1:] == s[:-1]).any())
        if dup:
            raise FrameError("duplicate indices in update")

    def _parts(self) -> list[bytes | memoryview]:
        return [*pack_indices(self.indices), precision(self.precision).narrow(self.values).data]

    def _flags(self) -> int:
        return precision(self.precision).code << PRECISION_SHIFT

    @classmethod
    def _parse(cls, sender: int, step: int, r: Reader, size: int | None, flags: int = 0) -> "Update":
        code = (flags & PRECISION_MASK) >> PRECISION_SHIFT
        if code not in BY_CODE:
            raise FrameError(f"unknown precision code {code}")
        kind = BY_CODE[code]
        n, runs = r.unpack(COUNTS)
        idx = read_indices(r, n, runs, kind.wire.itemsize)
        val = kind.widen(r.array(kind.wire, n))
        r.end()
        msg = cls(sender, step, idx, val, kind.name)
        if size is not None:
            msg.check_size(size)
        return msg

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Update):
            return NotImplemented
        return (
            self.sender == other.sender
            and self.step == other.step
            and self.precision == other.precision
            and _arrays_equal(self.indices, other.indices)
            and _arrays_equal(self.values, other.values)
        )

    __hash__ = None  # type: ignore[assignment]


_DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype("<f4"),
    2: np.dtype("<f8"),
    3: np.dtype("<i4"),
    4: np.dtype("<i8"),
    5: np.dtype("u1"),
}
_CODE_OF: dict[str, int] = {dt.str: code for code, dt in _DTYPE_CODES.items()}
#: (kind, itemsize) -> the little-endian dtype it is framed as.
_CANONICAL: dict[tuple[str, int], np.dtype] = {(dt.kind, dt.itemsize): dt for dt in _DTYPE_CODES.values()}
_CODE_NDIM = struct.Struct("<BB")


@dataclass(frozen=True, eq=False)
class Tensors(Message):
    """Named dense arrays: a replica snapshot, a checkpoint (with optimizer state), a leaver's replica.

    Payload: count u32, then per array: name (u8 length + utf8), dtype code u8
    (1 f4, 2 f8, 3 i4, 4 i8, 5 u1), ndim u8, shape as u64s, raw C-order bytes.
    Float arrays must be finite.  The mapping keeps insertion order.
    """

    TYPE: ClassVar[FrameType] = FrameType.TENSORS
    COMPRESSIBLE: ClassVar[bool] = True

    sender: int
    step: int
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.arrays, Mapping):
            raise FrameError("arrays must be a mapping of name -> array")
        if len(self.arrays) > _MAX_TENSORS:
            raise FrameError(f"too many arrays ({len(self.arrays)})")
        out: dict[str, np.ndarray] = {}
        for name, arr in self.arrays.items():
            if not isinstance(name, str) or not name:
                raise FrameError(f"array name must be a non-empty str, got {name!r}")
            if len(name.encode("utf-8")) > 255:
                raise FrameError(f"array name too long: {name[:40]!r}...")
            a = np.asarray(arr)
            dt = _CANONICAL.get((a.dtype.kind, a.dtype.itemsize))
            if dt is None:
                raise FrameError(f"array {name!r}: dtype {a.dtype} not supported (f4, f8, i4, i8, u1)")
            if a.ndim > _MAX_NDIM:
                raise FrameError(f"array {name!r}: ndim {a.ndim} > {_MAX_NDIM}")
            a = np.ascontiguousarray(a, dtype=dt)
            _check_array_finite(f"array {name!r}", a)
            out[name] = a
        set_field(self, "arrays", out)

    def _parts(self) -> list[bytes | memoryview]:
        parts: list[bytes | memoryview] = [U32.pack(len(self.arrays))]
        for name, a in self.arrays.items():
            parts.append(pack_text(name, U8))
            parts.append(struct.pack(f"<BB{a.ndim}Q", _CODE_OF[a.dtype.str], a.ndim, *a.shape))
            parts.append(np.ascontiguousarray(a).data)
        return parts

    @classmethod
    def _parse(cls, sender: int, step: int, r: Reader, size: int | None, flags: int = 0) -> "Tensors":
        (count,) = r.unpack(U32)
        if count > _MAX_TENSORS:
            raise FrameError(f"too many arrays ({count})")
        arrays: dict[str, np.ndarray] = {}
        for _ in range(count):
            name = r.text(U8, "array name")
            if not name:
                raise FrameError("empty array name")
            if name in arrays:
                raise FrameError(f"duplicate array name {name!r}")
            code, ndim = r.unpack(_CODE_NDIM)
            if code not in _DTYPE_CODES:
                raise FrameError(f"array {name!r}: unknown dtype code {code}")
            if ndim > _MAX_NDIM:
                raise FrameError(f"array {name!r}: ndim {ndim} > {_MAX_NDIM}")
            shape = r.unpack(struct.Struct(f"<{ndim}Q")) if ndim else ()
            dt = _DTYPE_CODES[code]
            n = math.prod(shape)
            if n * dt.itemsize > r.left:
                raise FrameError(f"array {name!r}: shape {shape} needs more bytes than the payload holds")
            arrays[name] = r.array(dt, n).reshape(shape)
        r.end()
        return cls(sender, step, arrays)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tensors):
            return NotImplemented
        return (
            self.sender == other.sender
            and self.step == other.step
            and list(self.arrays) == list(other.arrays)
            and all(_arrays_equal(self.arrays[k], other.arrays[k]) for k in self.arrays)
        )

    __hash__ = None  # type: ignore[assignment]


# --------------------------------------------------------------------------- control


@dataclass(frozen=True)
class Hello(Message):
    """Worker → supervisor: the worker has started (or re-joined) and is listening."""

    TYPE: ClassVar[FrameType] = FrameType.HELLO
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = (("pid", INT64),)

    sender: int
    step: int
    pid: int


@dataclass(frozen=True)
class Report(Message):
    """Worker → supervisor once per step; doubles as the "announce" (``has_update``).

    ``timings`` are seconds spent in (fetch, compute, filter, write, wait, read,
    apply), see ``STEP_PHASES``. The barrier phases (wait, read, apply) and
    ``bytes_read`` (update frames read from the store) are those of the previous
    step's close, which comes after its report. ``staleness``: how many earlier
    steps' closes the replica had not applied when it trained this step (0
    under BSP; up to SSP's slack, or a round's steps under averaging and async).
    """

    TYPE: ClassVar[FrameType] = FrameType.REPORT
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = (
        ("loss_sum", FLOAT64),
        ("samples", INT64),
        ("has_update", BOOL),
        ("bytes_sent", INT64),
        ("entries_sent", INT64),
        ("entries_pending", INT64),
        ("timings", TIMINGS),
        ("bytes_read", INT64),
        ("staleness", INT64),
    )

    sender: int
    step: int
    loss_sum: float
    samples: int
    has_update: bool
    bytes_sent: int
    entries_sent: int
    entries_pending: int
    timings: tuple[float, ...]
    bytes_read: int = 0
    staleness: int = 0


@dataclass(frozen=True)
class Close(Message):
    """Supervisor → all workers: step closed.

    ``live`` are the ranks in the job from the next step on (a worker missing
    from it leaves; one new in it joins from a snapshot), ``updates`` the ranks
    whose update for this step each worker fetches, ``merges`` the ranks that
    left and whose unsent accumulated updates every worker adds in, ``cursor``
    the global mini-batch cursor for the next step; ``flags``: bit0
    ``CLOSE_SNAPSHOT``, bit1 ``CLOSE_FINAL``.
    """

    TYPE: ClassVar[FrameType] = FrameType.CLOSE
    FROM_SUPERVISOR: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = (
        ("cursor", INT64),
        ("flags", Flags(CLOSE_SNAPSHOT | CLOSE_FINAL, "Close")),
        ("live", RANKS),
        ("updates", RANKS),
        ("merges", RANKS),
    )

    sender: int
    step: int
    cursor: int
    flags: int
    live: tuple[int, ...]
    updates: tuple[int, ...]
    merges: tuple[int, ...] = ()


@dataclass(frozen=True)
class Leave(Message):
    """Supervisor → one worker: leave the job (scale-in)."""

    TYPE: ClassVar[FrameType] = FrameType.LEAVE
    FROM_SUPERVISOR: ClassVar[bool] = True
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = (("rank", INT32),)

    sender: int
    step: int
    rank: int


@dataclass(frozen=True)
class Left(Message):
    """Leaving worker → supervisor: gone; ``has_replica`` says its replica was written."""

    TYPE: ClassVar[FrameType] = FrameType.LEFT
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = (("has_replica", BOOL),)

    sender: int
    step: int
    has_replica: bool


@dataclass(frozen=True)
class Finish(Message):
    """Supervisor → all workers: write your final replica and stop."""

    TYPE: ClassVar[FrameType] = FrameType.FINISH
    FROM_SUPERVISOR: ClassVar[bool] = True

    sender: int
    step: int


@dataclass(frozen=True)
class Takeover(Message):
    """A new supervisor → all workers: it took over the job (runtime/supervisor/failover.py).

    A worker of the previous run writes its final replica, says done, and starts again (its process exits to be
    run again: a pod's container restarts); one that has not started training says hello again.
    """

    TYPE: ClassVar[FrameType] = FrameType.TAKEOVER
    FROM_SUPERVISOR: ClassVar[bool] = True

    sender: int
    step: int


@dataclass(frozen=True)
class Done(Message):
    """Worker → supervisor: final replica written after ``seconds`` of billed work.

    ``rejected_frames`` counts the inbound frames this worker refused, so the
    job's summary accounts for every malformed frame, not only the supervisor's;
    ``repaired_frames`` the peers' update frames the store lost that it read
    again once their senders had published them anew.
    """

    TYPE: ClassVar[FrameType] = FrameType.DONE
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = (
        ("seconds", NONNEG_FLOAT64), ("rejected_frames", UINT64), ("repaired_frames", UINT64),
    )

    sender: int
    step: int
    seconds: float
    rejected_frames: int = 0
    repaired_frames: int = 0


@dataclass(frozen=True)
class Failed(Message):
    """Worker → supervisor: the worker gave up; ``reason`` is short utf-8 text (at most ``MAX_REASON_BYTES``)."""

    TYPE: ClassVar[FrameType] = FrameType.FAILED
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = (("reason", Utf8(MAX_REASON_BYTES)),)

    sender: int
    step: int
    reason: str
