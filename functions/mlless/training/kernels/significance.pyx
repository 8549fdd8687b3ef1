# cython: language_level=3
# distutils: language = c++
"""ISP significance filter as a hierarchical timing wheel: the work per step follows what changed.

An entry i with accumulated update δ_i ≠ 0 and replica value x_i is sent at
step t iff |δ_i| > (v/√t)·|x_i| (or x_i = 0, or v = 0).  While δ_i and x_i
stay put, the threshold only falls, so the entry becomes significant at a
step it knows in advance: the first t > (v·|x_i|/|δ_i|)².  Each pending entry
therefore waits in a bucket for that step ("due").  Touching an entry (its
own update changes δ_i and x_i, a peer's changes x_i) recomputes its due step
and moves it if it left its bucket; `select(t)` pops the bucket of step t and
checks each entry with the exact predicate, so the selection is the same as
walking every pending entry, at the cost of the entries touched plus those due.

The buckets form a hierarchical timing wheel (Varghese & Lauck): level L has
2^bits buckets, each covering 2^(bits·L) steps of the aligned block that the
current step is in, so every due step up to 2^31 has a bucket and only
(31/bits)·2^bits of them exist, few enough that the ends being appended to
stay in cache.  When the current step enters a new block of a level, that
block's bucket is emptied into the finer levels.  Buckets forget nothing
eagerly: an entry that moved leaves a stale copy, recognised by its due step
no longer falling in that bucket's block.  Coarse buckets are emptied rarely
(the top ones never, in a real job), so once the copies outnumber the pending
entries several times over, the wheel is rebuilt from the slots: memory stays
O(model) and the rebuild's cost is shared by the touches that made the copies.

The work is memory-bound (a step touches rows scattered over the model), so
δ_i and its due step share one 8-byte slot and the loops prefetch slots a
few rows ahead.
"""
import numpy as np
cimport numpy as cnp
from libc.math cimport fabs, sqrt
from libc.stdint cimport int32_t, int64_t, uint32_t
from libcpp.vector cimport vector

cnp.import_array()

cdef extern from *:
    # GCC/Clang builtins: start loading a cache line a later iteration needs; count leading zero bits
    void __builtin_prefetch(const void *addr) nogil
    int __builtin_clz(unsigned int x) nogil

cdef packed struct Slot:
    float acc     # δ_i
    int32_t due   # the step entry i waits for, NOT_PENDING when δ_i = 0

#: The numpy twin of `Slot`.
SLOT = np.dtype([("acc", np.float32), ("due", np.int32)])

#: δ_i = 0: the entry is not pending.
DEF NOT_PENDING = -1
#: Due later than any job runs (also where NaNs go: they are never significant unless v = 0, as before).
DEF FAR = 2147483647
#: Entries ahead that the loops prefetch: about two model rows of a rank-20 factorisation.
DEF PREFETCH_AHEAD = 48
#: Rebuild once the buckets hold this many copies per pending entry (and at least MIN_COPIES)...
DEF COPIES_PER_PENDING = 4
DEF MIN_COPIES = 1 << 16


cdef inline int32_t _due(float d, float xi, double v, int32_t now) noexcept nogil:
    """The first step ≥ now at which |d| > (v/√t)·|xi| could hold, never later than the exact one.

    The real solution is the first t > t0 = (v·|xi|/|d|)²; shrinking t0 by 1e-9
    (far above the rounding of t0 and of the predicate) makes the estimate
    at most one step early, and `select` re-checks exactly.
    """
    if v == 0.0 or xi == 0.0:
        return now
    cdef double r = v * fabs(<double>xi) / fabs(<double>d)
    cdef double t0 = r * r * (1.0 - 1e-9)
    if not (t0 < <double>(FAR - 1)):
        return FAR
    cdef int32_t t = <int32_t>t0 + 1
    return t if t > now else now


