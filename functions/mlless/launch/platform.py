"""What the supervisor tells the platform it runs on, and what it hears back.

Locally there is nothing to tell: the supervisor starts and stops worker
processes itself. On Kubernetes (`mlless.launch.kube.KubePlatform`) the
desired worker count goes to the TrainingJob's `scale` subresource, progress
is mirrored into its status for `kubectl get tj`, and a `kubectl scale` or a
`suspend: true` made by someone else comes back through `poll`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlatformRequest:
    """What the job's owner asked for since the supervisor last looked."""

    workers: int | None = None  # a desired worker count set from outside
    suspend: bool = False


class Platform:
    """The local platform; subclasses override what their platform can do."""

    def set_workers(self, desired: int, removed: int | None = None) -> None:
        """The job now wants `desired` workers; `removed` names the rank that left, so the platform removes that one."""
        log.info("desired workers: %d%s", desired, f" (rank {removed} left)" if removed is not None else "")

    def publish(self, status: Mapping[str, Any], final: bool = False) -> None:
        """Progress (step, trainLoss, validationLoss, costUSD, workers, ...) for the platform's users.

        Called after every step close; implementations rate-limit, except for
        the `final` call at the end of the job.
        """

    def poll(self) -> PlatformRequest | None:
        """Requests made from outside since the last call (cheap to call every step; implementations rate-limit)."""
        return None
