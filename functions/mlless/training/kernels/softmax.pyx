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
from libc.math cimport exp, fabs, log, sqrt

from mlless.training.kernels.normalized cimport count_rows, see_row, share_moves
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


cdef int _check_classes(const int[::1] classes, int k) except -1:
    cdef Py_ssize_t r
    for r in range(classes.shape[0]):
        if not 0 <= classes[r] < k:
            raise ValueError(f"row {r}: class {classes[r]} outside [0, {k})")
    return 0


cdef object _entries(const int[::1] feats, Py_ssize_t n_slots, int k):
    """The k parameters of each feature of ``feats[:n_slots]``, in their order, then the k biases (int32): the
    bias is the feature ``feats[n_slots]`` = n_features (`feature_slots`)."""
    return (np.asarray(feats[:n_slots + 1], dtype=np.int32)[:, None] * k + np.arange(k, dtype=np.int32)).ravel()


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
    _check_classes(classes, k)
    feats_arr = np.empty(nnz + 1, dtype=np.int32)
    slot_arr = np.empty(nnz, dtype=np.int32)
    z_arr = np.empty(k, dtype=np.float64)
    cdef int[::1] feats = feats_arr, slot_of = slot_arr
    cdef double[::1] z = z_arr
    cdef int c, y
    n_slots = feature_slots(indices, n_features, slot_map, feats, &slot_of[0] if nnz else NULL)
    idx_arr = _entries(feats, n_slots, k)
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
    return idx_arr, grad_arr, loss


#: The most a logit moves in one sub-step of `_flow`: small enough that the midpoint rule follows the flow (the
#: cross-entropy's curvature in a logit is at most 1/4) within a few parts in a thousand of the step.
cdef double FLOW_MOVE = 0.25
#: The sub-steps of `_flow` at most; the rest of a step beyond them is dropped (its residuals are tiny by then).
cdef int FLOW_STEPS = 64


cdef void _residuals(const double *z, int y, double *p, int k) noexcept nogil:
    """p[:k] = softmax(z) − onehot(y), the cross-entropy's gradient in the logits."""
    cdef int c
    for c in range(k):
        p[c] = z[c]
    _to_probabilities(p, k)
    p[y] -= 1.0


cdef void _flow(double *z, int y, double rate, const double *ppu, double *u, double *p, int k) noexcept nogil:
    """The importance-invariant step of a row of logits ``z`` and class ``y`` (as `linear.pyx`'s `Loss.step`): u[c]
    such that moving class c's weights by −u[c]·(their direction), along which its logit changes ``ppu[c]`` per
    unit, is the limit of many small gradient steps adding up to ``rate``. That is u[c] = ∫ (p_c − [c = y]) dh
    over h in [0, rate] along the flow dz_c/dh = −ppu[c]·(p_c(z) − [c = y]). For more than two classes the flow
    has no closed form: it is followed by the midpoint rule in sub-steps that move no logit by more than
    `FLOW_MOVE`, so a large step lands short of the label instead of past it. ``z`` ends as the flow's end and
    ``p`` (2k) is scratch."""
    cdef double left = rate, fastest, h
    cdef double *mid = p + k
    cdef int c, i
    for c in range(k):
        u[c] = 0.0
    for i in range(FLOW_STEPS):
        _residuals(z, y, p, k)
        fastest = 0.0
        for c in range(k):
            fastest = max(fastest, ppu[c] * fabs(p[c]))
        h = left if fastest * left <= FLOW_MOVE else FLOW_MOVE / fastest
        for c in range(k):
            mid[c] = z[c] - 0.5 * h * ppu[c] * p[c]
        _residuals(mid, y, p, k)
        for c in range(k):
            u[c] += h * p[c]
            z[c] -= h * ppu[c] * p[c]
        left -= h
        if left <= 0.0:
            break


def invariant_step(const double[::1] z not None, int y, double rate, const double[::1] ppu not None):
    """`_flow`'s u for the logits ``z`` of a row of class ``y``, from Python (tests)."""
    cdef int k = z.shape[0]
    if ppu.shape[0] != k or not 0 <= y < k:
        raise ValueError("z and ppu are one entry a class, and y one of the classes")
    work = np.array(z, dtype=np.float64)
    u_arr, p_arr = np.empty(k), np.empty(2 * k)
    cdef double[::1] zz = work, u = u_arr, p = p_arr
    _flow(&zz[0], y, rate, &ppu[0], &u[0], &p[0], k)
    return u_arr


