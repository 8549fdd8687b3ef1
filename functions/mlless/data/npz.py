"""Byte-for-byte reproducible `.npz` files.

`np.savez` stamps every member with the current time, so two runs with the
same seed would produce different bytes and different checksums.  This
writer builds the same format (a zip of `.npy` members, readable by
`np.load(..., allow_pickle=False)`) with a fixed timestamp and no
compression (batches are read every step; inflating costs more than the
bytes saved).
"""
from __future__ import annotations

import hashlib
import io
import zipfile
from typing import Mapping

import numpy as np

_EPOCH = (1980, 1, 1, 0, 0, 0)


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialise arrays (never object dtype) into deterministic npz bytes."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            with zf.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(arr), allow_pickle=False)
    return out.getvalue()


def load_npz_bytes(data: bytes, source: str) -> dict[str, np.ndarray]:
    """Load every array of an npz held in memory, refusing pickled objects."""
    with np.load(io.BytesIO(data), allow_pickle=False) as f:
        return {name: f[name] for name in f.files}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
