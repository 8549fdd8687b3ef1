"""CSV input: `mlless prepare --format csv FILE --label COL`.

The first line names the columns, and every later line is one row (quoted fields as in RFC 4180, but a row is on
one line). COL is the label column, by its name in the header or by its 0-based position. Every other column is
numeric when its non-empty cells among the first `TYPE_ROWS` rows are numbers (all but 1 %), and categorical
otherwise:

- numeric columns are features 0 … k − 1 in header order, their values as given (an empty cell is absent);
- categorical ones are hashed with their column into [k, 2^hash_bits), value 1, as Criteo's categoricals are
  (`formats.criteo_feature_indices`); with none, the feature space is the k numeric columns (a dense set).

A row with another number of fields, a label its `--labels` kind refuses, or a numeric cell that is not a finite
number is reported with its line and left out, as in the other formats (`--on-error`).
"""
from __future__ import annotations

import csv
import itertools
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from mlless.data.chunks import SparseChunk
from mlless.data.classes import ClassLabels
from mlless.data.formats import class_labels, label_of
from mlless.data.hashing import bucket, hash_strings
from mlless.data.text import ErrorLog, floats_of, read_blocks

#: Rows read to tell numeric columns from categorical ones, and the share of their non-empty cells that must be
#: numbers for a numeric one.
TYPE_ROWS, NUMERIC_SHARE = 1000, 0.99


class CsvError(ValueError):
    """The file's header does not fit the options (no header, no such label column, too few hash bits)."""


@dataclass(frozen=True)
class CsvOptions:
    label: str
    hash_bits: int = 18
    labels: str = "binary"  # mlless.data.manifest.LABEL_KINDS
    delimiter: str = ","
    #: With labels "classes": their numbering (`mlless.data.classes`), shared with the validation file's options.
    classes: ClassLabels | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", class_labels(self.labels, self.classes))


@dataclass(frozen=True)
class CsvLayout:
    """What the header and the first rows say: the columns, the label's, and which are numeric or categorical."""

    columns: tuple[str, ...]
    header_line: int
    label: int
    numeric: tuple[int, ...]
    categorical: tuple[int, ...]
    n_features: int

    def describe(self) -> dict[str, object]:
        return {"label_column": self.columns[self.label], "numeric_columns": [self.columns[c] for c in self.numeric],
                "categorical_columns": [self.columns[c] for c in self.categorical]}


def _rows(lines: list[str], delimiter: str, first_line: int) -> Iterator[tuple[int, list[str] | str]]:
    """(line number, fields) of each non-blank line, or (line number, why) of one that is not a CSV row."""
    for number, line in enumerate(lines, start=first_line):
        if not line.strip():
            continue
        try:
            yield number, next(csv.reader([line], delimiter=delimiter, strict=True))
        except csv.Error as exc:
            yield number, f"not a CSV row ({exc})"


def _lines(data: bytes) -> list[str]:
    # latin-1 maps every byte to one character and back, so a categorical cell hashes as its bytes, whatever the
    # file's encoding, and no byte can fail to decode.
    return [line.rstrip("\r") for line in data.decode("latin-1").split("\n")[:-1]]


def _text(fields: list[str], options: CsvOptions) -> bytes:
    """A row as its error line shows it."""
    return options.delimiter.join(fields).encode("latin-1")


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _mostly_numbers(cells: list[str]) -> bool:
    """Whether a column of these (non-empty) cells is numeric: a stray word in a numeric column is a bad row, not a
    reason to hash its numbers."""
    return sum(map(_is_number, cells)) >= NUMERIC_SHARE * len(cells)


def _first_rows(path: str, delimiter: str, count: int) -> list[tuple[int, list[str] | str]]:
    """The header and up to `count` − 1 rows after it; CsvError if there is no header."""
    block = next(read_blocks(path), None)
    rows = [] if block is None else list(itertools.islice(_rows(_lines(block.data), delimiter, 1), count))
    if not rows:
        raise CsvError(f"{path}: empty; a CSV file starts with a header line naming its columns")
    if isinstance(rows[0][1], str):
        raise CsvError(f"{path}:{rows[0][0]}: the header is {rows[0][1]}")
    return rows


def _names(header: list[str] | str) -> tuple[str, ...]:
    return tuple(name.strip() for name in header)


