"""Synthetic datasets of any size, generated chunk by chunk with bounded memory.

* PMF: ratings = mu + U_u . V_i + noise, with U, V ~ N(0, rank**-0.5) so the
  low-rank part has unit variance; clipped to [1, 5] unless `clip=False`.
  Users and items are Zipf-distributed with exponent `skew` (0 = uniform):
  real ratings are skewed that way, and uniform ids would hide the cache and
  load-balance effects of popular rows.  The default 0.8 gives the top 1 % of
  items about 30 % of the ratings.  Rows are independent, so a 10M-rating
  ML-10M-sized set (70k x 10k) takes a few seconds to generate.
* Clicks: Criteo-shaped sparse rows, 13 "integer" columns (each present with
  p=0.8) with the magnitudes and tails of real ones (`integer_columns`: counts
  log-normal up to 10^4, clock times 0-2359, distances up to about 5,000) and
  26 categoricals (present with p=0.9, a skewed per-column vocabulary) hashed
  exactly like Criteo, so ~37 nnz per row; the values of each column are
  Zipf-distributed with exponent `skew`, as in real click logs.  A planted
  score s = w.x / sqrt(39) + b over the hashed space (integers enter as log1p,
  as the default transform writes them) makes the labels, so a model can
  actually learn something: Bernoulli(sigmoid(s)) for `lr`, s + noise for
  `regression`, and for `multiclass` the class whose own planted score, plus
  Gumbel noise, is largest (a sample of the softmax).
* Higgs-like: 28 dense features as in the UCI HIGGS set (21 kinematic ones of
  mixed scales and heavy tails, 7 masses derived from them); the label is
  Bernoulli(sigmoid) of a score that is not linear in the features, so a linear
  model tops out well below 100 % as on the real set.
* Gaussian blobs, for k-means: `clusters` centres uniform in a box (scikit-learn's make_blobs' [-10, 10]), of
  unequal sizes (weights ~ Dirichlet(1), at least a tenth of the mean) and unequal, anisotropic spreads (each
  cluster's scale log-normal around 1.5, each feature's ×U(0.5, 1.5)); the label is the blob's index.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np

from mlless.data.chunks import RatingsChunk, SparseChunk
from mlless.data.formats import CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS, criteo_feature_indices
from mlless.data.hashing import hash_ints

CHUNK_ROWS = 1 << 20
#: Zipf exponent of user, item and categorical-value popularity (0: uniform).
DEFAULT_SKEW = 0.8


@dataclass(frozen=True)
class PmfParams:
    rows: int = 1_000_000
    users: int = 6_000
    items: int = 4_000
    rank: int = 10
    noise: float = 0.5
    mean: float = 3.5
    bias: float = 0.4  # std of the user and item biases, as real ratings have them
    clip: bool = True
    skew: float = DEFAULT_SKEW

    def describe(self) -> dict:
        return {"synthetic": "pmf", **asdict(self)}


#: What the clicks generator's labels are (`mlless.data.manifest.LABEL_KINDS`), by its `--synthetic` name.
CLICK_TASKS = {"lr": "binary", "regression": "real", "multiclass": "classes"}


@dataclass(frozen=True)
class LrParams:
    rows: int = 1_000_000
    hash_bits: int = 18
    vocabulary: int = 10_000
    bias: float = -1.0
    skew: float = DEFAULT_SKEW
    task: str = "lr"  # a name of CLICK_TASKS
    classes: int = 4  # multiclass

    def describe(self) -> dict:
        return {"synthetic": self.task, **asdict(self), "labels": CLICK_TASKS[self.task]}


@dataclass(frozen=True)
class HiggsParams:
    rows: int = 1_000_000
    noise: float = 1.0  # std of the label score's noise

    def describe(self) -> dict:
        return {"synthetic": "higgs", **asdict(self), "labels": "binary"}


@dataclass(frozen=True)
class BlobsParams:
    rows: int = 1_000_000
    features: int = 16
    clusters: int = 8

    def describe(self) -> dict:
        return {"synthetic": "blobs", **asdict(self), "labels": "classes"}


class Zipf:
    """Ids 0..n-1 with P(id of popularity rank k) ∝ k^-skew; the popular ids are scattered, not 0, 1, 2, ..."""

    def __init__(self, n: int, skew: float, rng: np.random.Generator) -> None:
        if skew < 0:
            raise ValueError(f"skew must be >= 0, got {skew}")
        weights = np.arange(1, n + 1, dtype=np.float64) ** -skew
        self.cdf = np.cumsum(weights / weights.sum())
        self.ids = rng.permutation(n)

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        ranks = np.searchsorted(self.cdf, rng.random(size) * self.cdf[-1], side="right")
        return self.ids[np.minimum(ranks, len(self.ids) - 1)]


def generate_pmf(p: PmfParams, seed: int) -> Iterator[RatingsChunk]:
    rng = np.random.default_rng([seed, 0x504D46])
    scale = p.rank ** -0.25  # each factor N(0, rank^-1/4) -> dot product has unit variance
    U = rng.normal(0.0, scale, size=(p.users, p.rank)).astype(np.float32)
    V = rng.normal(0.0, scale, size=(p.items, p.rank)).astype(np.float32)
    user_bias = rng.normal(0.0, p.bias, size=p.users).astype(np.float32)
    item_bias = rng.normal(0.0, p.bias, size=p.items).astype(np.float32)
    user_ids, item_ids = Zipf(p.users, p.skew, rng), Zipf(p.items, p.skew, rng)
    for start in range(0, p.rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, p.rows - start)
        crng = np.random.default_rng([seed, 0x504D46, start])
        users = user_ids.sample(crng, n)
        items = item_ids.sample(crng, n)
        r = np.einsum("ij,ij->i", U[users], V[items]) + user_bias[users] + item_bias[items] + p.mean
        r += crng.normal(0.0, p.noise, size=n).astype(np.float32)
        if p.clip:
            np.clip(r, 1.0, 5.0, out=r)
        keys = np.arange(start, start + n, dtype=np.int64)
        yield RatingsChunk(keys, users.astype(np.int64), items.astype(np.int64), r.astype(np.float32))


#: The clicks' integer columns: the first COUNT_COLUMNS are counts, then CLOCK_COLUMNS clock times (HHMM), then
#: distances, as the integer columns of real click logs are.
COUNT_COLUMNS, CLOCK_COLUMNS = 9, 2
MAX_COUNT, MAX_DISTANCE = 10_000, 5_000


def integer_columns(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 13) raw integer values with the magnitudes and tails of real ones: counts log-normal (medians 1 to
    55, σ 1.5) capped at 10^4, clock times 0-2359 busier by day, distances log-normal (median 300) capped at 5,000."""
    out = np.empty((n, CRITEO_INT_COLUMNS), dtype=np.float32)
    medians = np.exp(np.linspace(0.0, 4.0, COUNT_COLUMNS))
    out[:, :COUNT_COLUMNS] = np.minimum(np.floor(rng.lognormal(np.log(medians), 1.5, (n, COUNT_COLUMNS))), MAX_COUNT)
    hours = np.clip(np.round(rng.normal(14.0, 5.0, (n, CLOCK_COLUMNS))), 0, 23)
    out[:, COUNT_COLUMNS:COUNT_COLUMNS + CLOCK_COLUMNS] = hours * 100 + rng.integers(0, 60, (n, CLOCK_COLUMNS))
    distances = rng.lognormal(np.log(300.0), 1.2, (n, CRITEO_INT_COLUMNS - COUNT_COLUMNS - CLOCK_COLUMNS))
    out[:, COUNT_COLUMNS + CLOCK_COLUMNS:] = np.minimum(np.floor(distances), MAX_DISTANCE)
    return out


