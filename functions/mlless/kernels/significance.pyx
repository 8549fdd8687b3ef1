# cython: language_level=3
# distutils: language = c++
"""ISP significance filter as a timing wheel: the work per step follows what changed.

An entry i with accumulated update δ_i ≠ 0 and replica value x_i is sent at
step t iff |δ_i| > (v/√t)·|x_i| (or x_i = 0, or v = 0).  While δ_i and x_i
stay put, the threshold only falls, so the entry becomes significant at a
step it knows in advance: the first t > (v·|x_i|/|δ_i|)².  Each pending entry
therefore waits in the bucket of that step ("due").  Touching an entry (its
own update changes δ_i and x_i, a peer's changes x_i) recomputes its due step
and moves it; `select(t)` pops the bucket of step t and checks each entry
with the exact predicate, so the selection is the same as walking every
pending entry, at the cost of the entries touched plus those due.

Buckets for the next ``ring_steps`` steps form a ring; entries due later sit
in one overflow list that is swept a slice per step, each entry at least
once every ``ring_steps`` steps, and enter the ring before they are due.  Buckets
forget nothing eagerly: an entry moved to another bucket leaves a stale copy,
recognised by ``due[i]`` no longer naming that bucket's step.
"""
import numpy as np
cimport numpy as cnp
from libc.math cimport fabs, sqrt
from libc.stdint cimport int32_t, int64_t, uint8_t
from libcpp.vector cimport vector

cnp.import_array()

#: δ_i = 0: the entry is not pending.
DEF NOT_PENDING = -1
#: Due later than any job runs (also where NaNs go: they are never significant unless v = 0, as before).
DEF FAR = 4611686018427387904  # 2**62


cdef inline int64_t _due(float d, float xi, double v, int64_t now) noexcept nogil:
    """The first step ≥ now at which |d| > (v/√t)·|xi| could hold, never later than the exact one.

    The real solution is the first t > t0 = (v·|xi|/|d|)²; shrinking t0 by 1e-9
    (far above the rounding of t0 and of the predicate) makes the estimate
    at most one step early, and `select` re-checks exactly.
    """
    if v == 0.0 or xi == 0.0:
        return now
    cdef double r = v * fabs(<double>xi) / fabs(<double>d)
    cdef double t0 = r * r * (1.0 - 1e-9)
    if not (t0 < <double>FAR):
        return FAR
    cdef int64_t t = <int64_t>t0 + 1
    return t if t > now else now


