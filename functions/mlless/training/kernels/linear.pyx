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
from libc.math cimport exp, fabs, fmin, log, log1p, sqrtf

from mlless.training.kernels.normalized cimport count_rows, see_row, share_moves
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

    cdef double step(self, double z, double y, double rate, double ppu) noexcept nogil:
        """The importance-invariant step (Karampatziakis and Langford, "Online Importance Weight Aware Updates",
        UAI 2011): u such that moving each weight by −u·c_j, where Σ_j c_j·x_j = ``ppu`` (the margin's change per
        unit of u), is the limit of infinitely many small gradient steps adding up to ``rate``. It never carries z
        past the label, however large ``rate``·``ppu``. The first-order step, ``rate``·dloss, by default; a loss
        with a closed form overrides it."""
        return rate * self.dloss(z, y)

    def value(self, double z, double y):
        """The loss, from Python (tests)."""
        return self.loss(z, y)

    def invariant_step(self, double z, double y, double rate, double ppu):
        """`step`, from Python (tests)."""
        return self.step(z, y, rate, ppu)


cdef class Log(Loss):
    """Binary cross-entropy of sigmoid(z) against y in {0, 1}, the stable way:
    ``max(z, 0) − z·y + log1p(exp(−|z|))``, so a large |z| neither overflows nor returns log(0)."""

    cdef double loss(self, double z, double y) noexcept nogil:
        return (z if z > 0 else 0.0) - z * y + log1p(exp(-fabs(z)))

    cdef double dloss(self, double z, double y) noexcept nogil:
        return _sigmoid(z) - y

    cdef double step(self, double z, double y, double rate, double ppu) noexcept nogil:
        # With s = 2y − 1 and m = s·z, the flow dm/dh = ppu·σ(−m) integrates to f(m) = m + e^m = m0 + e^m0 + rate·ppu
        # = T, solved by Newton's method (f convex and increasing: from the right of the root it only descends).
        # The start is right of the root: f(m0 + δ) ≥ f(m0) + δ, and for T > 1, f(ln T) = ln T + T ≥ T. Both are
        # needed: from m0 + δ alone a large δ left e^m so large that each Newton step moved m by about 1, and 50
        # steps stopped far from the root (m0 9.2, δ 100: 59.2 for 9.21).
        cdef double s = 2.0 * y - 1.0, m0 = s * z, m, target, em
        cdef int i
        if rate * ppu < 1e-6 or m0 > 30.0:  # a tiny move: the first-order step is exact to float precision
            return rate * self.dloss(z, y)
        target = m0 + exp(m0) + rate * ppu
        m = m0 + rate * ppu
        if target > 1.0:
            m = fmin(m, log(target))
        for i in range(50):
            em = exp(m)
            if fabs(m + em - target) <= 1e-12 * (1.0 + fabs(target)):
                break
            m -= (m + em - target) / (1.0 + em)
        return -s * (m - m0) / ppu


cdef class Hinge(Loss):
    """max(0, 1 − s·z) with s = 2y − 1: labels 0/1 as the classes −1/+1."""

    cdef double loss(self, double z, double y) noexcept nogil:
        cdef double m = (2.0 * y - 1.0) * z
        return 1.0 - m if m < 1.0 else 0.0

    cdef double dloss(self, double z, double y) noexcept nogil:
        cdef double s = 2.0 * y - 1.0
        return -s if s * z < 1.0 else 0.0

    cdef double step(self, double z, double y, double rate, double ppu) noexcept nogil:
        # The flow moves z towards the margin at a constant pace and stops there.
        cdef double s = 2.0 * y - 1.0, gap = 1.0 - s * z
        if gap <= 0.0:
            return 0.0
        return -s * (rate if rate * ppu <= gap else gap / ppu)


cdef class Squared(Loss):
    """(z − y)²: its sum over a batch is the squared error RMSE is reported from.

    It keeps the first-order step: its invariant one, (z − y)(1 − e^(−2·rate·ppu))/ppu, ended 2-3 % higher in
    validation RMSE after 3 epochs at P = 1 and 2."""

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


cdef tuple _touched(const float[::1] params, const cnp.int64_t[::1] indptr, const int[::1] indices,
                    const float[::1] values, Py_ssize_t n_rows, int n_features, int[::1] slot_map):
    """A per-sample step's batch checked, and the entries the step changes: the features the batch touches, once
    each in order of first appearance, then the bias (int32), with their values before it."""
    _check_batch(params, indptr, indices, values, n_rows, n_features)
    if slot_map.shape[0] < n_features:
        raise ValueError("slot_map is smaller than n_features")
    idx_arr = np.empty(indices.shape[0] + 1, dtype=np.int32)
    cdef Py_ssize_t n_slots = feature_slots(indices, n_features, slot_map, idx_arr, NULL)
    idx_arr = idx_arr[:n_slots + 1]
    return idx_arr, np.asarray(params)[idx_arr]


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
    cdef Py_ssize_t n = labels.shape[0]
    if g2.shape[0] != params.shape[0]:
        raise ValueError("the accumulator must match params")
    idx_arr, before = _touched(params, indptr, indices, values, n, n_features, slot_map)
    cdef Py_ssize_t j, r
    cdef int f
    cdef float *W = &params[0]
    cdef float *G = &g2[0]
    cdef double z, loss = 0.0
    cdef float resid, g, lr_wd = lr * wd
    with nogil:
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
    return idx_arr, np.asarray(params)[idx_arr] - before, loss