def generate_lr(p: LrParams, seed: int) -> Iterator[SparseChunk]:
    """Clicks (the module's docstring), labelled as `p.task` says."""
    n_features = 1 << p.hash_bits
    rng = np.random.default_rng([seed, 0x4C52])
    # Strong enough that a model trained on a few thousand rows measurably beats the base rate. One planted
    # vector a score: one for lr and regression, one a class for multiclass.
    scores = p.classes if p.task == "multiclass" else 1
    w = rng.normal(0.0, 2.0, size=(n_features, scores)).astype(np.float32)
    # log1p of the integer columns reaches 9 (8 for clock times): smaller weights keep them one feature of 39.
    w[:CRITEO_INT_COLUMNS] = rng.normal(0.0, 0.1, size=(CRITEO_INT_COLUMNS, scores))
    width = CRITEO_INT_COLUMNS + CRITEO_CAT_COLUMNS
    values = Zipf(p.vocabulary, p.skew, rng)
    step = CHUNK_ROWS // 4
    for start in range(0, p.rows, step):
        n = min(step, p.rows - start)
        crng = np.random.default_rng([seed, 0x4C52, start])
        ints = integer_columns(crng, n)
        vocab = values.sample(crng, (n, CRITEO_CAT_COLUMNS)).astype(np.int64)
        cols = np.broadcast_to(np.arange(CRITEO_CAT_COLUMNS, dtype=np.int64), vocab.shape)
        cat = criteo_feature_indices(hash_ints(vocab * CRITEO_CAT_COLUMNS + cols, 0x43415453), p.hash_bits)
        index = np.empty((n, width), dtype=np.int32)
        index[:, :CRITEO_INT_COLUMNS] = np.arange(CRITEO_INT_COLUMNS)
        index[:, CRITEO_INT_COLUMNS:] = cat.reshape(n, CRITEO_CAT_COLUMNS)
        value = np.ones((n, width), dtype=np.float32)
        value[:, :CRITEO_INT_COLUMNS] = ints
        present = np.empty((n, width), dtype=bool)
        present[:, :CRITEO_INT_COLUMNS] = crng.random((n, CRITEO_INT_COLUMNS)) < 0.8
        present[:, CRITEO_INT_COLUMNS:] = crng.random((n, CRITEO_CAT_COLUMNS)) < 0.9
        x = np.where(index < CRITEO_INT_COLUMNS, np.log1p(value), value) * present
        score = np.einsum("nw,nwk->nk", x, w[index]) / np.sqrt(width) + p.bias
        if p.task == "lr":
            labels = (crng.random(n) < 1.0 / (1.0 + np.exp(-score[:, 0]))).astype(np.float32)
        elif p.task == "regression":
            labels = (score[:, 0] + crng.normal(0.0, 0.5, n)).astype(np.float32)
        else:
            labels = np.argmax(score + crng.gumbel(size=score.shape), axis=1).astype(np.float32)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(present.sum(axis=1), out=indptr[1:])
        keys = np.arange(start, start + n, dtype=np.int64)
        yield SparseChunk(keys, labels, indptr, index[present], value[present])


