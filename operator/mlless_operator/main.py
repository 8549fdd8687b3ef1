"""Kopf entry points of the mlless operator: `kopf run -m mlless_operator` (or `-m mlless_operator.main`, or `python -m mlless_operator`).

Only registrations live here; each hands off in one line to `handlers/`.
Kopf may execute this file once per run, so it holds no state (the Prometheus
collectors live in `mlless_operator.metrics`).
"""
from __future__ import annotations

from typing import Any

import kopf

from mlless.contract import GROUP, PLURAL, SWEEP_PLURAL, VERSION
from mlless_operator import config as config_module
from mlless_operator import metrics
from mlless_operator.handlers import create, delete, lifecycle, scale, status, sweep, ttl

RESOURCE = (GROUP, VERSION, PLURAL)
SWEEPS = (GROUP, VERSION, SWEEP_PLURAL)
#: Decorator arguments must be known at import; everything else is read in `startup`.
_CONFIG = config_module.load()


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: Any, **_: Any) -> None:
    lifecycle.configure(settings, memo, logger)


@kopf.on.cleanup()
def shutdown(**kwargs: Any) -> None:
    lifecycle.shutdown(**kwargs)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return lifecycle.login(**kwargs)


@kopf.on.resume(*RESOURCE, id="reconcile", backoff=10)
@kopf.on.create(*RESOURCE, id="reconcile", backoff=10)
@metrics.instrumented("reconcile")
async def reconcile(**kwargs: Any) -> None:
    await create.reconcile(**kwargs)


@kopf.on.field(*RESOURCE, field="spec.workers", id="scale", backoff=10)
@metrics.instrumented("scale")
async def rescale(**kwargs: Any) -> None:
    await scale.rescale(**kwargs)


@kopf.on.delete(*RESOURCE, id="cleanup", backoff=10)
@metrics.instrumented("cleanup")
async def cleanup(**kwargs: Any) -> None:
    await delete.cleanup(**kwargs)


# Phase, suspension and resumption, activeDeadlineSeconds: the one writer of phase and conditions after creation.
@kopf.timer(*RESOURCE, id="status", interval=_CONFIG.status_interval, initial_delay=min(_CONFIG.status_interval, 5.0))
@metrics.instrumented("status")
async def follow_supervisor(**kwargs: Any) -> None:
    await status.follow_supervisor(**kwargs)


# Only finished jobs with spec.ttlSecondsAfterFinished get this timer.
@kopf.timer(*RESOURCE, id="ttl", interval=_CONFIG.ttl_interval, initial_delay=min(_CONFIG.ttl_interval, 5.0), when=ttl.applies)
@metrics.instrumented("ttl")
async def expire(**kwargs: Any) -> None:
    await ttl.expire(**kwargs)


# TrainingSweeps: trials created, followed, judged (ASHA) and stopped, on a timer only (one writer of the status).
@kopf.timer(*SWEEPS, id="sweep-follow", interval=_CONFIG.status_interval, initial_delay=min(_CONFIG.status_interval, 5.0))
@metrics.instrumented("sweep")
async def follow_sweep(**kwargs: Any) -> None:
    await sweep.reconcile(**kwargs)


@kopf.on.delete(*SWEEPS, id="sweep-cleanup", backoff=10)
@metrics.instrumented("sweep-cleanup")
async def cleanup_sweep(**kwargs: Any) -> None:
    await sweep.cleanup(**kwargs)
