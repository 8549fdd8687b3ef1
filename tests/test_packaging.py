"""The package split: a worker runs on the core install, without the operator's or the reports' dependencies.

The worker image (`Dockerfile`, target `worker`) installs only the core dependencies, so a top-level import of
kopf, kubernetes or matplotlib anywhere on a worker's path would break every worker pod. Each check runs in a
fresh interpreter whose import system refuses those packages, whether or not they are installed here.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

OPERATOR_AND_REPORT = ("kopf", "kubernetes", "matplotlib")

# What `mlless worker` and `mlless worker-server` import, the CLI included (its parser is built before any command runs).
WORKER_MODULES = (
    "mlless.cli",
    "mlless.runtime.worker",
    "mlless.runtime.function_server",
    "mlless.transport",
    "mlless.training.kernels.pmf",
    "mlless.training.kernels.linear",
)
# The supervisor's own modules; on a cluster it adds mlless.launch.kube, which is what the `supervisor` extra is for.
SUPERVISOR_MODULES = ("mlless.runtime.supervisor.loop", "mlless.runtime.local", "mlless.launch.launcher")


def _import_without(blocked: tuple[str, ...], modules: tuple[str, ...], then: str = "") -> subprocess.CompletedProcess:
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, sys

        BLOCKED = {blocked!r}

        class Refuse(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in BLOCKED:
                    raise ImportError(f"{{name}} is not installed in this image")
                return None

        sys.meta_path.insert(0, Refuse())
        for module in {modules!r}:
            importlib.import_module(module)
        {then}
    """)
    # The installed package, as every other test uses (a clean checkout's source tree has no compiled kernels).
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_worker_needs_no_operator_or_report_packages():
    result = _import_without(OPERATOR_AND_REPORT, WORKER_MODULES,
                             then="import mlless.cli; mlless.cli.build_parser().parse_args(['worker-server'])")
    assert result.returncode == 0, result.stderr


def test_supervisor_needs_no_operator_or_report_packages():
    result = _import_without(("kopf", "matplotlib"), SUPERVISOR_MODULES)
    assert result.returncode == 0, result.stderr


#: torch and torchvision, which only a neural-net job loads (the `torch` extra).
TORCH = ("torch", "torchvision")
# A worker and a supervisor of a job on any other model, the manifest checks and the operator.
WITHOUT_TORCH = (*WORKER_MODULES, *SUPERVISOR_MODULES, "mlless.spec", "mlless.training.models", "mlless_operator.main")
# A sparse job's worker builds its model and gives it its share of the cores (`runtime/worker.py`); a network needs
# torch, and says which extra installs it.
SPARSE_THEN_NETWORK = """
import numpy as np
from mlless.data.batches import SparseBatch
from mlless.training.models import build_model
model = build_model("logistic-regression", {"n_features": 8})
model.share_cores(2)
model.gradient(SparseBatch(np.array([0, 1]), np.array([3], np.int32), np.ones(1, np.float32), np.ones(1, np.float32)))
try:
    build_model("neural-net", {"channels": 1, "height": 8, "width": 8, "n_classes": 2, "pixel_mean": [0],
                               "pixel_std": [1]})
except ImportError as exc:
    print(exc)
"""


def test_only_a_network_imports_torch():
    result = _import_without(TORCH, WITHOUT_TORCH, then=f"exec({SPARSE_THEN_NETWORK!r})")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("spec.model.type neural-net needs torch and torchvision: "
                                     "pip install 'mlless[torch]'")


def test_the_blocker_does_block():
    """Guards the guard: an entry point that does need a refused package fails."""
    result = _import_without(("matplotlib",), ("mlless.telemetry.report.plots",))
    assert result.returncode != 0 and "matplotlib is not installed in this image" in result.stderr


@pytest.mark.parametrize("package", OPERATOR_AND_REPORT)
def test_core_dependencies_leave_roles_to_extras(package):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(req) for req in project["dependencies"]}
    assert package not in core
    roles = {_name(req) for extra in ("supervisor", "operator", "report") for req in project["optional-dependencies"][extra]}
    assert package in roles


def test_test_extra_installs_every_role():
    """CI runs `pip install '.[test]'`, and the suite imports the operator, the kube platform and the reports."""
    test = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert "mlless[supervisor,operator,report,datasets,torch]" in test


def _name(requirement: str) -> str:
    for i, ch in enumerate(requirement):
        if not (ch.isalnum() or ch in "-_."):
            return requirement[:i].lower()
    return requirement.lower()


@pytest.mark.parametrize(("command", "extra"), [(["report", ".", "--out", "report"], "report"),
                                                (["supervisor", "--job", "job.yaml", "--job-id", "x"], "supervisor")])
def test_a_command_whose_extra_is_missing_says_which_to_install(command, extra):
    result = _import_without(OPERATOR_AND_REPORT, ("mlless.cli",),
                             then=f"import mlless.cli; sys.exit(mlless.cli.main({command!r}))")
    assert result.returncode == 2, result.stderr
    assert f"pip install 'mlless[{extra}]'" in result.stderr and "Traceback" not in result.stderr