def csv_columns(path: str, delimiter: str) -> tuple[str, ...]:
    """The column names of `path`'s header."""
    return _names(_first_rows(path, delimiter, 1)[0][1])


def csv_layout(path: str, options: CsvOptions) -> CsvLayout:
    """Read the header and the first `TYPE_ROWS` rows of `path`; CsvError says what does not fit."""
    rows = _first_rows(path, options.delimiter, TYPE_ROWS + 1)
    columns = _names(rows[0][1])
    if options.label in columns:
        label = columns.index(options.label)
    elif options.label.isdigit() and int(options.label) < len(columns):
        label = int(options.label)
    else:
        raise CsvError(f"--label {options.label!r}: {path}'s header has no such column (it has: "
                       f"{', '.join(columns[:20])}{', …' if len(columns) > 20 else ''})")
    others = [c for c in range(len(columns)) if c != label]
    if not others:
        raise CsvError(f"{path}: no feature columns besides the label column {columns[label]!r}")
    sample = [fields for _, fields in rows[1:] if isinstance(fields, list) and len(fields) == len(columns)]
    numeric = tuple(c for c in others if _mostly_numbers([f[c] for f in sample if f[c].strip()]))
    categorical = tuple(c for c in others if c not in numeric)
    if categorical and (1 << options.hash_bits) <= len(numeric):
        raise CsvError(f"--hash-bits {options.hash_bits}: 2^{options.hash_bits} features leave no room to hash "
                       f"{path}'s categorical columns after its {len(numeric)} numeric ones")
    return CsvLayout(columns, rows[0][0], label, numeric, categorical,
                     (1 << options.hash_bits) if categorical else len(numeric))


def read_csv(path: str, errors: ErrorLog, options: CsvOptions, layout: CsvLayout) -> Iterator[SparseChunk]:
    """Parse `path` (header skipped) into CSR chunks, as `layout` says."""
    width, k = len(layout.columns), len(layout.numeric)
    buckets = layout.n_features - k
    for block in read_blocks(path):
        keys, labels, cells = [], [], []
        for number, fields in _rows(_lines(block.data), options.delimiter, block.first_line):
            if number == layout.header_line:
                continue
            if isinstance(fields, str):
                errors.bad(path, number, fields, block.data.split(b"\n")[number - block.first_line])
                continue
            if len(fields) != width:
                errors.bad(path, number, f"expected {width} fields as the header has, found {len(fields)}",
                           _text(fields, options))
                continue
            y, why = label_of(fields[layout.label], options.labels, options.classes, f"{path}:{number}")
            if why:
                errors.bad(path, number, f"column {layout.columns[layout.label]}: {why}", _text(fields, options))
                continue
            keys.append(number)
            labels.append(y)
            cells.append(fields)
        if not keys:
            continue
        n = len(keys)
        table = np.array(cells, dtype=object).reshape(n, width)
        index = np.zeros((n, k + len(layout.categorical)), np.int32)
        value = np.ones(index.shape, np.float32)
        present = np.zeros(index.shape, bool)
        ok = np.ones(n, bool)
        for j, c in enumerate(layout.numeric):
            cell = np.char.strip(table[:, c].astype(str))
            present[:, j] = cell != ""
            held = np.flatnonzero(present[:, j])
            parsed, good = floats_of(np.array([cell[r].encode("latin-1") for r in held], dtype=np.bytes_))
            value[held, j] = parsed
            bad = held[~good]
            for r in bad[ok[bad]]:
                errors.bad(path, keys[r], f"column {layout.columns[c]}: not a finite number ({str(cell[r])!r})",
                           _text(cells[r], options))
            ok[bad] = False
            index[:, j] = j
        for j, c in enumerate(layout.categorical, start=k):
            cell = table[:, c].astype(str)
            present[:, j] = cell != ""
            held = [s.encode("latin-1") for s in cell[present[:, j]]]
            index[present[:, j], j] = bucket(hash_strings(held, c), k, buckets) if held else []
        present &= ok[:, None]
        indptr = np.zeros(int(ok.sum()) + 1, np.int64)
        np.cumsum(present[ok].sum(axis=1), out=indptr[1:])
        yield SparseChunk(np.array(keys, np.int64)[ok], np.array(labels, np.float32)[ok], indptr, index[present],
                          value[present])
