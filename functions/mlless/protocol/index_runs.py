"""How an update's index array travels: as runs of consecutive indices, or listed.

A PMF update carries every parameter of each row it touched, and a row is ``rank + 1`` consecutive parameters
(``training/models/pmf.py``), so its indices are a few long runs ``s, s+1, ..., s+len-1``; a logistic
regression update's hashed features are mostly isolated.  The protocol knows no model: it finds the maximal
runs, in the order the indices come, and sends them (an int32 start and a u32 length each, 8 bytes) when that
is smaller than listing the indices (4 bytes each), that is when there are fewer than half as many runs as
indices.  The order and the values' alignment are kept, so a decoded update equals the one encoded.

Payload of ``mlless.protocol.messages.Update`` from frame version 2: ``n`` u32 entries, ``r`` u32 runs (0: the
indices are listed), then ``r`` int32 starts and ``r`` u32 lengths, or ``n`` int32 indices, then ``n`` float32
values (2-byte ones in a narrow precision, which the header's flags name).  The choice is a function of the
indices, so ``decode`` rejects a frame that made the other one: bytes and messages correspond one to one.
"""
from __future__ import annotations

import struct

import numpy as np

from mlless.protocol.framing import I4, FrameError, Reader

__all__ = ["COUNTS", "pack_indices", "read_indices"]

#: An update payload's two counts: entries, then runs (0 when the indices are listed).
COUNTS = struct.Struct("<II")
_U4 = np.dtype("<u4")
_I32_END = 2**31  # a run's end (one past its last index) may be at most this


def _jumps(idx: np.ndarray) -> np.ndarray:
    """Whether a new run starts at each position after 0 (so there is one run more than jumps).  (Differences of
    int32 indices that are >= 0 fit in int32; the negative ones a forged frame lists are rejected anyway.)"""
    return idx[1:] - idx[:-1] != 1


def pack_indices(idx: np.ndarray) -> list[bytes | memoryview]:
    """The counts and the index part of an update payload for the int32 indices ``idx``."""
    n = idx.size
    if n < 3:  # one run of 2 takes 8 bytes, as 2 listed indices do: listing wins every tie
        return [COUNTS.pack(n, 0), idx.data]
    jumps = _jumps(idx)
    r = int(np.count_nonzero(jumps)) + 1
    if 2 * r >= n:
        return [COUNTS.pack(n, 0), idx.data]
    bounds = np.empty(r + 1, np.intp)
    bounds[0], bounds[-1] = 0, n
    np.add(np.flatnonzero(jumps), 1, out=bounds[1:-1])
    starts = idx[bounds[:-1]]
    lengths = np.diff(bounds).astype(_U4)
    return [COUNTS.pack(n, r), starts.data, lengths.data]


def read_indices(r: Reader, n: int, runs: int, value_bytes: int = 4) -> np.ndarray:
    """The ``n`` indices of an update whose counts were ``n`` and ``runs``, with its index part next in ``r`` and its
    ``n`` values of ``value_bytes`` each after that (2 in a narrow precision, `mlless.protocol.precision`).  Every
    byte count is checked against the payload before anything is allocated."""
    listed = runs == 0
    need = (4 * n if listed else 8 * runs) + value_bytes * n
    if r.left != need:
        what = f"{n} listed indices" if listed else f"{n} entries in {runs} runs"
        raise FrameError(f"update payload holds {r.left} bytes after its counts, expected {need} for {what}")
    if listed:
        idx = r.array(I4, n)
        found = int(np.count_nonzero(_jumps(idx))) + 1 if n >= 3 else n
        if 2 * found < n:
            raise FrameError(f"{n} listed indices form {found} runs, fewer than half as many: they must travel as runs")
        return idx
    if 2 * runs >= n:
        raise FrameError(f"{runs} runs for {n} entries: at least half as many runs as entries must be listed")
    starts = r.array(I4, runs)
    lengths = r.array(_U4, runs)
    if int(lengths.min()) < 1:
        raise FrameError(f"run {int(np.argmin(lengths))} has length 0")
    ends = lengths.cumsum(dtype=np.int64)  # where each run's entries end in the index array
    if int(ends[-1]) != n:
        raise FrameError(f"run lengths sum to {int(ends[-1])}, not the {n} entries")
    if int(starts.min()) < 0:
        raise FrameError("negative index in update")
    last = starts + lengths.astype(np.int64)  # one past each run's last index
    if int(last.max()) > _I32_END:
        raise FrameError(f"run {int(np.argmax(last))} ends beyond int32")
    joined = np.flatnonzero(starts[1:] == last[:-1])
    if joined.size:
        raise FrameError(f"run {int(joined[0]) + 1} continues run {int(joined[0])}: runs must be maximal")
    # Entry k of run j is starts[j] + (k - first entry of run j): the offsets are int32-safe, as every result is.
    idx = np.repeat((starts - (ends - lengths)).astype(I4), lengths)
    idx += np.arange(n, dtype=I4)
    return idx
