# cython: language_level=3
"""What the sparse kernels (linear.pyx, softmax.pyx) share about a CSR mini-batch: its check, and the local slot of
each feature it touches. Inline, so each kernel compiles its own copy and no module calls another's."""
cimport numpy as cnp


cdef inline int check_csr(const cnp.int64_t[::1] indptr, const int[::1] indices, Py_ssize_t n_rows) except -1:
    if indptr.shape[0] != n_rows + 1:
        raise ValueError("indptr must have one entry more than the batch has rows")
    if n_rows >= 0 and (indptr[0] != 0 or indptr[n_rows] != indices.shape[0]):
        raise ValueError("indptr does not span indices")
    return 0


cdef inline Py_ssize_t feature_slots(const int[::1] indices, int n_features, int[::1] slot_map, int[::1] feats,
                                         int *slot_of) except -1:
    """List each distinct feature of a batch once in ``feats`` (order of first appearance), then the bias
    index ``n_features``; return how many features.  With ``slot_of``, also store each entry's position in
    ``feats``.  ``slot_map`` is all -1 again on return; a feature outside the model is an IndexError."""
    cdef Py_ssize_t j, k, n_slots = 0, bad = -1
    cdef int f
    with nogil:
        for j in range(indices.shape[0]):
            f = indices[j]
            if f < 0 or f >= n_features:
                bad = j
                break
            if slot_map[f] < 0:
                slot_map[f] = <int>n_slots
                feats[n_slots] = f
                n_slots += 1
            if slot_of != NULL:
                slot_of[j] = slot_map[f]
        for k in range(n_slots):
            slot_map[feats[k]] = -1
    if bad >= 0:
        raise IndexError(f"feature index {indices[bad]} outside [0, {n_features})")
    feats[n_slots] = n_features
    return n_slots