def normalized_step(Loss loss_fn not None, float[::1] params not None, float[::1] g2 not None,
                    float[::1] scale not None, float[::1] rows not None, double[::1] norm not None,
                    const cnp.int64_t[::1] indptr not None, const int[::1] indices not None,
                    const float[::1] values not None, const float[::1] labels not None,
                    int n_features, float lr, float wd, int workers, int[::1] slot_map not None):
    """One mini-batch of per-example normalized adaptive updates (NAG: Ross, Mineiro and Langford, "Normalized
    Online Learning", UAI 2013, Algorithm 1, as Vowpal Wabbit's default), applied in place.

    Per row, for each feature j: a value larger than any seen, |x_j| > s_j, first shrinks w_j by (s_j/x_j)² and
    raises s_j to |x_j| (``scale``); then with z = w·x + b, r = dloss(z, y) and g = r·x_j, G_j += g² (``g2``) and
    w_j −= lr·√(t/N)·g/(s_j·√G_j) + lr·wd·w_j, where N sums Σ_j (x_j/s_j)² over the rows seen and t counts them
    (``norm`` = [N, t]). A feature multiplied by 1,000 gets a weight 1,000 times smaller and the same predictions:
    the step is scale-free. The bias is a feature of value 1. The step lr·√(t/N)·r is taken importance-invariant,
    as Vowpal Wabbit's `--invariant` default: `Loss.step` integrates the loss's flow along the row's update
    direction in closed form (logistic and hinge), so a large step lands short of the label or on the margin
    instead of past them.

    Under the sum of ``workers`` replicas' updates, each replica learns its batch as one learner would, and then
    divides each feature's move over the batch by the workers expected to move it, k_j = 1 + (P − 1)·(1 − (1 −
    q_j)^B), with q_j the share of the rows seen that hold it (``rows`` counts them) and B the batch's rows: the
    sum of the replicas' updates averages them on the features every batch holds (the bias, dense columns) and
    adds them on the rare ones, which one replica moves alone. Dividing each per-row step instead let a feature
    every replica holds move P times as far as one learner would within a batch, and the sum overshot.

    Returns ``(idx int32, delta float32, loss_sum float)`` as `adagrad_step` does.
    """
    cdef Py_ssize_t n = labels.shape[0]
    if not g2.shape[0] == scale.shape[0] == rows.shape[0] == params.shape[0]:
        raise ValueError("the accumulators must match params")
    if norm.shape[0] != 2:
        raise ValueError("norm holds N and t")
    idx_arr, before = _touched(params, indptr, indices, values, n, n_features, slot_map)
    cdef const int[::1] feats = idx_arr
    cdef const float[::1] start = before
    cdef Py_ssize_t j, r
    cdef int f
    cdef float *W = &params[0]
    cdef float *G = &g2[0]
    cdef float *S = &scale[0]
    cdef double z, loss = 0.0, rate, g, ppu, u, seen = norm[1] + n
    cdef float resid, lr_wd = lr * wd
    with nogil:
        count_rows(&rows[0], indices, 1)
        S[n_features] = 1.0
        for r in range(n):
            see_row(W, S, &norm[0], indptr, indices, values, r, 1)
            z = W[n_features]
            for j in range(indptr[r], indptr[r + 1]):
                z += W[indices[j]] * values[j]
            loss += loss_fn.loss(z, labels[r])
            resid = <float>loss_fn.dloss(z, labels[r])
            if resid == 0:
                continue
            rate = lr * sqrtf(<float>(norm[1] / norm[0]))
            # Each weight moves by −u·x_j/(s_j·√G_j): first G, and the margin's change per unit of u (ppu), then
            # u, the importance-invariant step of the loss (`Loss.step`; rate·resid to first order).
            G[n_features] += resid * resid
            ppu = 1.0 / sqrtf(G[n_features])
            for j in range(indptr[r], indptr[r + 1]):
                f = indices[j]
                if values[j] != 0:  # then s_j > 0 too
                    g = resid * values[j]
                    G[f] += <float>(g * g)
                    ppu += values[j] * values[j] / (S[f] * sqrtf(G[f]))
            u = loss_fn.step(z, labels[r], rate, ppu)
            for j in range(indptr[r], indptr[r + 1]):
                f = indices[j]
                if values[j] != 0:
                    W[f] -= <float>(u * values[j] / (S[f] * sqrtf(G[f]))) + lr_wd * W[f]
            W[n_features] -= <float>(u / sqrtf(G[n_features]))
        share_moves(W, &rows[0], feats, start, n, seen, workers, 1)
    return idx_arr, np.asarray(params)[idx_arr] - before, loss


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
