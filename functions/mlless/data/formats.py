"""Parsers for the three input formats, each yielding row chunks.

* MovieLens ratings: `userId,movieId,rating,timestamp` CSV with a header
  (ml-latest*, ML-20M) or `::`-separated `.dat` (ML-1M, ML-10M).
* Criteo: TSV of label, 13 integer columns, 26 hexadecimal categorical
  columns; any field may be blank.
* LIBSVM/svmlight: `label idx:val idx:val ...`.

Criteo feature index space (exactly [0, 2**hash_bits)): integer column j
(0..12) is feature j; categorical column c (0..25) with value v is feature
13 + H(c, v) mod (2**hash_bits - 13), where H is the stable FNV-1a/fmix64
hash of `hashing.py`.  Blank fields produce no entry.  (The original put
categoricals at an offset without shrinking the modulus, so its largest
index equalled the feature count; this layout cannot.)  Integer values are
kept raw here; the transform (log1p or min-max) is applied when batches are
written, after the training statistics are known.
"""
from __future__ import annotations

import math

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

from mlless.data.chunks import RatingsChunk, SparseChunk
from mlless.data.classes import ClassLabels
from mlless.data.hashing import bucket, hash_strings, hash_words
from mlless.data.text import (
    Block,
    ErrorLog,
    Lines,
    floats_of,
    parse_floats,
    parse_ints,
    read_blocks,
    split_fields,
    split_lines,
)

CRITEO_INT_COLUMNS = 13
CRITEO_CAT_COLUMNS = 26
CRITEO_FIELDS = 1 + CRITEO_INT_COLUMNS + CRITEO_CAT_COLUMNS
T = TypeVar("T")
R = TypeVar("R")


def _report(errors: ErrorLog, source: str, lines: Lines, bad: np.ndarray, reason: str) -> None:
    for i in np.flatnonzero(bad):
        errors.bad(source, int(lines.numbers[i]), reason, lines.text(int(i)))


# ---------------------------------------------------------------- MovieLens


def read_movielens(path: str, errors: ErrorLog) -> Iterator[RatingsChunk]:
    """Parse MovieLens ratings; the format (CSV or `::`) is detected from the first line."""
    n_fields = 0
    dat = False
    for block in read_blocks(path):
        data = block.data
        if n_fields == 0:
            first = data[: data.find(b"\n")].rstrip(b"\r")
            dat = b"::" in first
            n_fields = len(first.split(b"::" if dat else b","))
            if n_fields < 3:
                errors.bad(path, block.first_line, "expected user, item, rating[, timestamp]", first)
            n_fields = max(n_fields, 3)
        if dat:
            data = data.replace(b"::", b"\t")
        lines = split_lines(type(block)(data, block.first_line))
        if block.first_line == 1 and len(lines) and lines.numbers[0] == 1:
            head = lines.text(0)
            if head[:1] and not (head[:1].isdigit()):
                lines = lines.take(np.arange(1, len(lines)))  # header line
        if not len(lines):
            continue
        fields, good = split_fields(lines, ord("\t") if dat else ord(","), n_fields)
        _report(errors, path, lines, ~good, f"expected {n_fields} fields")
        lines = lines.take(good)
        users, ok_u = parse_ints(*fields.chars(0))
        items, ok_i = parse_ints(*fields.chars(1))
        ratings, ok_r = parse_floats(*fields.chars(2))
        ok = ok_u & ok_i & ok_r & (fields.lengths(0) > 0) & (fields.lengths(1) > 0)
        # Ratings are stored as float32: one beyond its range would become inf (and the mean rating with it).
        ok &= (users >= 0) & (items >= 0) & (np.abs(ratings) <= np.finfo(np.float32).max)
        if not ok.all():
            _report(errors, path, lines, ~ok, "bad user id, item id or rating")
        yield RatingsChunk(lines.numbers[ok], users[ok], items[ok], ratings[ok].astype(np.float32))


