"""The operator's imports go one way: main → handlers → reconcile → builders, kubeapi, conditions → mlless."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "mlless_operator"


def imported(path: Path) -> set[str]:
    """The mlless_operator modules a file imports (`from mlless_operator import x` counts as mlless_operator.x)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            if node.module == "mlless_operator":
                names |= {f"mlless_operator.{a.name}" for a in node.names}
    return {n for n in names if n.startswith("mlless_operator.")}


def modules(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).glob("*.py"))


@pytest.mark.parametrize("path", modules("handlers"), ids=lambda p: p.stem)
def test_handlers_import_no_other_handler(path: Path) -> None:
    assert not {n for n in imported(path) if n.startswith("mlless_operator.handlers")}


@pytest.mark.parametrize("path", modules("reconcile"), ids=lambda p: p.stem)
def test_reconcile_imports_no_handler(path: Path) -> None:
    assert not {n for n in imported(path) if n.startswith(("mlless_operator.handlers", "mlless_operator.main"))}


@pytest.mark.parametrize("path", modules("builders"), ids=lambda p: p.stem)
def test_builders_are_pure(path: Path) -> None:
    """Builders import other builders and the config only: nothing that talks to the API server."""
    assert {n for n in imported(path) if not n.startswith("mlless_operator.builders")} <= {"mlless_operator.config"}


def test_no_two_modules_share_a_name() -> None:
    names = [p.stem for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    assert sorted(names) == sorted(set(names))
