"""`mlless`'s start loads no scipy.optimize (0.4 s of imports): the curve fits import it on first use, and the
supervisor imports it in the background while its workers start (`autotuner/curves.py`, `warm_up`)."""
from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = "import sys; {code}; print('scipy.optimize' in sys.modules)"
FIT = ("from mlless.autotuner.curves import fit_reference; "
       "fit_reference([1, 2, 3, 4, 5, 6, 7, 8], [1.0, 0.8, 0.7, 0.64, 0.6, 0.58, 0.57, 0.565])")


@pytest.mark.parametrize("code, loads", [("import mlless.cli", False), (FIT, True)])
def test_the_command_line_loads_scipy_optimize_only_when_a_curve_is_fitted(code: str, loads: bool) -> None:
    """The second case shows the probe can see scipy.optimize; the first, that the CLI does not load it."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(code=code)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(loads), out.stdout + out.stderr