def infer_rating_range(ratings: np.ndarray) -> tuple[float, float]:
    """A plausible rating range from a sample of ratings: its range without the extreme 0.1 % (at least one value
    each side, from 100 ratings on), widened by that range (at least 1) on each side, and never below 0 when the
    sample is non-negative. MovieLens' 0.5-5 stars give [0, 9.5]; a stray 1e38 or -7 falls outside."""
    ordered = np.sort(ratings.astype(np.float64))
    trim = len(ordered) // 1000 + 1 if len(ordered) >= 100 else 0
    lo, hi = float(ordered[trim]), float(ordered[len(ordered) - 1 - trim])
    span = max(hi - lo, 1.0)
    return (0.0 if lo >= 0 else lo - span), hi + span


#: Ratings the inferred range is taken from: the first rows of the input, however it is cut into chunks.
RATING_SAMPLE_ROWS = 100_000


def within_rating_range(
    chunks: Iterable[RatingsChunk], path: str, errors: ErrorLog, given: tuple[float, float] | None,
    found: Callable[[tuple[float, float]], None],
) -> Iterator[RatingsChunk]:
    """Report ratings outside `given`, or outside the range inferred from the first RATING_SAMPLE_ROWS, as
    malformed lines: one implausible rating (1e38 from a corrupt export) would otherwise set the mean and poison
    the model. `found` learns an inferred range."""
    def inferred(held: list[RatingsChunk]) -> tuple[float, float]:
        bounds = infer_rating_range(np.concatenate([c.ratings for c in held])[:RATING_SAMPLE_ROWS])
        found(bounds)
        return bounds

    held: list[RatingsChunk] = []
    bounds = given
    for chunk in chunks:
        held.append(chunk)
        if bounds is None and sum(map(len, held)) >= RATING_SAMPLE_ROWS:
            bounds = inferred(held)
        if bounds is not None:
            yield from (_in_range(each, bounds, path, errors, given is not None) for each in held)
            held = []
    if held:  # fewer ratings than the sample in all
        bounds = inferred(held)
        yield from (_in_range(each, bounds, path, errors, False) for each in held)


def _in_range(chunk: RatingsChunk, bounds: tuple[float, float], path: str, errors: ErrorLog, given: bool) -> RatingsChunk:
    lo, hi = bounds
    ok = (chunk.ratings >= lo) & (chunk.ratings <= hi)
    if ok.all():
        return chunk
    how = "given by --rating-range" if given else "inferred from the first ratings; set it with --rating-range"
    for key, rating in zip(chunk.keys[~ok], chunk.ratings[~ok]):
        errors.bad(path, int(key), f"rating outside [{lo:g}, {hi:g}] ({how})", f"{rating:g}")
    return chunk.take(ok)


# ---------------------------------------------------------------- Criteo


def criteo_feature_indices(hashes: np.ndarray, hash_bits: int) -> np.ndarray:
    """Map categorical hashes into [13, 2**hash_bits)."""
    return bucket(hashes, CRITEO_INT_COLUMNS, (1 << hash_bits) - CRITEO_INT_COLUMNS)


def read_criteo(path: str, errors: ErrorLog, hash_bits: int, workers: int = 1) -> Iterator[SparseChunk]:
    """Parse Criteo TSV into CSR chunks (integer values raw, categoricals hashed).

    Blocks can be parsed on `workers` threads; results and malformed-line
    reports come back in input order, so output never depends on the thread
    count.  Default 1: on 2 cores threads gave no speed-up (the many small
    numpy calls per block hold the GIL), ~100k lines/s either way.
    """
    if (1 << hash_bits) <= CRITEO_INT_COLUMNS:
        raise ValueError(f"hash_bits={hash_bits} leaves no room for categorical features")
    for chunk, bad in ordered_map(lambda blk: _parse_criteo_block(blk, hash_bits), read_blocks(path), workers):
        for line_no, reason, text in bad:
            errors.bad(path, line_no, reason, text)
        yield chunk


