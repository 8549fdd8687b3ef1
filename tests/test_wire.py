"""Wire frames: roundtrip of every type, and corruption always surfaces as FrameError."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlless.protocol import wire
from mlless.protocol.wire import (
    CLOSE_SNAPSHOT,
    HEADER,
    Close,
    Done,
    Failed,
    Finish,
    FrameError,
    Hello,
    Leave,
    Left,
    Report,
    Tensors,
    Update,
    decode,
    encode,
)

ranks = st.integers(0, 2**31 - 1)
steps = st.integers(0, 2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
i64 = st.integers(0, 2**63 - 1)
rank_lists = st.lists(ranks, max_size=20, unique=True).map(tuple)


@st.composite
def updates(draw: st.DrawFn) -> Update:
    n = draw(st.integers(0, 200))
    idx = draw(hnp.arrays(np.int32, n, elements=st.integers(0, 2**31 - 1), unique=True))
    val = draw(hnp.arrays(np.float32, n, elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
    return Update(draw(ranks), draw(steps), idx, val)


_dtypes = st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.uint8])


@st.composite
def tensors(draw: st.DrawFn) -> Tensors:
    names = draw(st.lists(st.text(min_size=1, max_size=20), max_size=5, unique=True))
    names = [n for n in names if len(n.encode()) <= 255]
    arrays = {}
    for name in names:
        dt = np.dtype(draw(_dtypes))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
        elems = st.floats(width=dt.itemsize * 8, allow_nan=False, allow_infinity=False) if dt.kind == "f" else None
        arrays[name] = draw(hnp.arrays(dt, shape, elements=elems))
    return Tensors(draw(ranks), draw(steps), arrays)


messages = st.one_of(
    updates(),
    tensors(),
    st.builds(Hello, ranks, steps, i64),
    st.builds(
        Report, ranks, steps, finite, i64, st.booleans(), i64, i64, i64, st.tuples(*[nonneg] * 7)
    ),
    st.builds(Close, st.just(-1), steps, i64, st.sampled_from([0, CLOSE_SNAPSHOT, wire.CLOSE_FINAL, CLOSE_SNAPSHOT | wire.CLOSE_FINAL]), rank_lists, rank_lists, rank_lists),
    st.builds(Leave, st.just(-1), steps, ranks),
    st.builds(Left, ranks, steps, st.booleans()),
    st.builds(Finish, st.just(-1), steps),
    st.builds(Done, ranks, steps, nonneg, st.integers(0, 2**64 - 1)),
    st.builds(Failed, ranks, steps, st.text(max_size=300)),
)


@given(messages, st.booleans())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_roundtrip_every_type(msg: wire.Message, compress: bool) -> None:
    frame = encode(msg, compress=compress)
    out = decode(frame)
    assert type(out) is type(msg)
    assert out == msg


@given(messages, st.data())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_bit_flip_is_frame_error(msg: wire.Message, data: st.DataObject) -> None:
    frame = bytearray(encode(msg, compress=data.draw(st.booleans())))
    pos = data.draw(st.integers(0, len(frame) - 1))
    bit = data.draw(st.integers(0, 7))
    frame[pos] ^= 1 << bit
    # Flipping a bit of sender/step still yields a consistent frame when the
    # new value is valid (they are not covered by the crc); everything else must fail.
    sender_step = range(6, 18)
    if pos in sender_step:
        try:
            out = decode(bytes(frame))
        except FrameError:
            return
        assert type(out) is type(msg)
        return
    with pytest.raises(FrameError):
        decode(bytes(frame))


@given(messages, st.data())
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_truncation_is_frame_error(msg: wire.Message, data: st.DataObject) -> None:
    frame = encode(msg)
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(FrameError):
        decode(frame[:cut])
    with pytest.raises(FrameError):
        decode(frame + b"\x00")


@given(st.binary(max_size=400))
@settings(max_examples=1000)
def test_random_bytes_never_crash(data: bytes) -> None:
    try:
        decode(data)
    except FrameError:
        pass


def _frame(ftype: int, payload: bytes, *, sender: int = 0, step: int = 0, flags: int = 0) -> bytes:
    """Hand-build a frame with a valid header and crc around an arbitrary payload."""
    return HEADER.pack(wire.MAGIC, wire.VERSION, ftype, flags, sender, step, len(payload), zlib.crc32(payload)) + payload


@given(st.sampled_from(list(wire.FrameType)), st.binary(max_size=300), st.integers(-1, 3))
@settings(max_examples=1500)
def test_random_payload_with_valid_crc_validates_or_fails_cleanly(ftype: int, payload: bytes, sender: int) -> None:
    """Valid envelope, garbage payload: the parser itself must reject, not crash."""
    try:
        msg = decode(_frame(ftype, payload, sender=sender))
    except FrameError:
        return
    # Anything that parses must re-encode to exactly the same bytes.
    assert encode(msg, compress=False) == _frame(ftype, payload, sender=sender)


def test_header_checks() -> None:
    good = encode(Hello(1, 2, 3))
    with pytest.raises(FrameError, match="magic"):
        decode(b"XYZ" + good[3:])
    with pytest.raises(FrameError, match="version"):
        decode(good[:3] + b"\x02" + good[4:])
    with pytest.raises(FrameError, match="unknown frame type"):
        decode(good[:4] + b"\x63" + good[5:])
    with pytest.raises(FrameError, match="flags"):
        decode(good[:5] + b"\x02" + good[6:])
    with pytest.raises(FrameError, match="may not be compressed"):
        decode(good[:5] + b"\x01" + good[6:])
    with pytest.raises(FrameError, match="crc"):
        decode(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(FrameError, match="truncated"):
        decode(good[:10])
    with pytest.raises(FrameError):
        decode("not bytes")  # type: ignore[arg-type]


def test_sender_roles_enforced() -> None:
    with pytest.raises(FrameError):
        Close(0, 1, 0, 0, (), ())
    with pytest.raises(FrameError):
        Hello(-1, 0, 1)
    # A supervisor-only frame claiming a worker sender is rejected at decode.
    payload = struct.pack("<i", 3)
    with pytest.raises(FrameError, match="sender"):
        decode(_frame(wire.FrameType.LEAVE, payload, sender=2))


def test_update_size_checks() -> None:
    upd = Update(0, 1, np.array([0, 5, 9]), np.array([1.0, 2.0, 3.0], np.float32))
    frame = encode(upd)
    assert decode(frame, size=10) == upd
    with pytest.raises(FrameError, match="out of range"):
        decode(frame, size=9)
    dup = encode(Update(0, 1, np.array([3, 3]), np.array([1.0, 2.0])))
    decode(dup)  # no size: duplicates are only checked against a model
    with pytest.raises(FrameError, match="duplicate"):
        decode(dup, size=10)
    with pytest.raises(FrameError, match="duplicate"):  # sparse path (sort, not bincount)
        decode(dup, size=10**6)
    with pytest.raises(FrameError, match="negative"):
        Update(0, 1, np.array([-1]), np.array([1.0]))
    with pytest.raises(FrameError):
        decode(frame, size=-1)


def test_update_rejects_bad_arrays() -> None:
    with pytest.raises(FrameError, match="length"):
        Update(0, 1, np.array([1, 2]), np.array([1.0]))
    with pytest.raises(FrameError, match="NaN"):
        Update(0, 1, np.array([1]), np.array([np.nan]))
    with pytest.raises(FrameError, match="NaN"):
        Update(0, 1, np.array([1]), np.array([1e300]))  # overflows float32 -> inf
    with pytest.raises(FrameError, match="int32"):
        Update(0, 1, np.array([2**40]), np.array([1.0]))
    with pytest.raises(FrameError, match="integers"):
        Update(0, 1, np.array([1.5]), np.array([1.0]))
    with pytest.raises(FrameError, match="1-D"):
        Update(0, 1, np.zeros((2, 2), np.int32), np.zeros((2, 2), np.float32))


def test_nan_smuggled_past_encoder_is_rejected() -> None:
    payload = struct.pack("<I", 1) + np.array([0], np.int32).tobytes() + np.array([np.inf], np.float32).tobytes()
    with pytest.raises(FrameError, match="NaN or inf"):
        decode(_frame(wire.FrameType.UPDATE, payload))
    t = Tensors(0, 0, {"w": np.ones(3)})
    raw = bytearray(t._payload())
    raw[-8:] = np.array([np.nan]).tobytes()
    with pytest.raises(FrameError, match="NaN"):
        decode(_frame(wire.FrameType.TENSORS, bytes(raw)))


def test_update_length_mismatch() -> None:
    payload = struct.pack("<I", 3) + b"\x00" * 16
    with pytest.raises(FrameError, match="expected 24"):
        decode(_frame(wire.FrameType.UPDATE, payload))
    payload = struct.pack("<I", 2**32 - 1)
    with pytest.raises(FrameError):
        decode(_frame(wire.FrameType.UPDATE, payload))


def test_compression_path() -> None:
    n = 50_000
    upd = Update(3, 7, np.arange(n, dtype=np.int32), np.zeros(n, np.float32))
    assert not encode(upd)[5] & wire.FLAG_COMPRESSED  # off unless asked for
    frame = encode(upd, compress=True)
    assert frame[5] & wire.FLAG_COMPRESSED
    assert len(frame) < 8 * n // 4
    assert decode(frame, size=n) == upd
    rng = np.random.default_rng(0)
    noisy = Update(3, 7, rng.permutation(n).astype(np.int32), rng.standard_normal(n).astype(np.float32))
    assert decode(encode(noisy, compress=True), size=n) == noisy
    big = Tensors(0, 1, {"w": np.zeros((300, 100), np.float32), "m": np.ones(10, np.int64)})
    bf = encode(big, compress=True)
    assert bf[5] & wire.FLAG_COMPRESSED
    assert decode(bf) == big


def test_compressed_garbage_and_bombs() -> None:
    with pytest.raises(FrameError, match="compressed"):
        decode(_frame(wire.FrameType.UPDATE, b"not zlib at all", flags=wire.FLAG_COMPRESSED))
    ok = zlib.compress(Update(0, 0, np.arange(4), np.zeros(4))._payload())
    with pytest.raises(FrameError, match="trailing|truncated"):
        decode(_frame(wire.FrameType.UPDATE, ok + b"junk", flags=wire.FLAG_COMPRESSED))
    with pytest.raises(FrameError, match="truncated"):
        decode(_frame(wire.FrameType.UPDATE, ok[:-3], flags=wire.FLAG_COMPRESSED))


def test_bomb_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_PAYLOAD", 1000)
    bomb = zlib.compress(b"\x00" * 100_000)
    with pytest.raises(FrameError, match="MAX_PAYLOAD"):
        decode(_frame(wire.FrameType.TENSORS, bomb, flags=wire.FLAG_COMPRESSED))


def test_tensors_checks() -> None:
    t = Tensors(1, 2, {"w": np.arange(6, dtype=">f8").reshape(2, 3), "b": np.zeros(0, np.uint8)})
    out = decode(encode(t))
    assert isinstance(out, Tensors)
    assert out.arrays["w"].dtype == np.dtype("<f8") and out.arrays["w"].shape == (2, 3)
    assert out.arrays["w"].flags.writeable and out.arrays["w"].flags.aligned
    with pytest.raises(FrameError, match="not supported"):
        Tensors(0, 0, {"x": np.zeros(3, np.float16)})
    with pytest.raises(FrameError, match="not supported"):
        Tensors(0, 0, {"x": np.array(["a"])})
    with pytest.raises(FrameError, match="name"):
        Tensors(0, 0, {"": np.zeros(3)})
    with pytest.raises(FrameError, match="inf"):
        Tensors(0, 0, {"x": np.array([np.inf])})
    # duplicate names in a hand-built payload
    one = Tensors(0, 0, {"a": np.zeros(1, np.uint8)})._payload()[4:]
    with pytest.raises(FrameError, match="duplicate"):
        decode(_frame(wire.FrameType.TENSORS, struct.pack("<I", 2) + one + one))
    # shape claiming more data than present
    lie = struct.pack("<I", 1) + struct.pack("<B1sBBQ", 1, b"a", 1, 1, 2**40)
    with pytest.raises(FrameError, match="more bytes"):
        decode(_frame(wire.FrameType.TENSORS, lie))


def test_control_field_checks() -> None:
    with pytest.raises(FrameError, match="timings"):
        Report(0, 0, 0.0, 1, False, 0, 0, 0, (0.0,) * 6)
    with pytest.raises(FrameError, match="timings"):
        Report(0, 0, 0.0, 1, False, 0, 0, 0, (-1.0,) + (0.0,) * 6)
    with pytest.raises(FrameError, match="loss_sum"):
        Report(0, 0, float("nan"), 1, False, 0, 0, 0, (0.0,) * 7)
    with pytest.raises(FrameError, match="has_update"):
        Report(0, 0, 0.0, 1, 1, 0, 0, 0, (0.0,) * 7)  # type: ignore[arg-type]
    with pytest.raises(FrameError, match="flags"):
        Close(-1, 0, 0, 0x4, (), ())
    with pytest.raises(FrameError, match="duplicate"):
        Close(-1, 0, 0, 0, (1, 1), ())
    with pytest.raises(FrameError, match="step"):
        Finish(-1, -1)
    c = Close(-1, 5, 10, CLOSE_SNAPSHOT, [0, 1], [1])
    assert c.live == (0, 1) and c.snapshot
    assert Failed(0, 0, "é" * 2000).reason.encode() == ("é" * 512).encode()
    too_long = struct.pack("<H", 2000) + b"a" * 2000
    with pytest.raises(FrameError, match="exceeds"):
        decode(_frame(wire.FrameType.FAILED, too_long))
    with pytest.raises(FrameError, match="utf-8"):
        decode(_frame(wire.FrameType.FAILED, struct.pack("<H", 1) + b"\xff"))
    with pytest.raises(FrameError, match="0 or 1"):
        decode(_frame(wire.FrameType.LEFT, b"\x02"))
    with pytest.raises(FrameError, match="trailing"):
        decode(_frame(wire.FrameType.FINISH, b"\x00", sender=-1))
    with pytest.raises(FrameError, match="not a wire message"):
        encode(object())  # type: ignore[arg-type]