cdef class TimingWheel:
    """The ISP accumulator of one replica ``x``, its pending entries bucketed by the step they become significant.

    ``x`` is read when an entry is touched or popped, never written.  ``bits``
    sets the wheel's shape (2^bits buckets per level); any value gives the
    same selections.
    """
    cdef readonly object slots  # SLOT array: the accumulator and the due steps
    cdef Slot[::1] s
    cdef const float[::1] x
    cdef vector[vector[int32_t]] buckets
    cdef Py_ssize_t n_pending
    cdef readonly Py_ssize_t n_copies  # copies in the buckets, stale ones included (bounded: see the module's docstring)
    cdef int32_t now, bits, levels
    cdef int32_t level_of[32]  # the level of a due step whose highest bit differing from now's is b
    cdef uint32_t mask
    cdef double v

    def __init__(self, const float[::1] x not None, double v, int bits=6):
        if not 1 <= bits <= 8:
            raise ValueError(f"bits must be in [1, 8], got {bits}")
        self.bits = bits
        self.mask = (1u << bits) - 1
        self.levels = (31 + bits - 1) // bits
        for b in range(32):
            self.level_of[b] = b // bits  # a table: a division per touch was a tenth of the filter's time
        self.x = x
        self.v = v
        self.slots = np.zeros(x.shape[0], dtype=SLOT)
        self.s = self.slots
        self.buckets.resize(self.levels << bits)
        self.rebuild(1)

    @property
    def pending(self) -> int:
        """Entries with δ_i ≠ 0."""
        return self.n_pending

    cdef inline Py_ssize_t _bucket(self, int32_t due) noexcept nogil:
        """The bucket of a due step ≥ now: the level of the highest bit where it differs from now, then its digit there."""
        cdef uint32_t diff = <uint32_t>due ^ <uint32_t>self.now
        cdef int32_t level = 0 if diff == 0 else self.level_of[31 - __builtin_clz(diff)]
        return (level << self.bits) + ((<uint32_t>due >> (level * self.bits)) & self.mask)

    def rebuild(self, int64_t t):
        """Re-bucket every entry from scratch for a select at step ``t`` (after a gap in the steps, or a restore)."""
        if t < 1 or t >= FAR:
            raise ValueError(f"ISP step t must be in [1, 2^31 - 1), got {t}")
        cdef Py_ssize_t i, k
        with nogil:
            for k in range(<Py_ssize_t>self.buckets.size()):
                self.buckets[k].clear()
            self.now = <int32_t>t
            self.n_pending = self.n_copies = 0
            for i in range(self.s.shape[0]):
                self.s[i].due = NOT_PENDING
                if self.s[i].acc != 0.0:
                    self._touch(<int32_t>i)

    cdef inline void _touch(self, int32_t i) noexcept nogil:
        """Re-bucket entry i after δ_i or x_i changed."""
        cdef Slot *slot = &self.s[i]
        cdef int32_t old = slot.due, t
        cdef Py_ssize_t bucket
        if slot.acc == 0.0:
            if old != NOT_PENDING:
                slot.due = NOT_PENDING
                self.n_pending -= 1
            return
        t = _due(slot.acc, self.x[i], self.v, self.now)
        slot.due = t
        if old == NOT_PENDING:
            self.n_pending += 1
        bucket = self._bucket(t)
        # Bucket blocks nest, so if the old due is in the same bucket now, the copy made for it is in this
        # bucket or in a coarser one whose block contains it, which is emptied into the finer levels in time.
        if old == NOT_PENDING or bucket != self._bucket(old):
            self.buckets[bucket].push_back(i)
            self.n_copies += 1

    cdef int _check(self, const int[::1] idx) except -1:
        cdef Py_ssize_t j, size = self.s.shape[0]
        for j in range(idx.shape[0]):
            if idx[j] < 0 or idx[j] >= size:
                raise IndexError(f"index {idx[j]} outside [0, {size})")
        return 0

    def add(self, const int[::1] idx not None, const float[::1] delta not None):
        """δ[idx] += delta (idx may repeat) after the replica moved by the same delta; all or nothing."""
        cdef Py_ssize_t j, n = idx.shape[0]
        if delta.shape[0] != n:
            raise ValueError("idx and delta differ in length")
        self._check(idx)
        with nogil:
            for j in range(n):
                if j + PREFETCH_AHEAD < n:
                    __builtin_prefetch(&self.s[idx[j + PREFETCH_AHEAD]])
                    __builtin_prefetch(&self.x[idx[j + PREFETCH_AHEAD]])
                self.s[idx[j]].acc += delta[j]
                self._touch(idx[j])

    def touch(self, const int[::1] idx not None):
        """x moved at ``idx`` (a peer's update): re-bucket those of them that are pending."""
        cdef Py_ssize_t j, n = idx.shape[0]
        self._check(idx)
        with nogil:
            for j in range(n):
                if j + PREFETCH_AHEAD < n:
                    __builtin_prefetch(&self.s[idx[j + PREFETCH_AHEAD]])
                if self.s[idx[j]].due != NOT_PENDING:
                    self._touch(idx[j])

    def restore(self, const int[::1] idx not None, const float[::1] values not None):
        """Replace the accumulator: δ = 0 except δ[idx] = values."""
        if values.shape[0] != idx.shape[0]:
            raise ValueError("idx and values differ in length")
        self._check(idx)
        cdef Py_ssize_t j
        self.slots["acc"] = 0
        for j in range(idx.shape[0]):
            self.s[idx[j]].acc = values[j]
        self.rebuild(self.now)

    cdef void _advance(self) noexcept nogil:
        """Step ``now`` on by one; a level whose block just began empties that block's bucket into finer levels.

        Coarse before fine: an entry may fall from level L straight into the
        level L − 1 bucket that is emptied next in the same step.
        """
        cdef int32_t level, i
        cdef Py_ssize_t k, bucket
        cdef vector[int32_t] moving
        self.now += 1
        for level in range(self.levels - 1, 0, -1):
            if (<uint32_t>self.now & ((1u << (level * self.bits)) - 1)) != 0:
                continue
            bucket = (level << self.bits) + ((<uint32_t>self.now >> (level * self.bits)) & self.mask)
            moving.swap(self.buckets[bucket])
            self.n_copies -= moving.size()
            for k in range(<Py_ssize_t>moving.size()):
                i = moving[k]
                # Only copies whose entry is still due inside this block move; the rest are stale.
                if self.s[i].due != NOT_PENDING and self.s[i].due >> (level * self.bits) == self.now >> (level * self.bits):
                    self.buckets[self._bucket(self.s[i].due)].push_back(i)
                    self.n_copies += 1
            moving.clear()

    def select(self, int64_t t):
        """Pop the entries significant at step ``t``: ``(idx int32, δ float32)``, their δ reset to 0.

        Steps are expected one after another; any other ``t`` (the first
        select after a restore, or after steps without selection) re-buckets
        everything first.
        """
        if t != self.now or self.n_copies > max(COPIES_PER_PENDING * self.n_pending, MIN_COPIES):
            self.rebuild(t)
        cdef vector[int32_t] *bucket = &self.buckets[self._bucket(<int32_t>t)]
        cdef vector[int32_t] later
        out_idx_arr = np.empty(bucket.size(), dtype=np.int32)
        out_val_arr = np.empty(bucket.size(), dtype=np.float32)
        cdef int[::1] out_idx = out_idx_arr
        cdef float[::1] out_val = out_val_arr
        cdef double threshold = self.v / sqrt(<double>t)
        cdef Py_ssize_t j, n, sent = 0
        cdef int32_t i
        cdef Slot *slot
        cdef float xi
        with nogil:
            n = bucket.size()
            for j in range(n):
                if j + PREFETCH_AHEAD < n:
                    __builtin_prefetch(&self.s[bucket[0][j + PREFETCH_AHEAD]])
                    __builtin_prefetch(&self.x[bucket[0][j + PREFETCH_AHEAD]])
                i = bucket[0][j]
                slot = &self.s[i]
                if slot.due != t:
                    continue  # a stale copy: the entry moved, or was already handled from this bucket
                xi = self.x[i]
                if self.v == 0.0 or xi == 0.0 or fabs(<double>slot.acc) > threshold * fabs(<double>xi):
                    out_idx[sent] = i
                    out_val[sent] = slot.acc
                    sent += 1
                    slot.acc = 0.0
                    slot.due = NOT_PENDING
                    self.n_pending -= 1
                else:
                    later.push_back(i)  # the estimate was one step early
            self.n_copies -= n
            bucket.clear()
            self._advance()
            for i in later:
                self.s[i].due = NOT_PENDING
                self.n_pending -= 1
                self._touch(i)
        return out_idx_arr[:sent], out_val_arr[:sent]
