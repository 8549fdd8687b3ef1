"""The package layout's rules, checked on the source: imports run one way, and `spec` loads no training code.

Layers, top down: the CLI and `runtime` compose everything; below them `training`, `transport`, `telemetry`,
`autotuner` and `data`; `protocol` (which `training` and `transport` use), then `spec`; `contract`, the
generic `smoothing`, the stderr `progress` and the loader of `plugins` at the bottom. The operator may use only `contract`, `spec` and
`transport` of the runtime package, and the runtime package never imports the operator (which is a program of its
own: `mlless-operator`).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "functions" / "mlless"
OPERATOR = ROOT / "operator" / "mlless_operator"

#: For each part of `mlless`, the parts it may import (besides itself). What is not listed is forbidden.
ALLOWED: dict[str, set[str]] = {
    "contract": set(),
    "smoothing": set(),
    "progress": set(),
    "plugins": {"contract"},  # imports what MLLESS_PLUGINS names, which may be anything
    "spec": {"contract"},
    "data": {"contract", "progress"},
    "protocol": {"contract"},
    "autotuner": {"contract", "spec", "smoothing"},
    "training": {"contract", "spec", "data", "protocol", "plugins"},  # a replica's snapshot is laid out as its frame is
    "transport": {"contract", "protocol"},
    "telemetry": {"contract", "spec"},
    "runtime": {"contract", "spec", "data", "protocol", "autotuner", "training", "transport", "telemetry", "smoothing",
                "progress", "plugins"},
    "planning": {"contract", "spec", "data", "autotuner", "runtime", "telemetry", "progress", "plugins"},
    # A sweep runs local jobs, and checks their dataset first; its ASHA, manifest and status are pure, for the
    # operator too.
    "sweep": {"contract", "spec", "data", "runtime", "telemetry", "progress", "plugins"},
    "cli": {"contract", "spec", "data", "protocol", "autotuner", "training", "transport", "telemetry", "runtime",
            "progress", "plugins", "planning", "sweep"},
    "__main__": {"cli", "contract"},
    "__init__": set(),
}
# `sweep` for its pure parts: the manifest, ASHA and the status table (never its local runner).
OPERATOR_ALLOWED = {"contract", "spec", "transport", "sweep"}


def _part(module: str) -> str:
    """`mlless.runtime.worker` -> "runtime"; `mlless.contract` -> "contract"."""
    return module.split(".")[1] if module.count(".") else "__init__"


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in a file, relative imports resolved against `package`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def _module_name(path: Path, root: Path) -> tuple[str, str]:
    """(module, package) of a source file under `root`'s parent; a package's `__init__` is the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _violations(root: Path, rule) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        module, package = _module_name(path, root)
        for line, target in _imports(path, package):
            if target == "mlless" or target.startswith("mlless."):
                why = rule(module, target)
                if why:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target} ({why})")
    return bad


def test_mlless_imports_run_one_way():
    def rule(module: str, target: str) -> str | None:
        own, other = _part(module), _part(target)
        if other == own or other in ALLOWED[own] or other == "__init__":  # the root holds only __version__
            return None
        return f"{own} may import only {sorted(ALLOWED[own]) or 'nothing'}"

    assert _violations(PACKAGE, rule) == []


def test_the_operator_uses_only_contract_spec_and_transport():
    def rule(module: str, target: str) -> str | None:
        return None if _part(target) in OPERATOR_ALLOWED else f"the operator may import only {sorted(OPERATOR_ALLOWED)}"

    assert _violations(OPERATOR, rule) == []


def test_the_runtime_package_never_imports_the_operator():
    """Not even lazily, inside a function: `mlless operator` runs `python -m mlless_operator` instead."""
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {target}"
           for path in sorted(PACKAGE.rglob("*.py"))
           for line, target in _imports(path, _module_name(path, PACKAGE)[1])
           if target == "mlless_operator" or target.startswith("mlless_operator.")]
    assert bad == []


def test_every_part_of_the_package_has_a_rule():
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert parts == set(ALLOWED)


@pytest.mark.parametrize("module", ["mlless.spec", "mlless.contract", "mlless.spec.crd", "mlless.spec.reference"])
def test_validating_a_manifest_loads_no_training_code(module):
    """The operator validates manifests with `mlless.spec`: that must not load compiled kernels (or scipy)."""
    probe = (f"import sys, {module}; "
             "print(sorted(m for m in sys.modules if m.startswith(('mlless.training', 'mlless.autotuner', 'scipy'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_worker_process_does_not_import_scipy_stats():
    """`python -m mlless worker` imports the CLI; scipy.stats alone took 1-2 s of every worker's start (a cold
    start billed to every job, and to every trial of a sweep)."""
    probe = "import sys, mlless.cli, mlless.runtime.worker; print('scipy.stats' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
