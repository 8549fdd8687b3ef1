"""Binary, versioned, typed frames for everything mlless sends between processes.

Nothing is ever pickled (DESIGN.md §4): the original MLLess pickled tuples into
RabbitMQ bodies and Redis values, so any peer able to write a message could run
code in every worker.  Here a frame is a fixed little-endian header followed by
a payload whose layout is fixed by the frame type.

Header (``HEADER``, 26 bytes)::

    magic    3s   b"MLs"
    version  u8   1
    type     u8   FrameType
    flags    u8   bit0 = payload is zlib-compressed; other bits must be 0
    sender   i32  worker rank, or -1 for the supervisor
    step     i64  training step the message belongs to (>= 0)
    length   u32  payload length in bytes, as it appears on the wire
    crc32    u32  zlib.crc32 of the on-wire payload

``decode`` validates the whole frame before it returns: header, checksum,
exact payload length, array shapes, finiteness of floats, the allowed range of
every field, and (with ``size=``) the index range of updates.  Anything wrong is
a ``FrameError`` and nothing else, so a receiver can count and drop a bad frame
without a corrupt update ever reaching a replica.

Decoded numpy arrays are fresh, aligned, writable copies: the caller owns them.
"""
from __future__ import annotations

import enum
import math
import struct
import zlib
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

import numpy as np

from mlless.contract import STEP_PHASES

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER",
    "FLAG_COMPRESSED",
    "MAX_PAYLOAD",
    "MAX_REASON_BYTES",
    "CLOSE_SNAPSHOT",
    "CLOSE_FINAL",
    "FrameError",
    "FrameType",
    "Header",
    "Message",
    "Update",
    "Tensors",
    "Hello",
    "Report",
    "Close",
    "Leave",
    "Left",
    "Finish",
    "Done",
    "Failed",
    "encode",
    "decode",
    "peek_header",
]

MAGIC = b"MLs"
VERSION = 1
HEADER = struct.Struct("<3sBBBiqII")
FLAG_COMPRESSED = 0x01
_KNOWN_FLAGS = FLAG_COMPRESSED

#: Upper bound on a decompressed payload; a hostile or corrupt frame cannot make
#: the receiver allocate more than this (zip-bomb guard).
MAX_PAYLOAD = 1 << 30
#: Failure reasons are short, human-readable strings; longer ones are truncated
#: at encode time and rejected at decode time.
MAX_REASON_BYTES = 1024
#: ``Close.flags`` bit 0: the first live worker writes a replica snapshot.
CLOSE_SNAPSHOT = 0x01
#: ``Close.flags`` bit 1: this is the last step; workers apply it, then finish.
CLOSE_FINAL = 0x02
_KNOWN_CLOSE_FLAGS = CLOSE_SNAPSHOT | CLOSE_FINAL
#: Bounds on Tensors frames; generous, but they stop absurd counts early.
_MAX_TENSORS = 65535
_MAX_NDIM = 32


_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_U32_MAX = 2**32 - 1


class FrameError(ValueError):
    """A frame (or a message about to be framed) is malformed; never partially trusted."""


class FrameType(enum.IntEnum):
    """Frame type codes.  Data frames are < 16, control frames 16..; the rest is reserved."""

    UPDATE = 1
    TENSORS = 2
    HELLO = 16
    REPORT = 17
    CLOSE = 18
    LEAVE = 19
    LEFT = 20
    FINISH = 21
    DONE = 22
    FAILED = 23


@dataclass(frozen=True)
class Header:
    """The decoded fixed header of a frame (see the module docstring)."""

    type: int
    flags: int
    sender: int
    step: int
    length: int
    crc: int


# --------------------------------------------------------------------------- helpers


def _check_int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise FrameError(f"{name} must be an int, got {type(value).__name__}")
    v = int(value)
    if not lo <= v <= hi:
        raise FrameError(f"{name}={v} out of range [{lo}, {hi}]")
    return v


