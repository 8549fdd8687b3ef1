"""The container image's build inputs stay in step with the package (`Dockerfile`, `images/`, `.dockerignore`).

No test here builds the image (images/README.md says how); they check what broke it before: a module or file that
the Dockerfile, images/install-venv.sh or images/README.md names but the repository no longer has, a file the
Dockerfile copies that the build context leaves out, and the build's own check that the kernels compiled and load.
"""
from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
IMPORT_EXTENSIONS = IMAGES / "import-extensions.py"
# Where the repository's files are named from: the root, images/ (its files name each other bare), and the two
# package folders (`mlless_operator/config.py`).
PACKAGE_ROOTS = (ROOT / "functions", ROOT / "operator")
SEARCHED = (ROOT, IMAGES, *PACKAGE_ROOTS)

MODULE = re.compile(r"\bmlless(?:_operator)?(?:\.[A-Za-z_]\w*)+")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FILE_SUFFIX = re.compile(r"\.(?:py|pyx|sh|md|toml|ya?ml|lua|json)$")


def _module_exists(name: str) -> bool:
    parts = name.split(".")
    return any(base.joinpath(*parts[:-1], parts[-1] + ext).is_file()
               for base in PACKAGE_ROOTS for ext in (".py", ".pyx", "/__init__.py"))


def missing_modules(text: str) -> list[str]:
    return sorted({name for name in MODULE.findall(text) if not _module_exists(name)})


def _path_like(token: str) -> bool:
    if any(ch in token for ch in ":*<>=$") or token.startswith(("/", "-", "~")) or MODULE.fullmatch(token):
        return False
    return "/" in token or bool(FILE_SUFFIX.search(token)) or token in ("Dockerfile", ".dockerignore")


def missing_paths(markdown: str) -> list[str]:
    """The repository paths a Markdown file names in code spans that exist nowhere in the repository."""
    tokens = {token for span in CODE_SPAN.findall(markdown) for token in span.split() if _path_like(token)}
    return sorted(token for token in tokens if not any((base / token).exists() for base in SEARCHED))


@pytest.mark.parametrize("path", ["Dockerfile", "images/install-venv.sh", "images/README.md", ".dockerignore"])
def test_every_module_named_exists(path):
    assert missing_modules((ROOT / path).read_text()) == []


def test_every_file_the_images_readme_names_exists():
    assert missing_paths((IMAGES / "README.md").read_text()) == []


def test_the_name_checks_catch_a_renamed_module_and_a_missing_file():
    """Guards the guards with what broke the build once: the kernel `logreg`, renamed `linear`."""
    old_smoke_import = 'python -c "import mlless.training.kernels.pmf, mlless.training.kernels.logreg"'
    assert missing_modules(old_smoke_import) == ["mlless.training.kernels.logreg"]
    assert missing_paths("compiles `functions/mlless/training/kernels/logreg.pyx` and `setup.py`") == [
        "functions/mlless/training/kernels/logreg.pyx"]


def _copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY from the build context in the Dockerfile."""
    copies = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(word.startswith("--from=") for word in words):
            args = [word for word in words[1:] if not word.startswith("--")]
            copies.append((args[:-1], args[-1]))
    return copies


def _in_build_context(path: str) -> bool:
    """Whether .dockerignore keeps `path` in the context: the last pattern matching it or a folder above it wins."""
    kept = True
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            kept = negated
    return kept


def test_the_dockerignore_reading_is_the_one_docker_applies():
    assert not _in_build_context("tests/test_image.py") and not _in_build_context("images/README.md")
    assert not _in_build_context("functions/mlless/training/kernels/pmf.cpython-311-x86_64-linux-gnu.so")
    assert _in_build_context("functions/mlless/cli.py") and _in_build_context("images/install-venv.sh")


def test_every_file_the_dockerfile_copies_is_in_the_build_context():
    sources = [source for sources, _ in _copies() for source in sources]
    assert "images/install-venv.sh" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert _in_build_context(source), f"{source} is left out of the build context by .dockerignore"


def test_install_venv_finds_what_it_runs_beside_it():
    """install-venv.sh runs the files it names from its own folder, so the Dockerfile must copy them there with it."""
    script = (IMAGES / "install-venv.sh").read_text()
    subprocess.run(["sh", "-n", str(IMAGES / "install-venv.sh")], check=True)
    beside = set(re.findall(r'\$\(dirname "\$0"\)/([\w.-]+)', script))
    assert beside, "install-venv.sh no longer runs a file from its own folder: drop this test or update it"
    copied_with_it = [sources for sources, _ in _copies() if "images/install-venv.sh" in sources]
    assert copied_with_it and all(f"images/{name}" in copied_with_it[0] for name in beside)


def _import_extensions(package: str, *, path: Path | None = None) -> subprocess.CompletedProcess:
    env = None if path is None else {"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(IMPORT_EXTENSIONS), package], capture_output=True, text=True,
                          timeout=120, env=env)


def test_the_build_imports_every_kernel_the_source_compiles():
    """The build's check, on the package the suite imports: every .pyx in the source is a module it imported."""
    result = _import_extensions("mlless")
    assert result.returncode == 0, result.stderr
    compiled = {".".join(pyx.relative_to(ROOT / "functions").with_suffix("").parts)
                for pyx in (ROOT / "functions" / "mlless").rglob("*.pyx")}
    assert compiled and set(result.stdout.split()) == compiled


