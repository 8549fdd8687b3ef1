"""Stable, vectorised hashing for feature hashing, splits and shuffle buckets.

Python's `hash()` is salted per process, so it cannot name a feature: a model
trained today must see the same index for the same value tomorrow.  We use
the MurmurHash3 `fmix64` avalanche folded over the raw bytes of a value
(8 at a time), seeded with its column, so that the low bits (which the
modulo keeps) are well mixed.  Everything runs over whole numpy arrays;
no Python-level loop touches individual values.
"""
from __future__ import annotations

import numpy as np

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def fmix64(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser: a bijective avalanche on uint64 arrays."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(33)
        x *= _C1
        x ^= x >> np.uint64(33)
        x *= _C2
        x ^= x >> np.uint64(33)
    return x


def hash_ints(values: np.ndarray, seed: int) -> np.ndarray:
    """Hash integer keys (row numbers, ids) with a seed; stable across runs and platforms."""
    v = np.asarray(values).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = v * _GOLDEN + fmix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) ^ _GOLDEN)
    return fmix64(mixed)


def unit_interval(values: np.ndarray, seed: int) -> np.ndarray:
    """Map integer keys to deterministic pseudo-uniform floats in [0, 1)."""
    return (hash_ints(values, seed) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def hash_bytes_matrix(chars: np.ndarray, lengths: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """Hash byte strings given as a zero-padded (n, w) uint8 matrix; stable across runs.

    The bytes are read as little-endian uint64 words (w is padded to a
    multiple of 8) and folded word by word through `fmix64`, seeded with the
    column the value came from (so "a1b2" in column 3 and in column 7 land in
    different buckets) and finished with the length (so trailing zero bytes
    are not ambiguous).  One pass per 8 bytes, not per byte.
    """
    n, w = chars.shape
    if w % 8:
        chars = np.concatenate([chars, np.zeros((n, 8 - w % 8), dtype=np.uint8)], axis=1)
    return hash_words(np.ascontiguousarray(chars).view("<u8"), lengths, columns)


def hash_words(words: np.ndarray, lengths: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """`hash_bytes_matrix` on values already packed as zero-padded little-endian uint64 words."""
    with np.errstate(over="ignore"):
        h = fmix64(np.asarray(columns, np.uint64) * _GOLDEN + _FNV_OFFSET)
        for k in range(words.shape[1]):
            h = fmix64((h ^ words[:, k]) * _FNV_PRIME)
        h = fmix64(h ^ np.asarray(lengths, np.uint64))
    return h


def hash_strings(values: list[bytes] | list[str], column: int) -> np.ndarray:
    """Convenience wrapper for a list of values (tests, small inputs)."""
    raw = [v.encode() if isinstance(v, str) else v for v in values]
    w = max((len(v) for v in raw), default=0) or 1
    chars = np.zeros((len(raw), w), dtype=np.uint8)
    for i, v in enumerate(raw):
        chars[i, : len(v)] = np.frombuffer(v, dtype=np.uint8)
    lengths = np.array([len(v) for v in raw], dtype=np.int64)
    return hash_bytes_matrix(chars, lengths, np.full(len(raw), column, dtype=np.int64))


def bucket(hashes: np.ndarray, offset: int, n_buckets: int) -> np.ndarray:
    """Reduce hashes to int32 feature indices in [offset, offset + n_buckets)."""
    return (np.uint64(offset) + hashes % np.uint64(n_buckets)).astype(np.int32)