def _check_float(name: str, value: object, *, nonneg: bool = False) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise FrameError(f"{name} must be a float, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise FrameError(f"{name} is not finite: {v}")
    if nonneg and v < 0:
        raise FrameError(f"{name} must be >= 0, got {v}")
    return v


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise FrameError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _set(obj: object, name: str, value: object) -> None:
    """Normalise a field of a frozen dataclass in ``__post_init__``."""
    object.__setattr__(obj, name, value)


class _Reader:
    """Bounds-checked cursor over a payload; every short read is a FrameError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        """The next `n` bytes, as a view: a frame's payload is copied once, by `array`, and nowhere else."""
        if n < 0 or self.pos + n > len(self.buf):
            raise FrameError(f"payload truncated: need {n} bytes at offset {self.pos}, have {len(self.buf) - self.pos}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct) -> tuple:
        return st.unpack(self.take(st.size))

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        nbytes = count * dtype.itemsize
        raw = self.take(nbytes)
        return np.frombuffer(raw, dtype=dtype, count=count).copy()

    def end(self) -> None:
        if self.pos != len(self.buf):
            raise FrameError(f"{len(self.buf) - self.pos} unexpected trailing payload bytes")


_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

_I4 = np.dtype("<i4")
_F4 = np.dtype("<f4")


def _check_array_finite(name: str, arr: np.ndarray) -> None:
    if arr.dtype.kind == "f" and arr.size and not np.isfinite(arr).all():
        raise FrameError(f"{name} contains NaN or inf")


# --------------------------------------------------------------------------- messages


class Message:
    """Base of all frame payload types.  Subclasses are frozen dataclasses."""

    TYPE: ClassVar[FrameType]
    #: Only bulk frames may be compressed; a compressed control frame is rejected.
    COMPRESSIBLE: ClassVar[bool] = False
    #: Messages only the supervisor sends carry sender -1; worker messages a rank >= 0.
    FROM_SUPERVISOR: ClassVar[bool] = False

    sender: int
    step: int

    def _check_envelope(self) -> None:
        if self.FROM_SUPERVISOR:
            sender = _check_int("sender", self.sender, -1, -1)
        else:
            sender = _check_int("sender", self.sender, 0, _I32_MAX)
        _set(self, "sender", sender)
        _set(self, "step", _check_int("step", self.step, 0, _I64_MAX))

    # A message defines one of `_payload` (small ones) or `_parts` (bulk ones: their arrays' buffers, which
    # `encode` copies once, into the frame).
    def _payload(self) -> bytes:
        return b"".join(self._parts())

    def _parts(self) -> list[bytes | memoryview]:
        return [self._payload()]

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Message":  # pragma: no cover
        raise NotImplementedError


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


@dataclass(frozen=True, eq=False)
class Update(Message):
    """A worker's significant update for one step: sparse (indices, values).

    Payload: ``n`` u32, ``n`` int32 indices, ``n`` float32 values.  Indices are
    never negative; with ``decode(..., size=N)`` they must also be < N and
    unique, which is what a receiver applying the update into a replica of N
    parameters needs to trust.
    """

    TYPE: ClassVar[FrameType] = FrameType.UPDATE
    COMPRESSIBLE: ClassVar[bool] = True

    sender: int
    step: int
    indices: np.ndarray
    values: np.ndarray

    def __post_init__(self) -> None:
        self._check_envelope()
        idx = np.asarray(self.indices)
        val = np.asarray(self.values)
        if idx.ndim != 1 or val.ndim != 1:
            raise FrameError(f"indices and values must be 1-D, got shapes {idx.shape} and {val.shape}")
        if idx.shape != val.shape:
            raise FrameError(f"indices ({idx.size}) and values ({val.size}) differ in length")
        if idx.size > _U32_MAX:
            raise FrameError("too many entries for one update")
        if idx.size and idx.dtype.kind not in "iu":
            raise FrameError(f"indices must be integers, got {idx.dtype}")
        if idx.size and val.dtype.kind not in "fiu":
            raise FrameError(f"values must be numeric, got {val.dtype}")
        if idx.dtype != _I4:
            if idx.size and (int(idx.min()) < _I32_MIN or int(idx.max()) > _I32_MAX):
                raise FrameError("indices do not fit in int32")
            idx = idx.astype(_I4)
        if val.dtype != _F4:
            with np.errstate(over="ignore", invalid="ignore"):
                val = val.astype(_F4)
        idx = np.ascontiguousarray(idx)
        val = np.ascontiguousarray(val)
        if idx.size and int(idx.min()) < 0:
            raise FrameError("negative index in update")
        _check_array_finite("values", val)
        _set(self, "indices", idx)
        _set(self, "values", val)

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
        return [_U32.pack(self.indices.size), self.indices.data, self.values.data]

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Update":
        (n,) = r.unpack(_U32)
        if len(r.buf) - r.pos != 8 * n:
            raise FrameError(f"update payload holds {len(r.buf) - r.pos} bytes, expected {8 * n} for {n} entries")
        idx = r.array(_I4, n)
        val = r.array(_F4, n)
        r.end()
        msg = cls(sender, step, idx, val)
        if size is not None:
            msg.check_size(size)
        return msg

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Update):
            return NotImplemented
        return (
            self.sender == other.sender
            and self.step == other.step
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
        self._check_envelope()
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
        _set(self, "arrays", out)

    def _parts(self) -> list[bytes | memoryview]:
        parts: list[bytes | memoryview] = [_U32.pack(len(self.arrays))]
        for name, a in self.arrays.items():
            nb = name.encode("utf-8")
            parts.append(struct.pack(f"<B{len(nb)}sBB{a.ndim}Q", len(nb), nb, _CODE_OF[a.dtype.str], a.ndim, *a.shape))
            parts.append(np.ascontiguousarray(a).data)
        return parts

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Tensors":
        (count,) = r.unpack(_U32)
        if count > _MAX_TENSORS:
            raise FrameError(f"too many arrays ({count})")
        arrays: dict[str, np.ndarray] = {}
        for _ in range(count):
            (nlen,) = r.unpack(_U8)
            try:
                name = r.take(nlen).tobytes().decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FrameError(f"array name is not utf-8: {exc}") from None
            if not name:
                raise FrameError("empty array name")
            if name in arrays:
                raise FrameError(f"duplicate array name {name!r}")
            code, ndim = r.unpack(struct.Struct("<BB"))
            if code not in _DTYPE_CODES:
                raise FrameError(f"array {name!r}: unknown dtype code {code}")
            if ndim > _MAX_NDIM:
                raise FrameError(f"array {name!r}: ndim {ndim} > {_MAX_NDIM}")
            shape = r.unpack(struct.Struct(f"<{ndim}Q")) if ndim else ()
            dt = _DTYPE_CODES[code]
            n = math.prod(shape)
            if n * dt.itemsize > len(r.buf) - r.pos:
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


@dataclass(frozen=True)
class Hello(Message):
    """Worker → supervisor: the worker has started (or re-joined) and is listening."""

    TYPE: ClassVar[FrameType] = FrameType.HELLO
    _ST: ClassVar[struct.Struct] = struct.Struct("<q")

    sender: int
    step: int
    pid: int

    def __post_init__(self) -> None:
        self._check_envelope()
        _set(self, "pid", _check_int("pid", self.pid, 0, _I64_MAX))

    def _payload(self) -> bytes:
        return self._ST.pack(self.pid)

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Hello":
        (pid,) = r.unpack(cls._ST)
        r.end()
        return cls(sender, step, pid)


def _read_bool(r: _Reader, name: str) -> bool:
    (b,) = r.unpack(_U8)
    if b > 1:
        raise FrameError(f"{name} must be 0 or 1, got {b}")
    return bool(b)


@dataclass(frozen=True)
class Report(Message):
    """Worker → supervisor once per step; doubles as the "announce" (``has_update``).

    ``timings`` are seconds spent in (fetch, compute, filter, write, wait, read,
    apply), see ``STEP_PHASES``.
    """

    TYPE: ClassVar[FrameType] = FrameType.REPORT
    _ST: ClassVar[struct.Struct] = struct.Struct("<dqBqqq7d")

    sender: int
    step: int
    loss_sum: float
    samples: int
    has_update: bool
    bytes_sent: int
    entries_sent: int
    entries_pending: int
    timings: tuple[float, ...]

    def __post_init__(self) -> None:
        self._check_envelope()
        _set(self, "loss_sum", _check_float("loss_sum", self.loss_sum))
        for name in ("samples", "bytes_sent", "entries_sent", "entries_pending"):
            _set(self, name, _check_int(name, getattr(self, name), 0, _I64_MAX))
        _set(self, "has_update", _check_bool("has_update", self.has_update))
        t = tuple(self.timings)
        if len(t) != len(STEP_PHASES):
            raise FrameError(f"timings must have {len(STEP_PHASES)} entries {STEP_PHASES}, got {len(t)}")
        _set(self, "timings", tuple(_check_float(f"timings.{n}", v, nonneg=True) for n, v in zip(STEP_PHASES, t)))

    def _payload(self) -> bytes:
        return self._ST.pack(
            self.loss_sum,
            self.samples,
            int(self.has_update),
            self.bytes_sent,
            self.entries_sent,
            self.entries_pending,
            *self.timings,
        )

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Report":
        loss, samples, has, bsent, esent, epend, *timings = r.unpack(cls._ST)
        r.end()
        if has > 1:
            raise FrameError(f"has_update must be 0 or 1, got {has}")
        return cls(sender, step, loss, samples, bool(has), bsent, esent, epend, tuple(timings))


def _ranks(name: str, ranks: object) -> tuple[int, ...]:
    try:
        t = tuple(ranks)  # type: ignore[arg-type]
    except TypeError:
        raise FrameError(f"{name} must be a sequence of ranks") from None
    out = tuple(_check_int(f"{name}[]", x, 0, _I32_MAX) for x in t)
    if len(set(out)) != len(out):
        raise FrameError(f"{name} has duplicate ranks: {out}")
    return out


def _read_ranks(r: _Reader) -> tuple[int, ...]:
    (n,) = r.unpack(_U32)
    if 4 * n > len(r.buf) - r.pos:
        raise FrameError(f"rank list of {n} entries exceeds the payload")
    return tuple(int(x) for x in r.array(_I4, n))


@dataclass(frozen=True)
class Close(Message):
    """Supervisor → all workers: step closed.

    ``live`` are the ranks in the job from the next step on (a worker missing
    from it leaves; one new in it joins from a snapshot), ``updates`` the ranks
    whose update for this step each worker fetches, ``merges`` the ranks that
    left and whose unsent accumulated updates every worker adds in, ``cursor``
    the global mini-batch cursor for the next step; ``flags``: bit0
    ``CLOSE_SNAPSHOT``, bit1 ``CLOSE_FINAL``.  Unknown flag bits are
    rejected rather than ignored, so an older worker never silently skips a
    request it does not understand.
    """

    TYPE: ClassVar[FrameType] = FrameType.CLOSE
    FROM_SUPERVISOR: ClassVar[bool] = True
    _ST: ClassVar[struct.Struct] = struct.Struct("<qI")

    sender: int
    step: int
    cursor: int
    flags: int
    live: tuple[int, ...]
    updates: tuple[int, ...]
    merges: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self._check_envelope()
        _set(self, "cursor", _check_int("cursor", self.cursor, 0, _I64_MAX))
        flags = _check_int("flags", self.flags, 0, _U32_MAX)
        if flags & ~_KNOWN_CLOSE_FLAGS:
            raise FrameError(f"unknown Close flags 0x{flags:x}")
        _set(self, "flags", flags)
        _set(self, "live", _ranks("live", self.live))
        _set(self, "updates", _ranks("updates", self.updates))
        _set(self, "merges", _ranks("merges", self.merges))

    @property
    def snapshot(self) -> bool:
        return bool(self.flags & CLOSE_SNAPSHOT)

    @property
    def final(self) -> bool:
        return bool(self.flags & CLOSE_FINAL)

    def _payload(self) -> bytes:
        return b"".join(
            (
                self._ST.pack(self.cursor, self.flags),
                _U32.pack(len(self.live)),
                np.asarray(self.live, dtype=_I4).tobytes(),
                _U32.pack(len(self.updates)),
                np.asarray(self.updates, dtype=_I4).tobytes(),
                _U32.pack(len(self.merges)),
                np.asarray(self.merges, dtype=_I4).tobytes(),
            )
        )

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Close":
        cursor, flags = r.unpack(cls._ST)
        live = _read_ranks(r)
        updates = _read_ranks(r)
        merges = _read_ranks(r)
        r.end()
        return cls(sender, step, cursor, flags, live, updates, merges)


@dataclass(frozen=True)
class Leave(Message):
    """Supervisor → one worker: leave the job (scale-in)."""

    TYPE: ClassVar[FrameType] = FrameType.LEAVE
    FROM_SUPERVISOR: ClassVar[bool] = True
    _ST: ClassVar[struct.Struct] = struct.Struct("<i")

    sender: int
    step: int
    rank: int

    def __post_init__(self) -> None:
        self._check_envelope()
        _set(self, "rank", _check_int("rank", self.rank, 0, _I32_MAX))

    def _payload(self) -> bytes:
        return self._ST.pack(self.rank)

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Leave":
        (rank,) = r.unpack(cls._ST)
        r.end()
        return cls(sender, step, rank)


@dataclass(frozen=True)
class Left(Message):
    """Leaving worker → supervisor: gone; ``has_replica`` says its replica was written."""

    TYPE: ClassVar[FrameType] = FrameType.LEFT

    sender: int
    step: int
    has_replica: bool

    def __post_init__(self) -> None:
        self._check_envelope()
        _set(self, "has_replica", _check_bool("has_replica", self.has_replica))

    def _payload(self) -> bytes:
        return _U8.pack(int(self.has_replica))

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Left":
        has = _read_bool(r, "has_replica")
        r.end()
        return cls(sender, step, has)


@dataclass(frozen=True)
class Finish(Message):
    """Supervisor → all workers: write your final replica and stop."""

    TYPE: ClassVar[FrameType] = FrameType.FINISH
    FROM_SUPERVISOR: ClassVar[bool] = True

    sender: int
    step: int

    def __post_init__(self) -> None:
        self._check_envelope()

    def _payload(self) -> bytes:
        return b""

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Finish":
        r.end()
        return cls(sender, step)


@dataclass(frozen=True)
class Done(Message):
    """Worker → supervisor: final replica written after ``seconds`` of billed work.

    ``rejected_frames`` counts the inbound frames this worker refused, so the
    job's summary accounts for every malformed frame, not only the supervisor's.
    """

    TYPE: ClassVar[FrameType] = FrameType.DONE
    _ST: ClassVar[struct.Struct] = struct.Struct("<dQ")

    sender: int
    step: int
    seconds: float
    rejected_frames: int = 0

    def __post_init__(self) -> None:
        self._check_envelope()
        _set(self, "seconds", _check_float("seconds", self.seconds, nonneg=True))
        _set(self, "rejected_frames", _check_int("rejected_frames", self.rejected_frames, 0, 2**64 - 1))

    def _payload(self) -> bytes:
        return self._ST.pack(self.seconds, self.rejected_frames)

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Done":
        seconds, rejected = r.unpack(cls._ST)
        r.end()
        return cls(sender, step, seconds, rejected)


def _truncate_utf8(s: str, limit: int) -> str:
    b = s.encode("utf-8")
    if len(b) <= limit:
        return s
    return b[:limit].decode("utf-8", errors="ignore")


@dataclass(frozen=True)
class Failed(Message):
    """Worker → supervisor: the worker gave up; ``reason`` is short utf-8 text.

    Reasons longer than ``MAX_REASON_BYTES`` are truncated when the message is
    built (a failing worker should never fail again while reporting), and
    rejected when decoded.
    """

    TYPE: ClassVar[FrameType] = FrameType.FAILED

    sender: int
    step: int
    reason: str

    def __post_init__(self) -> None:
        self._check_envelope()
        if not isinstance(self.reason, str):
            raise FrameError(f"reason must be a str, got {type(self.reason).__name__}")
        _set(self, "reason", _truncate_utf8(self.reason, MAX_REASON_BYTES))

    def _payload(self) -> bytes:
        b = self.reason.encode("utf-8")
        return _U16.pack(len(b)) + b

    @classmethod
    def _parse(cls, sender: int, step: int, r: _Reader, size: int | None) -> "Failed":
        (n,) = r.unpack(_U16)
        if n > MAX_REASON_BYTES:
            raise FrameError(f"reason of {n} bytes exceeds {MAX_REASON_BYTES}")
        try:
            reason = r.take(n).tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FrameError(f"reason is not utf-8: {exc}") from None
        r.end()
        return cls(sender, step, reason)


_TYPES: dict[int, type[Message]] = {
    cls.TYPE: cls for cls in (Update, Tensors, Hello, Report, Close, Leave, Left, Finish, Done, Failed)
}


# --------------------------------------------------------------------------- framing


def encode(msg: Message, *, compress: bool = False) -> bytes:
    """Frame ``msg``.

    ``compress=True`` zlib-compresses a bulk frame (Update, Tensors) when that
    shrinks it. It is off by default: float updates shrink by about a third,
    and on a LAN the CPU time costs more step time than the bytes save.
    """
    cls = type(msg)
    if _TYPES.get(getattr(cls, "TYPE", -1)) is not cls:
        raise FrameError(f"not a wire message: {cls.__name__}")
    parts = msg._parts()
    length = sum(memoryview(p).nbytes for p in parts)
    if length > MAX_PAYLOAD:
        raise FrameError(f"payload of {length} bytes exceeds MAX_PAYLOAD")
    flags = 0
    if cls.COMPRESSIBLE and compress:
        packed = zlib.compress(b"".join(parts), 1)
        if len(packed) < length:
            parts, length, flags = [packed], len(packed), FLAG_COMPRESSED
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    header = HEADER.pack(MAGIC, VERSION, cls.TYPE, flags, msg.sender, msg.step, length, crc)
    return b"".join([header, *parts])  # the one copy of the arrays' bytes


def peek_header(data: bytes) -> Header:
    """Parse and check the fixed header only (magic, version, type, flags, length)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise FrameError(f"frame must be bytes, got {type(data).__name__}")
    if len(data) < HEADER.size:
        raise FrameError(f"frame truncated: {len(data)} bytes < header size {HEADER.size}")
    magic, version, ftype, flags, sender, step, length, crc = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}")
    if version != VERSION:
        raise FrameError(f"unsupported frame version {version} (this build speaks {VERSION})")
    if ftype not in _TYPES:
        raise FrameError(f"unknown frame type {ftype}")
    if flags & ~_KNOWN_FLAGS:
        raise FrameError(f"unknown header flags 0x{flags:x}")
    if flags & FLAG_COMPRESSED and not _TYPES[ftype].COMPRESSIBLE:
        raise FrameError(f"frame type {FrameType(ftype).name} may not be compressed")
    if len(data) - HEADER.size != length:
        raise FrameError(f"payload length mismatch: header says {length}, frame holds {len(data) - HEADER.size}")
    return Header(ftype, flags, sender, step, length, crc)


def _inflate(payload: bytes) -> bytes:
    d = zlib.decompressobj()
    try:
        out = d.decompress(payload, MAX_PAYLOAD + 1)
    except zlib.error as exc:
        raise FrameError(f"bad compressed payload: {exc}") from None
    if len(out) > MAX_PAYLOAD or d.unconsumed_tail:
        raise FrameError("decompressed payload exceeds MAX_PAYLOAD")
    if not d.eof or d.unused_data:
        raise FrameError("compressed payload is truncated or has trailing bytes")
    return out


def decode(data: bytes, *, size: int | None = None) -> Message:
    """Validate ``data`` completely and return the message it carries.

    ``size``: number of model parameters; when given, Update indices must be in
    ``[0, size)`` and unique.  Raises ``FrameError`` for anything malformed.
    """
    h = peek_header(data)
    payload = memoryview(data)[HEADER.size :]  # no copy: the arrays are copied out of it once
    if zlib.crc32(payload) != h.crc:
        raise FrameError("payload crc32 mismatch")
    if h.flags & FLAG_COMPRESSED:
        payload = _inflate(payload)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise FrameError(f"size must be a non-negative int, got {size!r}")
    cls = _TYPES[h.type]
    try:
        return cls._parse(h.sender, h.step, _Reader(payload), size)
    except FrameError as exc:
        raise FrameError(f"{cls.__name__} frame from sender {h.sender} step {h.step}: {exc}") from None
    except (ValueError, TypeError, OverflowError, MemoryError, struct.error) as exc:  # defensive: never leak others
        raise FrameError(f"{cls.__name__} frame: {type(exc).__name__}: {exc}") from None

