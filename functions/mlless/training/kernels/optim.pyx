# cython: language_level=3
"""Sparse (lazy) optimizer updates: touch only ``x[idx]`` and its state.

Every kernel applies the update in place and writes the applied change to
``delta`` (same length as ``idx``), because the worker feeds exactly that
change into the ISP accumulator.  Weight decay is decoupled (AdamW-style):
``−lr·wd·x_old`` is added to the step of each touched entry.

Lazy semantics (documented here once, tested in tests/test_optim.py): state
of an entry (velocity, Adam moments) only changes on steps where the entry is
in ``idx``; an untouched row's velocity is not decayed and its weight does not
drift.  Adam's bias correction uses the global step count ``t``, as TF's
LazyAdam / PyTorch's SparseAdam do.
"""
import numpy as np
cimport numpy as cnp
from libc.math cimport sqrt

cnp.import_array()

cdef extern from *:
    # GCC/Clang builtin: start loading a cache line that a later iteration will need
    void __builtin_prefetch(const void *addr) nogil

#: Entries ahead that scatter_add prefetches: about two model rows of a rank-20 factorisation.
DEF PREFETCH_AHEAD = 48


cdef int _check_lengths(float[::1] x, const int[::1] idx, const float[::1] grad, float[::1] delta) except -1:
    if grad.shape[0] != idx.shape[0] or delta.shape[0] != idx.shape[0]:
        raise ValueError("idx, grad and delta differ in length")
    return 0


cdef int _stopped_at(const int[::1] idx, Py_ssize_t bad, Py_ssize_t size) except -1:
    """After an update loop that stopped at entry ``bad`` (-1: it did not), an IndexError naming that index."""
    if bad >= 0:
        raise IndexError(f"index {idx[bad]} outside [0, {size}); entries before it were updated")
    return 0


def sgd_step(float[::1] x not None, const int[::1] idx not None, const float[::1] grad not None,
             float[::1] delta not None, float lr, float wd):
    """x_i += −lr·(g_i + wd·x_i)."""
    _check_lengths(x, idx, grad, delta)
    cdef Py_ssize_t j, i, n = idx.shape[0], size = x.shape[0], bad = -1
    cdef float d, lr_wd = lr * wd
    cdef float *X = &x[0] if size > 0 else NULL
    with nogil:
        for j in range(n):
            i = idx[j]
            if i < 0 or i >= size:
                bad = j
                break
            d = -lr * grad[j] - lr_wd * X[i]
            X[i] += d
            delta[j] = d
    _stopped_at(idx, bad, size)


def momentum_step(float[::1] x not None, const int[::1] idx not None, const float[::1] grad not None,
                  float[::1] delta not None, float[::1] vel not None, float lr, float mu, float wd,
                  bint nesterov):
    """Heavy-ball or Nesterov momentum on the touched entries.

    v_i ← μ·v_i + g_i; step = v_i (heavy ball) or μ·v_i + g_i (Nesterov, the
    form MLLess' PMF code uses); x_i += −lr·(step + wd·x_i).
    """
    _check_lengths(x, idx, grad, delta)
    if vel.shape[0] != x.shape[0]:
        raise ValueError("velocity buffer must match x")
    cdef Py_ssize_t j, i, n = idx.shape[0], size = x.shape[0], bad = -1
    cdef float v, g, d
    cdef float *X = &x[0] if size > 0 else NULL
    cdef float *V = &vel[0] if size > 0 else NULL
    cdef float lr_mu = lr * mu, lr_wd = lr * wd
    with nogil:
        for j in range(n):
            i = idx[j]
            if i < 0 or i >= size:
                bad = j
                break
            g = grad[j]
            v = mu * V[i] + g
            V[i] = v
            if nesterov:
                d = -lr_mu * v - lr * g - lr_wd * X[i]
            else:
                d = -lr * v - lr_wd * X[i]
            X[i] += d
            delta[j] = d
    _stopped_at(idx, bad, size)


def adam_step(float[::1] x not None, const int[::1] idx not None, const float[::1] grad not None,
              float[::1] delta not None, float[::1] m not None, float[::1] v not None,
              float lr, float beta1, float beta2, float eps, float wd, long t):
    """Lazy Adam (bias correction with the global step ``t`` ≥ 1) plus decoupled decay."""
    _check_lengths(x, idx, grad, delta)
    if m.shape[0] != x.shape[0] or v.shape[0] != x.shape[0]:
        raise ValueError("moment buffers must match x")
    if t < 1:
        raise ValueError("step count t starts at 1")
    cdef double c1 = 1.0 - beta1 ** t, c2 = 1.0 - beta2 ** t
    # fold both bias corrections into the step size: lr·sqrt(c2)/c1 · m / (sqrt(v) + eps·sqrt(c2))
    cdef float alpha = <float>(lr * sqrt(c2) / c1)
    cdef float eps_hat = <float>(eps * sqrt(c2))
    cdef float lr_wd = lr * wd, b1c = 1.0 - beta1, b2c = 1.0 - beta2
    cdef Py_ssize_t j, i, n = idx.shape[0], size = x.shape[0], bad = -1
    cdef float g, mj, vj, d
    cdef float *X = &x[0] if size > 0 else NULL
    cdef float *Mb = &m[0] if size > 0 else NULL
    cdef float *Vb = &v[0] if size > 0 else NULL
    with nogil:
        for j in range(n):
            i = idx[j]
            if i < 0 or i >= size:
                bad = j
                break
            g = grad[j]
            mj = beta1 * Mb[i] + b1c * g
            vj = beta2 * Vb[i] + b2c * g * g
            Mb[i] = mj
            Vb[i] = vj
            d = -alpha * mj / (sqrt(vj) + eps_hat) - lr_wd * X[i]
            X[i] += d
            delta[j] = d
    _stopped_at(idx, bad, size)


def scatter_add(float[::1] x not None, const int[::1] idx not None, const float[::1] values not None,
                unsigned char[::1] marks not None):
    """x[idx] += values for a peer's update, after checking every index once: in range and not repeated.

    ``marks`` (one byte per parameter, all 0 between calls) finds a repeat in
    O(len(idx)), where sorting or counting would cost O(n log n) or O(len(x)).
    Nothing is added unless the whole update is valid.  Returns -1 when it was
    applied, or the position of the first bad index (the caller names it).
    """
    cdef Py_ssize_t j, n = idx.shape[0], size = x.shape[0], bad = -1
    cdef int i
    if values.shape[0] != n:
        raise ValueError("idx and values differ in length")
    if marks.shape[0] != size:
        raise ValueError("marks must have one entry per parameter")
    with nogil:
        for j in range(n):
            i = idx[j]
            if i < 0 or i >= size or marks[i]:
                bad = j
                break
            marks[i] = 1
        if bad >= 0:
            for j in range(bad):
                marks[idx[j]] = 0
        else:
            for j in range(n):
                if j + PREFETCH_AHEAD < n:
                    __builtin_prefetch(&x[idx[j + PREFETCH_AHEAD]])  # the update's rows are scattered over x
                x[idx[j]] += values[j]
                marks[idx[j]] = 0
    return bad
