"""Synchronisation protocols, by the name `spec.sync.protocol` gives them.

Each protocol is one module of this package whose strategy (`base.SyncStrategy`) registers itself with `register`;
`sync_strategy` picks a job's. A strategy defined outside the package (a test's, a user's) registers the same way
once its module is imported; `load_plugins` imports the files or modules `MLLESS_SYNC_PLUGINS` names, so that worker
processes, which start from the job's JSON, know them too (`sync_strategy` calls it; the CLI, before validating). A name registered beyond the schema's enum is admitted
by manifest validation in this process (`mlless.spec.schema.admit`); the CRD lists only the built-in ones.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from mlless.contract import ENV_SYNC_PLUGINS
from mlless.spec import schema
from mlless.spec.job import SyncConfig

if TYPE_CHECKING:
    from mlless.runtime.sync.base import SyncStrategy

S = TypeVar("S", bound="type[SyncStrategy]")

STRATEGIES: dict[str, type[SyncStrategy]] = {}


def register(cls: S) -> S:
    """Make `cls` the strategy of the protocol named `cls.name` (a class decorator); a later one of the same name
    replaces it."""
    STRATEGIES[cls.name] = cls
    if cls.name not in schema.choices("sync.protocol"):
        schema.admit("sync.protocol", cls.name)
    return cls


def sync_strategy(config: SyncConfig) -> SyncStrategy:
    """The strategy `config.protocol` names; ValueError if none is registered under it."""
    load_plugins()
    try:
        return STRATEGIES[config.protocol](config)
    except KeyError:
        raise ValueError(f"no sync strategy is registered as {config.protocol!r} (known: {', '.join(STRATEGIES)})") from None


@functools.cache
def load_plugins() -> None:
    """Import, once per process, each Python file or module MLLESS_SYNC_PLUGINS names, for the strategies it
    registers. Not on import: a plugin may import any of mlless, this package's importers included."""
    for name in filter(None, (n.strip() for n in os.environ.get(ENV_SYNC_PLUGINS, "").split(","))):
        if name.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"mlless_sync_plugin_{Path(name).stem}", name)
            if spec is None or spec.loader is None:
                raise ImportError(f"{ENV_SYNC_PLUGINS}: cannot load {name}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
            spec.loader.exec_module(module)
        else:
            importlib.import_module(name)


# The built-in protocols register themselves on import; they import `register` from here, defined above (and
# `reduce`, its exchange patterns, into `exchange.EXCHANGES`).
from mlless.runtime.sync import admm, asynchronous, averaging, blocked, bsp, isp, reduce, ssp  # noqa: E402,F401