cdef class TimingWheel:
    """The pending entries of one replica's ISP accumulator, bucketed by the step they become significant.

    ``acc`` (δ) is owned by the wheel; ``x`` is the replica, read when an
    entry is touched or popped, never written.
    """
    cdef float[::1] acc
    cdef const float[::1] x
    cdef int64_t[::1] due
    cdef uint8_t[::1] overflowed
    cdef vector[vector[int32_t]] ring
    cdef vector[int32_t] overflow
    cdef Py_ssize_t sweep_read, sweep_write, n_pending
    cdef int64_t t_next, lap_end, ring_steps
    cdef double v

    def __init__(self, float[::1] acc not None, const float[::1] x not None, double v, int64_t ring_steps=4096):
        if x.shape[0] != acc.shape[0]:
            raise ValueError("x must match the accumulator")
        if ring_steps < 2 or ring_steps & (ring_steps - 1):
            raise ValueError(f"ring_steps must be a power of two >= 2, got {ring_steps}")
        self.ring_steps = ring_steps
        self.acc = acc
        self.x = x
        self.v = v
        self.due = np.full(acc.shape[0], NOT_PENDING, dtype=np.int64)
        self.overflowed = np.zeros(acc.shape[0], dtype=np.uint8)
        self.ring.resize(ring_steps)
        self.rebuild(1)

    @property
    def pending(self) -> int:
        """Entries with δ_i ≠ 0."""
        return self.n_pending

    @property
    def next_step(self) -> int:
        """The step the next `select` is expected for."""
        return self.t_next

    def rebuild(self, int64_t t):
        """Re-bucket every entry from scratch for a select at step ``t`` (after a gap in the steps, or a restore)."""
        cdef Py_ssize_t i, k
        with nogil:
            for k in range(self.ring_steps):
                self.ring[k].clear()
            self.overflow.clear()
            self.sweep_read = self.sweep_write = 0
            self.t_next = t
            self.lap_end = t + self.ring_steps // 2
            self.n_pending = 0
            for i in range(self.acc.shape[0]):
                self.due[i] = NOT_PENDING
                self.overflowed[i] = 0
                if self.acc[i] != 0.0:
                    self._touch(<int32_t>i)

    cdef inline void _touch(self, int32_t i) noexcept nogil:
        """Re-bucket entry i after δ_i or x_i changed."""
        cdef float d = self.acc[i]
        cdef int64_t old = self.due[i], t
        if d == 0.0:
            if old != NOT_PENDING:
                self.due[i] = NOT_PENDING
                self.n_pending -= 1
            return
        if old == NOT_PENDING:
            self.n_pending += 1
        t = _due(d, self.x[i], self.v, self.t_next)
        if t == old:
            return  # already in that bucket
        self.due[i] = t
        if t < self.t_next + self.ring_steps:
            self.ring[t & (self.ring_steps - 1)].push_back(i)
        elif not self.overflowed[i]:
            self.overflowed[i] = 1
            self.overflow.push_back(i)

    def add(self, const int[::1] idx not None, const float[::1] delta not None):
        """δ[idx] += delta (idx may repeat) after the replica moved by the same delta."""
        cdef Py_ssize_t j, n = idx.shape[0], size = self.acc.shape[0]
        if delta.shape[0] != n:
            raise ValueError("idx and delta differ in length")
        for j in range(n):  # checked first: nothing is added from a batch with a bad index
            if idx[j] < 0 or idx[j] >= size:
                raise IndexError(f"index {idx[j]} outside [0, {size})")
        with nogil:
            for j in range(n):
                self.acc[idx[j]] += delta[j]
                self._touch(idx[j])

    def touch(self, const int[::1] idx not None):
        """x moved at ``idx`` (a peer's update): re-bucket those of them that are pending."""
        cdef Py_ssize_t j, n = idx.shape[0], size = self.acc.shape[0]
        for j in range(n):
            if idx[j] < 0 or idx[j] >= size:
                raise IndexError(f"index {idx[j]} outside [0, {size})")
        with nogil:
            for j in range(n):
                if self.due[idx[j]] != NOT_PENDING:
                    self._touch(idx[j])

    cdef void _sweep(self) noexcept nogil:
        """Move the overflow entries that came within the ring's reach into it, a slice of the list per step.

        A lap of the list takes at most ring_steps/2 steps, so an entry is seen
        at least every ring_steps steps, and one that is not yet within reach at a
        visit cannot fall due before the next.
        """
        cdef Py_ssize_t remaining = <Py_ssize_t>self.overflow.size() - self.sweep_read
        cdef int64_t steps_left = self.lap_end - self.t_next
        cdef Py_ssize_t quota = remaining if steps_left <= 1 else (remaining + steps_left - 1) // steps_left
        cdef int32_t i
        cdef int64_t t
        while quota > 0:
            i = self.overflow[self.sweep_read]
            self.sweep_read += 1
            quota -= 1
            t = self.due[i]
            if t == NOT_PENDING or t < self.t_next + self.ring_steps:
                self.overflowed[i] = 0
                if t != NOT_PENDING:
                    self.ring[t & (self.ring_steps - 1)].push_back(i)
            else:
                self.overflow[self.sweep_write] = i
                self.sweep_write += 1
        if self.sweep_read == <Py_ssize_t>self.overflow.size():
            self.overflow.resize(self.sweep_write)
            self.sweep_read = self.sweep_write = 0
            self.lap_end = self.t_next + self.ring_steps // 2

    def select(self, int64_t t):
        """Pop the entries significant at step ``t``: ``(idx int32, δ float32)``, their δ reset to 0.

        Steps are expected one after another; any other ``t`` (the first
        select after a restore, or after steps without selection) re-buckets
        everything first.
        """
        if t < 1:
            raise ValueError(f"ISP step t starts at 1, got {t}")
        if t != self.t_next:
            self.rebuild(t)
        cdef vector[int32_t] *bucket = &self.ring[t & (self.ring_steps - 1)]
        cdef vector[int32_t] later
        out_idx_arr = np.empty(bucket.size(), dtype=np.int32)
        out_val_arr = np.empty(bucket.size(), dtype=np.float32)
        cdef int[::1] out_idx = out_idx_arr
        cdef float[::1] out_val = out_val_arr
        cdef double threshold = self.v / sqrt(<double>t)
        cdef Py_ssize_t j, sent = 0
        cdef int32_t i
        cdef float d, xi
        with nogil:
            self._sweep()
            for j in range(<Py_ssize_t>bucket.size()):
                i = bucket[0][j]
                if self.due[i] != t:
                    continue  # a stale copy: the entry moved, or was already handled from this bucket
                d = self.acc[i]
                xi = self.x[i]
                if self.v == 0.0 or xi == 0.0 or fabs(<double>d) > threshold * fabs(<double>xi):
                    out_idx[sent] = i
                    out_val[sent] = d
                    sent += 1
                    self.acc[i] = 0.0
                    self.due[i] = NOT_PENDING
                    self.n_pending -= 1
                else:
                    later.push_back(i)  # the estimate was one step early
            bucket.clear()
            self.t_next = t + 1
            for i in later:
                self.due[i] = NOT_PENDING
                self.n_pending -= 1
                self._touch(i)
        return out_idx_arr[:sent], out_val_arr[:sent]
