"""Files committed to the repository that a module of `mlless` writes: each must be its generator's output."""
from __future__ import annotations

from importlib import import_module
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def assert_generated(path: str, module: str) -> None:
    """`path` (from the repository root) holds what `python -m <module>` prints, its `render()`."""
    assert (ROOT / path).read_text() == import_module(module).render(), f"run: python -m {module} > {path}"


def assert_generated_block(path: str, module: str) -> None:
    """`path` holds, between the module's markers, what `python -m <module> <path>` writes there (its `splice`)."""
    text = (ROOT / path).read_text()
    assert import_module(module).splice(text) == text, f"run: python -m {module} {path}"
