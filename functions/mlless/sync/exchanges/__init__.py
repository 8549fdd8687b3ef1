"""Exchange patterns, one module each, registered under the name `spec.sync.exchange` gives them
(`base.EXCHANGES`); importing the package registers the built-in ones. docs/architecture.md shows how to add one.
"""
from mlless.sync.exchanges import alltoall, instore, reduce  # noqa: F401  the built-ins register on import
