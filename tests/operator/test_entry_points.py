"""Every way to start the operator registers every handler.

Each case runs in a fresh interpreter: in this one `mlless_operator` is
already imported, and Kopf's default registry is a process-wide global.
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

#: Import a module as `kopf run -m NAME` does (importlib.import_module), then list the handler ids in Kopf's
#: default registry. The registry has no public listing, hence its per-kind sub-registries.
PROBE = """
import importlib, json, sys
import kopf
importlib.import_module(sys.argv[1])
registry = kopf.get_default_registry()
print(json.dumps({kind: sorted({h.id for h in getattr(registry, kind).get_all_handlers()})
                  for kind in ("_activities", "_changing", "_spawning")}))
"""

EXPECTED = {
    "_activities": {"startup", "shutdown", "login"},
    "_changing": {"reconcile", "scale/spec.workers", "cleanup"},
    "_spawning": {"status", "ttl"},
}


@pytest.mark.parametrize("module", ["mlless_operator", "mlless_operator.main"])
def test_kopf_run_module_registers_every_handler(module: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", PROBE, module], env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    registered = {kind: set(ids) for kind, ids in json.loads(out).items()}
    for kind, ids in EXPECTED.items():
        assert ids <= registered[kind], (module, kind, registered[kind])


def test_the_operator_is_a_program_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """`mlless-operator` and `python -m mlless_operator` (both `__main__.main`); `mlless operator` runs the latter."""
    from mlless import cli

    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["mlless-operator"].partition(":")
    assert module == "mlless_operator.__main__" and callable(getattr(importlib.import_module(module), function))
    calls = []
    monkeypatch.setattr(cli.os, "execv", lambda path, argv: calls.append((path, argv)))
    cli.main(["operator"])
    assert calls == [(sys.executable, [sys.executable, "-m", "mlless_operator"])]
