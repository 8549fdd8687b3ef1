"""The documentation stays true to the repository.

- README.md is short, and its two quickstart commands come early and are the ones CI runs.
- Every repository path that docs/architecture.md names in backticks exists.
- Every relative link in README.md, CHANGELOG.md and docs/*.md resolves, anchors included.

Pure file reading: no services, no compiled kernels.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"

INSTALL_AND_RUN = (
    "pip install '.[datasets]' && mlless prepare --sample movielens-small --out data/movielens"
    " && mlless train examples/movielens.yaml"
)
TEST_COMMAND = "pip install '.[test]' && python -m pytest"

#: Where a path named in the docs may be relative to: the repository, or one of the two packages.
PATH_ROOTS = (ROOT, ROOT / "functions" / "mlless", ROOT / "operator" / "mlless_operator", ROOT / "operator")


def _without_fences(text: str) -> str:
    """The text with fenced code blocks blanked out (their backticks would pair with the prose's)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


# ---- README --------------------------------------------------------------------------------------


def test_readme_is_at_most_250_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"


@pytest.mark.parametrize("command", [INSTALL_AND_RUN, TEST_COMMAND], ids=["install-and-run", "tests"])
def test_readme_quickstart_command_is_in_the_first_60_lines(command):
    head = README.read_text().splitlines()[:60]
    assert command in head, f"{command!r} is not a line of README.md's first 60"


def test_ci_runs_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "README's test command" in ci
    assert re.search(r"pip install -q '\.\[test\]' && python3? -m pytest\s*$", ci, re.M), ci[-300:]


# ---- docs/architecture.md: named paths -------------------------------------------------------------


def _named_paths(text: str) -> list[str]:
    """Backticked tokens that look like repository paths: with a '/' or ending in .py, no spaces,
    not URLs or URL paths, not placeholders (NAME, *)."""
    found = []
    for token in re.findall(r"`([^`\n]+)`", _without_fences(text)):
        token = token.strip()
        if " " in token or "://" in token or token.startswith(("/", ":")):
            continue
        if "NAME" in token or "*" in token or "<" in token:
            continue
        if "/" in token or token.endswith(".py"):
            found.append(token.split(":")[0])  # `file.py:function`
    return found


def _exists(token: str) -> bool:
    if "/" not in token.rstrip("/"):  # a bare name, e.g. `schema.py` in a row about spec/, or `kernels/`
        name = token.rstrip("/")
        return (ROOT / name).exists() or any(
            True for top in ("functions", "operator", "tests", "benchmarks") for _ in (ROOT / top).rglob(name)
        )
    return any((base / token).exists() for base in PATH_ROOTS)


def test_architecture_names_paths():
    assert len(_named_paths(ARCHITECTURE.read_text())) > 30  # the check below checks something


@pytest.mark.parametrize("token", sorted(set(_named_paths(ARCHITECTURE.read_text()))))
def test_every_path_architecture_names_exists(token):
    assert _exists(token), f"docs/architecture.md names `{token}`, which is not in the repository"


def test_the_path_check_can_fail():
    assert not _exists("functions/mlless/no_such_module.py")
    assert _named_paths("see `runtime/nowhere.py` and `rediss://x` and `NAME.pyx`") == ["runtime/nowhere.py"]


# ---- relative links ---------------------------------------------------------------------------------


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces to '-'."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", _without_fences(markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        candidate, n = slug, 1
        while candidate in anchors:
            candidate, n = f"{slug}-{n}", n + 1
        anchors.add(candidate)
    return anchors


LINKED_FILES = [README, ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def _links(path: Path) -> list[str]:
    return [
        target
        for target in re.findall(r"\]\(([^)\s]+)\)", _without_fences(path.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def _broken(source: Path, target: str) -> str | None:
    file_part, _, anchor = target.partition("#")
    resolved = (source.parent / file_part).resolve() if file_part else source
    if not resolved.exists():
        return f"{target}: no such file"
    if anchor and resolved.suffix == ".md" and anchor not in github_anchors(resolved.read_text()):
        return f"{target}: no heading #{anchor} in {resolved.name}"
    return None


@pytest.mark.parametrize("source", LINKED_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(source):
    broken = [problem for target in _links(source) if (problem := _broken(source, target))]
    assert broken == [], f"{source.relative_to(ROOT)}: {broken}"


def test_the_link_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title\n[ok](#a-title) [bad](#nope) [gone](missing.md) [web](https://x.org/y)\n")
    assert _links(page) == ["#a-title", "#nope", "missing.md"]
    assert [_broken(page, t) for t in _links(page)][0] is None
    assert all(_broken(page, t) for t in _links(page)[1:])
    assert "reproducing-the-papers-claims-benchmarkspaperpy" in github_anchors(
        "## Reproducing the papers' claims (`benchmarks/paper.py`)"
    )
