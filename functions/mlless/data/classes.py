"""Class labels (`mlless prepare --labels classes`): any K distinct values, numbered 0 … K − 1.

A class label is an integer ("1", "+7", "3.0") or a word ("cat"); a number that is not an integer ("2.5") or not
finite is refused, as it is a value to regress on (`--labels real`). The parsers number the labels in the order they
first appear (`ClassLabels.id_of`); when the training rows are read, `final()` sorts them (integers ascending, then
words) and the batches hold each row's sorted position, so the classes are 0 … K − 1 whatever the file called
them; the manifest records the labels in that order (`feature_stats.label_values`). Once the training file is read
the classes are `freeze()`-d: a validation file's row with another label is a bad line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mlless.data.manifest import MAX_CLASSES
from mlless.data.text import MalformedInputError


@dataclass(eq=False)
class ClassLabels:
    """The distinct class labels read so far, each with the number it was first given."""

    ids: dict[int | str, int] = field(default_factory=dict)
    frozen: bool = False

    @staticmethod
    def key(text: bytes | str) -> tuple[int | str | None, str]:
        """The class `text` names (an int for an integer, else the word), or None and why it is refused. `text`
        is bytes (libsvm) or a str whose characters are the file's bytes (csv reads latin-1)."""
        raw = text if isinstance(text, bytes) else text.encode("latin-1", "replace")
        word = raw.decode("utf-8", "replace").strip()
        if not word:
            return None, "label is empty"
        try:
            number = float(word)
        except ValueError:
            return word, ""
        if not math.isfinite(number) or number != int(number):
            return None, "a class label that is a number must be an integer (--labels real reads values to regress on)"
        return int(number), ""

    def id_of(self, text: bytes | str, where: str) -> tuple[float, str]:
        """The number of the class `text` names, and why it is refused ("" if it is not). `where` ("file:line")
        names the line that brings one class more than `MAX_CLASSES` (MalformedInputError, whatever --on-error
        says: the data set is not one of classes)."""
        key, why = self.key(text)
        if key is None:
            return 0.0, why
        if key in self.ids:
            return float(self.ids[key]), ""
        if self.frozen:
            return 0.0, f"label {key!r} is none of the training file's classes"
        if len(self.ids) >= MAX_CLASSES:
            raise MalformedInputError(f"{where}: --labels classes: more than {MAX_CLASSES} distinct labels (--labels real "
                                 "reads them as values to regress on)")
        self.ids[key] = len(self.ids)
        return float(self.ids[key]), ""

    def number(self, labels: np.ndarray, where: str) -> np.ndarray:
        """Integer labels given as numbers (a generator's), numbered as `id_of` numbers them written out."""
        values, inverse = np.unique(labels, return_inverse=True)
        ids = np.array([self.id_of(f"{int(v)}", where)[0] for v in values], np.float32)
        return ids[inverse]

    def freeze(self) -> None:
        """No more classes: a later label that is none of these is refused."""
        self.frozen = True

    def final(self) -> tuple[list[int | str], np.ndarray]:
        """The labels in class order (integers ascending, then words), and each first-seen number's class."""
        values = sorted(self.ids, key=lambda k: (isinstance(k, str), k))
        order = np.empty(len(values), np.float32)
        for position, value in enumerate(values):
            order[self.ids[value]] = position
        return values, order
