"""Chunked reading and vectorised tokenising of delimited text.

Inputs can be far larger than memory (Criteo: 45M lines, ~11 GB), and a
Python loop over 40 fields per line runs at only ~100k lines/s.  So we read
blocks of a few MB, find newlines and delimiters with numpy, and cut fields
out of the block as zero-padded byte matrices that the parsers convert with
array arithmetic.  Line numbers are tracked so that any malformed line can be
reported as `file:line`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import IO, Iterator

import fsspec
import numpy as np

BLOCK_BYTES = 8 << 20
PAD = 64
_POW10 = 10 ** np.arange(19, dtype=np.int64)


class MalformedInputError(ValueError):
    """An input line could not be parsed; the message names the file and line number."""


@dataclass
class ErrorLog:
    """Applies the `--on-error` policy: raise on the first bad line, or skip and count."""

    policy: str = "fail"
    skipped: int = 0
    examples: list[str] = field(default_factory=list)
    max_examples: int = 10

    def bad(self, source: str, line_no: int, reason: str, text: bytes | str = b"") -> None:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        shown = text if len(text) <= 80 else text[:77] + "..."
        message = f"{source}:{line_no}: {reason}: {shown!r}"
        if self.policy != "skip":
            raise MalformedInputError(message + " (use --on-error skip to skip malformed lines)")
        self.skipped += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(message)


@dataclass
class Block:
    """A run of complete lines from one file; `first_line` is the 1-based number of line 0."""

    data: bytes
    first_line: int


def open_input(path: str) -> IO[bytes]:
    """Open a local path or fsspec URL for binary reading, decompressing .gz/.bz2/.xz by suffix."""
    return fsspec.open(path, "rb", compression="infer").open()


def read_blocks(path: str, block_bytes: int = BLOCK_BYTES) -> Iterator[Block]:
    """Yield blocks that end on a newline, so no line is ever split between blocks."""
    line = 1
    carry = b""
    with open_input(path) as f:
        while True:
            chunk = f.read(block_bytes)
            if not chunk:
                break
            data = carry + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                carry = data
                continue
            block, carry = data[: cut + 1], data[cut + 1 :]
            yield Block(block, line)
            line += block.count(b"\n")
    if carry:
        yield Block(carry + b"\n", line)


@dataclass
class Lines:
    """Line boundaries of a block: `starts`/`ends` byte offsets (end excludes '\\r\\n')."""

    buf: np.ndarray  # uint8 view of the block
    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    numbers: np.ndarray  # int64, 1-based line numbers in the file

    def text(self, i: int) -> bytes:
        return self.buf[self.starts[i] : self.ends[i]].tobytes()

    def take(self, keep: np.ndarray) -> "Lines":
        return Lines(self.buf, self.starts[keep], self.ends[keep], self.numbers[keep])

    def __len__(self) -> int:
        return int(self.starts.shape[0])


def split_lines(block: Block, skip_blank: bool = True) -> Lines:
    """Find every line of a block (it must end with '\\n'); blank lines are dropped."""
    # Zero padding past the end lets `Fields.chars` read fixed-width windows safely.
    buf = np.frombuffer(block.data + bytes(PAD), dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    starts = np.empty(len(nl), dtype=np.int64)
    starts[0:1] = 0
    starts[1:] = nl[:-1] + 1
    ends = nl.astype(np.int64)
    cr = (ends > starts) & (buf[np.maximum(ends - 1, 0)] == 13)
    ends = ends - cr
    numbers = block.first_line + np.arange(len(nl), dtype=np.int64)
    lines = Lines(buf, starts, ends, numbers)
    if skip_blank:
        blank = ends == starts
        if blank.any():
            lines = lines.take(~blank)
    return lines


@dataclass
class Fields:
    """Field boundaries for lines that all have exactly `n` fields: (rows, n) start/end offsets."""

    buf: np.ndarray
    starts: np.ndarray  # (rows, n) int64
    ends: np.ndarray  # (rows, n) int64

    def lengths(self, col: int | slice) -> np.ndarray:
        return self.ends[:, col] - self.starts[:, col]

    def chars(self, col: int | slice, width: int | None = None, multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Cut column(s) out as a zero-padded uint8 matrix (values, width) plus lengths.

        Rows are gathered from a sliding-window view of the block, so the
        index array has one entry per value (not per byte).  `multiple`
        rounds the width up (8 lets the hash read whole uint64 words).
        """
        starts = np.ravel(self.starts[:, col])
        lengths = np.ravel(self.ends[:, col]) - starts
        w = int(lengths.max(initial=0)) if width is None else width
        w = max(w, 1)
        w = -(-w // multiple) * multiple
        buf = self.buf
        if w > PAD:
            buf = np.concatenate([buf, np.zeros(w, dtype=np.uint8)])
        windows = np.lib.stride_tricks.sliding_window_view(buf, w)
        chars = windows[starts]
        live = np.arange(w, dtype=np.int64) < lengths[:, None]
        np.multiply(chars, live, out=chars)
        return chars, lengths


    def words(self, col: int | slice) -> tuple[np.ndarray, np.ndarray]:
        """Column(s) as zero-padded little-endian uint64 words (values, ceil(maxlen/8)) plus lengths.

        Reads 8 bytes at arbitrary offsets through a 1-byte-stride uint64 view
        of the block, so hashing needs one gather per 8 bytes of value.
        """
        starts = np.ravel(self.starts[:, col])
        lengths = np.ravel(self.ends[:, col]) - starts
        n_words = max(1, -(-int(lengths.max(initial=0)) // 8))
        buf = self.buf
        if n_words * 8 > PAD:
            buf = np.concatenate([buf, np.zeros(n_words * 8, dtype=np.uint8)])
        view = np.ndarray(shape=(len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))
        out = np.empty((len(starts), n_words), dtype=np.uint64)
        for k in range(n_words):
            word = view[starts + 8 * k]
            left = np.clip(lengths - 8 * k, 0, 8).astype(np.uint64)
            mask = np.where(left >= 8, np.uint64(0xFFFFFFFFFFFFFFFF), (np.uint64(1) << (left * np.uint64(8))) - np.uint64(1))
            out[:, k] = word & mask
        return out, lengths


def split_fields(lines: Lines, delimiter: int, n_fields: int) -> tuple[Fields, np.ndarray]:
    """Tokenise lines on a one-byte delimiter; returns fields of good lines and a mask of them.

    Lines with a different number of fields are not in `Fields`; the mask lets
    the caller report them by line number.
    """
    buf = lines.buf
    # Restrict to delimiters inside lines (a '\r' or '\n' is never a delimiter).
    d = np.flatnonzero(buf == delimiter)
    lo = np.searchsorted(d, lines.starts)
    hi = np.searchsorted(d, lines.ends)
    good = (hi - lo) == (n_fields - 1)
    lo = lo[good]
    pos = d[lo[:, None] + np.arange(n_fields - 1)] if n_fields > 1 else np.empty((len(lo), 0), np.int64)
    starts = np.empty((len(lo), n_fields), dtype=np.int64)
    ends = np.empty((len(lo), n_fields), dtype=np.int64)
    starts[:, 0] = lines.starts[good]
    starts[:, 1:] = pos + 1
    ends[:, :-1] = pos
    ends[:, -1] = lines.ends[good]
    return Fields(buf, starts, ends), good


def parse_ints(chars: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parse optional-signed decimal integers; returns (int64 values, ok mask).

    Empty fields parse as 0 with ok=True (the caller decides what blank means);
    any other non-digit, or more than 18 digits, makes ok False.
    """
    n, w = chars.shape
    w = min(w, 19)
    chars = chars[:, :w]
    first = chars[:, 0]
    sign = (first == 45) | (first == 43)  # '-' or '+'
    digits = chars.astype(np.int64) - 48
    live = np.arange(w) < lengths[:, None]
    is_digit = (digits >= 0) & (digits <= 9)
    good = is_digit | ~live
    good[:, 0] |= sign & (lengths > 1)
    ok = good.all(axis=1) & (lengths <= 18)
    # Positional weights: the last live byte is 10**0; non-digits (the sign, padding) weigh 0.
    exponent = np.clip(lengths[:, None] - 1 - np.arange(w), 0, 18)
    weights = np.where(is_digit & live, _POW10[exponent], 0)
    values = (digits * weights).sum(axis=1)
    values = np.where(first == 45, -values, values)
    return values, ok


def parse_floats(chars: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parse decimal floats via numpy's bytes->float cast; returns (float64 values, ok mask)."""
    values, ok = floats_of(np.ascontiguousarray(chars).view(f"S{chars.shape[1]}").ravel())
    return values, ok & (lengths > 0)


def floats_of(strings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values, ok mask) of a bytes array: one vectorised cast, and one value at a time only when some
    string is not a number, so a bad line costs its block a slow pass instead of failing it."""
    try:
        values = strings.astype(np.float64)
        return values, np.isfinite(values)
    except ValueError:
        values = np.zeros(len(strings), dtype=np.float64)
        ok = np.zeros(len(strings), dtype=bool)
        for i, s in enumerate(strings):
            try:
                values[i] = float(s)
                ok[i] = np.isfinite(values[i])
            except ValueError:
                pass
        return values, ok
