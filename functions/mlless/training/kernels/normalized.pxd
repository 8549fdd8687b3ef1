# cython: language_level=3
"""What the normalized adaptive updates (NAG: Ross, Mineiro and Langford, "Normalized Online Learning", UAI 2013) of
linear.pyx and softmax.pyx share: each feature's scale, the normalizer N over the rows, and the share of a batch's
moves among the summed replicas. Inline, so each kernel compiles its own copy and no module calls another's.

A feature f owns ``width`` consecutive parameters from ``f*width`` (1 for a linear model, K for softmax); its scale
s_f (``S``) and its row count (``R``) sit at that first index, and the bias is feature ``n_features``."""
from libc.math cimport fabs, pow

cimport numpy as cnp


cdef inline void count_rows(float *R, const int[::1] indices, int width) noexcept nogil:
    """Count each entry of a batch in its feature's row count (a feature twice in a row counts twice)."""
    cdef Py_ssize_t j
    for j in range(indices.shape[0]):
        R[<Py_ssize_t>indices[j] * width] += 1


cdef inline void see_row(float *W, float *S, double *norm, const cnp.int64_t[::1] indptr, const int[::1] indices,
                         const float[::1] values, Py_ssize_t r, int width) noexcept nogil:
    """Row r's values against each feature's scale, before the row's step: a value larger than any seen, |x_f| > s_f,
    first shrinks f's weights by (s_f/x_f)² and raises s_f to |x_f|; then N (``norm[0]``) adds Σ_f (x_f/s_f)² and 1
    for the bias, and t (``norm[1]``) counts the row. A feature multiplied by 1,000 then gets weights 1,000 times
    smaller and the same margins: the step is scale-free."""
    cdef Py_ssize_t j, i, at
    cdef double ax, shrink
    for j in range(indptr[r], indptr[r + 1]):
        at = <Py_ssize_t>indices[j] * width
        ax = fabs(values[j])
        if ax > S[at]:
            if S[at] > 0:
                shrink = (S[at] / ax) * (S[at] / ax)
                for i in range(at, at + width):
                    W[i] *= <float>shrink
            S[at] = <float>ax
    norm[0] += 1.0  # the bias: (1/1)²
    for j in range(indptr[r], indptr[r + 1]):
        at = <Py_ssize_t>indices[j] * width
        if S[at] > 0:
            norm[0] += (values[j] / S[at]) * (values[j] / S[at])
    norm[1] += 1.0


cdef inline double expected_workers(double held, double batch, int workers) noexcept nogil:
    """How many of `workers` replicas are expected to move a feature that a share `held` of rows holds, each
    replica a batch of `batch` rows."""
    return 1.0 + (workers - 1) * (1.0 - pow(1.0 - held, batch))


cdef inline void share_moves(float *W, const float *R, const int[::1] feats, const float[::1] start, Py_ssize_t n_rows,
                             double seen, int workers, int width) noexcept nogil:
    """Divide each feature's move over a batch of ``n_rows`` rows by the workers expected to make it, under the sum
    of ``workers`` replicas' updates: k_f = 1 + (P − 1)·(1 − (1 − q_f)^B), q_f its rows (``R``) over the ``seen``
    rows, B the batch's rows. ``feats`` lists the touched features and then the bias, whose share is 1; ``start``
    holds their ``width`` parameters each, as they were before the batch."""
    cdef Py_ssize_t k, c, i, n_slots = feats.shape[0] - 1
    cdef double share
    if workers <= 1:
        return
    for k in range(n_slots + 1):
        i = <Py_ssize_t>feats[k] * width
        share = expected_workers(R[i] / seen if k < n_slots else 1.0, n_rows, workers)
        for c in range(width):
            W[i + c] = <float>(start[k * width + c] + (W[i + c] - start[k * width + c]) / share)
