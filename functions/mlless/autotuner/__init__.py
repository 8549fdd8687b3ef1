"""Scale-in auto-tuner (MLLess and MLES §4.2): knee detection, curve fits and the remove/keep decision.

Pure decision logic (numpy + scipy, no I/O). The supervisor calls :meth:`AutoTuner.observe` once per closed
step and acts on the returned :class:`Decision`.

Modules: ``smoothing`` (causal EWMA), ``knee`` (knee detectors), ``curves`` (L_P and ℓ_p fits),
``durations`` (step-time estimates), ``tuner`` (the state machine). Import them by name: this package imports
nothing itself, because a worker uses only ``smoothing`` and must not load scipy (a third of a second) for it.
"""