#: The Higgs-like set's dense features: 21 kinematic ones, then 7 masses.
HIGGS_FEATURES = 28


def generate_higgs(p: HiggsParams, seed: int) -> Iterator[SparseChunk]:
    """Dense Higgs-like rows (the module's docstring): every row holds all 28 features."""
    rng = np.random.default_rng([seed, 0x4869])
    # Columns of the 21 kinematic features: transverse momenta (positive, heavy-tailed, scale ~1), pseudorapidities
    # (normal, |eta| < 2.5), azimuths (uniform on (-pi, pi)), b-tags (0, 1.1 or 2.2), as HIGGS's are laid out.
    kinds = np.array(["pt", "eta", "phi"] * 5 + ["pt", "phi"] + ["btag"] * 4)
    a = rng.normal(0.0, 1.0, 21)
    means = np.select([kinds == "pt", kinds == "btag"], [np.exp(-0.1 + 0.5**2 / 2), 1.1], 0.0)
    step = CHUNK_ROWS // 4
    for start in range(0, p.rows, step):
        n = min(step, p.rows - start)
        crng = np.random.default_rng([seed, 0x4869, start])
        x = np.empty((n, HIGGS_FEATURES), dtype=np.float32)
        low = x[:, :21]  # a view: the kinematic features
        low[:, kinds == "pt"] = crng.lognormal(-0.1, 0.5, (n, int((kinds == "pt").sum())))
        low[:, kinds == "eta"] = np.clip(crng.normal(0.0, 1.0, (n, int((kinds == "eta").sum()))), -2.5, 2.5)
        low[:, kinds == "phi"] = crng.uniform(-np.pi, np.pi, (n, int((kinds == "phi").sum())))
        low[:, kinds == "btag"] = 1.1 * crng.integers(0, 3, (n, int((kinds == "btag").sum())))
        pt = low[:, kinds == "pt"]
        # The masses: functions of the momenta, near 1, as HIGGS's m_jj, m_jjj, m_lv, m_jlv, m_bb, m_wbb, m_wwbb.
        pair = np.arange(7) % pt.shape[1]
        x[:, 21:] = np.sqrt(pt[:, pair] * pt[:, (pair + 1) % pt.shape[1]] + 0.1) * crng.lognormal(0.0, 0.15, (n, 7))
        # Signal: masses near their resonance (1) and a planted mix of the kinematics, centred on their means so
        # that about half the rows are signal, as in HIGGS; |m - 1| and the cosine are what no linear model fits.
        score = ((low - means) @ a / 4.0 + 3.0 * (0.35 - np.abs(x[:, 21:] - 1.0).mean(axis=1))
                 + 0.5 * np.cos(x[:, 2] - x[:, 5]) + crng.normal(0.0, p.noise, n))
        labels = (crng.random(n) < 1.0 / (1.0 + np.exp(-score))).astype(np.float32)
        indptr = np.arange(0, (n + 1) * HIGGS_FEATURES, HIGGS_FEATURES, dtype=np.int64)
        index = np.tile(np.arange(HIGGS_FEATURES, dtype=np.int32), n)
        keys = np.arange(start, start + n, dtype=np.int64)
        yield SparseChunk(keys, labels, indptr, index, x.ravel())


