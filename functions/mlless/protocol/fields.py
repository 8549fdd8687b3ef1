"""Payload field types and the ``Message`` base every frame type derives from.

A message declares its payload as a table of ``(name, Field)`` pairs
(``Message.FIELDS``); ``Message`` packs the fields in table order, parses them
back, and validates each through its field type both when a message is built
and when it is decoded, so a sender cannot frame what a receiver would reject.
Messages whose payload is a variable set of arrays (updates, tensors) override
``_parts`` and ``_parse`` and use the same ``Reader``
(``mlless.protocol.framing``).
"""
from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from mlless.contract import STEP_PHASES
from mlless.protocol.framing import I4, U8, U16, U32, FrameError, FrameType, Reader, pack_text, register
from mlless.protocol.identity import SUPERVISOR

__all__ = [
    "I32_MAX",
    "U32_MAX",
    "Field",
    "Int",
    "Float",
    "Bool",
    "Flags",
    "Ranks",
    "Utf8",
    "Timings",
    "INT32",
    "INT64",
    "UINT64",
    "FLOAT64",
    "NONNEG_FLOAT64",
    "BOOL",
    "RANKS",
    "TIMINGS",
    "Message",
    "set_field",
]

I32_MAX = 2**31 - 1
I64_MAX = 2**63 - 1
U32_MAX = 2**32 - 1


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


def set_field(obj: object, name: str, value: object) -> None:
    """Normalise a field of a frozen dataclass in ``__post_init__``."""
    object.__setattr__(obj, name, value)


# --------------------------------------------------------------------------- field types


class Field(ABC):
    """How one payload field is validated, packed and parsed.

    ``check`` runs when a message is built (so also after parsing): it returns
    the normalised value or raises FrameError.  ``read`` only checks what the
    encoding itself can get wrong (lengths, byte values, utf-8).
    """

    @abstractmethod
    def check(self, name: str, value: Any) -> Any: ...

    @abstractmethod
    def pack(self, value: Any) -> bytes: ...

    @abstractmethod
    def read(self, r: Reader, name: str) -> Any: ...


class Int(Field):
    """An integer in ``[lo, hi]``, packed with the struct format ``fmt``."""

    def __init__(self, fmt: str, lo: int, hi: int) -> None:
        self.st, self.lo, self.hi = struct.Struct(fmt), lo, hi

    def check(self, name: str, value: Any) -> int:
        return _check_int(name, value, self.lo, self.hi)

    def pack(self, value: int) -> bytes:
        return self.st.pack(value)

    def read(self, r: Reader, name: str) -> int:
        return r.unpack(self.st)[0]


class Flags(Int):
    """A u32 bit set: unknown bits are rejected rather than ignored, so an older peer never silently skips a
    request it does not understand."""

    def __init__(self, known: int, what: str) -> None:
        super().__init__("<I", 0, U32_MAX)
        self.known, self.what = known, what

    def check(self, name: str, value: Any) -> int:
        flags = super().check(name, value)
        if flags & ~self.known:
            raise FrameError(f"unknown {self.what} flags 0x{flags:x}")
        return flags


class Float(Field):
    """A finite float64 (``nonneg``: also >= 0)."""

    _ST = struct.Struct("<d")

    def __init__(self, *, nonneg: bool = False) -> None:
        self.nonneg = nonneg

    def check(self, name: str, value: Any) -> float:
        return _check_float(name, value, nonneg=self.nonneg)

    def pack(self, value: float) -> bytes:
        return self._ST.pack(value)

    def read(self, r: Reader, name: str) -> float:
        return r.unpack(self._ST)[0]


class Bool(Field):
    """One byte, 0 or 1."""

    def check(self, name: str, value: Any) -> bool:
        return _check_bool(name, value)

    def pack(self, value: bool) -> bytes:
        return U8.pack(int(value))

    def read(self, r: Reader, name: str) -> bool:
        (b,) = r.unpack(U8)
        if b > 1:
            raise FrameError(f"{name} must be 0 or 1, got {b}")
        return bool(b)


