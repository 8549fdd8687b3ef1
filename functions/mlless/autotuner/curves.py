"""Loss-curve models and their bounded non-negative fits (MLLess and MLES §4.2).

* Reference curve, fitted once at the knee on the P-worker losses:
  ``L_P(t) = 1/(θ0·t^θ1 + θ2) + θ3`` — the O(1/√(Bt) + 1/t) shape of mini-batch SGD.
* Slow-convergence curve, fitted every interval on the losses since the last removal only:
  ``ℓ_p(t) = 1/(θ0·t² + θ1·t + θ2) + θ3``.

All θ ≥ 0 (the papers' non-negative least squares). Residuals are weighted so that later points count more,
as the original's ``curve_fit(sigma=1/i)``: extrapolation depends on the tail, not on the first steps.

Numerics (why the fits live in normalised coordinates): with raw steps t ~ 10³ and losses ~ 10⁻¹, θ0 of
the quadratic is ~10⁻⁷ and underflows the solver's tolerances. We fit in τ = t/t_scale (t_scale = the last
step of the window, so τ ∈ (0, 1]) and y = loss/y_scale (y_scale = the mean loss of the window), where every
θ is O(1). Initial guesses come from variable projection: for a fixed asymptote θ3 (and exponent θ1),
1/(y − θ3) is *linear* in the remaining θ, so a search over θ3 with a non-negative least-squares solve inside
(over a small grid of θ1 for L_P) lands in the right valley; a short bounded refinement (``least_squares``,
trust-region reflective, analytic Jacobian) polishes it. For L_P the search is a grid narrowed three times, every
exponent and asymptote at once in closed form (`_reference_starts`), where a bounded scalar search per exponent,
a hundred small solves, had taken two thirds of the fit; the ETA refits its curve as often as its fits' cost
allows (runtime/supervisor/eta.py), so their cost is how fresh it is (benchmarks/forecast.py).
"""

from __future__ import annotations

import importlib
import math
import threading
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["CurveFitError", "FittedCurve", "fit_reference", "fit_slow", "reference_model", "slow_model", "warm_up"]

CurveKind = Literal["reference", "slow"]
_TINY = 1e-12
_MAX_EXPONENT = 8.0  # θ1 beyond this is a step function, not a learning curve; also keeps τ^θ1 finite


def _optimize():  # type: ignore[no-untyped-def]
    """scipy.optimize, imported on first use: it is 0.4 s of `mlless`'s 0.7 s of imports, and a job fits its first
    curve only after some evaluations (`warm_up` imports it beside the workers' start)."""
    return importlib.import_module("scipy.optimize")


def warm_up() -> None:
    """Import what the fits need in a background thread, while the caller waits on something else (the supervisor:
    its workers' start)."""
    threading.Thread(target=_optimize, name="mlless-curves-import", daemon=True).start()


class CurveFitError(ValueError):
    """The data cannot support a fit (too few points, non-finite, flat) or the solver failed."""


def reference_model(tau: NDArray[np.float64], th: NDArray[np.float64]) -> NDArray[np.float64]:
    """1/(θ0·τ^θ1 + θ2) + θ3 in normalised coordinates."""
    return 1.0 / np.maximum(th[0] * np.power(tau, th[1]) + th[2], _TINY) + th[3]


def slow_model(tau: NDArray[np.float64], th: NDArray[np.float64]) -> NDArray[np.float64]:
    """1/(θ0·τ² + θ1·τ + θ2) + θ3 in normalised coordinates."""
    return 1.0 / np.maximum(th[0] * tau * tau + th[1] * tau + th[2], _TINY) + th[3]


def _reference_jac(tau: NDArray[np.float64], th: NDArray[np.float64]) -> NDArray[np.float64]:
    p = np.power(tau, th[1])
    den = np.maximum(th[0] * p + th[2], _TINY)
    g = -1.0 / (den * den)
    return np.column_stack([g * p, g * th[0] * p * np.log(tau), g, np.ones_like(tau)])


def _slow_jac(tau: NDArray[np.float64], th: NDArray[np.float64]) -> NDArray[np.float64]:
    den = np.maximum(th[0] * tau * tau + th[1] * tau + th[2], _TINY)
    g = -1.0 / (den * den)
    return np.column_stack([g * tau * tau, g * tau, g, np.ones_like(tau)])


