"""Scale-in auto-tuner (MLLess and MLES §4.2): knee detection, curve fits and the remove/keep decision.

Pure decision logic (numpy + scipy, no I/O). The supervisor calls :meth:`AutoTuner.observe` once per closed
step and acts on the returned :class:`Decision`.

Modules: ``knee`` (knee detectors), ``curves`` (L_P and ℓ_p fits), ``durations`` (step-time estimates),
``tuner`` (the state machine); the causal EWMA they smooth with is ``mlless.smoothing``. Import them by name:
this package imports nothing itself, so that importing one module does not load scipy (a third of a second).
"""
