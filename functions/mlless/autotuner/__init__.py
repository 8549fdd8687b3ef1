"""Scale-in auto-tuner (MLLess and MLES §4.2): knee detection, curve fits and the remove/keep decision.

Pure decision logic (numpy + scipy, no I/O). The supervisor calls :meth:`AutoTuner.observe` once per closed
step and acts on the returned :class:`Decision`.

Modules: ``smoothing`` (causal EWMA), ``knee`` (knee detectors), ``curves`` (L_P and ℓ_p fits),
``durations`` (step-time estimates), ``tuner`` (the state machine).
"""

from .curves import CurveFitError, FittedCurve, fit_reference, fit_slow
from .knee import kneedle, make_knee_detector
from .tuner import AutoTuner, Decision, Outcome

__all__ = [
    "AutoTuner",
    "CurveFitError",
    "Decision",
    "FittedCurve",
    "Outcome",
    "fit_reference",
    "fit_slow",
    "kneedle",
    "make_knee_detector",
]
