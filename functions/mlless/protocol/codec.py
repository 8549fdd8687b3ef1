"""Framing of everything mlless sends between processes: header, field types, encode and decode.

Nothing is ever pickled: the original MLLess pickled tuples into RabbitMQ
bodies and Redis values, so any peer able to write a message could run code in
every worker.  Here a frame is a fixed little-endian header followed by a
payload whose layout is fixed by the frame type (``mlless.protocol.messages``).

Header (``HEADER``, 26 bytes)::

    magic    3s   b"MLs"
    version  u8   1
    type     u8   FrameType
    flags    u8   bit0 = payload is zlib-compressed; bit1 = sealed, no checksum (crc32 is 0);
                  other bits must be 0
    sender   i32  worker rank, or -1 for the supervisor
    step     i64  training step the message belongs to (>= 0)
    length   u32  payload length in bytes, as it appears on the wire
    crc32    u32  zlib.crc32 of the on-wire payload (0 with the sealed flag)

A message declares its payload as a table of ``(name, Field)`` pairs
(``Message.FIELDS``); the codec packs the fields in table order, parses them
back, and validates each through its field type both when a message is built
and when it is decoded, so a sender cannot frame what a receiver would reject.
Messages whose payload is a variable set of arrays (updates, tensors) override
``_parts`` and ``_parse`` and use the same ``Reader``.

``decode`` validates the whole frame before it returns: header, checksum,
exact payload length, array shapes, finiteness of floats, the allowed range of
every field, and (with ``size=``) the index range of updates.  Anything wrong is
a ``FrameError`` and nothing else, so a receiver can count and drop a bad frame
without a corrupt update ever reaching a replica.

Decoded numpy arrays are fresh, aligned, writable copies: the caller owns them.

Sealing.  What crosses a process boundary is a *sealed* frame: the frame, then
``MAC_BYTES`` of HMAC-SHA256 (truncated) keyed with the job's key, over a
context string, a zero byte and the frame.  The transports seal what they write
and unseal what they read (``seal`` / ``unseal``), so a frame that no member of
the job wrote (no key, another job's key, or a valid frame moved to another
Redis key: the key name is the context) never reaches ``decode`` as a frame:
``unseal`` hands back a ``Rejected`` in its place, which ``decode`` turns into a
``FrameError`` with the reason.  The receiver therefore counts and drops it on
the same path as any malformed frame.  HMAC-SHA256 rather than keyed BLAKE2b:
OpenSSL's SHA-256 runs on the CPU's SHA extensions, 0.58 ms per MB against
keyed BLAKE2b's 1.1 on the 2-core development machine (Python 3.11, OpenSSL
3.0); sealing or unsealing a frame costs that plus a copy of it (0.02-0.09 ms
per MB), about twice what encoding or decoding it costs.

A verified MAC already proves what the checksum does, so ``decode`` skips the
checksum of a frame that ``unseal`` verified (a ``Verified``), and a sender that
knows its frame will travel sealed can leave the checksum out
(``encode(..., sealed=True)``): on a worker's update, the two CRC passes cost
half as much again as sealing it.  Such a frame decodes only as a ``Verified``,
so a frame read from anywhere else (a file) always has its checksum.
"""
from __future__ import annotations

import enum
import hmac
import math
import struct
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mlless.contract import STEP_PHASES

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER",
    "FLAG_COMPRESSED",
    "FLAG_SEALED",
    "MAX_PAYLOAD",
    "MAC_BYTES",
    "I32_MAX",
    "U32_MAX",
    "U8",
    "U16",
    "U32",
    "I4",
    "FrameError",
    "FrameType",
    "Header",
    "Reader",
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
    "pack_text",
    "pack_blob",
    "encode",
    "decode",
    "peek_header",
    "Rejected",
    "Verified",
    "seal",
    "unseal",
]

MAGIC = b"MLs"
VERSION = 1
HEADER = struct.Struct("<3sBBBiqII")
FLAG_COMPRESSED = 0x01
FLAG_SEALED = 0x02
_KNOWN_FLAGS = FLAG_COMPRESSED | FLAG_SEALED

#: Upper bound on a decompressed payload; a hostile or corrupt frame cannot make
#: the receiver allocate more than this (zip-bomb guard).
MAX_PAYLOAD = 1 << 30

I32_MAX = 2**31 - 1
I64_MAX = 2**63 - 1
U32_MAX = 2**32 - 1

