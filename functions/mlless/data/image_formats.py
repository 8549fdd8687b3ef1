"""The image inputs of `mlless prepare --format`, each read as it is distributed, into one `ImageSet`.

- npz: arrays X and y (`mlless.data.images`).
- cifar: CIFAR-10's and CIFAR-100's python batches (data_batch_1 … 5 and test_batch; CIFAR-100's train and test),
  pickled dicts of a uint8 `data` array, one row of 3 × 32 × 32 pixels (channels first) an image, and `labels`
  (CIFAR-100: `fine_labels`, its 100 classes). INPUT is the directory holding them, the archive as distributed
  (cifar-10-python.tar.gz, read as a stream: nothing is extracted to disk), or one batch file. The pickles are read
  by `mlless.data.safe_pickle`, which runs nothing a file names.
- mnist: idx files (train-images-idx3-ubyte and train-labels-idx1-ubyte, t10k-… for the test part; gzipped or not),
  as MNIST and Fashion-MNIST ship them. INPUT is their directory, or an images file (its labels file beside it).
- image-folder: one sub-folder of PNG or JPEG images per class, the folder's name its label, decoded by Pillow (a
  dependency of torchvision, imported only here), each resized to `--image-size` if given; RGB, or one channel when
  every image is grayscale.

Labels are classes; `--labels real` reads an npz's `y` as real targets to regress on (`REAL_LABEL_FORMATS`: the
others' labels are class ids or folder names by nature).

INPUT's training part trains; with `--validation`, a second input of the same format is the validation split, and
of a cifar or mnist one its test part is read (test_batch, t10k-…): `--validation` naming INPUT again validates on
the distribution's test set. Without it `prepare_images` holds out a seeded fraction, as for the other kinds.
"""
from __future__ import annotations

import gzip
import io
import math
import posixpath
import re
import struct
import tarfile
import zlib
from dataclasses import dataclass
from typing import Any, Iterator

import fsspec
import numpy as np
from fsspec import AbstractFileSystem

from mlless.data import safe_pickle
from mlless.data.errors import PrepareError
from mlless.data.images import CLASSES, REAL, ImageSet, image_set, npz_images, read_bytes

#: The `--format` choices that make a data set of images.
IMAGE_FORMATS = ("npz", "cifar", "mnist", "image-folder")
#: Those of them whose labels may be real targets (`--labels real`).
REAL_LABEL_FORMATS = ("npz",)
#: What a training input and a validation input are read for (a cifar or mnist input holds both).
TRAIN, TEST = "train", "test"


@dataclass(frozen=True)
class _Part:
    """Images read from one input, as `image_set` takes them; `mode` is an image folder's Pillow mode."""

    x: np.ndarray
    y: np.ndarray
    where: str
    channels_first: bool = False
    mode: str | None = None


def read_images(fmt: str, path: str, validation: str | None = None,
                size: tuple[int, int] | None = None, labels: str = CLASSES) -> ImageSet:
    """The images of `path` in format `fmt` (one of `IMAGE_FORMATS`), with `validation`'s as the validation split;
    an image folder's resized to `size`, (width, height); their labels read as `labels` (classes, or real in
    `REAL_LABEL_FORMATS`). PrepareError naming the file and the problem otherwise."""
    if labels == REAL and fmt not in REAL_LABEL_FORMATS:
        raise PrepareError(f"--format {fmt} reads class labels; real targets come in "
                           f"{' or '.join(REAL_LABEL_FORMATS)} (--labels real)")
    train = _read(fmt, path, TRAIN, size, None)
    held = None if validation is None else _read(fmt, validation, TEST, size, train.mode)
    description: dict[str, Any] = {"format": fmt, "path": path}
    if size is not None:
        description["image_size"] = list(size)
    if validation is not None:
        description["validation"] = validation
    return image_set(train.x, train.y, description, train.where, held and (held.x, held.y, held.where),
                     channels_first=train.channels_first, labels=labels)


def _read(fmt: str, path: str, part: str, size: tuple[int, int] | None, mode: str | None) -> _Part:
    if fmt == "npz":
        return _Part(*npz_images(path))
    if fmt == "cifar":
        return _cifar(path, part)
    if fmt == "mnist":
        return _mnist(path, part)
    if fmt == "image-folder":
        return _folder(path, size, mode)
    raise PrepareError(f"unknown image format {fmt!r}; expected one of {', '.join(IMAGE_FORMATS)}")


