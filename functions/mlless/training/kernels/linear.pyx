# cython: language_level=3
"""Sparse linear-model kernels over CSR mini-batches: one loop per task, a small class per loss.

As scikit-learn's ``_sgd_fast.pyx.tp``, the loops are written once and ask a `Loss` for the loss of a margin
``z = w·x + b`` against a label ``y`` and its derivative in ``z``: `Log` (logistic regression), `Hinge` (linear
SVM) and `Squared` (linear regression). Parameter layout, shared with `mlless.training.models.linear`:
``params[:n_features]`` are the weights and ``params[n_features]`` is the bias. Touched features get local
slots through ``slot_map`` (int32, -1 between calls, reset before return), so the cost per batch is O(nnz),
never O(n_features).
"""
import numpy as np
cimport numpy as cnp
from libc.math cimport exp, log1p, fabs, sqrtf

from mlless.training.kernels.sparse_rows cimport check_csr, feature_slots

cnp.import_array()


cdef inline double _sigmoid(double z) noexcept nogil:
    cdef double ez
    if z >= 0:
        return 1.0 / (1.0 + exp(-z))
    ez = exp(z)
    return ez / (1.0 + ez)


cdef class Loss:
    """A loss of the margin z against the label y: `loss` and its derivative `dloss` in z."""

    cdef double loss(self, double z, double y) noexcept nogil:
        return 0.0

    cdef double dloss(self, double z, double y) noexcept nogil:
        return 0.0

    def value(self, double z, double y):
        """The loss, from Python (tests)."""
        return self.loss(z, y)


cdef class Log(Loss):
    """Binary cross-entropy of sigmoid(z) against y in {0, 1}, the stable way:
    ``max(z, 0) − z·y + log1p(exp(−|z|))``, so a large |z| neither overflows nor returns log(0)."""

    cdef double loss(self, double z, double y) noexcept nogil:
        return (z if z > 0 else 0.0) - z * y + log1p(exp(-fabs(z)))

    cdef double dloss(self, double z, double y) noexcept nogil:
        return _sigmoid(z) - y


cdef class Hinge(Loss):
    """max(0, 1 − s·z) with s = 2y − 1: labels 0/1 as the classes −1/+1."""

    cdef double loss(self, double z, double y) noexcept nogil:
        cdef double m = (2.0 * y - 1.0) * z
        return 1.0 - m if m < 1.0 else 0.0

    cdef double dloss(self, double z, double y) noexcept nogil:
        cdef double s = 2.0 * y - 1.0
        return -s if s * z < 1.0 else 0.0


cdef class Squared(Loss):
    """(z − y)²: its sum over a batch is the squared error RMSE is reported from."""

    cdef double loss(self, double z, double y) noexcept nogil:
        return (z - y) * (z - y)

    cdef double dloss(self, double z, double y) noexcept nogil:
        return 2.0 * (z - y)


cdef int _check_batch(const float[::1] params, const cnp.int64_t[::1] indptr, const int[::1] indices,
                      const float[::1] values, Py_ssize_t n_rows, int n_features) except -1:
    check_csr(indptr, indices, n_rows)
    if values.shape[0] != indices.shape[0]:
        raise ValueError("indices and values differ in length")
    if params.shape[0] != <Py_ssize_t>n_features + 1:
        raise ValueError("params length must be n_features + 1")
    return 0


def gradient(Loss loss_fn not None, const float[::1] params not None, const cnp.int64_t[::1] indptr not None,
                    const int[::1] indices not None, const float[::1] values not None,
                    const float[::1] labels not None, int n_features, int[::1] slot_map not None):
    """Gradient of the mean loss over one CSR batch.

    Returns ``(idx int32, grad float32, loss_sum float)``; ``idx`` lists every
    touched feature once (in order of first appearance) followed by the bias
    index ``n_features``.  Duplicate features within a row are summed, as in
    scipy's CSR semantics.
    """
    cdef Py_ssize_t n = labels.shape[0], nnz = indices.shape[0]
    _check_batch(params, indptr, indices, values, n, n_features)
    if slot_map.shape[0] < n_features:
        raise ValueError("slot_map is smaller than n_features")
    cdef int[::1] feats = np.empty(nnz + 1, dtype=np.int32)
    cdef int[::1] slot_of = np.empty(nnz, dtype=np.int32)
    cdef Py_ssize_t j, r, n_slots = feature_slots(indices, n_features, slot_map, feats, &slot_of[0] if nnz else NULL)
    idx_arr = np.asarray(feats[:n_slots + 1]).copy()
    grad_arr = np.zeros(n_slots + 1, dtype=np.float32)
    cdef float[::1] grad = grad_arr
    cdef double z, resid, loss = 0.0, gb = 0.0, inv_n = (1.0 / n) if n > 0 else 0.0
    cdef float fr
    cdef float b = params[n_features]
    with nogil:
        for r in range(n):
            z = b
            for j in range(indptr[r], indptr[r + 1]):
                z += params[indices[j]] * values[j]
            loss += loss_fn.loss(z, labels[r])
            resid = loss_fn.dloss(z, labels[r]) * inv_n
            gb += resid
            fr = <float>resid
            for j in range(indptr[r], indptr[r + 1]):
                grad[slot_of[j]] += fr * values[j]
        grad[n_slots] = <float>gb
    return idx_arr, grad_arr, loss


