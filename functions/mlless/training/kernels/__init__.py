"""Compiled Cython hot loops (built by setup.py as ``mlless.training.kernels.<stem>``).

Each kernel validates its inputs in a ``def`` wrapper and runs its loop with
the GIL released; everything else (shapes, defaults, bookkeeping) lives in
the Python modules that call them: `mlless.training.models`, `mlless.training.optim`,
`mlless.training.significance`.
"""
