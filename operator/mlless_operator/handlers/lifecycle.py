"""Operator start and stop: configuration, Kopf settings, API client, metrics server."""
from __future__ import annotations

import logging
from typing import Any

import kopf

from mlless_operator import config as config_module
from mlless_operator import metrics
from mlless_operator.kubeapi import KubeAPI, make_client


def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger | logging.LoggerAdapter) -> None:
    cfg = config_module.load()
    memo.config = cfg
    memo.api = KubeAPI(make_client())
    # Own finalizer and annotation prefix, so this operator never collides with another Kopf operator's state.
    settings.persistence.finalizer = cfg.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=cfg.annotations_prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=cfg.annotations_prefix, key="last-handled-configuration")
    # Load balancers silently drop idle connections: let the server end watches and re-list rather than hang.
    settings.watching.server_timeout = 300
    # A stuck connection must not block the operator forever.
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    # Every job has timers, and its finalizer goes only once they have stopped; Kopf re-checks that every
    # `cancellation_polling` seconds (60 by default), which held every deletion (TTL, kubectl delete) for up to a minute.
    settings.background.cancellation_polling = 1
    # Kubernetes Events come from kopf.info/warn only, not from every log line. (The level must stay at INFO:
    # it also filters kopf.info, which records every transition.)
    settings.posting.loggers = False
    settings.posting.level = logging.INFO
    metrics.serve(cfg.metrics_port)
    logger.info("mlless operator configured: image %s, openfaas namespace %s", cfg.image, cfg.openfaas_namespace)


def shutdown(memo: kopf.Memo, **_: Any) -> None:
    api = getattr(memo, "api", None)
    if api is not None:
        api.close()


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account in a cluster, else the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
