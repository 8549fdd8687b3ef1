# cython: language_level=3
"""ISP significance-filter kernels.

The accumulator ``acc`` (float32, one per parameter) is paired with a dirty
list: ``flags[i]`` is 1 iff ``i`` is in ``dirty[:n_dirty]``.  Accumulating
appends newly dirty entries; selection walks only the dirty list.
"""
import numpy as np
cimport numpy as cnp
from libc.math cimport fabs

cnp.import_array()


def accumulate(float[::1] acc not None, cnp.uint8_t[::1] flags not None, int[::1] dirty not None,
               Py_ssize_t n_dirty, const int[::1] idx not None, const float[::1] delta not None):
    """acc[idx] += delta; returns the new dirty count."""
    cdef Py_ssize_t j, i, n = idx.shape[0], size = acc.shape[0]
    cdef int bad = 0
    if delta.shape[0] != n:
        raise ValueError("idx and delta differ in length")
    if flags.shape[0] != size or dirty.shape[0] != size:
        raise ValueError("flags and dirty must match the accumulator")
    with nogil:
        for j in range(n):
            i = idx[j]
            if i < 0 or i >= size:
                bad = 1
                break
            acc[i] += delta[j]
            if not flags[i]:
                flags[i] = 1
                dirty[n_dirty] = <int>i
                n_dirty += 1
    if bad:
        raise IndexError(f"index outside [0, {size})")
    return n_dirty


cdef inline bint _significant(float d, float xi, double threshold, bint everything) noexcept nogil:
    # |d| > t·|x| rather than |d/x| > t: a multiply instead of a divide per entry, same decision.
    return everything or xi == 0.0 or fabs(<double>d) > threshold * fabs(<double>xi)


def select(float[::1] acc not None, cnp.uint8_t[::1] flags not None, int[::1] dirty not None,
           Py_ssize_t n_dirty, const float[::1] x not None, double threshold, bint everything):
    """Pop the significant entries: |acc_i / x_i| > threshold, or x_i == 0 and acc_i ≠ 0.

    With ``everything`` set, every non-zero entry is popped (drain / BSP).
    Entries whose accumulated value is exactly zero leave the dirty list
    without being sent.  Returns ``(idx, values, new_n_dirty)``; the popped
    entries of ``acc`` are reset to 0, the kept ones are compacted to the
    front of ``dirty`` in their original order.

    A sequential pass over the whole accumulator once most of the model is
    pending was measured slower than this walk (benchmarks/select_kernel.py),
    so the walk is the only path.
    """
    if x.shape[0] != acc.shape[0]:
        raise ValueError("x must match the accumulator")
    out_idx_arr = np.empty(n_dirty, dtype=np.int32)
    out_val_arr = np.empty(n_dirty, dtype=np.float32)
    cdef int[::1] out_idx = out_idx_arr
    cdef float[::1] out_val = out_val_arr
    cdef Py_ssize_t j, i, kept = 0, sent = 0
    cdef float d
    with nogil:
        for j in range(n_dirty):
            i = dirty[j]
            d = acc[i]
            if d == 0.0:
                flags[i] = 0
                continue
            if _significant(d, x[i], threshold, everything):
                out_idx[sent] = <int>i
                out_val[sent] = d
                sent += 1
                acc[i] = 0.0
                flags[i] = 0
            else:
                dirty[kept] = <int>i
                kept += 1
    return out_idx_arr[:sent], out_val_arr[:sent], kept
