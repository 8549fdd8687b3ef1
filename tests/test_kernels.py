"""Gradient kernels against float64 numpy references and finite differences."""
from __future__ import annotations

import numpy as np
import pytest

from mlless.training.kernels import linear as klin
from mlless.training.kernels import softmax as ksm
from mlless.training.kernels import pmf as kpmf


def pmf_reference(params: np.ndarray, users, items, ratings, n_users, n_items, rank, mean, l2):
    """Float64 loss (mean regularised squared error), dense gradient and SSE."""
    p = params.astype(np.float64).reshape(n_users + n_items, rank + 1)
    U, bu = p[:n_users, :rank], p[:n_users, rank]
    M, bi = p[n_users:, :rank], p[n_users:, rank]
    e = (U[users] * M[items]).sum(1) + bu[users] + bi[items] + mean - ratings
    B = len(ratings)
    reg = (p[users] ** 2).sum(1) + (p[n_users + items] ** 2).sum(1)
    loss = (e @ e + l2 * reg.sum()) / B
    g = np.zeros_like(p)
    np.add.at(g[:, :rank], users, 2 * e[:, None] * M[items] / B)
    np.add.at(g[:, :rank], n_users + items, 2 * e[:, None] * U[users] / B)
    np.add.at(g[:, rank], users, 2 * e / B)
    np.add.at(g[:, rank], n_users + items, 2 * e / B)
    np.add.at(g, users, 2 * l2 * p[users] / B)
    np.add.at(g, n_users + items, 2 * l2 * p[n_users + items] / B)
    return loss, g.reshape(-1), float(e @ e)


def make_pmf(rng, n_users=7, n_items=5, rank=3, n=40):
    params = rng.normal(0, 0.5, size=(n_users + n_items) * (rank + 1)).astype(np.float32)
    users = rng.integers(0, n_users, n).astype(np.int32)  # many duplicates on purpose
    items = rng.integers(0, n_items, n).astype(np.int32)
    ratings = rng.uniform(1, 5, n).astype(np.float32)
    return params, users, items, ratings


@pytest.mark.parametrize("l2", [0.0, 0.3])
def test_pmf_gradient_matches_numpy_reference(l2):
    rng = np.random.default_rng(1)
    nu, ni, rank = 7, 5, 3
    params, users, items, ratings = make_pmf(rng, nu, ni, rank)
    slots = np.full(nu + ni, -1, np.int32)
    idx, grad, sse = kpmf.pmf_gradient(params, users, items, ratings, nu, ni, rank, 3.0, l2, slots)
    _, gref, sse_ref = pmf_reference(params, users, items, ratings, nu, ni, rank, 3.0, l2)
    assert idx.dtype == np.int32 and grad.dtype == np.float32
    assert len(np.unique(idx)) == len(idx), "indices must be unique"
    touched = np.zeros(len(params), bool)
    touched[idx] = True
    # exactly the rows of the batch's users and items are touched
    rows = np.unique(np.concatenate([users, nu + items]))
    expect = (rows[:, None] * (rank + 1) + np.arange(rank + 1)).ravel()
    np.testing.assert_array_equal(np.sort(idx), expect)
    np.testing.assert_allclose(grad, gref[idx], rtol=1e-4, atol=1e-6)
    assert np.all(gref[~touched] == 0)
    assert sse == pytest.approx(sse_ref, rel=1e-5)
    assert np.all(slots == -1), "workspace must be reset"


def test_pmf_gradient_matches_finite_differences():
    rng = np.random.default_rng(2)
    nu, ni, rank, l2 = 4, 3, 2, 0.2
    params, users, items, ratings = make_pmf(rng, nu, ni, rank, n=15)
    slots = np.full(nu + ni, -1, np.int32)
    idx, grad, _ = kpmf.pmf_gradient(params, users, items, ratings, nu, ni, rank, 3.0, l2, slots)
    dense = np.zeros(len(params))
    dense[idx] = grad
    p64 = params.astype(np.float64)
    h = 1e-6
    for j in range(len(params)):
        up, down = p64.copy(), p64.copy()
        up[j] += h
        down[j] -= h
        fd = (pmf_reference(up, users, items, ratings, nu, ni, rank, 3.0, l2)[0]
              - pmf_reference(down, users, items, ratings, nu, ni, rank, 3.0, l2)[0]) / (2 * h)
        assert dense[j] == pytest.approx(fd, rel=1e-3, abs=1e-5), f"param {j}"