def adagrad_step(Loss loss_fn not None, float[::1] params not None, float[::1] g2 not None,
                        const cnp.int64_t[::1] indptr not None, const int[::1] indices not None,
                        const float[::1] values not None, const float[::1] labels not None,
                        int n_features, float lr, float wd, int[::1] slot_map not None):
    """One mini-batch of per-example SGD with per-coordinate AdaGrad, applied in place.

    Each row updates the weights of its features at once, as Vowpal Wabbit's
    adaptive updates do, instead of one averaged step per batch.  Per row, with
    z = w·x + b and r = dloss(z, y): for each feature j, g = r·x_j,
    G_j += g², w_j −= lr·g/√G_j + lr·wd·w_j (decoupled decay); the bias
    likewise with g = r.  ``g2`` (the accumulators, one per parameter) starts
    at 1 (`mlless.training.optim`), which bounds the first steps by ``lr``.

    Returns ``(idx int32, delta float32, loss_sum float)``: every touched
    feature once (in order of first appearance) then the bias, the change the
    batch made to each, and the progressive Σ loss (each row's loss just before
    its own update).  Duplicate features within a row are updated once per
    occurrence.
    """
    cdef Py_ssize_t n = labels.shape[0], nnz = indices.shape[0]
    _check_batch(params, indptr, indices, values, n, n_features)
    if g2.shape[0] != params.shape[0]:
        raise ValueError("the accumulator must match params")
    if slot_map.shape[0] < n_features:
        raise ValueError("slot_map is smaller than n_features")
    idx_arr = np.empty(nnz + 1, dtype=np.int32)
    cdef int[::1] feats = idx_arr
    cdef Py_ssize_t j, r, k, n_slots = feature_slots(indices, n_features, slot_map, feats, NULL)
    cdef int f
    idx_arr = idx_arr[:n_slots + 1]
    feats = idx_arr
    delta_arr = np.empty(n_slots + 1, dtype=np.float32)
    cdef float[::1] delta = delta_arr
    cdef float *W = &params[0]
    cdef float *G = &g2[0]
    cdef double z, loss = 0.0
    cdef float resid, g, x, lr_wd = lr * wd
    with nogil:
        for k in range(n_slots + 1):
            delta[k] = W[feats[k]]
        for r in range(n):
            z = W[n_features]
            for j in range(indptr[r], indptr[r + 1]):
                z += W[indices[j]] * values[j]
            loss += loss_fn.loss(z, labels[r])
            resid = <float>loss_fn.dloss(z, labels[r])
            for j in range(indptr[r], indptr[r + 1]):
                f = indices[j]
                g = resid * values[j]
                G[f] += g * g
                W[f] -= lr * g / sqrtf(G[f]) + lr_wd * W[f]
            G[n_features] += resid * resid
            W[n_features] -= lr * resid / sqrtf(G[n_features])
        for k in range(n_slots + 1):
            delta[k] = W[feats[k]] - delta[k]
    return idx_arr, delta_arr, loss


def logits(const float[::1] params not None, const cnp.int64_t[::1] indptr not None,
                  const int[::1] indices not None, const float[::1] values not None,
                  int n_features):
    """Logits w·x + b per row; features outside [0, n_features) are ignored."""
    cdef Py_ssize_t n = indptr.shape[0] - 1, r, j
    _check_batch(params, indptr, indices, values, n, n_features)
    out_arr = np.empty(n, dtype=np.float64)
    cdef double[::1] out = out_arr
    cdef double z
    cdef int f
    with nogil:
        for r in range(n):
            z = params[n_features]
            for j in range(indptr[r], indptr[r + 1]):
                f = indices[j]
                if 0 <= f < n_features:
                    z += params[f] * values[j]
            out[r] = z
    return out_arr


def loss_sum(Loss loss_fn not None, const double[::1] margins not None, const float[::1] labels not None):
    """Σ loss(z, y) over the rows' margins."""
    cdef Py_ssize_t n = margins.shape[0], r
    if labels.shape[0] != n:
        raise ValueError("margins and labels differ in length")
    cdef double s = 0.0
    with nogil:
        for r in range(n):
            s += loss_fn.loss(margins[r], labels[r])
    return s
