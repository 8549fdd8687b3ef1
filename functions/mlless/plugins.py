"""Extensions defined outside the package: models, sync strategies, aggregation rules and exchange patterns.

Each registers itself when its module is imported, with the `register` of its kind (`mlless.spec.registry`):
`mlless.training.models.register`, `mlless.sync.base.register`, `mlless.sync.aggregation.register`,
`mlless.sync.exchanges.base.register`. `load_plugins` imports, once per process, the Python files or
modules `MLLESS_PLUGINS` names, so that the worker processes and the supervisor, which start from the job's JSON,
know them too; the CLI calls it before validating a manifest, which then admits their names (the CRD lists only
the built-in ones).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from mlless.contract import ENV_PLUGINS

__all__ = ["load_plugins"]


@functools.cache
def load_plugins() -> None:
    """Import each file or module MLLESS_PLUGINS names. Not on import of mlless: a plugin may import any of it."""
    for name in filter(None, (n.strip() for n in os.environ.get(ENV_PLUGINS, "").split(","))):
        if name.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"mlless_plugin_{Path(name).stem}", name)
            if spec is None or spec.loader is None:
                raise ImportError(f"{ENV_PLUGINS}: cannot load {name}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
            spec.loader.exec_module(module)
        else:
            importlib.import_module(name)