Bad = list[tuple[int, str, bytes]]


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    """`map` over a thread pool with at most 2 * workers items in flight, results in order."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mlless-parse") as pool:
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _collect(lines: Lines, bad: np.ndarray, reason: str, out: Bad) -> None:
    for i in np.flatnonzero(bad):
        out.append((int(lines.numbers[i]), reason, lines.text(int(i))))


def _parse_criteo_block(block: Block, hash_bits: int) -> tuple[SparseChunk, Bad]:
    n_cat = CRITEO_CAT_COLUMNS
    bad: Bad = []
    lines = split_lines(block)
    fields, good = split_fields(lines, ord("\t"), CRITEO_FIELDS)
    _collect(lines, ~good, f"expected {CRITEO_FIELDS} tab-separated fields", bad)
    lines = lines.take(good)
    n = len(lines)
    label_chars, label_len = fields.chars(0, width=1)
    ok = (label_len == 1) & ((label_chars[:, 0] == ord("0")) | (label_chars[:, 0] == ord("1")))
    int_chars, int_len = fields.chars(slice(1, 1 + CRITEO_INT_COLUMNS))
    ints, int_ok = parse_ints(int_chars, int_len)
    ok &= int_ok.reshape(n, CRITEO_INT_COLUMNS).all(axis=1)
    cat_words, cat_len = fields.words(slice(1 + CRITEO_INT_COLUMNS, CRITEO_FIELDS))
    ok &= _hexadecimal(cat_words, cat_len).reshape(n, n_cat).all(axis=1)
    if not ok.all():
        _collect(lines, ~ok, "label must be 0/1, integer columns decimal and categorical columns hexadecimal", bad)
        bad.sort(key=lambda b: b[0])
    columns = np.tile(np.arange(n_cat, dtype=np.int64), n)
    cat_idx = criteo_feature_indices(hash_words(cat_words, cat_len, columns), hash_bits)
    index = np.empty((n, CRITEO_INT_COLUMNS + n_cat), dtype=np.int32)
    index[:, :CRITEO_INT_COLUMNS] = np.arange(CRITEO_INT_COLUMNS, dtype=np.int32)
    index[:, CRITEO_INT_COLUMNS:] = cat_idx.reshape(n, n_cat)
    value = np.ones((n, CRITEO_INT_COLUMNS + n_cat), dtype=np.float32)
    value[:, :CRITEO_INT_COLUMNS] = ints.reshape(n, CRITEO_INT_COLUMNS)
    present = np.empty((n, CRITEO_INT_COLUMNS + n_cat), dtype=bool)
    present[:, :CRITEO_INT_COLUMNS] = int_len.reshape(n, CRITEO_INT_COLUMNS) > 0
    present[:, CRITEO_INT_COLUMNS:] = cat_len.reshape(n, n_cat) > 0
    present &= ok[:, None]
    indptr = np.zeros(int(ok.sum()) + 1, dtype=np.int64)
    np.cumsum(present[ok].sum(axis=1), out=indptr[1:])
    labels = (label_chars[ok, 0] == ord("1")).astype(np.float32)
    return SparseChunk(lines.numbers[ok], labels, indptr, index[present], value[present]), bad


def _hexadecimal(words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Which zero-padded values (rows of `words`) are all hexadecimal digits: Criteo's categoricals are hashes, so
    anything else is a corrupt or foreign line. Arithmetic on the bytes, as a table lookup doubled the parse time."""
    chars = words.view(np.uint8)
    digit = (chars - np.uint8(48)) < 10
    letter = ((chars | np.uint8(0x20)) - np.uint8(97)) < 6
    return np.count_nonzero(digit | letter, axis=1) == lengths


# ---------------------------------------------------------------- LIBSVM


@dataclass(frozen=True)
class LibsvmOptions:
    """How to read feature indices: `base` 1 (svmlight default) or 0; keep or hash them. How to read labels
    (`mlless.data.manifest.LABEL_KINDS`): "binary" (-1/0 -> 0, +1/1 -> 1), "real" (any finite number, as it is)
    or "classes" (any K distinct values, numbered by `classes`, which a validation file's options share)."""

    base: int = 1
    indices: str = "keep"  # "keep" | "hash"
    hash_bits: int = 18
    labels: str = "binary"
    classes: ClassLabels | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", class_labels(self.labels, self.classes))


def class_labels(kind: str, given: ClassLabels | None) -> ClassLabels | None:
    """The class numbering of options whose labels are of `kind`: `given` (a training file's, for its validation
    file) or a new one for "classes"; None for other kinds."""
    return (given or ClassLabels()) if kind == "classes" else None