#: The blobs' centres are uniform in [-BOX, BOX] per feature, and their spreads log-normal around SPREAD.
BOX, SPREAD = 10.0, 1.5


def generate_blobs(p: BlobsParams, seed: int) -> Iterator[SparseChunk]:
    """Gaussian blobs (the module's docstring), dense rows of `p.features` features."""
    rng = np.random.default_rng([seed, 0x424C])
    centres = rng.uniform(-BOX, BOX, (p.clusters, p.features))
    weights = np.maximum(rng.dirichlet(np.ones(p.clusters)), 0.1 / p.clusters)
    weights /= weights.sum()
    scales = SPREAD * rng.lognormal(0.0, 0.5, (p.clusters, 1)) * rng.uniform(0.5, 1.5, (p.clusters, p.features))
    step = CHUNK_ROWS // 4
    for start in range(0, p.rows, step):
        n = min(step, p.rows - start)
        crng = np.random.default_rng([seed, 0x424C, start])
        blob = crng.choice(p.clusters, size=n, p=weights)
        x = (centres[blob] + scales[blob] * crng.standard_normal((n, p.features))).astype(np.float32)
        indptr = np.arange(0, (n + 1) * p.features, p.features, dtype=np.int64)
        index = np.tile(np.arange(p.features, dtype=np.int32), n)
        keys = np.arange(start, start + n, dtype=np.int64)
        yield SparseChunk(keys, blob.astype(np.float32), indptr, index, x.ravel())
