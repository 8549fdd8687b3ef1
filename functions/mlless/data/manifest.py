"""The `manifest.json` of a prepared dataset: schema, serialisation and validation.

The manifest is the contract between `mlless prepare` and the workers: it
says what kind of batches to expect, the model dimensions, and the sha256 of
every file so a truncated or tampered batch is caught before training on
it.  It holds no timestamps, so the same input and seed give the same bytes.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

FORMAT_VERSION = 1
#: Bounds of a data set's counts: far above any real one (row ids and feature indices are int32 in batches).
MAX_ROWS = 2**40
MAX_FEATURES = 2**31 - 1
KINDS = ("ratings", "sparse", "images")
#: What a data set's labels are (`mlless prepare --labels`, the manifest's `source.labels`): 0/1, real
#: numbers (regression), or a few distinct values, each a class (`feature_stats.label_classes`, sorted). An image set's
#: are classes or real (`IMAGE_LABEL_KINDS`).
LABEL_KINDS = ("binary", "real", "classes")
#: A data set of classes has at most this many distinct labels: beyond, they are values to regress on.
MAX_CLASSES = 1000
#: Bounds of an image data set's shape, so a manifest cannot make a reader build a network of any size.
MAX_CHANNELS = 64
MAX_IMAGE_SIDE = 4096
#: A pixel's largest value: images are stored as uint8, and their mean and deviation are on this scale.
MAX_PIXEL = 255


class DatasetError(ValueError):
    """A prepared dataset is missing, malformed or corrupt; the message names the file."""


def batch_name(i: int) -> str:
    return f"train/batch-{i:06d}.npz"


def user_shard_name(s: int) -> str:
    return f"users/shard-{s:03d}.npz"


#: Every user shard's and item's rating count (`mlless.data.user_shards`).
USER_COUNTS_NAME = "users/counts.npz"
MAX_USER_SHARDS = 4096
VALIDATION_NAME = "validation.npz"
IDS_NAME = "ids.npz"
MANIFEST_NAME = "manifest.json"


#: The manifest's fields an image data set has and others have not (`Manifest`); n_classes is null for real labels.
IMAGE_FIELDS = ("channels", "height", "width", "n_classes", "pixel_mean", "pixel_std")
#: The label kinds of an image set (`source.labels`; absent: classes, as before it was recorded).
IMAGE_LABEL_KINDS = ("classes", "real")


@dataclass(frozen=True)
class Manifest:
    """Typed view of manifest.json; fields that do not apply to a kind are None."""

    format_version: int
    kind: str
    source: dict[str, Any]
    seed: int
    batch_size: int
    n_batches: int
    n_train: int
    n_validation: int
    validation_fraction: float
    n_validation_dropped: int
    n_users: int | None
    n_items: int | None
    mean_rating: float | None
    rating_min: float | None
    rating_max: float | None
    n_features: int | None
    hash_bits: int | None
    feature_stats: dict[str, Any]
    skipped_lines: int
    skipped_examples: list[str]
    checksums: dict[str, str] = field(default_factory=dict)
    #: Ratings only: the training ratings are also in this many user shards (`mlless.data.user_shards`); 0 in
    #: data sets prepared before there were any (the field may be absent), and for sparse data.
    user_shards: int = 0
    #: Images only (None for other kinds, and absent from their manifests): the shape of an image, channels first,
    #: its number of classes (None for real labels, whose training mean and standard deviation are
    #: `feature_stats.label_mean` and `label_std`), and each channel's pixel mean and standard deviation over the
    #: training images, on the 0-255 scale of the stored uint8 pixels.
    channels: int | None = None
    height: int | None = None
    width: int | None = None
    n_classes: int | None = None
    pixel_mean: list[float] | None = None
    pixel_std: list[float] | None = None

    def _check_values(self, source: str) -> None:
        """Plausible values: finite numbers, a consistent rating range, and dimensions no larger than the rows
        that define them (prepare numbers only the users and items it saw), so a manifest cannot make a reader
        allocate a model of any size."""
        rows = self.n_train + self.n_validation + self.n_validation_dropped
        for name in ("n_users", "n_items"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= rows:
                raise DatasetError(f"{source}: field '{name}' is {v}; at most the {rows} rows can define")
        if self.n_features is not None and not 0 <= self.n_features <= MAX_FEATURES:
            raise DatasetError(f"{source}: field 'n_features' is {self.n_features}, not in [0, {MAX_FEATURES}]")
        for name in ("mean_rating", "rating_min", "rating_max"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise DatasetError(f"{source}: field '{name}' is {v}, not a finite number")
        if not 0 <= self.validation_fraction < 1:  # NaN fails it too
            raise DatasetError(f"{source}: field 'validation_fraction' is {self.validation_fraction}, not in [0, 1)")
        if self.kind == "images":
            self._check_images(source)
        if self.rating_min is not None and self.rating_max is not None and self.mean_rating is not None \
                and not self.rating_min <= self.mean_rating <= self.rating_max:
            raise DatasetError(f"{source}: fields 'rating_min' <= 'mean_rating' <= 'rating_max' do not hold: "
                               f"{self.rating_min}, {self.mean_rating}, {self.rating_max}")

    def _check_images(self, source: str) -> None:
        """An image's shape and classes within bounds, and a mean and a positive deviation per channel on the
        pixels' scale (a network divides by the deviation); of real labels, no classes but their mean and a positive
        deviation (a network's output is scaled by it)."""
        assert self.channels is not None and self.height is not None and self.width is not None \
            and self.pixel_mean is not None and self.pixel_std is not None
        labels = self.source.get("labels", IMAGE_LABEL_KINDS[0])
        if labels not in IMAGE_LABEL_KINDS:
            raise DatasetError(f"{source}: field 'source.labels' of images is {labels!r}, not one of {IMAGE_LABEL_KINDS}")
        counts = [("channels", MAX_CHANNELS), ("height", MAX_IMAGE_SIDE), ("width", MAX_IMAGE_SIDE)]
        if labels == "real":
            if self.n_classes is not None:
                raise DatasetError(f"{source}: field 'n_classes' is {self.n_classes}, and the labels are real")
            for name in ("label_mean", "label_std"):
                v = self.feature_stats.get(name)
                if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                        and (name == "label_mean" or v > 0)):
                    raise DatasetError(f"{source}: field 'feature_stats.{name}' of real labels is {v!r}, not a "
                                       + ("finite number" if name == "label_mean" else "positive finite number"))
        elif self.n_classes is None:
            raise DatasetError(f"{source}: field 'n_classes' must not be null")
        else:
            counts.append(("n_classes", MAX_CLASSES))
        for name, top in counts:
            if not 1 <= getattr(self, name) <= top:
                raise DatasetError(f"{source}: field '{name}' is {getattr(self, name)}, not in [1, {top}]")
        for name, positive in (("pixel_mean", False), ("pixel_std", True)):
            values = getattr(self, name)
            if len(values) != self.channels or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and (0 < v if positive else 0 <= v)
                    and v <= MAX_PIXEL for v in values):  # NaN fails the comparisons
                bounds = f"(0, {MAX_PIXEL}]" if positive else f"[0, {MAX_PIXEL}]"
                raise DatasetError(f"{source}: field '{name}' must be {self.channels} numbers in {bounds}, one a "
                                   f"channel; got {values}")

    def to_json(self) -> str:
        data = asdict(self)
        if self.kind != "images":  # other kinds' manifests stay as they were before there were images
            for name in IMAGE_FIELDS:
                del data[name]
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def batch_rows(self, i: int) -> int:
        """Rows in batch i: batch_size for all but the last."""
        if i < self.n_batches - 1:
            return self.batch_size
        return self.n_train - (self.n_batches - 1) * self.batch_size

    @classmethod
    def from_json(cls, text: str | bytes, source: str) -> Manifest:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DatasetError(f"{source}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise DatasetError(f"{source}: top level must be an object")
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> Manifest:
        """Check presence and type of every field, then the cross-field invariants."""
        kind = data.get("kind")
        if kind not in KINDS:
            raise DatasetError(f"{source}: field 'kind' must be one of {KINDS}, got {kind!r}")
        per_kind_required = {
            "ratings": {"n_users", "n_items", "mean_rating", "rating_min", "rating_max"},
            "sparse": {"n_features"},
            "images": set(IMAGE_FIELDS) - {"n_classes"},  # `_check_images`: null for real labels
        }[kind]
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.name == "user_shards" or (f.name in IMAGE_FIELDS and kind != "images"):
                    continue
                if f.name == "checksums":
                    raise DatasetError(f"{source}: missing field 'checksums'")
                raise DatasetError(f"{source}: missing field '{f.name}'")
            v = data[f.name]
            t = str(f.type)
            optional = "None" in t
            if v is None:
                if not optional or f.name in per_kind_required:
                    raise DatasetError(f"{source}: field '{f.name}' must not be null")
            elif t.startswith("int"):
                if not isinstance(v, int) or isinstance(v, bool):
                    raise DatasetError(f"{source}: field '{f.name}' must be an integer, got {v!r}")
            elif t.startswith("float"):
                if not isinstance(v, (int, float)) or isinstance(v, bool):
                    raise DatasetError(f"{source}: field '{f.name}' must be a number, got {v!r}")
                v = float(v)
            elif t.startswith("dict"):
                if not isinstance(v, dict):
                    raise DatasetError(f"{source}: field '{f.name}' must be an object")
            elif t.startswith("list"):
                if not isinstance(v, list):
                    raise DatasetError(f"{source}: field '{f.name}' must be a list")
            elif t == "str" and not isinstance(v, str):
                raise DatasetError(f"{source}: field '{f.name}' must be a string")
            if f.name in IMAGE_FIELDS and v is not None and kind != "images":
                raise DatasetError(f"{source}: field '{f.name}' is for images alone, and this data set is {kind}")
            values[f.name] = v
        m = cls(**values)
        if m.format_version != FORMAT_VERSION:
            raise DatasetError(f"{source}: unsupported format_version {m.format_version} (this reader knows {FORMAT_VERSION})")
        for name in ("batch_size", "n_train", "n_batches", "n_validation", "n_validation_dropped"):
            if not (1 if name == "batch_size" else 0) <= getattr(m, name) <= MAX_ROWS:
                raise DatasetError(f"{source}: field '{name}' out of range: {getattr(m, name)}")
        if m.n_batches != -(-m.n_train // m.batch_size):
            raise DatasetError(f"{source}: n_batches={m.n_batches} disagrees with n_train={m.n_train} and batch_size={m.batch_size}")
        m._check_values(source)
        if len(m.checksums) < m.n_batches + 1:  # before looking for each: n_batches may be absurd
            raise DatasetError(f"{source}: {len(m.checksums)} checksums for {m.n_batches} batches and the validation split")
        for i in range(m.n_batches):
            if batch_name(i) not in m.checksums:
                raise DatasetError(f"{source}: no checksum for {batch_name(i)}")
        if VALIDATION_NAME not in m.checksums:
            raise DatasetError(f"{source}: no checksum for {VALIDATION_NAME}")
        if m.user_shards:
            if m.kind != "ratings" or not 0 < m.user_shards <= MAX_USER_SHARDS:
                raise DatasetError(f"{source}: field 'user_shards' is {m.user_shards}; a ratings set has up to "
                                   f"{MAX_USER_SHARDS}, other kinds none")
            for name in [*map(user_shard_name, range(m.user_shards)), USER_COUNTS_NAME]:
                if name not in m.checksums:
                    raise DatasetError(f"{source}: no checksum for {name}")
        for name, digest in m.checksums.items():
            if not isinstance(digest, str) or len(digest) != 64:
                raise DatasetError(f"{source}: checksum of {name} is not a sha256 hex digest")
        return m
