# cython: language_level=3
"""PMF (biased matrix factorisation) kernels.

Parameter layout, shared with `mlless.training.models.pmf`: the flat float32 vector is a
row-major table of ``n_users + n_items`` rows of width ``rank + 1``.  Row ``u``
(``u < n_users``) holds the user factors followed by the user bias; row
``n_users + i`` holds the item factors followed by the item bias.  Keeping a
row's factors and bias adjacent means one cache line per touched row and that
the flat indices a batch touches come out as contiguous runs.

The gradient kernel runs with the GIL released.  It maps each touched global row
to a local slot through ``slot_map`` (int32, one entry per row, all -1 between
calls), so the per-touched-row accumulation needs neither a hash table nor
``np.unique``; the map is reset to -1 for exactly the rows it touched before
returning, so the cost stays O(batch), never O(model).
"""
import numpy as np
cimport numpy as cnp

cnp.import_array()

cdef extern from "pmf_sgd.h":
    float mlless_pmf_error(const float *pu, const float *pi, int rank, float mean, float rating) noexcept nogil
    double mlless_pmf_adagrad(float *P, float *G, float *D, const int *users, const int *items, const float *ratings,
                              const int *su, const int *si, Py_ssize_t n, int n_users, int rank, float mean, float l2,
                              float lr) noexcept nogil


cdef inline int _slot(int *slot_map, int *rows, int row, Py_ssize_t *n_slots) noexcept nogil:
    """The local slot of global ``row``; a row without one gets the next free slot."""
    if slot_map[row] < 0:
        slot_map[row] = <int>n_slots[0]
        rows[n_slots[0]] = row
        n_slots[0] += 1
    return slot_map[row]


cdef Py_ssize_t _assign_slots(const int[::1] users, const int[::1] items, int n_users, int n_items,
                              int[::1] slot_map, int[::1] rows, int[::1] su, int[::1] si,
                              Py_ssize_t *bad) noexcept nogil:
    """Give every distinct row of the batch a local slot; return how many slots.

    On an out-of-range id, stores the sample position in ``bad`` and stops.
    """
    cdef Py_ssize_t s, n = users.shape[0], n_slots = 0
    for s in range(n):
        if users[s] < 0 or users[s] >= n_users or items[s] < 0 or items[s] >= n_items:
            bad[0] = s
            return n_slots
        su[s] = _slot(&slot_map[0], &rows[0], users[s], &n_slots)
        si[s] = _slot(&slot_map[0], &rows[0], n_users + items[s], &n_slots)
    return n_slots


cdef inline void _reset_slots(int[::1] slot_map, const int[::1] rows, Py_ssize_t n_slots) noexcept nogil:
    cdef Py_ssize_t k
    for k in range(n_slots):
        slot_map[rows[k]] = -1


cdef int _check_batch(const float[::1] params, const int[::1] users, const int[::1] items, const float[::1] ratings,
                      int n_users, int n_items, int rank, int[::1] slot_map) except -1:
    if users.shape[0] != ratings.shape[0] or items.shape[0] != ratings.shape[0]:
        raise ValueError("users, items and ratings differ in length")
    if params.shape[0] != (<Py_ssize_t>n_users + n_items) * (rank + 1):
        raise ValueError("params length does not match n_users, n_items and rank")
    if slot_map.shape[0] < n_users + n_items:
        raise ValueError("slot_map is smaller than n_users + n_items")
    return 0


cdef tuple _slots(const int[::1] users, const int[::1] items, int n_users, int n_items, int width,
                  int[::1] slot_map):
    """`_assign_slots` for a batch, leaving ``slot_map`` all -1 again; an id outside the table is an IndexError
    naming it. Returns the flat index of every parameter of the touched rows (slot by slot), the slot of each
    sample's user row and of its item row, and the touched rows by slot."""
    cdef Py_ssize_t n = users.shape[0], bad = -1, n_slots, slot, k
    cdef int[::1] rows = np.empty(2 * n, dtype=np.int32)
    cdef int[::1] su = np.empty(n, dtype=np.int32)
    cdef int[::1] si = np.empty(n, dtype=np.int32)
    with nogil:
        n_slots = _assign_slots(users, items, n_users, n_items, slot_map, rows, su, si, &bad)
        _reset_slots(slot_map, rows, n_slots)
    if bad >= 0:
        raise IndexError(f"sample {bad}: user {users[bad]} or item {items[bad]} outside "
                         f"{n_users} users x {n_items} items")
    idx_arr = np.empty(n_slots * width, dtype=np.int32)
    cdef int[::1] idx = idx_arr
    with nogil:
        for slot in range(n_slots):
            for k in range(width):
                idx[slot * width + k] = <int>(rows[slot] * width + k)
    return idx_arr, su, si, rows[:n_slots]