def normalized_step(float[::1] params not None, float[::1] g2 not None, float[::1] scale not None,
                    float[::1] rows not None, double[::1] norm not None, const cnp.int64_t[::1] indptr not None,
                    const int[::1] indices not None, const float[::1] values not None,
                    const int[::1] classes not None, int n_features, int k, float lr, float wd, int workers,
                    int[::1] slot_map not None):
    """One mini-batch of per-example normalized adaptive updates, applied in place: `linear.pyx`'s
    `normalized_step` with K weights a feature (normalized.pxd holds what they share).

    A feature's K weights share its scale s_f (at ``scale[f*K]``, its rows at ``rows[f*K]``), so that a feature
    multiplied by 1,000 gets weights 1,000 times smaller and the same logits; each weight has its own G. Per row,
    with p = softmax(z) and r = p − onehot(y): G_fc += (r_c·x_f)², and each weight of class c moves by
    −u_c·x_f/(s_f·√G_fc) − lr·wd·w_fc, the biases by −u_c/√G_bc, with u the importance-invariant step of rate
    lr·√(t/N) (`_flow`). Under the sum of ``workers`` replicas, each feature's moves over the batch are divided by
    the workers expected to make them (`share_moves`).

    Returns ``(idx int32, delta float32, loss_sum float)``: the entries as `softmax_gradient` lists them, the change
    the batch made to each, and the progressive Σ cross-entropy (each row's just before its own update).
    """
    cdef Py_ssize_t n = classes.shape[0], nnz = indices.shape[0], j, r, at, n_slots
    _check(params, indptr, indices, values, n, n_features, k)
    _check_classes(classes, k)
    if not g2.shape[0] == scale.shape[0] == rows.shape[0] == params.shape[0]:
        raise ValueError("the accumulators must match params")
    if norm.shape[0] != 2:
        raise ValueError("norm holds N and t")
    if slot_map.shape[0] < n_features:
        raise ValueError("slot_map is smaller than n_features")
    feats_arr = np.empty(nnz + 1, dtype=np.int32)
    n_slots = feature_slots(indices, n_features, slot_map, feats_arr, NULL)
    idx_arr = _entries(feats_arr, n_slots, k)
    before = np.asarray(params)[idx_arr]
    scratch = np.empty(6 * k, dtype=np.float64)
    cdef const int[::1] feats = feats_arr[:n_slots + 1]
    cdef const float[::1] start = before
    cdef double[::1] work = scratch
    cdef double *z = &work[0]
    cdef double *resid = &work[k]
    cdef double *ppu = &work[2 * k]
    cdef double *u = &work[3 * k]
    cdef double *p = &work[4 * k]  # and work[5 * k:]: `_flow`'s scratch
    cdef float *W = &params[0]
    cdef float *G = &g2[0]
    cdef float *S = &scale[0]
    cdef Py_ssize_t bias = <Py_ssize_t>n_features * k
    cdef double loss = 0.0, rate, x, seen = norm[1] + n
    cdef float lr_wd = lr * wd
    cdef int c, y
    with nogil:
        count_rows(&rows[0], indices, k)
        S[bias] = 1.0
        for r in range(n):
            see_row(W, S, &norm[0], indptr, indices, values, r, k)
            y = classes[r]
            _logits(params, indptr, indices, values, r, n_features, k, z)
            for c in range(k):
                resid[c] = z[c]
            loss += _to_probabilities(resid, k) - z[y]
            resid[y] -= 1.0
            rate = lr * sqrt(norm[1] / norm[0])
            # First G, and each logit's change per unit of its u (ppu); a weight whose G is still 0 (its class's
            # residual underflowed) has no direction yet and stays.
            for c in range(k):
                G[bias + c] += <float>(resid[c] * resid[c])
                ppu[c] = 1.0 / sqrt(G[bias + c]) if G[bias + c] > 0 else 0.0
            for j in range(indptr[r], indptr[r + 1]):
                at = <Py_ssize_t>indices[j] * k
                x = values[j]
                if x != 0:  # then s_f > 0 too
                    for c in range(k):
                        G[at + c] += <float>((resid[c] * x) * (resid[c] * x))
                        if G[at + c] > 0:
                            ppu[c] += x * x / (S[at] * sqrt(G[at + c]))
            _flow(z, y, rate, ppu, u, p, k)
            for j in range(indptr[r], indptr[r + 1]):
                at = <Py_ssize_t>indices[j] * k
                x = values[j]
                if x != 0:
                    for c in range(k):
                        if G[at + c] > 0:
                            W[at + c] -= <float>(u[c] * x / (S[at] * sqrt(G[at + c]))) + lr_wd * W[at + c]
            for c in range(k):
                if G[bias + c] > 0:
                    W[bias + c] -= <float>(u[c] / sqrt(G[bias + c]))
        share_moves(W, &rows[0], feats, start, n, seen, workers, k)
    return idx_arr, np.asarray(params)[idx_arr] - before, loss


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