def _fs(path: str) -> tuple[AbstractFileSystem, str]:
    try:
        return fsspec.core.url_to_fs(path)
    except (ValueError, ImportError) as exc:
        raise PrepareError(f"{path}: cannot open ({exc})") from None


# ---------------------------------------------------------------------------------------------------- CIFAR

#: A part's batch files by name: CIFAR-10's data_batch_N and test_batch, CIFAR-100's train and test.
_CIFAR_FILES = {TRAIN: re.compile(r"data_batch_(\d+)|train"), TEST: re.compile(r"test_batch|test")}
#: The labels' key: CIFAR-10's, then CIFAR-100's fine labels (its 100 classes, not the 20 coarse ones).
_CIFAR_LABELS = ("labels", "fine_labels")
#: An archive member larger than this is no batch (CIFAR-100's train, the largest, is 155 MB): not read into memory.
_MAX_BATCH_BYTES = 1 << 30
#: How the compressed archives tarfile reads start: gzip, bzip2, xz; a plain tar has "ustar" at byte 257.
_ARCHIVE_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ")


def _cifar(path: str, part: str) -> _Part:
    fs, local = _fs(path)
    if fs.isdir(local):
        names = [n for n in fs.ls(local, detail=False) if _CIFAR_FILES[part].fullmatch(posixpath.basename(n))]
        files = [(name, _cat(fs, name)) for name in names]
    else:
        try:
            with fs.open(local, "rb") as fh:
                head = fh.read(512)
        except FileNotFoundError:
            raise PrepareError(f"input file not found: {path}") from None
        except OSError as exc:
            raise PrepareError(f"{path}: cannot read ({exc})") from None
        archive = head.startswith(_ARCHIVE_MAGIC) or head[257:262] == b"ustar"
        files = list(_members(fs, local, path, part)) if archive else [(path, read_bytes(path))]
    if not files:
        raise PrepareError(f"{path}: no CIFAR batch files of the {part} part in it ("
                           + ("data_batch_1 … 5 or train" if part == TRAIN else "test_batch or test") + ")")
    if len({posixpath.basename(name).startswith("data_batch") for name, _ in files}) > 1:
        raise PrepareError(f"{path}: holds both CIFAR-10's batches (data_batch_N) and CIFAR-100's (train)")
    files.sort(key=lambda file: _batch_number(file[0]))
    batches = [_cifar_batch(name, data) for name, data in files]
    shapes = {x.shape[1:] for x, _ in batches}
    if len(shapes) > 1:
        raise PrepareError(f"{path}: its batches hold images of different sizes ({', '.join(map(str, shapes))})")
    return _Part(np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches]),
                 path if len(files) > 1 else files[0][0], channels_first=True)


def _cat(fs: AbstractFileSystem, name: str) -> bytes:
    try:
        return fs.cat_file(name)
    except OSError as exc:
        raise PrepareError(f"{name}: cannot read ({exc})") from None


def _batch_number(name: str) -> int:
    match = re.fullmatch(r"data_batch_(\d+)", posixpath.basename(name))
    return int(match[1]) if match else 0


def _members(fs: AbstractFileSystem, local: str, path: str, part: str) -> Iterator[tuple[str, bytes]]:
    """The batch files of `part` in the tar archive at `path`, read as a stream (`r|*`: an object store's file need
    not seek), each named `path:member`."""
    try:
        with fs.open(local, "rb") as fh, tarfile.open(fileobj=fh, mode="r|*") as tar:
            for member in tar:
                if not (member.isfile() and _CIFAR_FILES[part].fullmatch(posixpath.basename(member.name))):
                    continue
                where = f"{path}:{member.name}"
                if member.size > _MAX_BATCH_BYTES:
                    raise PrepareError(f"{where}: {member.size:,} bytes, more than a CIFAR batch")
                handle = tar.extractfile(member)
                data = handle.read() if handle is not None else b""
                if len(data) != member.size:
                    raise PrepareError(f"{where}: truncated ({len(data):,} of {member.size:,} bytes)")
                yield where, data
    except PrepareError:
        raise
    # tarfile and the decompressors fail on damaged input in many ways (ReadError, EOFError, zlib.error,
    # lzma.LZMAError, OSError for a bad gzip header or CRC): each means the archive is not readable.
    except Exception as exc:
        raise PrepareError(f"{path}: not a readable tar archive ({type(exc).__name__}: {exc})") from None