def test_the_build_fails_on_a_kernel_that_does_not_load(tmp_path):
    package = tmp_path / "kernels_pkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / f"broken{sysconfig.get_config_var('EXT_SUFFIX')}").write_bytes(b"not a shared object")
    result = _import_extensions("kernels_pkg", path=tmp_path)
    assert result.returncode != 0 and "kernels_pkg/inner/broken" in result.stderr


def test_the_build_fails_on_a_package_without_kernels(tmp_path):
    (tmp_path / "plain_pkg").mkdir()
    (tmp_path / "plain_pkg" / "__init__.py").write_text("")
    result = _import_extensions("plain_pkg", path=tmp_path)
    assert result.returncode != 0 and "ships no compiled extension module" in result.stderr


# ---- the torch variant: EXTRAS=s3,torch and TORCH_INDEX ----------------------------------------------------------

EXTRA_REQUIREMENTS = IMAGES / "extra-requirements.py"


def _build_args() -> dict[str, str]:
    """The Dockerfile's global ARGs (before the first FROM) and their defaults."""
    text = (ROOT / "Dockerfile").read_text()
    head = text[:text.index("\nFROM ")]
    return dict(re.findall(r"^ARG (\w+)=(.*)$", head, re.M))


def test_every_venv_stage_hands_the_torch_index_to_install_venv():
    """TORCH_INDEX is a global ARG (empty: PyPI), redeclared in each stage that runs install-venv.sh, and passed to it."""
    assert _build_args() == {"EXTRAS": "s3", "TORCH_INDEX": ""}
    stages = re.split(r"^FROM ", (ROOT / "Dockerfile").read_text(), flags=re.M)[1:]
    installing = [stage for stage in stages if "install-venv.sh \"" in stage]
    assert [stage.split()[2] for stage in installing] == ["venv-worker", "venv-operator", "venv-full"]
    for stage in installing:
        assert "ARG TORCH_INDEX\n" in stage and re.search(r'install-venv\.sh "[^"]*\$EXTRAS" "\$TORCH_INDEX"', stage), stage


def test_the_images_readme_says_how_to_build_the_torch_variant():
    readme = (IMAGES / "README.md").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "torch" in extras and "--build-arg EXTRAS=s3,torch" in readme
    assert "--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu" in readme
    assert "extraImages" in readme  # how the operator finds it


def _wheel(tmp_path: Path, extras: dict[str, list[str]]) -> Path:
    """A wheel whose METADATA declares `extras` as setuptools writes them (`Requires-Dist: X; extra == "E"`)."""
    lines = ["Metadata-Version: 2.1", "Name: mlless", "Version: 0.1.0", "Requires-Dist: numpy>=1.26"]
    for extra, requirements in extras.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {requirement}; extra == "{extra}"' for requirement in requirements]
    path = tmp_path / "mlless-0.1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("mlless-0.1.0.dist-info/METADATA", "\n".join(lines) + "\n")
    return path


def _extra_requirements(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXTRA_REQUIREMENTS), *args], capture_output=True, text=True, timeout=60)


def test_the_torch_index_serves_exactly_the_torch_extras_requirements(tmp_path):
    """What install-venv.sh installs from TORCH_INDEX: pyproject.toml's torch extra, read from the wheel, nothing else."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wheel = _wheel(tmp_path, {name: extras[name] for name in ("s3", "torch", "report")})
    result = _extra_requirements(str(wheel), "torch")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [r.replace(" ", "") for r in extras["torch"]] and len(extras["torch"]) == 2
    missing = _extra_requirements(str(wheel), "gpu")
    assert missing.returncode != 0 and missing.stderr.strip().endswith("the wheel has no extra 'gpu' (it has: s3, torch, report)")
    assert len(missing.stderr.strip().splitlines()) == 1
