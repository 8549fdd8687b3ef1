"""Synchronisation protocols, by the name `spec.sync.protocol` gives them.

Each protocol is one module of this package whose strategy (`base.SyncStrategy`) registers itself with `register`;
`sync_strategy` picks a job's. A strategy defined outside the package (a test's, a user's) registers the same way
once its module is imported (`mlless.plugins`, which `sync_strategy` calls). A name registered beyond the schema's
enum is admitted by manifest validation in this process (`mlless.spec.schema.admit`); the CRD lists only the
built-in ones.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from mlless.plugins import load_plugins
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


# The built-in protocols register themselves on import; they import `register` from here, defined above (and
# `reduce` and `instore`, their exchange patterns, into `exchange.EXCHANGES`).
from mlless.runtime.sync import admm, asynchronous, averaging, blocked, bsp, instore, isp, reduce, ssp  # noqa: E402,F401
