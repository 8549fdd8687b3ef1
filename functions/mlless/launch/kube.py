"""The supervisor's side of Kubernetes: its TrainingJob's `status` and `scale` subresources.

The supervisor's ServiceAccount may only `get` and `patch` `trainingjobs/status`
and `trainingjobs/scale` of its own job, so everything here goes through those
two subresources: progress is merge-patched into status, the desired worker
count into scale (`spec.workers`), and a GET of status (which answers the whole
object) brings back what the owner changed in the spec.

All calls are synchronous, with a timeout, in the supervisor's loop thread
(the class is not thread-safe), and none raises: the API being down or the
job being deleted must not stop training. Failures are logged once per kind.

Reads after writes (the race between a scale patch and a poll): the apiserver
answers a GET without `resourceVersion` with a quorum read, and `set_workers`
and `poll` run one after the other, so a poll after a scale patch that went
through sees the new count. What remains:
- A scale patch that failed leaves the old count on the server; reported as a
  request, it would make the supervisor undo its own scale-in. So the patch is
  retried before each poll, and until it goes through poll reports no count.
- The owner's `kubectl scale` racing the supervisor's patch: merge patches
  carry no precondition, so the later write wins. If the owner's lands last,
  the next poll reports it; if the supervisor's does, the owner's is lost and
  they scale again, as when two `kubectl scale` commands race.
"""
from __future__ import annotations

import logging
import math
import numbers
import os
import time
from typing import Any, Callable, Mapping

import kubernetes

from mlless.contract import ENV_JOB_NAME, ENV_JOB_NAMESPACE, GROUP, PLURAL, VERSION
from mlless.launch.platform import Platform, PlatformRequest

log = logging.getLogger(__name__)

# Status fields the operator owns; the supervisor never writes them.
OPERATOR_FIELDS = frozenset({"phase", "conditions", "observedGeneration", "selector"})