def pmf_gradient(const float[::1] params not None, const int[::1] users not None,
                 const int[::1] items not None, const float[::1] ratings not None,
                 int n_users, int n_items, int rank, double mean, double l2,
                 int[::1] slot_map not None):
    """Gradient of the mean regularised squared error over one batch.

    Objective per batch (B samples)::

        (1/B) Σ_s [ e_s² + l2 (‖U_u‖² + b_u² + ‖M_i‖² + b_i²) ],
        e_s = U_u·M_i + b_u + b_i + mean − r_s

    so a row's L2 pull is proportional to how often it occurs in the batch,
    which makes the batch objective an unbiased estimate of the full one.

    Returns ``(idx int32, grad float32, sse float)``: the flat indices of every
    touched parameter (each exactly once, grouped by row in order of first
    appearance), the gradient there, and Σ e_s² at the incoming parameters.
    """
    cdef Py_ssize_t n = ratings.shape[0], width = rank + 1
    _check_batch(params, users, items, ratings, n_users, n_items, rank, slot_map)
    cdef int[::1] su, si, rows
    idx_arr, su, si, rows = _slots(users, items, n_users, n_items, width, slot_map)
    cdef Py_ssize_t n_slots = rows.shape[0]
    grad_arr = np.zeros(n_slots * width, dtype=np.float32)
    cdef float[::1] grad = grad_arr
    cdef float[::1] counts = np.zeros(n_slots, dtype=np.float32)
    cdef Py_ssize_t s, k, slot
    cdef float e, c = (2.0 / n) if n > 0 else 0.0, ce, reg
    cdef double sse = 0.0
    cdef float fmean = <float>mean
    cdef const float *P = &params[0] if params.shape[0] > 0 else NULL
    cdef const float *pu
    cdef const float *pi
    cdef float *G = &grad[0] if grad.shape[0] > 0 else NULL
    cdef float *gu
    cdef float *gi
    with nogil:
        for s in range(n):
            pu = P + <Py_ssize_t>users[s] * width
            pi = P + (<Py_ssize_t>n_users + items[s]) * width
            e = mlless_pmf_error(pu, pi, rank, fmean, ratings[s])
            sse += <double>e * e
            ce = c * e
            gu = G + su[s] * width
            gi = G + si[s] * width
            for k in range(rank):
                gu[k] += ce * pi[k]
                gi[k] += ce * pu[k]
            gu[rank] += ce
            gi[rank] += ce
            counts[su[s]] += 1.0
            counts[si[s]] += 1.0
        if l2 != 0.0:
            for slot in range(n_slots):
                reg = <float>(c * l2) * counts[slot]
                pu = P + rows[slot] * width
                gu = G + slot * width
                for k in range(width):
                    gu[k] += reg * pu[k]
    return idx_arr, grad_arr, sse


def pmf_adagrad_step(float[::1] params not None, float[::1] g2 not None, const int[::1] users not None,
                     const int[::1] items not None, const float[::1] ratings not None,
                     int n_users, int n_items, int rank, double mean, double l2, float lr,
                     int[::1] slot_map not None):
    """One mini-batch of per-rating SGD with LIBMF's row-wise AdaGrad, applied in place.

    The ratings are visited in order and each one updates its user and item
    rows at once, as LIBMF does, instead of one averaged step per batch: a
    batch of B ratings is B updates, which is why a handful of epochs reach
    what mini-batch gradients need dozens for.  Per rating, with
    e = U_u·M_i + b_u + b_i + mean − r::

        g_U = e·M_i + l2·U_u          G_u += mean_k(g_U[k]²)   U_u −= lr·g_U / √G_u
        g_b = e + l2·b_u              H_u += g_b²              b_u −= lr·g_b / √H_u

    (the item row likewise, with the user row's values from before this
    rating).  ``g2`` holds two accumulators per row, G then H (2·(n_users +
    n_items) floats: small enough to stay in cache, unlike one per
    parameter).  They start at 1 (`mlless.training.optim`), LIBMF's choice, which
    bounds the first steps by ``lr``.

    Returns ``(idx int32, delta float32, sse float)``: every parameter of the
    touched rows once (grouped by row in order of first appearance), the
    change the batch made to it, and the progressive Σ e² (each rating's
    error just before its own update).  The per-rating loop is C (`pmf_sgd.h`),
    which says why.
    """
    cdef Py_ssize_t n = ratings.shape[0], width = rank + 1
    _check_batch(params, users, items, ratings, n_users, n_items, rank, slot_map)
    if g2.shape[0] != 2 * (<Py_ssize_t>n_users + n_items):
        raise ValueError("the accumulator must hold two values per row")
    cdef int[::1] su, si
    idx_arr, su, si, _ = _slots(users, items, n_users, n_items, width, slot_map)
    delta_arr = np.zeros(idx_arr.shape[0], dtype=np.float32)
    cdef float[::1] delta = delta_arr
    cdef double sse = 0.0
    with nogil:
        if n > 0:
            sse = mlless_pmf_adagrad(&params[0], &g2[0], &delta[0], &users[0], &items[0], &ratings[0], &su[0], &si[0],
                                     n, n_users, rank, <float>mean, <float>l2, lr)
    return idx_arr, delta_arr, sse


def pmf_predict(const float[::1] params not None, const int[::1] users not None,
                const int[::1] items not None, int n_users, int n_items, int rank, double mean):
    """Predictions U_u·M_i + b_u + b_i + mean; ids outside the table contribute nothing.

    An id seen only at evaluation time (≥ n_users / n_items, or negative) has
    no factors or bias, so its prediction falls back to the global mean plus
    whatever bias of the other side is known.
    """
    cdef Py_ssize_t n = users.shape[0], width = rank + 1, s, k, bu, bi
    if items.shape[0] != n:
        raise ValueError("users and items differ in length")
    if params.shape[0] != (<Py_ssize_t>n_users + n_items) * width:
        raise ValueError("params length does not match n_users, n_items and rank")
    out_arr = np.empty(n, dtype=np.float32)
    cdef float[::1] out = out_arr
    cdef float p
    cdef bint ku, ki
    with nogil:
        for s in range(n):
            ku = 0 <= users[s] < n_users
            ki = 0 <= items[s] < n_items
            p = <float>mean
            bu = <Py_ssize_t>users[s] * width
            bi = (<Py_ssize_t>n_users + items[s]) * width
            if ku:
                p = p + params[bu + rank]
            if ki:
                p = p + params[bi + rank]
            if ku and ki:
                for k in range(rank):
                    p = p + params[bu + k] * params[bi + k]
            out[s] = p
    return out_arr
