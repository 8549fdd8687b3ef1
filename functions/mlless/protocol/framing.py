"""Framing of everything mlless sends between processes: the header, the byte primitives, encode and decode.

Nothing is ever pickled: the original MLLess pickled tuples into RabbitMQ
bodies and Redis values, so any peer able to write a message could run code in
every worker.  Here a frame is a fixed little-endian header followed by a
payload whose layout is fixed by the frame type (``mlless.protocol.messages``,
built from the field types of ``mlless.protocol.fields``).

Header (``HEADER``, 26 bytes)::

    magic    3s   b"MLs"
    version  u8   3 (1 listed every update index; 2 sends runs of them, `mlless.protocol.index_runs`; 3 adds the
                  report's staleness)
    type     u8   FrameType
    flags    u8   bit0 = payload is zlib-compressed; bit1 = sealed, no checksum (crc32 is 0); bits 2-3 = the
                  precision code of an Update's values (`mlless.protocol.precision`: 0 float32, 1 float16,
                  2 bfloat16; 0 for every other frame type); other bits must be 0
    sender   i32  worker rank, or SUPERVISOR (-1, `mlless.protocol.identity`) for the supervisor
    step     i64  training step the message belongs to (>= 0)
    length   u32  payload length in bytes, as it appears on the wire
    crc32    u32  zlib.crc32 of the on-wire payload (0 with the sealed flag)

Each message class registers its frame type here when it is defined
(``register``), so ``decode`` knows which class parses a payload.  The
little-endian primitives and the ``Reader`` are shared with the embedded
broker's requests (``mlless.transport.embedded_broker``).

``decode`` validates the whole frame before it returns: header, checksum,
exact payload length, array shapes, finiteness of floats, the allowed range of
every field, and (with ``size=``) the index range of updates.  Anything wrong is
a ``FrameError`` and nothing else, so a receiver can count and drop a bad frame
without a corrupt update ever reaching a replica.

Decoded numpy arrays are fresh, aligned, writable copies: the caller owns them.

Frames cross processes sealed (``mlless.protocol.sealing``); ``decode`` takes
what ``unseal`` hands back, and only a ``Verified`` frame may lack its checksum.
A ``Verified`` frame decodes only if its signer may speak as its header's sender
(a worker as its own rank, the supervisor as -1).
"""
from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from mlless.protocol.identity import describe, speaks_for
from mlless.protocol.sealing import Rejected, Verified

__all__ = [
    "MAGIC",
    "VERSION",
    "HEADER",
    "MAX_RANK",
    "FLAG_COMPRESSED",
    "FLAG_SEALED",
    "PRECISION_MASK",
    "PRECISION_SHIFT",
    "MAX_PAYLOAD",
    "U8",
    "U16",
    "U32",
    "I4",
    "FrameError",
    "FrameType",
    "Header",
    "Reader",
    "pack_text",
    "pack_blob",
    "register",
    "encode",
    "decode",
    "peek_header",
]

MAGIC = b"MLs"
VERSION = 3
HEADER = struct.Struct("<3sBBBiqII")
#: The largest worker rank the header's i32 sender holds.
MAX_RANK = 2**31 - 1
FLAG_COMPRESSED = 0x01
FLAG_SEALED = 0x02
#: Bits 2-3 of the flags: the precision code of a frame's float values, for a type that may narrow them
#: (`NARROWABLE`, an Update: `mlless.protocol.precision`). float32 frames are as before the field existed.
PRECISION_SHIFT = 2
PRECISION_MASK = 0x03 << PRECISION_SHIFT
_KNOWN_FLAGS = FLAG_COMPRESSED | FLAG_SEALED | PRECISION_MASK

#: Upper bound on a decompressed payload; a hostile or corrupt frame cannot make
#: the receiver allocate more than this (zip-bomb guard).
MAX_PAYLOAD = 1 << 30

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

    @property
    def precision(self) -> int:
        """The precision code of the payload's float values (0: float32)."""
        return (self.flags & PRECISION_MASK) >> PRECISION_SHIFT


# --------------------------------------------------------------------------- primitives


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


# --------------------------------------------------------------------------- the frame-type registry

#: Every message class by its frame type; a class registers itself when it is defined.
class Message(Protocol):
    """What framing needs of a frame's payload type (`mlless.protocol.fields.Message`, whose subclasses register
    here): its type and whether it may be compressed, its sender and step, and its payload both ways."""

    TYPE: ClassVar[FrameType]
    COMPRESSIBLE: ClassVar[bool]
    #: Whether its float values may travel in a narrower precision, which the header's flags then say.
    NARROWABLE: ClassVar[bool]
    sender: int
    step: int

    def _parts(self) -> list[bytes | memoryview]: ...

    def _flags(self) -> int: ...

    @classmethod
    def _parse(cls, sender: int, step: int, r: Reader, size: int | None, flags: int = 0) -> Message: ...


_TYPES: dict[int, type[Message]] = {}


def register(cls: type[Message]) -> None:
    """Make ``cls`` the class that frames and parses its ``TYPE``; one class per frame type."""
    if cls.TYPE in _TYPES:
        raise TypeError(f"frame type {cls.TYPE!r} is taken by {_TYPES[cls.TYPE].__name__}")
    _TYPES[cls.TYPE] = cls


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
    flags = msg._flags()
    if cls.COMPRESSIBLE and compress:
        packed = zlib.compress(b"".join(parts), 1)
        if len(packed) < length:
            parts, length, flags = [packed], len(packed), flags | FLAG_COMPRESSED
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
    if flags & PRECISION_MASK and not _TYPES[ftype].NARROWABLE:
        raise FrameError(f"frame type {FrameType(ftype).name} carries float32 values only")
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
    if isinstance(data, Verified):
        if not speaks_for(data.signer, h.sender):
            raise FrameError(f"frame from sender {h.sender} was sealed by {describe(data.signer)}: forged")
    else:
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
        return cls._parse(h.sender, h.step, Reader(payload), size, h.flags)
    except FrameError as exc:
        raise FrameError(f"{cls.__name__} frame from sender {h.sender} step {h.step}: {exc}") from None
    except (ValueError, TypeError, OverflowError, MemoryError, struct.error) as exc:  # defensive: never leak others
        raise FrameError(f"{cls.__name__} frame: {type(exc).__name__}: {exc}") from None

