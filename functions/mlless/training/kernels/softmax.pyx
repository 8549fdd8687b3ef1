# cython: language_level=3
"""Sparse multinomial logistic regression (softmax) over CSR mini-batches.

Parameter layout, shared with `mlless.training.models.softmax`: feature-major, ``params[f*K:(f+1)*K]`` are feature
f's weights for the K classes and ``params[n_features*K:]`` the K biases, so a touched feature's entries are one
contiguous run, as a PMF row's are. Touched features get local slots through ``slot_map`` (int32, -1 between calls,
reset before return; sparse_rows.pxd), as in `linear.pyx`, so a batch costs O(nnz·K), never O(n_features·K). A row's loss is
logsumexp(z) − z_y with max(z) subtracted first, so no logit overflows.
"""
import numpy as np
cimport numpy as cnp
from libc.math cimport exp, log

from mlless.training.kernels.sparse_rows cimport check_csr, feature_slots

cnp.import_array()


cdef int _check(const float[::1] params, const cnp.int64_t[::1] indptr, const int[::1] indices,
                const float[::1] values, Py_ssize_t n_rows, int n_features, int k) except -1:
    if k < 2:
        raise ValueError("softmax needs at least 2 classes")
    check_csr(indptr, indices, n_rows)
    if values.shape[0] != indices.shape[0]:
        raise ValueError("indices and values differ in length")
    if params.shape[0] != (<Py_ssize_t>n_features + 1) * k:
        raise ValueError("params length must be (n_features + 1) * classes")
    return 0


cdef void _logits(const float[::1] params, const cnp.int64_t[::1] indptr, const int[::1] indices,
                  const float[::1] values, Py_ssize_t r, int n_features, int k, double *z) noexcept nogil:
    """z[:k] = the biases + Σ_j W[f_j] x_j of row r; features outside [0, n_features) are ignored."""
    cdef Py_ssize_t j
    cdef int c, f
    for c in range(k):
        z[c] = params[n_features * k + c]
    for j in range(indptr[r], indptr[r + 1]):
        f = indices[j]
        if 0 <= f < n_features:
            for c in range(k):
                z[c] += params[f * k + c] * values[j]


cdef double _to_probabilities(double *z, int k) noexcept nogil:
    """Turn the logits z[:k] into probabilities in place; return logsumexp of the logits."""
    cdef int c
    cdef double top = z[0], total = 0.0
    for c in range(1, k):
        if z[c] > top:
            top = z[c]
    for c in range(k):
        z[c] = exp(z[c] - top)
        total += z[c]
    for c in range(k):
        z[c] /= total
    return top + log(total)


def softmax_gradient(const float[::1] params not None, const cnp.int64_t[::1] indptr not None,
                     const int[::1] indices not None, const float[::1] values not None,
                     const int[::1] classes not None, int n_features, int k, int[::1] slot_map not None):
    """Gradient of the mean cross-entropy over one CSR batch whose rows are of ``classes`` (each in 0..k-1).

    Returns ``(idx int32, grad float32, loss_sum float)``: each touched feature's k entries (features in order of
    first appearance), then the k biases.
    """
    cdef Py_ssize_t n = classes.shape[0], nnz = indices.shape[0], j, r, s, n_slots
    _check(params, indptr, indices, values, n, n_features, k)
    if slot_map.shape[0] < n_features:
        raise ValueError("slot_map is smaller than n_features")
    for r in range(n):
        if not 0 <= classes[r] < k:
            raise ValueError(f"row {r}: class {classes[r]} outside [0, {k})")
    feats_arr = np.empty(nnz + 1, dtype=np.int32)
    slot_arr = np.empty(nnz, dtype=np.int32)
    z_arr = np.empty(k, dtype=np.float64)
    cdef int[::1] feats = feats_arr, slot_of = slot_arr
    cdef double[::1] z = z_arr
    cdef int c, y
    n_slots = feature_slots(indices, n_features, slot_map, feats, &slot_of[0] if nnz else NULL)
    bias = (n_features * k + np.arange(k, dtype=np.int32))
    idx_arr = np.concatenate([(np.asarray(feats[:n_slots])[:, None] * k + np.arange(k, dtype=np.int32)).ravel(), bias])
    grad_arr = np.zeros((n_slots + 1) * k, dtype=np.float32)
    cdef float[::1] grad = grad_arr
    cdef double loss = 0.0, inv_n = (1.0 / n) if n > 0 else 0.0, zy, x
    with nogil:
        for r in range(n):
            y = classes[r]
            _logits(params, indptr, indices, values, r, n_features, k, &z[0])
            zy = z[y]
            loss += _to_probabilities(&z[0], k) - zy
            z[y] -= 1.0  # d loss / d z = p - onehot(y)
            for c in range(k):
                z[c] *= inv_n
                grad[n_slots * k + c] += <float>z[c]
            for j in range(indptr[r], indptr[r + 1]):
                s = slot_of[j]
                x = values[j]
                for c in range(k):
                    grad[s * k + c] += <float>(z[c] * x)
    return idx_arr.astype(np.int32), grad_arr, loss


def softmax_logits(const float[::1] params not None, const cnp.int64_t[::1] indptr not None,
                   const int[::1] indices not None, const float[::1] values not None, int n_features, int k):
    """The (rows, k) logits; features outside [0, n_features) are ignored."""
    cdef Py_ssize_t n = indptr.shape[0] - 1, r
    _check(params, indptr, indices, values, n, n_features, k)
    out_arr = np.empty((n, k), dtype=np.float64)
    cdef double[:, ::1] out = out_arr
    with nogil:
        for r in range(n):
            _logits(params, indptr, indices, values, r, n_features, k, &out[r, 0])
    return out_arr
