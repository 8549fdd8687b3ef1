"""Synchronisation: how the workers' replicas stay one model.

A protocol (`spec.sync.protocol`) is a `base.SyncStrategy`, one module of `protocols/`; an exchange pattern
(`spec.sync.exchange`) is an `exchanges.base.Exchange`, one module of `exchanges/`; an aggregation rule
(`spec.sync.aggregation`) is an `aggregation.Aggregation`. Each kind registers with the `register` of its base
module (`mlless.spec.registry`), a plugin's too once `mlless.plugins` imported it. Importing this package registers
the built-ins; `sync_strategy` picks a job's protocol.
"""
from __future__ import annotations

from mlless.plugins import load_plugins
from mlless.spec.job import SyncConfig
from mlless.sync import exchanges, protocols  # noqa: F401  the built-ins register on import
from mlless.sync.base import STRATEGIES, SyncStrategy


def sync_strategy(config: SyncConfig) -> SyncStrategy:
    """The strategy `config.protocol` names; ValueError if none is registered under it."""
    load_plugins()
    return STRATEGIES.named(config.protocol)(config)