def test_pmf_gradient_rejects_out_of_range_ids_and_keeps_workspace_clean():
    rng = np.random.default_rng(3)
    params, users, items, ratings = make_pmf(rng)
    users[5] = 7  # == n_users
    slots = np.full(12, -1, np.int32)
    with pytest.raises(IndexError, match="sample 5"):
        kpmf.pmf_gradient(params, users, items, ratings, 7, 5, 3, 3.0, 0.0, slots)
    assert np.all(slots == -1)
    with pytest.raises(ValueError, match="dtype mismatch"):
        kpmf.pmf_gradient(params.astype(np.float64), users, items, ratings, 7, 5, 3, 3.0, 0.0, slots)


def test_pmf_empty_batch():
    params = np.zeros(12 * 4, np.float32)
    e = np.empty(0, np.int32)
    idx, grad, sse = kpmf.pmf_gradient(params, e, e, np.empty(0, np.float32), 7, 5, 3, 3.0, 0.1,
                                       np.full(12, -1, np.int32))
    assert len(idx) == len(grad) == 0 and sse == 0


def test_pmf_predict_unknown_ids_fall_back_to_known_bias():
    nu, ni, rank = 2, 2, 2
    p = np.arange((nu + ni) * (rank + 1), dtype=np.float32) / 10
    users = np.array([0, 5, 1, -1], np.int32)
    items = np.array([1, 0, 9, 9], np.int32)
    out = kpmf.pmf_predict(p, users, items, nu, ni, rank, 3.0)
    t = p.reshape(nu + ni, rank + 1)
    assert out[0] == pytest.approx(3.0 + t[0, :2] @ t[3, :2] + t[0, 2] + t[3, 2], rel=1e-6)
    assert out[1] == pytest.approx(3.0 + t[2, 2])  # unknown user: mean + item bias
    assert out[2] == pytest.approx(3.0 + t[1, 2])  # unknown item: mean + user bias
    assert out[3] == pytest.approx(3.0)


# --- logistic regression -------------------------------------------------------------------------

def make_csr(rng, n_rows=30, n_features=10, nnz_per_row=4):
    indptr = np.zeros(n_rows + 1, np.int64)
    lens = rng.integers(0, nnz_per_row + 1, n_rows)
    indptr[1:] = np.cumsum(lens)
    indices = rng.integers(0, n_features, indptr[-1]).astype(np.int32)  # duplicates within rows allowed
    values = rng.normal(0, 1, indptr[-1]).astype(np.float32)
    labels = (rng.random(n_rows) < 0.4).astype(np.float32)
    return indptr, indices, values, labels


def lr_reference(params, indptr, indices, values, labels, n_features):
    """Float64 mean BCE and dense gradient via a dense design matrix."""
    p = params.astype(np.float64)
    X = np.zeros((len(labels), n_features))
    for r in range(len(labels)):
        for j in range(indptr[r], indptr[r + 1]):
            X[r, indices[j]] += values[j]
    z = X @ p[:n_features] + p[n_features]
    loss = np.logaddexp(0, z) - z * labels
    resid = 1 / (1 + np.exp(-z)) - labels
    g = np.concatenate([X.T @ resid, [resid.sum()]]) / len(labels)
    return loss.mean(), g, loss.sum()


def test_logreg_gradient_matches_numpy_reference_and_finite_differences():
    rng = np.random.default_rng(4)
    F = 10
    indptr, indices, values, labels = make_csr(rng, n_features=F)
    params = rng.normal(0, 0.7, F + 1).astype(np.float32)
    slots = np.full(F, -1, np.int32)
    idx, grad, loss_sum = klin.gradient(klin.Log(), params, indptr, indices, values, labels, F, slots)
    _, gref, loss_ref = lr_reference(params, indptr, indices, values, labels, F)
    assert np.all(slots == -1)
    assert idx[-1] == F, "bias is always touched, last"
    np.testing.assert_array_equal(np.sort(idx[:-1]), np.unique(indices))
    np.testing.assert_allclose(grad, gref[idx], rtol=1e-4, atol=1e-6)
    assert loss_sum == pytest.approx(loss_ref, rel=1e-5)
    dense = np.zeros(F + 1)
    dense[idx] = grad
    h = 1e-6
    for j in range(F + 1):
        up, down = params.astype(np.float64), params.astype(np.float64)
        up[j] += h
        down[j] -= h
        fd = (lr_reference(up, indptr, indices, values, labels, F)[0]
              - lr_reference(down, indptr, indices, values, labels, F)[0]) / (2 * h)
        assert dense[j] == pytest.approx(fd, rel=1e-3, abs=1e-6)