def label_of(text: bytes | str, kind: str, classes: ClassLabels | None, where: str) -> tuple[float, str]:
    """A row's label read as `kind` (`LibsvmOptions.labels`), and why it is refused ("" if it is not): "binary"
    takes -1/0 as 0 and +1/1 as 1; "real" any finite number as it is; "classes" the number `classes` gives the
    value (`mlless.data.classes`; `where`, "file:line", names a line with one class too many)."""
    if classes is not None:
        return classes.id_of(text, where)
    try:
        y = float(text)
    except ValueError:
        return 0.0, "label is not a number"
    if kind != "binary":
        return (y, "") if math.isfinite(y) else (0.0, "label is not a finite number")
    if y not in (-1.0, 0.0, 1.0):
        return 0.0, "label must be -1, 0 or +1 (--labels real reads any number, --labels classes any K values)"
    return float(y > 0), ""


def read_libsvm(path: str, errors: ErrorLog, options: LibsvmOptions) -> Iterator[SparseChunk]:
    """Parse LIBSVM text; labels as `options.labels` says, `qid:` tokens and `#` comments ignored.

    Lines vary in length, so this parser loops in Python (about 0.3-0.5 M
    short lines/s); the hashing of indices in "hash" mode is vectorised.
    """
    n_buckets = 1 << options.hash_bits
    for block in read_blocks(path):
        keys: list[int] = []
        labels: list[float] = []
        lengths: list[int] = []
        idx_tokens: list[bytes] = []
        val_tokens: list[bytes] = []
        line_no = block.first_line - 1
        for raw in block.data.split(b"\n")[:-1]:
            line_no += 1
            line = raw.split(b"#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            y, why = label_of(parts[0], options.labels, options.classes, f"{path}:{line_no}")
            if why:
                errors.bad(path, line_no, why, raw)
                continue
            feats = [p for p in parts[1:] if not p.startswith(b"qid:")]
            pairs = [p.split(b":", 1) for p in feats]
            if any(len(p) != 2 or not p[0] or not p[1] for p in pairs):
                errors.bad(path, line_no, "features must be index:value", raw)
                continue
            keys.append(line_no)
            labels.append(y)
            lengths.append(len(pairs))
            idx_tokens.extend(p[0] for p in pairs)
            val_tokens.extend(p[1] for p in pairs)
        if not keys:
            continue
        values, ok_v = _floats(val_tokens)
        if options.indices == "hash":
            index = bucket(hash_strings(idx_tokens, 0), 0, n_buckets).astype(np.int64) if idx_tokens else np.empty(0, np.int64)
            ok_i = np.ones(len(idx_tokens), dtype=bool)
        else:
            index, ok_i = _ints(idx_tokens)
            index = index - options.base
            ok_i &= index >= 0
        indptr = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        bad_entry = ~(ok_v & ok_i)
        chunk = SparseChunk(np.array(keys, np.int64), np.array(labels, np.float32), indptr, index, values.astype(np.float32))
        if bad_entry.any():
            row_of_entry = np.repeat(np.arange(len(keys)), lengths)
            bad_rows = np.zeros(len(keys), dtype=bool)
            bad_rows[row_of_entry[bad_entry]] = True
            first_bad = {}  # a bad row's first bad entry, shown in its message
            for j in np.flatnonzero(bad_entry)[::-1]:
                first_bad[int(row_of_entry[j])] = int(j)
            for r in np.flatnonzero(bad_rows):
                j = first_bad[int(r)]
                errors.bad(path, int(chunk.keys[r]), f"feature index below {options.base} or value not a finite "
                           "number", idx_tokens[j] + b":" + val_tokens[j])
            chunk = chunk.take(~bad_rows)
        yield chunk


def _floats(tokens: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    if not tokens:
        return np.empty(0, np.float64), np.empty(0, bool)
    return floats_of(np.array(tokens))


def _ints(tokens: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    if not tokens:
        return np.empty(0, np.int64), np.empty(0, bool)
    arr = np.array(tokens)
    w = arr.dtype.itemsize
    chars = arr.view(np.uint8).reshape(len(tokens), w)
    lengths = np.char.str_len(arr).astype(np.int64)
    values, ok = parse_ints(chars, lengths)
    return values, ok & (lengths > 0) & (lengths <= 10)
