"""Wire frames: roundtrip of every type, and corruption always surfaces as FrameError."""
from __future__ import annotations

import dataclasses
import struct
import zlib

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlless.protocol import layouts
from mlless.protocol.fields import Message
from mlless.protocol.framing import (
    FLAG_COMPRESSED,
    FLAG_SEALED,
    HEADER,
    MAGIC,
    VERSION,
    FrameError,
    FrameType,
    decode,
    encode,
)
from mlless.protocol.messages import (
    MAX_MAGNITUDE,
    CLOSE_FINAL,
    CLOSE_SNAPSHOT,
    Close,
    Done,
    Failed,
    Finish,
    Hello,
    Leave,
    Left,
    Report,
    Takeover,
    Tensors,
    Update,
)
from mlless.protocol.precision import BY_NAME
from mlless.protocol.identity import ANY_WORKER, BADGE_BYTES, SUPERVISOR, Issuer, Verifier, parse_identity
from mlless.protocol.sealing import SEAL_BYTES, Rejected, Verified, seal, unseal

ranks = st.integers(0, 2**31 - 1)
steps = st.integers(0, 2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
i64 = st.integers(0, 2**63 - 1)
rank_lists = st.lists(ranks, max_size=20, unique=True).map(tuple)


@st.composite
def updates(draw: st.DrawFn) -> Update:
    """In any precision (`spec.sync.precision`), its values within the precision's range."""
    n = draw(st.integers(0, 200))
    idx = draw(hnp.arrays(np.int32, n, elements=st.integers(0, 2**31 - 1), unique=True))
    kind = draw(st.sampled_from(list(BY_NAME.values())))
    bound = min(MAX_MAGNITUDE, kind.largest or MAX_MAGNITUDE)
    val = draw(hnp.arrays(np.float32, n, elements=st.floats(-bound, bound, width=32)))
    return Update(draw(ranks), draw(steps), idx, val, kind.name)


@st.composite
def row_updates(draw: st.DrawFn) -> Update:
    """Whole rows of `width` parameters in any order, as a PMF update lists them: the indices travel as runs."""
    width = draw(st.integers(1, 60))
    rows = draw(st.lists(st.integers(0, 2**31 // width - 1), min_size=1, max_size=40, unique=True))
    idx = (np.array(rows, np.int64)[:, None] * width + np.arange(width)).ravel()
    val = draw(hnp.arrays(np.float32, idx.size, elements=st.floats(-MAX_MAGNITUDE, MAX_MAGNITUDE, width=32)))
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
    row_updates(),
    tensors(),
    st.builds(Hello, ranks, steps, i64),
    st.builds(
        Report, ranks, steps, finite, i64, st.booleans(), i64, i64, i64, st.tuples(*[nonneg] * 7)
    ),
    st.builds(Close, st.just(-1), steps, i64, st.sampled_from([0, CLOSE_SNAPSHOT, CLOSE_FINAL, CLOSE_SNAPSHOT | CLOSE_FINAL]), rank_lists, rank_lists, rank_lists),
    st.builds(Leave, st.just(-1), steps, ranks),
    st.builds(Left, ranks, steps, st.booleans()),
    st.builds(Finish, st.just(-1), steps),
    st.builds(Takeover, st.just(-1), steps),
    st.builds(Done, ranks, steps, nonneg, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
    st.builds(Failed, ranks, steps, st.text(max_size=300)),
)


@given(messages, st.booleans())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_roundtrip_every_type(msg: Message, compress: bool) -> None:
    frame = encode(msg, compress=compress)
    out = decode(frame)
    assert type(out) is type(msg)
    assert out == msg


@given(messages, st.data())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_bit_flip_is_frame_error(msg: Message, data: st.DataObject) -> None:
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
def test_truncation_is_frame_error(msg: Message, data: st.DataObject) -> None:
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
    return HEADER.pack(MAGIC, VERSION, ftype, flags, sender, step, len(payload), zlib.crc32(payload)) + payload


@given(st.sampled_from(list(FrameType)), st.binary(max_size=300), st.integers(-1, 3))
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
    with pytest.raises(FrameError, match="version 1"):  # an older build's frame: it listed every update index
        decode(good[:3] + b"\x01" + good[4:])
    with pytest.raises(FrameError, match="unknown frame type"):
        decode(good[:4] + b"\x63" + good[5:])
    with pytest.raises(FrameError, match="flags"):
        decode(good[:5] + b"\x10" + good[6:])
    with pytest.raises(FrameError, match="HELLO carries float32 values only"):  # an Update's precision bits
        decode(good[:5] + b"\x04" + good[6:])
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
        decode(_frame(FrameType.LEAVE, payload, sender=2))


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
    payload = struct.pack("<II", 1, 0) + np.array([0], np.int32).tobytes() + np.array([np.inf], np.float32).tobytes()
    with pytest.raises(FrameError, match="NaN or inf"):
        decode(_frame(FrameType.UPDATE, payload))
    t = Tensors(0, 0, {"w": np.ones(3)})
    raw = bytearray(b"".join(t._parts()))
    raw[-8:] = np.array([np.nan]).tobytes()
    with pytest.raises(FrameError, match="NaN"):
        decode(_frame(FrameType.TENSORS, bytes(raw)))


def test_update_values_are_bounded() -> None:
    """1e30 is finite in float32, and one such value makes every replica's loss overflow; the bound stops it."""
    edge = np.float32(MAX_MAGNITUDE)
    assert decode(encode(Update(0, 1, np.array([1, 2]), np.array([edge, -edge])))).values.tolist() == [edge, -edge]
    for bad in (1e30, -1e30, 2 * MAX_MAGNITUDE):
        with pytest.raises(FrameError, match="beyond the bound"):
            Update(0, 1, np.array([1, 2]), np.array([0.5, bad]))
    payload = struct.pack("<II", 1, 0) + np.array([0], np.int32).tobytes() + np.array([1e30], np.float32).tobytes()
    with pytest.raises(FrameError, match=r"values reach 1e\+30, beyond the bound of \+-1e\+06"):
        decode(_frame(FrameType.UPDATE, payload))


def test_replica_params_are_bounded() -> None:
    """A replica frame's parameters get the update's bound (optimizer state is only finite: AdaGrad's grows)."""
    like = np.zeros(3, np.float32)
    good = {layouts.PARAMS: np.full(3, MAX_MAGNITUDE, np.float32), "optimizer.g2": np.full(3, 1e12, np.float32)}
    assert layouts.check_params(decode(encode(Tensors(0, 0, good))).arrays, like) is not None
    forged = decode(encode(Tensors(0, 0, {layouts.PARAMS: np.array([0, 1e30, 0], np.float32)})))
    with pytest.raises(FrameError, match="params reach 1e\\+30"):
        layouts.check_params(forged.arrays, like)


def test_update_length_mismatch() -> None:
    payload = struct.pack("<II", 3, 0) + b"\x00" * 16
    with pytest.raises(FrameError, match="holds 16 bytes after its counts, expected 24 for 3 listed indices"):
        decode(_frame(FrameType.UPDATE, payload))
    payload = struct.pack("<I", 2**32 - 1)
    with pytest.raises(FrameError):
        decode(_frame(FrameType.UPDATE, payload))
    # forged counts are checked against the payload before anything is allocated
    for n, runs in ((2**32 - 1, 0), (2**32 - 1, 2**31 - 1), (2**32 - 1, 1)):
        with pytest.raises(FrameError, match="expected"):
            decode(_frame(FrameType.UPDATE, struct.pack("<II", n, runs) + b"\x00" * 64))


def _runs_frame(n: int, starts: list[int], lengths: list[int]) -> bytes:
    """An update frame with these runs, whatever they say, and n zero values."""
    runs = struct.pack("<II", n, len(starts)) + np.array(starts, "<i4").tobytes() + np.array(lengths, "<u4").tobytes()
    return _frame(FrameType.UPDATE, runs + bytes(4 * n))


def test_update_indices_travel_as_runs() -> None:
    """Two rank-3 PMF rows (4 parameters each) and two adjacent ones: 16 indices in 3 runs, in the sender's order."""
    idx = np.r_[28:36, 8:12, 20:24]
    upd = Update(3, 7, idx, np.arange(16, dtype=np.float32))
    frame = encode(upd)
    assert len(frame) == HEADER.size + 8 + 3 * 8 + 16 * 4  # against 8 + 16 * 8 listed
    assert frame[HEADER.size : HEADER.size + 8] == struct.pack("<II", 16, 3)
    out = decode(frame, size=36)
    assert out == upd and out.indices.flags.writeable and out.indices.dtype == np.int32
    listed = encode(Update(0, 0, np.array([1, 2, 4, 5, 7, 9]), np.zeros(6)))  # 4 runs of 6: listed is smaller
    assert listed[HEADER.size : HEADER.size + 8] == struct.pack("<II", 6, 0)


@pytest.mark.parametrize(
    "n, starts, lengths, error",
    [
        (8, [0, 10], [4, 0], "run 1 has length 0"),
        (8, [0, 10], [4, 3], "run lengths sum to 7, not the 8 entries"),
        (8, [0, 10], [4, 5], "run lengths sum to 9, not the 8 entries"),
        (8, [0, -10], [4, 4], "negative index in update"),
        (8, [0, 2**31 - 3], [4, 4], "run 1 ends beyond int32"),
        (8, [0, 4], [4, 4], "run 1 continues run 0: runs must be maximal"),
        (4, [0, 10], [2, 2], "2 runs for 4 entries: at least half as many runs as entries must be listed"),
        (8, [0, 2], [4, 4], None),  # overlapping runs are duplicates: only a model size rejects them
    ],
)
def test_malformed_runs_are_rejected(n: int, starts: list[int], lengths: list[int], error: str | None) -> None:
    frame = _runs_frame(n, starts, lengths)
    if error is None:
        decode(frame)
        with pytest.raises(FrameError, match="duplicate"):
            decode(frame, size=100)
        return
    with pytest.raises(FrameError, match=f"^Update frame from sender 0 step 0: {error}$"):
        decode(frame)


def test_listed_indices_that_form_runs_are_rejected() -> None:
    """Runs or listed is a function of the indices: the other choice would give one update two frames."""
    payload = struct.pack("<II", 4, 0) + np.array([5, 6, 7, 8], "<i4").tobytes() + bytes(16)
    with pytest.raises(FrameError, match="4 listed indices form 1 runs, fewer than half as many: they must travel as runs"):
        decode(_frame(FrameType.UPDATE, payload))


def test_compression_path() -> None:
    n = 50_000
    upd = Update(3, 7, np.arange(n, dtype=np.int32), np.zeros(n, np.float32))
    assert not encode(upd)[5] & FLAG_COMPRESSED  # off unless asked for
    frame = encode(upd, compress=True)
    assert frame[5] & FLAG_COMPRESSED
    assert len(frame) < 8 * n // 4
    assert decode(frame, size=n) == upd
    rng = np.random.default_rng(0)
    noisy = Update(3, 7, rng.permutation(n).astype(np.int32), rng.standard_normal(n).astype(np.float32))
    assert decode(encode(noisy, compress=True), size=n) == noisy
    big = Tensors(0, 1, {"w": np.zeros((300, 100), np.float32), "m": np.ones(10, np.int64)})
    bf = encode(big, compress=True)
    assert bf[5] & FLAG_COMPRESSED
    assert decode(bf) == big


def test_compressed_garbage_and_bombs() -> None:
    with pytest.raises(FrameError, match="compressed"):
        decode(_frame(FrameType.UPDATE, b"not zlib at all", flags=FLAG_COMPRESSED))
    ok = zlib.compress(b"".join(Update(0, 0, np.arange(4), np.zeros(4))._parts()))
    with pytest.raises(FrameError, match="trailing|truncated"):
        decode(_frame(FrameType.UPDATE, ok + b"junk", flags=FLAG_COMPRESSED))
    with pytest.raises(FrameError, match="truncated"):
        decode(_frame(FrameType.UPDATE, ok[:-3], flags=FLAG_COMPRESSED))


def test_bomb_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mlless.protocol.framing.MAX_PAYLOAD", 1000)
    bomb = zlib.compress(b"\x00" * 100_000)
    with pytest.raises(FrameError, match="MAX_PAYLOAD"):
        decode(_frame(FrameType.TENSORS, bomb, flags=FLAG_COMPRESSED))


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
    one = b"".join(Tensors(0, 0, {"a": np.zeros(1, np.uint8)})._parts())[4:]
    with pytest.raises(FrameError, match="duplicate"):
        decode(_frame(FrameType.TENSORS, struct.pack("<I", 2) + one + one))
    # shape claiming more data than present
    lie = struct.pack("<I", 1) + struct.pack("<B1sBBQ", 1, b"a", 1, 1, 2**40)
    with pytest.raises(FrameError, match="more bytes"):
        decode(_frame(FrameType.TENSORS, lie))


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
    assert c.live == (0, 1) and c.flags & CLOSE_SNAPSHOT
    assert Failed(0, 0, "é" * 2000).reason.encode() == ("é" * 512).encode()
    too_long = struct.pack("<H", 2000) + b"a" * 2000
    with pytest.raises(FrameError, match="exceeds"):
        decode(_frame(FrameType.FAILED, too_long))
    with pytest.raises(FrameError, match="utf-8"):
        decode(_frame(FrameType.FAILED, struct.pack("<H", 1) + b"\xff"))
    with pytest.raises(FrameError, match="0 or 1"):
        decode(_frame(FrameType.LEFT, b"\x02"))
    with pytest.raises(FrameError, match="trailing"):
        decode(_frame(FrameType.FINISH, b"\x00", sender=-1))
    with pytest.raises(FrameError, match="not a wire message"):
        encode(object())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- golden frames

#: Frames captured from the encoder before the codec became table-driven: (id, message, compressed, frame as hex).
#: Frame version 2 changed the version byte of each, and the payload of the updates (their indices may travel as
#: runs, `mlless.protocol.index_runs`); version 3 the version byte again, and the reports' payload (their staleness).
#: The wire format is a contract between processes of possibly different builds, so it must not drift silently.
GOLDEN: list[tuple[str, Message, bool, str]] = [
    (
        "update",
        Update(3, 7, np.array([0, 5, 9, 2**31 - 1]), np.array([1.5, -2.0, 0.0, 3.25], np.float32)),
        False,
        "4d4c730301000300000007000000000000002800000081bee2b10400000000000000000000000500000009000000ffff"
        "ff7f0000c03f000000c00000000000005040"
    ),
    (
        "update_empty",
        Update(0, 0, np.zeros(0, np.int32), np.zeros(0, np.float32)),
        False,
        "4d4c730301000000000000000000000000000800000069df22650000000000000000"
    ),
    (
        "update_runs",  # frame version 2: two rank-3 PMF rows and two adjacent ones, 16 indices in 3 runs
        Update(5, 9, np.r_[28:36, 8:12, 20:24], np.linspace(-1, 1, 16, dtype=np.float32)),
        False,
        "4d4c7303010005000000090000000000000060000000b65ed38110000000030000001c00000008000000140000000800"
        "00000400000004000000000080bfdedd5dbfbcbb3bbf9a9919bfefeeeebeabaaaabecdcc4cbe898888bd8988883dcdcc"
        "4c3eabaaaa3eefeeee3e9a99193fbcbb3b3fdedd5d3f0000803f"
    ),
    (
        "update_z",
        Update(1, 2, np.arange(200, dtype=np.int32), np.zeros(200, np.float32)),
        True,
        "4d4c730301010100000002000000000000001c0000006c52499378013bc1c0c0c008c4207002428d92a321301a023842"
        "0000f8380192"
    ),
    (
        "tensors",
        Tensors(
            0,
            9,
            {
                "params": np.arange(6, dtype=np.float32).reshape(2, 3),
                "d": np.array([1.0, -2.5]),
                "i": np.array([[1, 2]], np.int32),
                "l": np.array(7, np.int64),
                "é": np.zeros(3, np.uint8),
            },
        ),
        False,
        "4d4c7303020000000000090000000000000091000000400b46980500000006706172616d730102020000000000000003"
        "00000000000000000000000000803f0000004000004040000080400000a0400164020102000000000000000000000000"
        "00f03f00000000000004c001690302010000000000000002000000000000000100000002000000016c04010100000000"
        "000000070000000000000002c3a905010300000000000000000000"
    ),
    (
        "tensors_z",
        Tensors(2, 4, {"w": np.zeros((30, 10), np.float32)}),
        True,
        "4d4c73030201020000000400000000000000230000004ef971b5780163646060602c67649203d220c005a146c9d11018"
        "0d81d1101832210000111a00a5"
    ),
    (
        "tensors_empty",
        Tensors(0, 0, {}),
        False,
        "4d4c73030200000000000000000000000000040000001cdf442100000000"
    ),
    (
        "hello",
        Hello(4, 0, 123456),
        False,
        "4d4c73031000040000000000000000000000080000001f79dc1340e2010000000000"
    ),
    (
        "report",
        Report(2, 11, 0.625, 32, True, 4096, 512, 17, (0.1, 0.2, 0.0, 1.5, 2.25, 3.0, 0.001), 8192, 3),
        False,
        "4d4c73031100020000000b000000000000007100000003945596000000000000e43f2000000000000000010010000000"
        "000000000200000000000011000000000000009a9999999999b93f9a9999999999c93f00000000000000000000000000"
        "00f83f00000000000002400000000000000840fca9f1d24d62503f00200000000000000300000000000000"
    ),
    (
        "report_noupd",
        Report(0, 1, -3.5, 0, False, 0, 0, 0, (0.0,) * 7),
        False,
        "4d4c73031100000000000100000000000000710000001871153a0000000000000cc00000000000000000000000000000"
        "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
        "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    ),
    (
        "close",
        Close(-1, 5, 640, CLOSE_SNAPSHOT | CLOSE_FINAL, (0, 1, 3), (1, 3), (2,)),
        False,
        "4d4c73031200ffffffff05000000000000003000000076c1129b80020000000000000300000003000000000000000100"
        "0000030000000200000001000000030000000100000002000000"
    ),
    (
        "close_empty",
        Close(-1, 0, 0, 0, (), ()),
        False,
        "4d4c73031200ffffffff00000000000000001800000020cac1a300000000000000000000000000000000000000000000"
        "0000"
    ),
    (
        "leave",
        Leave(-1, 8, 3),
        False,
        "4d4c73031300ffffffff080000000000000004000000f270f13303000000"
    ),
    (
        "left",
        Left(3, 8, True),
        False,
        "4d4c73031400030000000800000000000000010000001bdf05a501"
    ),
    (
        "left_no",
        Left(1, 9, False),
        False,
        "4d4c73031400010000000900000000000000010000008def02d200"
    ),
    (
        "finish",
        Finish(-1, 12),
        False,
        "4d4c73031500ffffffff0c000000000000000000000000000000"
    ),
    (
        "takeover",  # a message added later (runtime/supervisor/failover.py)
        Takeover(-1, 0),
        False,
        "4d4c73031800ffffffff00000000000000000000000000000000"
    ),
    (
        "done",  # with repaired_frames (docs/reliability.md), which followed rejected_frames
        Done(1, 12, 45.5, 3, 2),
        False,
        "4d4c73031600010000000c0000000000000018000000c6e482f60000000000c046400300000000000000020000000000"
        "0000"
    ),
    (
        "done_default",
        Done(0, 2, 0.0),
        False,
        "4d4c730316000000000002000000000000001800000020cac1a300000000000000000000000000000000000000000000"
        "0000"
    ),
    (
        "failed",
        Failed(2, 6, "diverged: loss is nan — é"),
        False,
        "4d4c730317000200000006000000000000001e000000ae4ab53e1c0064697665726765643a206c6f7373206973206e61"
        "6e20e2809420c3a9"
    ),
    (
        "failed_empty",
        Failed(0, 0, ""),
        False,
        "4d4c7303170000000000000000000000000002000000ff12d9410000"
    ),
]


@pytest.mark.parametrize("name, msg, compressed, golden", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_frames(name: str, msg: Message, compressed: bool, golden: str) -> None:
    frame = bytes.fromhex(golden)
    assert decode(frame) == msg
    if compressed:
        # zlib's output may differ between zlib builds; what must not drift is that it decodes.
        assert frame[5] & FLAG_COMPRESSED
    else:
        assert encode(msg) == frame


def test_field_tables_match_the_dataclasses() -> None:
    """A control message is packed from FIELDS alone: a field missing there would silently not be sent."""
    for cls in (Hello, Report, Close, Leave, Left, Finish, Takeover, Done, Failed):
        names = [f.name for f in dataclasses.fields(cls)]
        assert names == ["sender", "step", *(name for name, _ in cls.FIELDS)], cls.__name__


# --------------------------------------------------------------------------- sealing

ISSUER = Issuer(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
RANK3 = ISSUER.issue(3, Ed25519PrivateKey.from_private_bytes(bytes(range(32, 64))))
VERIFIER = Verifier(ISSUER.public)
#: The seal of GOLDEN[0]'s frame by RANK3 under "value update:3:7": signer id, public key, certificate, signature.
GOLDEN_SEAL = (
    "0300000029acbae141bccaf0b22e1a94d34d0bc7361e526d0bfe12c89794bc9322966dd7c1566822c491dfdca5108a5f7f63"
    "671b0edb0e2313b00b00926d48ddcae9c8b5bb505c84afbf6b58fb6ec626f9075c7ece23f18a781f0deb9aa4d2ad2960dc04"
    "2a43d07a0f8092d85d8faadf966253104115f93c2daa9f08dd9f142ac48a89917fb0d8a60ec48adfa657cfb33f648da84ece"
    "733b50ce969c01805b1a7987de00"
)


def test_seal_roundtrip_and_every_forgery_is_rejected() -> None:
    frame = encode(Update(3, 7, np.array([0, 5]), np.array([1.5, -2.0], np.float32)))
    sealed = seal(frame, RANK3, "value update:3:7")
    assert len(sealed) == len(frame) + SEAL_BYTES
    opened = unseal(sealed, VERIFIER, "value update:3:7")
    assert opened == frame and isinstance(opened, Verified) and opened.signer == 3
    flipped = bytearray(sealed)
    flipped[40] ^= 1
    certificate = bytearray(sealed)
    certificate[-SEAL_BYTES + BADGE_BYTES - 1] ^= 1
    claimed = bytearray(sealed)
    claimed[-SEAL_BYTES] = 4  # the badge's signer id says rank 4: the certificate no longer covers it
    forgeries = {
        "no seal": (frame, "bad or missing seal: not written by a member of this job"),
        "another issuer's identity": (seal(frame, Issuer().issue(3), "value update:3:7"), "bad or missing seal"),
        "another key name": (seal(frame, RANK3, "value update:3:8"), "bad signature: not written by rank 3"),
        "a flipped bit": (bytes(flipped), "bad signature: not written by rank 3 of this job, or changed since"),
        "a changed certificate": (bytes(certificate), "bad or missing seal"),
        "another signer id": (bytes(claimed), "bad or missing seal"),
        "shorter than a seal": (sealed[:SEAL_BYTES - 1], "bad or missing seal"),
        "empty": (b"", "bad or missing seal"),
    }
    for what, (forged, reason) in forgeries.items():
        rejected = unseal(forged, VERIFIER, "value update:3:7")
        assert isinstance(rejected, Rejected) and rejected == b"", what
        with pytest.raises(FrameError, match=f"^value update:3:7: {reason}"):
            decode(rejected)


def test_a_verified_frame_decodes_only_as_what_its_signer_may_speak_as() -> None:
    """A member's seal verifies, but a worker's frame whose sender is another rank, or the supervisor, is a forgery;
    a function backend's shared identity speaks as any rank but never as the supervisor, and the supervisor, trusted
    with the job, as anyone (the model it hands workers is a replica frame)."""
    def opened(msg: Message, signer: int) -> Verified:
        return unseal(seal(encode(msg, sealed=True), ISSUER.issue(signer), "message"), VERIFIER, "message")

    update = Update(0, 7, np.array([0]), np.array([1.0], np.float32))
    assert decode(opened(update, 0)) == update
    assert decode(opened(update, ANY_WORKER)) == update
    assert decode(opened(Finish(-1, 7), SUPERVISOR)) == Finish(-1, 7)
    assert decode(opened(update, SUPERVISOR)) == update
    for msg, signer, who in ((update, 1, "rank 1"), (Finish(-1, 7), 0, "rank 0"),
                             (Finish(-1, 7), ANY_WORKER, "a function worker")):
        with pytest.raises(FrameError, match=f"^frame from sender {msg.sender} was sealed by {who}: forged$"):
            decode(opened(msg, signer))


def test_identity_text_roundtrip_and_bad_text() -> None:
    again = parse_identity(RANK3.text())
    assert again.badge == RANK3.badge and again.issuer == ISSUER.public
    assert parse_identity(ISSUER.text()).public == ISSUER.public
    for bad in ("", "3:00", RANK3.text()[:-2], "issuer:zz", RANK3.text().replace("3:", "-3:", 1)):
        with pytest.raises(ValueError, match="^not an identity: SIGNER:KEY:CERTIFICATE:ISSUER or issuer:KEY, in hex$"):
            parse_identity(bad)
    assert RANK3.text().split(":")[1] not in repr(RANK3) and ISSUER.text() not in repr(ISSUER)


def test_a_frame_without_checksum_decodes_only_once_its_seal_is_verified() -> None:
    msg = Update(3, 7, np.array([0, 5]), np.array([1.5, -2.0], np.float32))
    frame = encode(msg, sealed=True)
    assert frame[5] == FLAG_SEALED and frame[HEADER.size - 4:HEADER.size] == bytes(4)  # flags, then crc32 0
    assert frame[HEADER.size:] == encode(msg)[HEADER.size:]
    with pytest.raises(FrameError, match="no checksum"):
        decode(frame)  # e.g. read from a file: nothing vouches for it
    opened = unseal(seal(frame, RANK3, "value update:3:7"), VERIFIER, "value update:3:7")
    assert isinstance(opened, Verified)
    got = decode(opened)
    np.testing.assert_array_equal(got.indices, msg.indices)
    np.testing.assert_array_equal(got.values, msg.values)
    # a verified frame's checksum is not read again: the signature covered every bit of it
    stale = bytearray(encode(msg))
    stale[HEADER.size - 1] ^= 0xFF
    with pytest.raises(FrameError, match="crc"):
        decode(bytes(stale))
    assert decode(unseal(seal(bytes(stale), RANK3, "c"), VERIFIER, "c")).step == 7


def test_golden_sealed_frame() -> None:
    """The seal (signer id, public key, certificate, then the Ed25519 signature of SHA-256 over a prefix, the
    context, a zero byte and the frame) is wire format too; Ed25519 signatures are deterministic."""
    frame = bytes.fromhex(GOLDEN[0][3])
    sealed = seal(frame, RANK3, "value update:3:7")
    assert sealed[:len(frame)] == frame
    assert sealed[len(frame):].hex() == GOLDEN_SEAL


def test_who_may_write_each_key() -> None:
    """A rank's keys are its own (the supervisor may empty them); the job's state is the supervisor's; the snapshot
    and reduced parts are anyone's, whose frames name their sender."""
    from mlless.protocol import keys

    for key in (keys.update(3, 9, 1), f"{keys.update(3, 9, 1)}:2", keys.snapshot_pending(3), keys.final_replica(3),
                keys.leaver_replica(3), keys.checkpoint(3)):
        assert keys.writer(key) == 3, key
        assert [keys.may_write(s, key) for s in (3, 4, SUPERVISOR, ANY_WORKER)] == [True, False, True, True], key
    for key in (keys.job_checkpoint(), keys.job_state(), keys.job_rows(2)):
        assert keys.writer(key) == SUPERVISOR, key
        assert [keys.may_write(s, key) for s in (3, SUPERVISOR, ANY_WORKER)] == [False, True, False], key
    for key in (keys.snapshot(), "reduced:1:update:0:2", "x"):
        assert keys.writer(key) is None and keys.may_write(3, key), key
