"""Reading a user's pickle file without running what it names: the CIFAR python batches (`mlless.data.image_formats`).

`pickle.load` calls any function a file names, so a pickle from a user (or from across a process boundary) is never
read with it. `load` reads with an unpickler whose `find_class` refuses every global but the few numpy names an
array is rebuilt from: dicts, lists, tuples, strings, bytes, numbers and None load as themselves, and so do numpy
arrays of integers. CIFAR's batches need the arrays: their `data` is a numpy uint8 array (pickled by numpy's
`__reduce__`: `_reconstruct(ndarray, (0,), b"b")`, then `ndarray.__setstate__` with a `dtype` and the raw bytes),
not plain bytes, so `_reconstruct`, `ndarray` and `dtype` are admitted, with the dtype held to plain integers: an
object dtype would let the file's own objects into an array (harmless here, since those are plain data too, but no
batch needs one), and no other global is reachable from those three. Python 3 writes bytes at protocol 2 as
`_codecs.encode(text, "latin1")`, admitted for latin1 alone.
"""
from __future__ import annotations

import io
import pickle
from typing import Any, BinaryIO, Callable

import numpy as np

_multiarray = getattr(np, "_core", None) or np.core  # numpy 2 renamed numpy.core, and warns on the old name

#: The dtypes an array in the file may have: unsigned and signed integers, one byte order or none.
_INTEGER_KINDS = "ui"


def _dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    """`numpy.dtype` as a pickle calls it (`dtype('u1', False, True)`; a Python 2 file gives b'u1'), for integers."""
    if isinstance(spec, bytes):
        spec = spec.decode("ascii", "replace")
    if not isinstance(spec, str) or len(spec) > 4:
        raise pickle.UnpicklingError(f"an array dtype {spec!r}: only integer arrays are read")
    try:
        dtype = np.dtype(spec, bool(align), bool(copy))
    except TypeError:
        raise pickle.UnpicklingError(f"an array dtype {spec!r}: only integer arrays are read") from None
    if dtype.kind not in _INTEGER_KINDS:
        raise pickle.UnpicklingError(f"an array of {dtype}: only integer arrays are read")
    return dtype


def _reconstruct(subtype: Any, shape: Any, typecode: Any) -> np.ndarray:
    """numpy's `_reconstruct` for plain arrays only (a subclass could be any class the file names)."""
    if subtype is not np.ndarray:
        raise pickle.UnpicklingError("an array of a numpy subclass: only plain arrays are read")
    return _multiarray.multiarray._reconstruct(np.ndarray, shape, typecode)


def _latin1(text: Any, encoding: Any) -> bytes:
    """`_codecs.encode(text, "latin1")`: how Python 3 writes bytes at protocol 2 (which Python 2, which has no
    bytes, reads too), as a batch re-pickled for both versions holds its pixels; no other codec."""
    if not isinstance(text, str) or encoding != "latin1":
        raise pickle.UnpicklingError(f"it encodes {type(text).__name__} with {encoding!r}; only latin1 text is read")
    return text.encode("latin1")


#: (module, name) -> what the file gets for it. Python 2 files and numpy 1 name numpy.core, numpy 2 numpy._core.
_ALLOWED: dict[tuple[str, str], Callable[..., Any] | type] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("_codecs", "encode"): _latin1,
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"it names {module}.{name}; only plain data and integer numpy arrays are "
                                         "read from a pickle") from None


def load(stream: BinaryIO | bytes) -> Any:
    """The object pickled in `stream`; pickle.UnpicklingError if it names anything but plain data and integer arrays,
    or another error of the unpickler's (EOFError, ValueError, ...) if the bytes are not a whole pickle.
    Strings of a Python 2 pickle (CIFAR's) come back as bytes, keys included: b"data"."""
    if isinstance(stream, bytes):
        stream = io.BytesIO(stream)
    return _Unpickler(stream, encoding="bytes").load()