class Ranks(Field):
    """Distinct worker ranks: a u32 count, then that many int32s."""

    def check(self, name: str, value: Any) -> tuple[int, ...]:
        try:
            t = tuple(value)
        except TypeError:
            raise FrameError(f"{name} must be a sequence of ranks") from None
        out = tuple(_check_int(f"{name}[]", x, 0, I32_MAX) for x in t)
        if len(set(out)) != len(out):
            raise FrameError(f"{name} has duplicate ranks: {out}")
        return out

    def pack(self, value: tuple[int, ...]) -> bytes:
        return U32.pack(len(value)) + np.asarray(value, dtype=I4).tobytes()

    def read(self, r: Reader, name: str) -> tuple[int, ...]:
        (n,) = r.unpack(U32)
        if 4 * n > r.left:
            raise FrameError(f"rank list of {n} entries exceeds the payload")
        return tuple(int(x) for x in r.array(I4, n))


class Utf8(Field):
    """Short text: u16 byte length + utf-8.  Longer than ``max_bytes`` is truncated when a message is built (a
    failing worker should never fail again while reporting) and rejected when one is decoded."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def check(self, name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise FrameError(f"{name} must be a str, got {type(value).__name__}")
        b = value.encode("utf-8")
        return value if len(b) <= self.max_bytes else b[: self.max_bytes].decode("utf-8", errors="ignore")

    def pack(self, value: str) -> bytes:
        return pack_text(value, U16)

    def read(self, r: Reader, name: str) -> str:
        return r.text(U16, name, self.max_bytes)


class Timings(Field):
    """Seconds per step phase (``STEP_PHASES``), each a non-negative float64."""

    _ST = struct.Struct(f"<{len(STEP_PHASES)}d")

    def check(self, name: str, value: Any) -> tuple[float, ...]:
        t = tuple(value)
        if len(t) != len(STEP_PHASES):
            raise FrameError(f"{name} must have {len(STEP_PHASES)} entries {STEP_PHASES}, got {len(t)}")
        return tuple(_check_float(f"{name}.{n}", v, nonneg=True) for n, v in zip(STEP_PHASES, t))

    def pack(self, value: tuple[float, ...]) -> bytes:
        return self._ST.pack(*value)

    def read(self, r: Reader, name: str) -> tuple[float, ...]:
        return r.unpack(self._ST)


#: The field types messages use; all integers are non-negative.
INT32 = Int("<i", 0, I32_MAX)
INT64 = Int("<q", 0, I64_MAX)
UINT64 = Int("<Q", 0, 2**64 - 1)
FLOAT64 = Float()
NONNEG_FLOAT64 = Float(nonneg=True)
BOOL = Bool()
RANKS = Ranks()
TIMINGS = Timings()


# --------------------------------------------------------------------------- messages


class Message:
    """Base of all frame payload types.  Subclasses are frozen dataclasses whose fields after ``sender`` and
    ``step`` are listed, in wire order, in ``FIELDS``."""

    TYPE: ClassVar[FrameType]
    #: Only bulk frames may be compressed; a compressed control frame is rejected.
    COMPRESSIBLE: ClassVar[bool] = False
    #: Only an Update's values may travel narrowed (`mlless.protocol.precision`).
    NARROWABLE: ClassVar[bool] = False
    #: Messages only the supervisor sends carry sender SUPERVISOR; worker messages a rank >= 0.
    FROM_SUPERVISOR: ClassVar[bool] = False
    #: The payload: (field name, field type) in wire order.
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = ()

    sender: int
    step: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "TYPE" in cls.__dict__:
            register(cls)

    def __post_init__(self) -> None:
        if self.FROM_SUPERVISOR:
            sender = _check_int("sender", self.sender, SUPERVISOR, SUPERVISOR)
        else:
            sender = _check_int("sender", self.sender, 0, I32_MAX)
        set_field(self, "sender", sender)
        set_field(self, "step", _check_int("step", self.step, 0, I64_MAX))
        for name, ftype in self.FIELDS:
            set_field(self, name, ftype.check(name, getattr(self, name)))

    def _parts(self) -> list[bytes | memoryview]:
        """The payload in pieces; bulk messages return their arrays' buffers, which `encode` copies once."""
        return [b"".join(ftype.pack(getattr(self, name)) for name, ftype in self.FIELDS)]

    def _flags(self) -> int:
        """The header flags its payload's layout sets: an Update's precision; none by default."""
        return 0

    @classmethod
    def _parse(cls, sender: int, step: int, r: Reader, size: int | None, flags: int = 0) -> "Message":
        """Build the message from its payload; ``size`` is the model size ``decode`` was given, if any, and
        ``flags`` the header's."""
        values = [ftype.read(r, name) for name, ftype in cls.FIELDS]
        r.end()
        return cls(sender, step, *values)  # type: ignore[call-arg]