@dataclass(frozen=True)
class FittedCurve:
    """A fitted curve; callable on raw training steps and returns losses in the original units."""

    kind: CurveKind
    theta: tuple[float, float, float, float]  # normalised-space parameters
    t_scale: float
    y_scale: float
    rel_rmse: float  # weighted residual RMS relative to the loss scale, a fit-quality indicator
    n_points: int
    first_step: float
    last_step: float
    _th: NDArray[np.float64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_th", np.asarray(self.theta, dtype=np.float64))

    def __call__(self, t: ArrayLike) -> NDArray[np.float64] | float:
        tau = np.asarray(t, dtype=np.float64) / self.t_scale
        model = reference_model if self.kind == "reference" else slow_model
        out = self.y_scale * model(np.maximum(tau, _TINY), self._th)
        return float(out) if out.ndim == 0 else out

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly summary for metrics/logging."""
        return {
            "kind": self.kind,
            "theta": [float(x) for x in self.theta],
            "t_scale": self.t_scale,
            "y_scale": self.y_scale,
            "rel_rmse": self.rel_rmse,
            "n_points": self.n_points,
            "steps": [self.first_step, self.last_step],
        }


def _prepare(steps: ArrayLike, losses: ArrayLike, min_points: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    t = np.asarray(steps, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    if t.shape != y.shape or t.ndim != 1:
        raise CurveFitError(f"steps and losses must be 1-D of equal length, got {t.shape} and {y.shape}")
    if t.size < min_points:
        raise CurveFitError(f"too few points to fit ({t.size} < {min_points})")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(y))):
        raise CurveFitError("non-finite step or loss in the fit window")
    if np.any(t <= 0) or np.any(np.diff(t) <= 0):
        raise CurveFitError("steps must be positive and strictly increasing")
    if np.any(y < 0):
        raise CurveFitError("losses must be non-negative for this curve family")
    y_scale = float(np.mean(y))
    if y_scale <= _TINY:
        raise CurveFitError("loss is identically zero")
    if float(np.ptp(y)) <= 1e-9 * y_scale:
        raise CurveFitError("flat loss curve: nothing to fit")
    return t, y, float(t[-1]), y_scale


def _weights(n: int) -> NDArray[np.float64]:
    """σ_i = 1/i as in the original ⇒ residual weight ∝ i; normalised to mean 1."""
    w = np.arange(1, n + 1, dtype=np.float64)
    return w / w.mean()


#: The reference curve's starting exponents θ1, and its asymptotes θ3 tried first, as fractions of the least loss.
_EXPONENTS = np.array([0.5, 1.0, 1.5, 2.0, 3.0])
_ASYMPTOTES = np.array([0.0, 0.25, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.995])
#: Each narrowing grids the bracket about the best asymptote so far with this many points: three of 17 leave it
#: 1/4096 of its width, where the residual came within 0.3 % of a bounded scalar search's on random curves (two
#: left it up to 5 % above; tests/test_autotuner.py), and the polish does the rest.
_NARROWINGS = (17, 17, 17)


def _two_column_nnls(x1: NDArray[np.float64], x2: NDArray[np.float64],
                     y: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """argmin ‖c1·x1 + c2·x2 − y‖ over c1, c2 ≥ 0 along the last axis, for every leading index at once: the
    unconstrained solution where it is non-negative, else the better of the two one-column ones (the optimum of a
    convex problem on two variables lies on an axis when not inside)."""
    g11, g12, g22 = (x1 * x1).sum(-1), (x1 * x2).sum(-1), (x2 * x2).sum(-1)
    r1, r2 = (x1 * y).sum(-1), (x2 * y).sum(-1)
    det = g11 * g22 - g12 * g12
    with np.errstate(divide="ignore", invalid="ignore"):
        c1, c2 = (g22 * r1 - g12 * r2) / det, (g11 * r2 - g12 * r1) / det
        inside = (det > 1e-12 * g11 * g22) & (c1 >= 0.0) & (c2 >= 0.0)
        # On an axis, c = r/g clamped at 0 leaves ‖y‖² − r²/g: the larger r²/g (with r > 0) is the better axis.
        gain1 = np.where((r1 > 0.0) & (g11 > 0.0), r1 * r1 / g11, 0.0)
        gain2 = np.where((r2 > 0.0) & (g22 > 0.0), r2 * r2 / g22, 0.0)
        first = gain1 >= gain2
        c1 = np.where(inside, c1, np.where(first & (gain1 > 0.0), r1 / g11, 0.0))
        c2 = np.where(inside, c2, np.where(first, 0.0, r2 / g22))
    return c1, c2


def _reference_costs(powers: NDArray[np.float64], yn: NDArray[np.float64], w: NDArray[np.float64],
                     d: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...]:
    """For each exponent's τ^θ1 (a row of `powers`) and each asymptote of its row of `d`: the reference curve's
    weighted residual with θ0, θ2 ≥ 0 solved in closed form for that θ1 and θ3 (inf where infeasible), θ0, θ2."""
    gap = yn - d[..., None]
    # 1/(y − d) ≈ θ0·τ^θ1 + θ2, weighted so that errors in y, not in 1/(y − d), are balanced: δ(1/g) ≈ δg/g².
    rw = w * gap * gap
    power = powers[:, None, :]
    c1, c2 = _two_column_nnls(power * rw, rw, w * gap)
    den = c1[..., None] * power + c2[..., None]
    feasible = (gap > 0.0).all(-1) & (den > _TINY).all(-1)
    residual = ((w * (1.0 / np.maximum(den, _TINY) + d[..., None] - yn)) ** 2).sum(-1)
    return np.where(feasible, residual, np.inf), c1, c2


def _reference_starts(tau: NDArray[np.float64], yn: NDArray[np.float64],
                      w: NDArray[np.float64]) -> list[tuple[float, NDArray[np.float64]]]:
    """(residual, θ) of the reference curve at each exponent of `_EXPONENTS` with its best asymptote: variable
    projection over θ3 ∈ [0, min y), its grid narrowed `_NARROWINGS` times about the best point."""
    hi = float(yn.min()) * (1.0 - 1e-6)
    powers = np.power(tau, _EXPONENTS[:, None])
    rows = np.arange(_EXPONENTS.size)
    d = np.broadcast_to(hi * _ASYMPTOTES, (_EXPONENTS.size, _ASYMPTOTES.size))
    costs, c1, c2 = _reference_costs(powers, yn, w, d)
    best = costs.argmin(1)
    lo = d[rows, np.maximum(best - 1, 0)]
    up = np.where(best + 1 < _ASYMPTOTES.size, d[rows, np.minimum(best + 1, _ASYMPTOTES.size - 1)], hi)
    for points in _NARROWINGS:
        d = lo[:, None] + (up - lo)[:, None] * np.linspace(0.0, 1.0, points)
        costs, c1, c2 = _reference_costs(powers, yn, w, d)
        best = costs.argmin(1)
        at, step = d[rows, best], (up - lo) / (points - 1)
        lo, up = np.maximum(at - step, 0.0), np.minimum(at + step, hi)
    found = costs[rows, best]
    return [(float(found[i]), np.array([c1[i, best[i]], _EXPONENTS[i], c2[i, best[i]], d[i, best[i]]]))
            for i in rows if np.isfinite(found[i])]


def _linear_start(basis: NDArray[np.float64], yn: NDArray[np.float64], w: NDArray[np.float64],
                  d: float) -> tuple[NDArray[np.float64], float] | None:
    """For a fixed asymptote d, solve 1/(y−d) ≈ basis·c with c ≥ 0 (NNLS); return (c, model residual)."""
    gap = yn - d
    if np.any(gap <= 0):
        return None
    target = 1.0 / gap
    # Weight so that errors in y, not in 1/(y-d), are balanced: δ(1/g) ≈ δg/g².
    rw = w * gap * gap
    coef = _optimize().nnls(basis * rw[:, None], target * rw)[0]
    den = basis @ coef
    if np.any(den <= _TINY):
        return None
    res = float(np.sum((w * (1.0 / den + d - yn)) ** 2))
    return coef, res


def _profile_asymptote(basis: NDArray[np.float64], yn: NDArray[np.float64],
                       w: NDArray[np.float64]) -> tuple[NDArray[np.float64], float, float] | None:
    """Variable projection: minimise the residual over the asymptote d ∈ [0, min y), NNLS for the rest.

    Returns (coef, d, residual). A bounded 1-D search is far more robust than starting a 4-parameter
    Gauss–Newton from a guess: the model has a long, flat valley along (θ2, θ3) on nearly-flat windows.
    """
    hi = float(yn.min()) * (1.0 - 1e-6)

    def cost(d: float) -> float:
        got = _linear_start(basis, yn, w, d)
        return math.inf if got is None else got[1]

    grid = hi * _ASYMPTOTES
    costs = [cost(float(d)) for d in grid]
    i = int(np.argmin(costs))
    if not math.isfinite(costs[i]):
        return None
    lo_b, hi_b = float(grid[max(i - 1, 0)]), float(grid[i + 1]) if i + 1 < grid.size else hi
    opt = _optimize().minimize_scalar(cost, bounds=(lo_b, hi_b), method="bounded",
                                      options={"xatol": 1e-6 * max(hi, 1e-9)})
    d = float(opt.x) if math.isfinite(float(opt.fun)) and float(opt.fun) <= costs[i] else float(grid[i])
    got = _linear_start(basis, yn, w, d)
    if got is None:
        return None
    return got[0], d, got[1]


def _refine(kind: CurveKind, tau: NDArray[np.float64], yn: NDArray[np.float64], w: NDArray[np.float64],
            starts: list[NDArray[np.float64]], *, start_cost: float = math.inf,
            max_nfev: int = 40) -> tuple[NDArray[np.float64], float]:
    model, jac = (reference_model, _reference_jac) if kind == "reference" else (slow_model, _slow_jac)
    upper = np.array([np.inf, _MAX_EXPONENT, np.inf, np.inf]) if kind == "reference" else np.full(4, np.inf)
    lower = np.zeros(4)
    best: tuple[NDArray[np.float64], float] | None = (starts[0], start_cost) if math.isfinite(start_cost) else None
    for x0 in starts:
        x0 = np.clip(x0, lower + 1e-9, np.where(np.isfinite(upper), upper - 1e-9, np.inf))
        try:
            sol = _optimize().least_squares(
                lambda th: w * (model(tau, th) - yn),
                x0,
                jac=lambda th: w[:, None] * jac(tau, th),
                bounds=(lower, upper),
                method="trf",
                x_scale="jac",
                max_nfev=max_nfev,
                xtol=1e-10,
                ftol=1e-10,
                gtol=1e-10,
            )
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            continue
        if not np.all(np.isfinite(sol.x)):
            continue
        cost = float(np.sum(sol.fun ** 2))
        if best is None or cost < best[1]:
            best = (sol.x, cost)
    if best is None:
        raise CurveFitError(f"{kind} fit failed from every starting point")
    return best


def _finish(kind: CurveKind, th: NDArray[np.float64], cost: float, w: NDArray[np.float64], t: np.ndarray,
            t_scale: float, y_scale: float) -> FittedCurve:
    rel_rmse = math.sqrt(cost / float(np.sum(w * w)))
    curve = FittedCurve(kind, tuple(float(x) for x in th), t_scale, y_scale, rel_rmse, int(t.size),
                        float(t[0]), float(t[-1]))
    if not np.all(np.isfinite(curve(np.array([t[0], t[-1], 2 * t[-1]])))):
        raise CurveFitError(f"{kind} fit produced a non-finite curve")
    return curve


def fit_reference(steps: ArrayLike, losses: ArrayLike, *, min_points: int = 8) -> FittedCurve:
    """Fit L_P(t) = 1/(θ0·t^θ1 + θ2) + θ3, θ ≥ 0 (losses should already be EWMA-filtered)."""
    t, y, t_scale, y_scale = _prepare(steps, losses, min_points)
    tau, yn, w = t / t_scale, y / y_scale, _weights(t.size)
    starts = _reference_starts(tau, yn, w)
    if not starts:
        raise CurveFitError("reference fit: no feasible starting point")
    starts.sort(key=lambda s: s[0])
    th, cost = _refine("reference", tau, yn, w, [starts[0][1]], start_cost=starts[0][0])
    return _finish("reference", th, cost, w, t, t_scale, y_scale)


def fit_slow(steps: ArrayLike, losses: ArrayLike, *, min_points: int = 4) -> FittedCurve:
    """Fit ℓ_p(t) = 1/(θ0·t² + θ1·t + θ2) + θ3, θ ≥ 0 (losses since the last removal, EWMA-filtered)."""
    t, y, t_scale, y_scale = _prepare(steps, losses, min_points)
    tau, yn, w = t / t_scale, y / y_scale, _weights(t.size)
    basis = np.column_stack([tau * tau, tau, np.ones_like(tau)])
    got = _profile_asymptote(basis, yn, w)
    if got is None:
        raise CurveFitError("slow fit: no feasible starting point")
    coef, d, res = got
    th, cost = _refine("slow", tau, yn, w, [np.append(coef, d)], start_cost=res)
    return _finish("slow", th, cost, w, t, t_scale, y_scale)