class KubePlatform(Platform):
    def __init__(
        self,
        api: kubernetes.client.CustomObjectsApi,
        name: str,
        namespace: str,
        *,
        desired: int | None = None,
        min_interval: float = 2.0,
        poll_interval: float = 5.0,
        request_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`desired` is the worker count the supervisor starts with; left None, the first poll reports spec.workers as a request."""
        self.api = api
        self.name = name
        self.namespace = namespace
        self.min_interval = min_interval
        self.poll_interval = poll_interval
        self.request_timeout = request_timeout
        self.clock = clock
        self._desired = desired  # the newest count set here or reported by poll
        self._scale_unsent = False  # set_workers' count has not reached the server yet
        # The operator numbers the ranks of each session (creation, resume after a suspend) from 0, so
        # removedRanks left by an earlier session would name live pods: a supervisor starts the list afresh,
        # with its first status patch.
        self._removed: list[int] = []  # status.removedRanks as last written
        self._ranks_unsent: list[int] = []  # ranks set_workers was told about, not yet in status
        self._pending: dict[str, Any] = {"removedRanks": []}  # published fields not yet patched
        self._last_publish: float | None = None
        self._last_poll: float | None = None
        self._suspend = False  # the suspend flag as last reported
        self._errors_seen: set[tuple[str, str]] = set()

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, kubeconfig: str | None = None, **options: Any
    ) -> KubePlatform | None:
        """The platform of the job named by MLLESS_JOB_NAME/MLLESS_JOB_NAMESPACE, or None outside Kubernetes.

        In a pod (KUBERNETES_SERVICE_HOST set) it uses the ServiceAccount;
        otherwise, or with an explicit `kubeconfig`, a kubeconfig file
        ($KUBECONFIG read now, not when `kubernetes` was imported). A broken
        configuration raises: better a supervisor that fails at start than a
        job whose status silently never moves.
        """
        env = os.environ if env is None else env
        name, namespace = env.get(ENV_JOB_NAME), env.get(ENV_JOB_NAMESPACE)
        if not name or not namespace:
            return None
        configuration = kubernetes.client.Configuration()
        if kubeconfig is None and env.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(
                config_file=kubeconfig or env.get("KUBECONFIG"), client_configuration=configuration, persist_config=False
            )
        # A client of its own: the global default configuration may belong to someone else in this process.
        api = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(configuration))
        return cls(api, name, namespace, **options)

    # ---- Platform ----------------------------------------------------------------------------

    def publish(self, status: Mapping[str, Any], final: bool = False) -> None:
        """Merge-patch these status fields, at most once per `min_interval` unless `final`.

        Fields published in between wait in `_pending` (newest value wins), as
        do the fields of a patch that failed, so the next patch carries them.
        """
        self._pending.update({k: _json_value(v) for k, v in status.items() if k not in OPERATOR_FIELDS})
        now = self.clock()
        if not self._pending or (not final and self._last_publish is not None and now - self._last_publish < self.min_interval):
            return
        self._last_publish = now
        if self._call("patch status", self.api.patch_namespaced_custom_object_status, {"status": dict(self._pending)}) is not None:
            self._pending.clear()

    def set_workers(self, desired: int, removed: int | None = None) -> None:
        """Record `removed` in status.removedRanks (the operator reads it to pick which pod goes), then scale to `desired`."""
        self._desired = int(desired)
        self._scale_unsent = True
        if removed is not None and int(removed) not in self._ranks_unsent:
            self._ranks_unsent.append(int(removed))
        self._push_scale()

    def poll(self) -> PlatformRequest | None:
        """What the owner changed in the spec since the last report, at most once per `poll_interval`.

        `workers` is spec.workers when it differs from the newest count known
        here (set by `set_workers` or already reported), else None; `suspend`
        is spec.suspend. None when neither changed, between polls and on errors.
        """
        now = self.clock()
        if self._last_poll is not None and now - self._last_poll < self.poll_interval:
            return None
        self._last_poll = now
        scale_synced = self._push_scale()
        job = self._read()
        if job is None:
            return None
        spec = job.get("spec") or {}
        workers = spec.get("workers")
        requested = None
        if scale_synced and isinstance(workers, int) and workers != self._desired:
            self._desired = requested = workers
        suspend = bool(spec.get("suspend"))
        if requested is None and suspend == self._suspend:
            return None
        self._suspend = suspend
        return PlatformRequest(workers=requested, suspend=suspend)

    # ---- API calls -----------------------------------------------------------------------------

    def _push_scale(self) -> bool:
        """Send what `set_workers` has not got through yet, ranks before the count; True when nothing is left."""
        if self._ranks_unsent:
            ranks = self._removed + [r for r in self._ranks_unsent if r not in self._removed]
            if self._call("patch status.removedRanks", self.api.patch_namespaced_custom_object_status, {"status": {"removedRanks": ranks}}) is None:
                return False
            self._removed, self._ranks_unsent = ranks, []
        if self._scale_unsent:
            if self._call("patch scale", self.api.patch_namespaced_custom_object_scale, {"spec": {"replicas": self._desired}}) is None:
                return False
            self._scale_unsent = False
        return True

    def _read(self) -> dict[str, Any] | None:
        """The whole TrainingJob, read through the status subresource (the only GET the Role allows)."""
        return self._call("get status", self.api.get_namespaced_custom_object_status)

    def _call(self, what: str, method: Callable[..., Any], *body: Any) -> dict[str, Any] | None:
        """One call on this job; on any failure log it (once per kind) and answer None, so training goes on."""
        try:
            answer = method(GROUP, VERSION, self.namespace, PLURAL, self.name, *body, _request_timeout=self.request_timeout)
        except Exception as exc:  # noqa: BLE001 - whatever the API or the client does, training goes on
            kind = (what, _describe(exc))
            level = logging.DEBUG if kind in self._errors_seen else logging.WARNING
            self._errors_seen.add(kind)
            log.log(level, "TrainingJob %s/%s: %s failed: %s; training goes on (repeats are logged at debug level)",
                    self.namespace, self.name, what, kind[1])
            return None
        return answer if isinstance(answer, dict) else {}


def _describe(exc: Exception) -> str:
    """Status and reason only: the client's exception text carries response headers and bodies, which may hold secrets."""
    status = getattr(exc, "status", None)
    if status is not None:
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".rstrip()
    reason = getattr(exc, "reason", None)  # urllib3's MaxRetryError wraps the connection error
    return type(exc).__name__ + (f" ({type(reason).__name__})" if isinstance(reason, Exception) else "")


def _json_value(value: Any) -> Any:
    """Plain JSON: numpy scalars become int/float, and NaN/inf None (the merge patch then clears the field)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value
