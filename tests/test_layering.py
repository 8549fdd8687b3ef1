"""The package layout's rules, checked on the source: imports run one way, with no loops, and `spec` loads no
training code.

Layers, top down: the CLI composes everything; `runtime` (the worker, the supervisor, a local job, the function
server, a local sweep) and `planning` compose what is below them; `sync` (protocols, exchange patterns, aggregation)
over `training` and `transport`; `launch` (starting worker processes and pods), `stopping` (the stop rules and their
projection), `telemetry`, `autotuner` and `data`; `protocol` (which `training` and `transport` use), then `spec`;
`contract`, the generic `smoothing`, the stderr `progress` and the loader of `plugins` at the bottom. `sweep` holds
a TrainingSweep's pure parts (its manifest, ASHA, its status), which the operator uses too; its local runner is
`runtime.sweep`. The operator may use only `contract`, `spec`, `protocol`, `transport` and `sweep` of the runtime
package, and the runtime package never imports the operator (which is a program of its own: `mlless-operator`).
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
    "stopping": {"contract", "spec", "smoothing", "autotuner"},
    "training": {"contract", "spec", "data", "protocol", "plugins"},  # a replica's snapshot is laid out as its frame is
    "transport": {"contract", "protocol"},
    "telemetry": {"contract", "spec"},
    "launch": {"contract", "spec", "protocol", "transport"},
    "sync": {"contract", "spec", "data", "protocol", "training", "transport", "plugins"},
    "sweep": {"contract", "spec", "telemetry", "plugins"},
    "runtime": {"contract", "spec", "data", "protocol", "autotuner", "training", "transport", "telemetry", "smoothing",
                "progress", "plugins", "sync", "stopping", "launch", "sweep"},
    "planning": {"contract", "spec", "data", "autotuner", "stopping", "runtime", "telemetry", "progress", "plugins"},
    "cli": {"contract", "spec", "data", "protocol", "autotuner", "training", "transport", "telemetry", "runtime",
            "progress", "plugins", "planning", "sweep", "sync", "stopping", "launch"},
    "__main__": {"cli", "contract"},
    "__init__": set(),
}
# `protocol` for the job identities the operator issues (`protocol.identity.Issuer`).
OPERATOR_ALLOWED = {"contract", "spec", "protocol", "transport", "sweep"}


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


def test_the_operator_uses_only_what_it_may():
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


def _graph(root: Path) -> dict[str, set[str]]:
    """Every module of the package under `root` and the modules of it that it imports, anywhere in its source (a
    function's lazy import and a type checker's import too); `from package import module` is an edge to the module."""
    modules = {_module_name(path, root)[0]: path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, set())
        package = _module_name(path, root)[1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    edges.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
        edges &= set(modules)
        edges.discard(module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("root", [PACKAGE, OPERATOR], ids=["mlless", "mlless_operator"])
def test_no_module_imports_itself_through_others(root):
    """No import loops, counting imports inside functions and those only a type checker runs: a loop means two
    modules are one job, or a registry is read where it is filled."""
    assert _cycles(_graph(root)) == []


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