def _cifar_batch(where: str, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """A batch file's images, (rows, 3, side, side), and labels."""
    try:
        batch = safe_pickle.load(data)
    # The unpickler fails on damaged input in many ways (UnpicklingError, EOFError, ValueError from numpy's
    # setstate on short array bytes, ...): each means the file is not a batch.
    except Exception as exc:
        raise PrepareError(f"{where}: not a readable CIFAR batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(batch, dict):
        raise PrepareError(f"{where}: not a CIFAR batch (a pickled {type(batch).__name__}, not a dict)")
    fields = {key.decode("latin-1") if isinstance(key, bytes) else key: value for key, value in batch.items()}
    label_key = next((key for key in _CIFAR_LABELS if key in fields), None)
    if "data" not in fields or label_key is None:
        raise PrepareError(f"{where}: not a CIFAR batch (no 'data' and 'labels' or 'fine_labels' in it)")
    pixels = fields["data"]
    if not (isinstance(pixels, np.ndarray) and pixels.dtype == np.uint8 and pixels.ndim == 2):
        raise PrepareError(f"{where}: 'data' must be a uint8 array of one row an image, got "
                           + (f"{pixels.dtype} {pixels.shape}" if isinstance(pixels, np.ndarray)
                              else type(pixels).__name__))
    side = math.isqrt(pixels.shape[1] // 3)
    if side == 0 or 3 * side * side != pixels.shape[1]:
        raise PrepareError(f"{where}: rows of {pixels.shape[1]} pixels are not 3 channels of a square image "
                           f"(CIFAR's are 3 × 32 × 32 = 3072)")
    labels = np.asarray(fields[label_key]) if isinstance(fields[label_key], (list, np.ndarray)) else np.array(None)
    if labels.dtype.kind not in "iu" or labels.shape != (len(pixels),):
        raise PrepareError(f"{where}: '{label_key}' must be {len(pixels)} integers, one an image")
    return pixels.reshape(-1, 3, side, side), labels


# ---------------------------------------------------------------------------------------------------- MNIST

#: The idx files' names, by part: MNIST's t10k is its test part. Some copies spell the dash before idx as a dot.
_IDX_PREFIX = {TRAIN: "train", TEST: "t10k"}
#: The idx type of unsigned bytes, the one MNIST's images and labels have.
_IDX_UBYTE = 0x08


def _mnist(path: str, part: str) -> _Part:
    fs, local = _fs(path)
    if fs.isdir(local):
        names = {posixpath.basename(n) for n in fs.ls(local, detail=False)}
        images, labels = (_idx_name(names, f"{_IDX_PREFIX[part]}-{what}", dims, path) for what, dims in
                          (("images", 3), ("labels", 1)))
        images, labels = posixpath.join(path.rstrip("/"), images), posixpath.join(path.rstrip("/"), labels)
    else:
        images = path
        head, name = posixpath.split(path)
        sibling = re.sub(r"images([-.]idx)3", r"labels\g<1>1", name)
        if sibling == name:
            raise PrepareError(f"{path}: not an idx images file by its name (no 'images-idx3' in it); give the "
                               "directory of train-images-idx3-ubyte and train-labels-idx1-ubyte")
        labels = posixpath.join(head, sibling)
    x = _idx(read_bytes(images), images, 3)
    y = _idx(read_bytes(labels), labels, 1)
    if len(y) != len(x):
        raise PrepareError(f"{labels}: {len(y):,} labels for the {len(x):,} images of {images}")
    return _Part(x, y, images)


def _idx_name(names: set[str], stem: str, dims: int, path: str) -> str:
    for sep in ("-", "."):
        for suffix in ("", ".gz"):
            if (name := f"{stem}{sep}idx{dims}-ubyte{suffix}") in names:
                return name
    raise PrepareError(f"{path}: no {stem}-idx{dims}-ubyte (or .gz) in it")


def _idx(data: bytes, where: str, ndim: int) -> np.ndarray:
    """The array of an idx file (gzipped or not) of `ndim` dimensions of unsigned bytes."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise PrepareError(f"{where}: not a readable gzip file ({exc})") from None
    if len(data) < 4 or data[:2] != b"\0\0":
        raise PrepareError(f"{where}: not an idx file (it does not start with two zero bytes)")
    kind, dims = data[2], data[3]
    if dims != ndim:
        raise PrepareError(f"{where}: an idx array of {dims} dimensions; "
                           + ("images have 3 (n, height, width)" if ndim == 3 else "labels have 1 (n)"))
    if kind != _IDX_UBYTE:
        raise PrepareError(f"{where}: idx type 0x{kind:02x}; --format mnist reads unsigned bytes (0x08)")
    header = 4 + 4 * dims
    shape = struct.unpack(f">{dims}I", data[4:header]) if len(data) >= header else ()
    size = header + math.prod(shape)
    if not shape or len(data) != size:
        raise PrepareError(f"{where}: " + ("truncated" if len(data) < size or not shape else "longer than its header")
                           + f": {len(data):,} bytes, its header describes {size:,}")
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


# ---------------------------------------------------------------------------------------------------- image folder

_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: Pillow's modes of grayscale images (1-bit, 8-bit, 8-bit with alpha): a folder of only these reads as 1 channel.
_GRAY_MODES = ("1", "L", "LA")


def _folder(path: str, size: tuple[int, int] | None, mode: str | None) -> _Part:
    """The images of a folder of class folders, resized to `size`; in Pillow's `mode` (a validation folder takes the
    training folder's), else RGB, or L if every image is grayscale."""
    try:
        from PIL import Image
    except ImportError:
        raise PrepareError("--format image-folder needs Pillow to decode images: pip install pillow") from None
    fs, local = _fs(path)
    if not fs.isdir(local):
        raise PrepareError(f"{path}: " + ("not a directory" if fs.exists(local) else "not found")
                           + "; --format image-folder reads a folder of one sub-folder of images per class")
    classes = sorted(entry["name"] for entry in fs.ls(local, detail=True)
                     if entry["type"] == "directory" and not posixpath.basename(entry["name"]).startswith("."))
    files: list[str] = []
    labels: list[str] = []
    for folder in classes:
        found = sorted(f for f in fs.find(folder) if f.lower().endswith(_IMAGE_SUFFIXES)
                       and not posixpath.basename(f).startswith("."))
        if not found:
            raise PrepareError(f"{folder}: no PNG or JPEG images (.png, .jpg, .jpeg) in this class folder")
        files += found
        labels += [posixpath.basename(folder)] * len(found)
    if not files:
        raise PrepareError(f"{path}: no sub-folders; --format image-folder reads one sub-folder of images per class")
    x: np.ndarray | None = None
    gray = True
    for i, file in enumerate(files):
        try:
            with Image.open(io.BytesIO(fs.cat_file(file))) as image:
                gray = gray and image.mode in _GRAY_MODES
                image = image.convert(mode or "RGB")  # decodes: a damaged file fails here
                if size is not None and image.size != size:
                    image = image.resize(size, Image.Resampling.BILINEAR)
                pixels = np.asarray(image)
        # Pillow reports a damaged or truncated file as OSError (UnidentifiedImageError is one), SyntaxError or
        # ValueError, and an image of more pixels than it allows as DecompressionBombError.
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise PrepareError(f"{file}: not a readable PNG or JPEG image ({exc})") from None
        if x is None:
            x = np.empty((len(files), *pixels.shape), np.uint8)
        elif pixels.shape != x.shape[1:]:
            raise PrepareError(f"{file}: {pixels.shape[1]}×{pixels.shape[0]} pixels, and {files[0]} is "
                               f"{x.shape[2]}×{x.shape[1]}: give --image-size to resize them all")
        x[i] = pixels
    assert x is not None
    if mode is None and gray:  # converted to RGB, each channel the gray one: keep one
        x = np.ascontiguousarray(x[..., 0])
    return _Part(x, np.array(labels), path, mode="L" if x.ndim == 3 else "RGB")
