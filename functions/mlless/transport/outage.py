"""Waiting out a service that cannot be reached, for the services transport's Redis and RabbitMQ clients.

Either service out of reach is waited out for up to ``outage_seconds`` (default
60, or $MLLESS_OUTAGE_SECONDS), with exponential backoff and jitter; the first
connection gets only ``CONNECT_SECONDS``, so a wrong URL is reported at once.
What counts as an outage, and what is refused at once instead, is each client's
to say (``mlless.transport.store``, ``mlless.transport.bus``).
"""
from __future__ import annotations

import logging
import os
import random
import time

from mlless.contract import ENV_OUTAGE_SECONDS

from .base import TransportError

__all__ = ["DEFAULT_OUTAGE_SECONDS", "CONNECT_SECONDS", "Outage", "outage_window"]

log = logging.getLogger(__name__)

#: How long a service may stay unreachable before a transport gives up.
DEFAULT_OUTAGE_SECONDS = 60.0
#: How long the first connection may take: a wrong URL or a service that is not there is reported at once,
#: not after a whole outage window.
CONNECT_SECONDS = 5.0


def outage_window(seconds: float | None) -> float:
    """``seconds`` if given, else $MLLESS_OUTAGE_SECONDS, else ``DEFAULT_OUTAGE_SECONDS``."""
    if seconds is None:
        return float(os.environ.get(ENV_OUTAGE_SECONDS, DEFAULT_OUTAGE_SECONDS))
    return seconds


class Outage:
    """Backoff through one outage: exponential, half of each pause random so that a job's processes do not
    retry in lockstep, until `seconds` have passed since the first failure."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.give_up, self.delay = seconds, time.monotonic() + seconds, 0.05

    def wait(self, service: str, reason: str) -> None:
        """Sleep before the next attempt, or raise TransportError once the outage has lasted too long."""
        left = self.give_up - time.monotonic()
        if left <= 0:
            raise TransportError(f"{service}: unreachable for {self.seconds:g}s: {reason}")
        pause = min(self.delay / 2 + random.uniform(0, self.delay / 2), left)
        log.warning("%s: %s; retrying in %.2fs", service, reason, pause)
        time.sleep(pause)
        self.delay = min(self.delay * 2, 5.0)
