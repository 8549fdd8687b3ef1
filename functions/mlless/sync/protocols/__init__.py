"""Synchronisation protocols, one module each (`base.SyncStrategy`), registered under the name
`spec.sync.protocol` gives them; importing the package registers the built-in ones."""
from mlless.sync.protocols import admm, asynchronous, averaging, blocked, bsp, gradients, isp, norm, ssp  # noqa: F401
