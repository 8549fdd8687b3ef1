"""import-extensions.py PACKAGE: import every compiled extension module the installed PACKAGE ships.

install-venv.sh runs it with the virtualenv's python, so a kernel that did not compile, or does not load, fails the
image build rather than a pod. The modules are found on disk at run time, among the package's own files, so adding or
renaming a kernel needs no edit here. It prints each module it imported; a package with none fails too, since that
means the wheel was built without its kernels.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import sys
from pathlib import Path


def extension_modules(package: str) -> list[str]:
    """The dotted names of the extension modules under `package`, in a stable order."""
    root = Path(importlib.import_module(package).__file__).parent
    # Most specific first ('.cpython-311-x86_64-linux-gnu.so' before '.so'), so the first match is the whole suffix.
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    names = []
    for path in sorted(root.rglob("*")):
        suffix = next((s for s in suffixes if path.name.endswith(s)), None)
        if suffix is not None and path.is_file():
            names.append(".".join((package, *path.relative_to(root).parent.parts, path.name.removesuffix(suffix))))
    return names


def main(package: str) -> None:
    names = extension_modules(package)
    if not names:
        sys.exit(f"{package} ships no compiled extension module: its kernels were not built")
    for name in names:
        importlib.import_module(name)
        print(name)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} PACKAGE")
    main(sys.argv[1])
