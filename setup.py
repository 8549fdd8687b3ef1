"""Build the Cython kernels; everything else is declared in pyproject.toml."""
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

PACKAGE = Path("functions")

extensions = [
    Extension(
        ".".join(pyx.relative_to(PACKAGE).with_suffix("").parts),  # mlless.training.kernels.pmf
        [str(pyx)],
        # a kernel's C part is its stem_*.h header (pmf_sgd.h), and what kernels share is in *.pxd files
        # (sparse_rows.pxd): listed so that sdists carry them and edits rebuild
        depends=[str(h) for h in sorted(pyx.parent.glob(f"{pyx.stem}_*.h")) + sorted(pyx.parent.glob("*.pxd"))],
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O3"],
    )
    for pyx in sorted(PACKAGE.glob("mlless/**/kernels/*.pyx"))
]

setup(
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    ),
)