#: Each loss of the linear kernel with its numpy reference: (loss per row, its derivative in the margin z).
LINEAR_LOSSES = {
    "hinge": (klin.Hinge, lambda z, y: np.maximum(0, 1 - (2 * y - 1) * z),
              lambda z, y: np.where((2 * y - 1) * z < 1, -(2 * y - 1), 0.0)),
    "squared": (klin.Squared, lambda z, y: (z - y) ** 2, lambda z, y: 2 * (z - y)),
}


@pytest.mark.parametrize("name", LINEAR_LOSSES)
def test_every_linear_loss_runs_the_same_loops_to_its_own_gradient_and_adagrad_step(name):
    loss_fn, loss, dloss = LINEAR_LOSSES[name]
    rng = np.random.default_rng(5)
    F = 10
    indptr, indices, values, labels = make_csr(rng, n_features=F)
    if name == "squared":
        labels = rng.normal(3.0, 2.0, len(labels)).astype(np.float32)
    params = rng.normal(0, 0.7, F + 1).astype(np.float32)
    X = np.zeros((len(labels), F))
    for r in range(len(labels)):
        for j in range(indptr[r], indptr[r + 1]):
            X[r, indices[j]] += values[j]
    z = X @ params[:F].astype(np.float64) + params[F]
    idx, grad, loss_sum = klin.gradient(loss_fn(), params, indptr, indices, values, labels, F, np.full(F, -1, np.int32))
    resid = dloss(z, labels)
    np.testing.assert_allclose(grad, (np.concatenate([X.T @ resid, [resid.sum()]]) / len(labels))[idx], rtol=1e-4,
                               atol=1e-6)
    assert loss_sum == pytest.approx(loss(z, labels).sum(), rel=1e-5)
    assert klin.loss_sum(loss_fn(), z, labels) == pytest.approx(loss_sum, rel=1e-5)
    # Per-sample AdaGrad: row by row, each row's loss taken just before its own update.
    ref, g2 = params.astype(np.float64), np.ones(F + 1)
    progressive = 0.0
    for r in range(len(labels)):
        cols = indices[indptr[r]:indptr[r + 1]]
        zr = ref[cols] @ values[indptr[r]:indptr[r + 1]] + ref[F]
        progressive += loss(zr, labels[r])
        g = dloss(zr, labels[r])
        for c, v in zip(cols, values[indptr[r]:indptr[r + 1]]):
            g2[c] += (g * v) ** 2
            ref[c] -= 0.1 * g * v / np.sqrt(g2[c])
        g2[F] += g * g
        ref[F] -= 0.1 * g / np.sqrt(g2[F])
    stepped = params.copy()
    idx, delta, loss_sum = klin.adagrad_step(loss_fn(), stepped, np.ones(F + 1, np.float32), indptr, indices, values,
                                             labels, F, 0.1, 0.0, np.full(F, -1, np.int32))
    np.testing.assert_allclose(stepped, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(delta, (stepped - params)[idx], atol=1e-6)
    assert loss_sum == pytest.approx(progressive, rel=1e-4)


def py_bce(z: float, y: float) -> float:
    """The kernel's binary cross-entropy of one logit, through `bce_sum`."""
    return klin.loss_sum(klin.Log(), np.array([z]), np.array([y], np.float32))


def py_sigmoid(z: float) -> float:
    """The kernel's sigmoid of one logit: the gradient of a batch of one featureless row labelled 0, at bias z."""
    empty = np.empty(0, np.int32)
    _, grad, _ = klin.gradient(klin.Log(), np.array([z], np.float32), np.zeros(2, np.int64), empty,
                                     np.empty(0, np.float32), np.zeros(1, np.float32), 0, empty)
    return float(grad[0])


def test_logreg_losses_are_stable_for_huge_logits():
    assert py_bce(1000.0, 1.0) == pytest.approx(0.0, abs=1e-12)
    assert py_bce(1000.0, 0.0) == pytest.approx(1000.0)
    assert py_bce(-1000.0, 1.0) == pytest.approx(1000.0)
    assert py_sigmoid(-1000.0) == 0.0 and py_sigmoid(1000.0) == 1.0
    for z in (-3.0, 0.0, 2.5):
        for y in (0.0, 1.0):
            p = 1 / (1 + np.exp(-z))
            assert py_bce(z, y) == pytest.approx(-(y * np.log(p) + (1 - y) * np.log(1 - p)))


def test_logreg_gradient_rejects_bad_input():
    rng = np.random.default_rng(5)
    indptr, indices, values, labels = make_csr(rng, n_features=10)
    params = np.zeros(11, np.float32)
    slots = np.full(10, -1, np.int32)
    bad = indices.copy()
    bad[0] = 10
    with pytest.raises(IndexError):
        klin.gradient(klin.Log(), params, indptr, bad, values, labels, 10, slots)
    assert np.all(slots == -1)
    with pytest.raises(ValueError):
        klin.gradient(klin.Log(), params, indptr[:-1], indices, values, labels, 10, slots)
    with pytest.raises(ValueError):
        klin.gradient(klin.Log(), np.zeros(10, np.float32), indptr, indices, values, labels, 10, slots)


def test_softmax_gradient_matches_numpy_reference_and_finite_differences():
    rng = np.random.default_rng(6)
    F, K = 10, 4
    indptr, indices, values, _ = make_csr(rng, n_features=F)
    classes = rng.integers(0, K, len(indptr) - 1).astype(np.int32)
    params = rng.normal(0, 0.7, (F + 1) * K).astype(np.float32)

    def reference(p: np.ndarray) -> tuple[float, np.ndarray]:
        X = np.zeros((len(classes), F))
        for r in range(len(classes)):
            for j in range(indptr[r], indptr[r + 1]):
                X[r, indices[j]] += values[j]
        W, b = p[:F * K].reshape(F, K), p[F * K:]
        z = X @ W + b
        lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
        loss = lse - z[np.arange(len(classes)), classes]
        d = np.exp(z - lse[:, None])
        d[np.arange(len(classes)), classes] -= 1
        return loss.sum(), np.concatenate([(X.T @ d).ravel(), d.sum(0)]) / len(classes)

    slots = np.full(F, -1, np.int32)
    idx, grad, loss_sum = ksm.softmax_gradient(params, indptr, indices, values, classes, F, K, slots)
    loss_ref, gref = reference(params.astype(np.float64))
    assert np.all(slots == -1) and len(np.unique(idx)) == len(idx)
    np.testing.assert_array_equal(idx[-K:], F * K + np.arange(K))
    np.testing.assert_allclose(grad, gref[idx], rtol=1e-4, atol=1e-6)
    assert loss_sum == pytest.approx(loss_ref, rel=1e-5)
    h = 1e-6
    for j in range(0, (F + 1) * K, 3):
        up, down = params.astype(np.float64), params.astype(np.float64)
        up[j] += h
        down[j] -= h
        fd = (reference(up)[0] - reference(down)[0]) / (2 * h) / len(classes)
        assert gref[j] == pytest.approx(fd, rel=1e-3, abs=1e-6)
    big = params * 1e4  # logits in the thousands: no overflow, and the same loss the reference computes stably
    assert np.isfinite(ksm.softmax_gradient(big, indptr, indices, values, classes, F, K, slots)[2])
    with pytest.raises(ValueError, match="class 4 outside"):
        ksm.softmax_gradient(params, indptr, indices, values, np.full(len(classes), K, np.int32), F, K, slots)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", ["log", "hinge", "squared"])
def test_normalized_updates_learn_the_same_whatever_a_features_units(name, workers):
    """A feature multiplied by 1,000 gets a weight 1,000 times smaller and the same margins, step after step, alone
    and as one of the replicas whose updates are summed."""
    loss_fn = {"log": klin.Log, "hinge": klin.Hinge, "squared": klin.Squared}[name]()
    rng = np.random.default_rng(7)
    F = 10
    indptr, indices, values, labels = make_csr(rng, n_features=F)
    if name == "squared":
        labels = rng.normal(1.0, 1.0, len(labels)).astype(np.float32)
    scaled = values * np.where(indices == 3, 1000.0, 1.0).astype(np.float32)
    runs = []
    for vals in (values, scaled):
        params, g2, scale, rows = (np.zeros(F + 1, np.float32) for _ in range(4))
        norm = np.zeros(2)
        for _ in range(3):
            idx, delta, _ = klin.normalized_step(loss_fn, params, g2, scale, rows, norm, indptr, indices, vals, labels,
                                                 F, 0.5, 0.0, workers, np.full(F, -1, np.int32))
        runs.append((params.copy(), klin.logits(params, indptr, indices, vals, F)))
    (plain, margins), (wide, wide_margins) = runs
    assert np.any(plain != 0) and np.all(np.isfinite(plain))
    np.testing.assert_allclose(wide[3] * 1000.0, plain[3], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(np.delete(wide, 3), np.delete(plain, 3), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(wide_margins, margins, rtol=1e-3, atol=1e-5)


def test_normalized_moves_are_averaged_among_the_workers_expected_to_make_them():
    """Under the sum of P replicas' updates, each replica learns its batch as alone, then divides a feature's move
    by the workers expected to make it: P for a feature every row holds (and the bias), and for one held by a
    share q of the rows, in a batch of B rows, k = 1 + (P − 1)(1 − (1 − q)^B)."""
    F = 10
    rows_seen = 100
    indptr = np.arange(0, 2 * rows_seen + 1, 2, dtype=np.int64)  # feature 0 in every row, one of 1..9 beside it
    indices = np.stack([np.zeros(rows_seen, np.int32), 1 + np.arange(rows_seen, dtype=np.int32) % 9], 1).ravel()
    values = np.ones(len(indices), np.float32)
    labels = (np.arange(rows_seen) % 2).astype(np.float32)
    state = [np.zeros(F + 1, np.float32) for _ in range(4)] + [np.zeros(2)]
    klin.normalized_step(klin.Log(), *state, indptr, indices, values, labels, F, 0.5, 0.0, 1, np.full(F, -1, np.int32))
    moves, after = {}, {}
    for workers in (1, 2):
        params, g2, scale, rows, norm = (a.copy() for a in state)
        _, moves[workers], _ = klin.normalized_step(klin.Log(), params, g2, scale, rows, norm,
                                                    np.array([0, 2, 4], np.int64), np.array([0, 3, 0, 3], np.int32),
                                                    np.ones(4, np.float32), np.ones(2, np.float32), F, 0.5, 0.0,
                                                    workers, np.full(F, -1, np.int32))
        after[workers] = (g2, scale, rows, norm)
    held = (state[3][3] + 2) / (rows_seen + 2)  # feature 3's rows, this batch's included, over the rows seen
    k = np.array([2.0, 1 + (1 - (1 - held) ** 2), 2.0])
    np.testing.assert_allclose(moves[2], moves[1] / k, rtol=1e-5)
    for one, two in zip(after[1], after[2]):  # the optimizer's state is as one learner's
        np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("name, y", [("log", 1.0), ("log", 0.0), ("hinge", 1.0), ("hinge", 0.0)])
@pytest.mark.parametrize("z", [-3.0, -0.2, 0.4, 2.0])
@pytest.mark.parametrize("rate_ppu", [1e-3, 0.5, 4.0, 40.0])
def test_the_importance_invariant_step_is_the_limit_of_many_small_gradient_steps(name, y, z, rate_ppu):
    """u with u·ppu the margin's move equals the sum of 20,000 gradient steps adding up to the rate; a large step
    stops at the margin (hinge) or moves the logistic margin by less than its first order. The squared loss keeps
    the first-order step (measured better)."""
    loss_fn = {"log": klin.Log, "hinge": klin.Hinge}[name]()
    ppu, n = 0.8, 20_000
    rate = rate_ppu / ppu
    margin = z
    for _ in range(n):
        dloss = 1 / (1 + np.exp(-margin)) - y if name == "log" else -(2 * y - 1) * ((2 * y - 1) * margin < 1)
        margin -= rate / n * ppu * dloss
    u = loss_fn.invariant_step(z, y, rate, ppu)
    assert z - u * ppu == pytest.approx(margin, abs=2e-3 * max(1.0, rate_ppu))
    assert klin.Squared().invariant_step(z, 2.5, rate, ppu) == pytest.approx(rate * 2 * (z - 2.5))
    if name == "log":
        assert abs(u) <= abs(rate * (1 / (1 + np.exp(-z)) - y)) + 1e-12
    else:
        assert (2 * y - 1) * (z - u * ppu) <= max(1.0, (2 * y - 1) * z) + 1e-9  # never past the margin


@pytest.mark.parametrize("y", [1.0, 0.0])
@pytest.mark.parametrize("z", [-20.0, -1.0, 0.0, 9.2, 25.0])
@pytest.mark.parametrize("rate_ppu", [100.0, 1e4, 1e8])
def test_the_logistic_invariant_step_solves_its_equation_for_large_moves(y, z, rate_ppu):
    """A confident row with a feature seen for the first time has a large rate·ppu: the new margin m must still solve
    m + e^m = m0 + e^m0 + rate·ppu (once Newton's start was so far right that 50 steps of about 1 each ended at
    59.2 for the root 9.21)."""
    ppu = 0.5
    s = 2 * y - 1
    u = klin.Log().invariant_step(z, y, rate_ppu / ppu, ppu)
    m0, m = s * z, s * (z - u * ppu)
    target = m0 + np.exp(m0) + rate_ppu
    assert m + np.exp(m) == pytest.approx(target, rel=1e-9)


@pytest.mark.parametrize("workers", [1, 2])
def test_softmax_normalized_updates_learn_the_same_whatever_a_features_units(workers):
    """Softmax's normalized updates: a feature multiplied by 1,000 gets K weights 1,000 times smaller and the same
    logits, step after step, alone and as one of the summed replicas."""
    rng = np.random.default_rng(8)
    F, K = 10, 3
    indptr, indices, values, _ = make_csr(rng, n_features=F)
    classes = rng.integers(0, K, len(indptr) - 1).astype(np.int32)
    scaled = values * np.where(indices == 3, 1000.0, 1.0).astype(np.float32)
    runs = []
    for vals in (values, scaled):
        params, g2, scale, rows = (np.zeros((F + 1) * K, np.float32) for _ in range(4))
        norm = np.zeros(2)
        for _ in range(3):
            ksm.normalized_step(params, g2, scale, rows, norm, indptr, indices, vals, classes, F, K, 0.5, 0.0, workers,
                                np.full(F, -1, np.int32))
        runs.append((params.reshape(F + 1, K).copy(), ksm.softmax_logits(params, indptr, indices, vals, F, K)))
    (plain, logits), (wide, wide_logits) = runs
    assert np.any(plain != 0) and np.all(np.isfinite(plain))
    np.testing.assert_allclose(wide[3] * 1000.0, plain[3], rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(np.delete(wide, 3, 0), np.delete(plain, 3, 0), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(wide_logits, logits, rtol=1e-3, atol=1e-5)
    # the same state as an accuracy: each row's class is the same
    np.testing.assert_array_equal(wide_logits.argmax(1), logits.argmax(1))


@pytest.mark.parametrize("margin, rate_ppu", [(0.0, 0.1), (-2.0, 5.0), (1.0, 40.0), (-8.0, 300.0)])
def test_softmax_invariant_step_of_two_classes_is_the_logistic_one(margin, rate_ppu):
    """With two classes moving at the same pace a, the softmax flow is the logistic one on the margin z1 − z0 at
    pace 2a: class 1's u is `Log.step`'s (closed form) within the sub-steps' error, and a large step lands short of
    the label, never past it."""
    a, rate = 2.0, rate_ppu / 4.0
    u = ksm.invariant_step(np.array([0.0, margin]), 1, rate, np.array([a, a]))
    want = klin.Log().invariant_step(margin, 1.0, rate, 2 * a)
    assert u[1] == pytest.approx(want, rel=0.05, abs=1e-6)
    assert u[0] == pytest.approx(-u[1], rel=1e-6)  # the probabilities' residuals are opposite
    first_order = rate * (1.0 / (1.0 + np.exp(-margin)) - 1.0)
    assert abs(u[1]) <= abs(first_order) + 1e-12