# Little-endian primitives the messages and the embedded broker's requests are built from.
U8 = struct.Struct("<B")
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
I4 = np.dtype("<i4")


class FrameError(ValueError):
    """Bytes (a frame, a message about to be framed, an embedded broker request) are malformed; never partially
    trusted."""


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
    TAKEOVER = 24


@dataclass(frozen=True)
class Header:
    """The decoded fixed header of a frame (see the module docstring)."""

    type: int
    flags: int
    sender: int
    step: int
    length: int
    crc: int


# --------------------------------------------------------------------------- primitives


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


def pack_text(value: str, prefix: struct.Struct) -> bytes:
    """``value`` as utf-8 after its byte length in ``prefix``; the counterpart of ``Reader.text``."""
    return pack_blob(value.encode("utf-8"), prefix)


def pack_blob(value: bytes, prefix: struct.Struct) -> bytes:
    """``value`` after its length in ``prefix``; the counterpart of ``Reader.blob``."""
    try:
        return prefix.pack(len(value)) + value
    except struct.error:
        raise FrameError(f"{len(value)} bytes do not fit a {prefix.size}-byte length") from None


class Reader:
    """Bounds-checked cursor over a payload; every short read is a FrameError."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0

    @property
    def left(self) -> int:
        """Bytes not read yet."""
        return len(self.buf) - self.pos

    def take(self, n: int) -> memoryview:
        """The next `n` bytes, as a view: a frame's payload is copied once, by `array`, and nowhere else."""
        if n < 0 or n > self.left:
            raise FrameError(f"payload truncated: need {n} bytes at offset {self.pos}, have {self.left}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, st: struct.Struct) -> tuple:
        return st.unpack(self.take(st.size))

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        raw = self.take(count * dtype.itemsize)
        return np.frombuffer(raw, dtype=dtype, count=count).copy()

    def blob(self, prefix: struct.Struct) -> bytes:
        """Bytes written by ``pack_blob``."""
        (n,) = self.unpack(prefix)
        return self.take(n).tobytes()

    def text(self, prefix: struct.Struct, what: str, max_bytes: int | None = None) -> str:
        """A string written by ``pack_text``; longer than ``max_bytes`` is an error before it is read."""
        (n,) = self.unpack(prefix)
        if max_bytes is not None and n > max_bytes:
            raise FrameError(f"{what} of {n} bytes exceeds {max_bytes}")
        try:
            return self.take(n).tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FrameError(f"{what} is not utf-8: {exc}") from None

    def end(self) -> None:
        if self.left:
            raise FrameError(f"{self.left} unexpected trailing payload bytes")


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

#: Every message class by its frame type; a class registers itself when it is defined.
_TYPES: dict[int, type["Message"]] = {}


class Message:
    """Base of all frame payload types.  Subclasses are frozen dataclasses whose fields after ``sender`` and
    ``step`` are listed, in wire order, in ``FIELDS``."""

    TYPE: ClassVar[FrameType]
    #: Only bulk frames may be compressed; a compressed control frame is rejected.
    COMPRESSIBLE: ClassVar[bool] = False
    #: Messages only the supervisor sends carry sender -1; worker messages a rank >= 0.
    FROM_SUPERVISOR: ClassVar[bool] = False
    #: The payload: (field name, field type) in wire order.
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = ()

    sender: int
    step: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "TYPE" in cls.__dict__:
            if cls.TYPE in _TYPES:
                raise TypeError(f"frame type {cls.TYPE!r} is taken by {_TYPES[cls.TYPE].__name__}")
            _TYPES[cls.TYPE] = cls

    def __post_init__(self) -> None:
        if self.FROM_SUPERVISOR:
            sender = _check_int("sender", self.sender, -1, -1)
        else:
            sender = _check_int("sender", self.sender, 0, I32_MAX)
        set_field(self, "sender", sender)
        set_field(self, "step", _check_int("step", self.step, 0, I64_MAX))
        for name, ftype in self.FIELDS:
            set_field(self, name, ftype.check(name, getattr(self, name)))

    def _parts(self) -> list[bytes | memoryview]:
        """The payload in pieces; bulk messages return their arrays' buffers, which `encode` copies once."""
        return [b"".join(ftype.pack(getattr(self, name)) for name, ftype in self.FIELDS)]

    def _payload(self) -> bytes:
        return b"".join(self._parts())

    @classmethod
    def _parse(cls, sender: int, step: int, r: Reader, size: int | None) -> "Message":
        """Build the message from its payload; ``size`` is the model size ``decode`` was given, if any."""
        values = [ftype.read(r, name) for name, ftype in cls.FIELDS]
        r.end()
        return cls(sender, step, *values)  # type: ignore[call-arg]


# --------------------------------------------------------------------------- framing


def encode(msg: Message, *, compress: bool = False, sealed: bool = False) -> bytes:
    """Frame ``msg``.

    ``compress=True`` zlib-compresses a bulk frame (Update, Tensors) when that
    shrinks it. It is off by default: float updates shrink by about a third,
    and on a LAN the CPU time costs more step time than the bytes save.
    ``sealed=True`` leaves the checksum out, for a frame that only ever travels
    through a transport (which seals it); it then decodes only once unsealed.
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
    if sealed:
        flags |= FLAG_SEALED
    else:
        for part in parts:
            crc = zlib.crc32(part, crc)
    header = HEADER.pack(MAGIC, VERSION, cls.TYPE, flags, msg.sender, msg.step, length, crc)
    return b"".join([header, *parts])  # the one copy of the arrays' bytes


def peek_header(data: bytes) -> Header:
    """Parse and check the fixed header only (magic, version, type, flags, length)."""
    if isinstance(data, Rejected):
        raise FrameError(data.reason)
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


def _inflate(payload: bytes | memoryview) -> bytes:
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
    payload: bytes | memoryview = memoryview(data)[HEADER.size :]  # no copy: arrays are copied out of it once
    if not isinstance(data, Verified):
        if h.flags & FLAG_SEALED:
            raise FrameError("frame has no checksum and did not come through a transport that verified it")
        if zlib.crc32(payload) != h.crc:
            raise FrameError("payload crc32 mismatch")
    if h.flags & FLAG_COMPRESSED:
        payload = _inflate(payload)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise FrameError(f"size must be a non-negative int, got {size!r}")
    cls = _TYPES[h.type]
    try:
        return cls._parse(h.sender, h.step, Reader(payload), size)
    except FrameError as exc:
        raise FrameError(f"{cls.__name__} frame from sender {h.sender} step {h.step}: {exc}") from None
    except (ValueError, TypeError, OverflowError, MemoryError, struct.error) as exc:  # defensive: never leak others
        raise FrameError(f"{cls.__name__} frame: {type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------- sealing

#: Bytes of the MAC after a sealed frame: HMAC-SHA256 truncated to 128 bits, as RFC 2104 allows (at least half
#: the hash, and 80 bits); forging one takes 2**128 tries, each a write the receivers count.
MAC_BYTES = 16


class Rejected(bytes):
    """Stands in for a value or message whose MAC did not verify: empty bytes, so nothing can be read from it, and
    ``decode`` raises ``FrameError(reason)`` for it.  It never leaves the process that made it."""

    reason: str

    def __new__(cls, reason: str) -> "Rejected":
        obj = super().__new__(cls)
        obj.reason = reason
        return obj


class Verified(bytes):
    """A frame whose MAC ``unseal`` verified: nobody without the job key wrote it and no bit of it changed on the
    way, so ``decode`` need not check its checksum."""


def _mac(key: bytes, context: str, frame: bytes | memoryview) -> bytes:
    h = hmac.new(key, context.encode("utf-8") + b"\0", "sha256")
    h.update(frame)
    return h.digest()[:MAC_BYTES]


def seal(frame: bytes, key: bytes, context: str) -> bytes:
    """``frame`` followed by its MAC under ``key``; ``context`` (a Redis key's name, or the message channel) is
    authenticated with it, so the frame is valid nowhere else."""
    return frame + _mac(key, context, frame)


def unseal(sealed: bytes, key: bytes, context: str) -> bytes:
    """The frame inside ``sealed`` as a ``Verified`` if its MAC verifies under ``key`` and ``context``; otherwise a
    ``Rejected``."""
    view = memoryview(sealed)
    if len(view) < MAC_BYTES or not hmac.compare_digest(view[-MAC_BYTES:], _mac(key, context, view[:-MAC_BYTES])):
        return Rejected(f"{context}: bad or missing MAC: not written by a member of this job")
    return Verified(view[:-MAC_BYTES])
