"""KubePlatform against the kmock API emulator, over real HTTP with the `kubernetes` client.

The emulator runs in a background thread with its own event loop, since the
platform's calls are synchronous. Time is a fake clock the tests advance; nothing
sleeps or asserts on elapsed time.
"""
from __future__ import annotations

import asyncio
import copy
import logging
import math
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import kmock
import numpy as np
import pytest
from kubernetes import client

from mlless.launch.kube import KubePlatform
from mlless.launch.platform import PlatformRequest

sys.path.insert(0, str(Path(__file__).parent / "operator"))
from kmock_emulator import Emulator  # noqa: E402

NS, NAME = "team", "ml"
TJ = kmock.resource("mlless.io/v1alpha1/trainingjobs")
TOKEN = "tok-do-not-log-0123456789"  # the kubeconfig's bearer token; must never reach a log
JOB_ENV = {"MLLESS_JOB_NAME": NAME, "MLLESS_JOB_NAMESPACE": NS}


class RecordingEmulator(Emulator):
    """The shared Emulator plus what these tests need from an apiserver.

    - Requests to the subresources in `refused` answer 403, as when RBAC denies them.
    - `calls` records (method, subresource, body) of every TrainingJob request, to check their order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.refused: set[str] = set()
        self.calls: list[tuple[str, str | None, Any]] = []

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource == TJ:
            self.calls.append((request.method.value, request.subresource, copy.deepcopy(request.data)))
            if request.subresource in self.refused:
                raise kmock.KubernetesError(status=403, reason="Forbidden", message="refused by the test")
        return await super()._handle(request)



class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Cluster:
    """The emulator, a kubeconfig pointing at it, and an unrestricted client playing the job's owner."""

    def __init__(self, emu: RecordingEmulator, url: str, kubeconfig: Path) -> None:
        self.emu = emu
        self.kubeconfig = kubeconfig
        configuration = client.Configuration()
        configuration.host = url.rstrip("/")
        self.owner = client.CustomObjectsApi(client.ApiClient(configuration))

    def create(self, **spec: Any) -> None:
        body = {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": NAME}, "spec": {"workers": 3, **spec}}
        self.owner.create_namespaced_custom_object("mlless.io", "v1alpha1", NS, "trainingjobs", body)

    def patch(self, body: dict[str, Any], subresource: str = "") -> Any:
        method = {"": self.owner.patch_namespaced_custom_object, "status": self.owner.patch_namespaced_custom_object_status,
                  "scale": self.owner.patch_namespaced_custom_object_scale}[subresource]
        return method("mlless.io", "v1alpha1", NS, "trainingjobs", NAME, body)

    def kubectl_scale(self, replicas: int) -> None:
        answer = self.patch({"spec": {"replicas": replicas}}, "scale")
        assert answer["kind"] == "Scale" and answer["spec"]["replicas"] == replicas

    def delete(self) -> None:
        self.owner.delete_namespaced_custom_object("mlless.io", "v1alpha1", NS, "trainingjobs", NAME)

    def job(self) -> dict[str, Any]:
        return self.emu.objects[TJ, NS, NAME].raw

    def status(self) -> dict[str, Any]:
        return self.job().get("status") or {}

    def platform(self, clock: Clock, **options: Any) -> KubePlatform:
        platform = KubePlatform.from_env(JOB_ENV, kubeconfig=str(self.kubeconfig), clock=clock, **options)
        assert platform is not None
        return platform


def write_kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{url}'}}}}]\n"
        f"users: [{{name: kmock, user: {{token: {TOKEN}}}}}]\n"
        "contexts: [{name: kmock, context: {cluster: kmock, user: kmock, namespace: team}}]\n"
        "current-context: kmock\n"
    )
    return path


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A RecordingEmulator served on a random port from a thread of its own, with the TrainingJob resource declared."""
    emu = RecordingEmulator()
    emu.resources["mlless.io/v1alpha1/trainingjobs"] = kmock.ResourceInfo(
        kind="TrainingJob", singular="trainingjob", namespaced=True, shortnames={"tj"},
        verbs={"get", "list", "watch", "create", "patch", "delete"}, subresources={"status", "scale"},
    )
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()
    url: list[str] = []

    async def serve() -> None:
        async with emu, kmock.Server(emu) as server:
            url.append(str(server.url))
            started.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert started.wait(10), "the emulator did not start"
    try:
        yield Cluster(emu, url[0], write_kubeconfig(tmp_path / "kubeconfig", url[0]))
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mlless.launch.kube" and r.levelno >= logging.WARNING]


# ---- from_env ------------------------------------------------------------------------------------


def test_from_env_is_none_outside_a_job(tmp_path: Path) -> None:
    kubeconfig = str(write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:1"))
    assert KubePlatform.from_env({}, kubeconfig=kubeconfig) is None
    assert KubePlatform.from_env({"MLLESS_JOB_NAME": NAME}, kubeconfig=kubeconfig) is None
    assert KubePlatform.from_env({"MLLESS_JOB_NAMESPACE": NS}, kubeconfig=kubeconfig) is None


def test_from_env_reads_kubeconfig_at_call_time(cluster: Cluster, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    # $KUBECONFIG set after `kubernetes` was imported; an explicit kubeconfig also beats the in-cluster switch.
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # when the tests themselves run in a pod
    monkeypatch.setenv("MLLESS_JOB_NAME", NAME)
    monkeypatch.setenv("MLLESS_JOB_NAMESPACE", NS)
    cluster.create()
    default_host = client.Configuration.get_default_copy().host
    platform = KubePlatform.from_env(clock=clock)
    assert isinstance(platform, KubePlatform) and (platform.namespace, platform.name) == (NS, NAME)
    platform.publish({"step": 1}, final=True)
    assert cluster.status() == {"removedRanks": [], "step": 1}
    assert client.Configuration.get_default_copy().host == default_host  # a client of its own; the global one untouched

    explicit = KubePlatform.from_env({**JOB_ENV, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, kubeconfig=str(cluster.kubeconfig), clock=clock)
    assert explicit is not None
    explicit.publish({"step": 2}, final=True)
    assert cluster.status() == {"removedRanks": [], "step": 2}


# ---- publish -------------------------------------------------------------------------------------


def test_publish_patches_given_fields_at_most_once_per_interval(cluster: Cluster, clock: Clock) -> None:
    cluster.create()
    cluster.patch({"status": {"phase": "Running", "conditions": [{"type": "Running", "status": "True"}], "workers": 3}}, "status")
    platform = cluster.platform(clock, min_interval=2.0)

    platform.publish({"step": 1, "trainLoss": 0.9, "phase": "Succeeded", "conditions": []})
    assert cluster.status()["step"] == 1 and cluster.status()["trainLoss"] == 0.9
    assert cluster.status()["phase"] == "Running" and cluster.status()["conditions"]  # the operator's, untouched

    clock.advance(0.5)
    platform.publish({"step": 2, "trainLoss": 0.8})
    clock.advance(1.0)
    platform.publish({"step": 3, "validationLoss": 0.85})
    assert cluster.status()["step"] == 1  # still inside the interval: nothing sent

    clock.advance(0.5)  # two seconds since the first patch
    platform.publish({"step": 4, "costUSD": 0.01})
    status = cluster.status()
    # The newest value of every field, including those published while waiting.
    assert {k: status[k] for k in ("step", "trainLoss", "validationLoss", "costUSD", "workers", "phase")} == {
        "step": 4, "trainLoss": 0.8, "validationLoss": 0.85, "costUSD": 0.01, "workers": 3, "phase": "Running"}
    status_patches = [body for method, sub, body in cluster.emu.calls if method == "PATCH" and sub == "status"]
    assert len(status_patches) == 3  # the operator's and two of the platform's
    assert all(set(body) == {"status"} for body in status_patches[1:])  # status only, never spec


def test_publish_sends_plain_json(cluster: Cluster, clock: Clock) -> None:
    cluster.create()
    platform = cluster.platform(clock)
    platform.publish({"step": np.int64(5), "trainLoss": np.float32(0.25), "validationLoss": 0.5})
    clock.advance(5)
    platform.publish({"step": 6, "trainLoss": math.nan, "validationLoss": math.inf})  # no loss yet: the fields are cleared
    assert cluster.status() == {"removedRanks": [], "step": 6}


def test_final_publish_flushes_at_once(cluster: Cluster, clock: Clock) -> None:
    cluster.create()
    platform = cluster.platform(clock, min_interval=60.0)
    platform.publish({"step": 1})
    clock.advance(1)
    platform.publish({"step": 2, "trainLoss": 0.5})
    assert cluster.status() == {"removedRanks": [], "step": 1}
    platform.publish({"completionTime": "2026-01-01T00:00:00Z", "modelURI": "s3://bucket/model"}, final=True)
    assert cluster.status() == {"removedRanks": [], "step": 2, "trainLoss": 0.5, "completionTime": "2026-01-01T00:00:00Z", "modelURI": "s3://bucket/model"}


# ---- set_workers ---------------------------------------------------------------------------------


def test_set_workers_records_the_removed_rank_then_scales(cluster: Cluster, clock: Clock) -> None:
    cluster.create(workers=4)
    cluster.patch({"status": {"removedRanks": [7]}}, "status")  # left by the session before a suspend
    platform = cluster.platform(clock, desired=4)
    platform.publish({"step": 1})
    # The operator numbers each session's ranks from 0: the old entries would name live pods, so they go.
    assert cluster.status()["removedRanks"] == []
    start = len(cluster.emu.calls)

    platform.set_workers(3, removed=2)
    assert cluster.status()["removedRanks"] == [2] and cluster.job()["spec"]["workers"] == 3
    calls = [(method, sub) for method, sub, _ in cluster.emu.calls[start:]]
    assert calls == [("PATCH", "status"), ("PATCH", "scale")]  # the ranks, then the count

    platform.set_workers(2, removed=0)
    platform.set_workers(2, removed=0)  # told twice: listed once
    platform.set_workers(3)  # no rank left: the count alone
    assert cluster.status()["removedRanks"] == [2, 0] and cluster.job()["spec"]["workers"] == 3
    assert cluster.emu.calls[-1][1:] == ("scale", {"spec": {"replicas": 3}})


# ---- poll ----------------------------------------------------------------------------------------


def test_poll_reports_the_owners_changes_but_not_its_own(cluster: Cluster, clock: Clock) -> None:
    cluster.create(workers=3)
    platform = cluster.platform(clock, desired=3, poll_interval=5.0)
    assert platform.poll() is None  # nothing changed

    platform.set_workers(2, removed=1)
    clock.advance(5)
    assert platform.poll() is None  # its own scale-in is not a request

    cluster.kubectl_scale(4)
    clock.advance(1)
    assert platform.poll() is None  # between polls the API is not asked
    clock.advance(4)
    assert platform.poll() == PlatformRequest(workers=4, suspend=False)
    clock.advance(5)
    assert platform.poll() is None  # reported once

    cluster.patch({"spec": {"suspend": True}})
    clock.advance(5)
    assert platform.poll() == PlatformRequest(workers=None, suspend=True)
    clock.advance(5)
    assert platform.poll() is None
    cluster.patch({"spec": {"suspend": False, "workers": 5}})
    clock.advance(5)
    assert platform.poll() == PlatformRequest(workers=5, suspend=False)


def test_first_poll_reports_the_count_when_the_start_count_is_unknown(cluster: Cluster, clock: Clock) -> None:
    cluster.create(workers=3)
    platform = cluster.platform(clock)
    assert platform.poll() == PlatformRequest(workers=3, suspend=False)
    clock.advance(5)
    assert platform.poll() is None


def test_a_scale_patch_that_failed_is_retried_and_its_old_count_not_reported(
    cluster: Cluster, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.create(workers=3)
    platform = cluster.platform(clock, desired=3)
    cluster.emu.refused.add("scale")
    platform.set_workers(2)
    assert cluster.job()["spec"]["workers"] == 3
    clock.advance(5)
    assert platform.poll() is None  # spec still says 3: that is the supervisor's own unsent change, not a request
    cluster.emu.refused.clear()
    clock.advance(5)
    assert platform.poll() is None
    assert cluster.job()["spec"]["workers"] == 2
    warnings = warnings_of(caplog)
    assert len(warnings) == 1 and "patch scale failed: HTTP 403 Forbidden" in warnings[0], warnings


# ---- errors --------------------------------------------------------------------------------------


def test_a_deleted_job_is_logged_once_per_kind_and_nothing_is_lost(
    cluster: Cluster, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.create()
    platform = cluster.platform(clock, desired=3)
    platform.publish({"step": 1})
    cluster.delete()
    caplog.set_level(logging.DEBUG, "mlless.launch.kube")
    for step in range(2, 6):
        clock.advance(5)
        platform.publish({"step": step, "trainLoss": 1.0 / step})
        assert platform.poll() is None
    platform.set_workers(2, removed=1)  # the ranks cannot be recorded, so the count is not sent either
    warnings = warnings_of(caplog)
    assert sorted(w.split(" failed")[0] for w in warnings) == [
        f"TrainingJob {NS}/{NAME}: get status",
        f"TrainingJob {NS}/{NAME}: patch status",
        f"TrainingJob {NS}/{NAME}: patch status.removedRanks",
    ]
    assert all("HTTP 404 Not Found" in w for w in warnings), warnings
    assert TOKEN not in caplog.text

    cluster.create()  # back (in real life: restored); the final patch carries every field still pending
    platform.publish({"modelURI": "s3://bucket/model"}, final=True)
    assert cluster.status() == {"step": 5, "trainLoss": 0.2, "modelURI": "s3://bucket/model"}


def test_an_unreachable_api_is_logged_not_raised(tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    platform = KubePlatform.from_env(JOB_ENV, kubeconfig=str(kubeconfig), clock=clock, request_timeout=2.0)
    assert platform is not None
    for step in range(3):
        platform.publish({"step": step}, final=step == 2)
        platform.set_workers(2, removed=1)
        assert platform.poll() is None
        clock.advance(5)
    warnings = warnings_of(caplog)
    assert warnings and len(warnings) == len(set(warnings)) and all("MaxRetryError" in w for w in warnings), warnings
    assert TOKEN not in caplog.text


def test_mlless_supervisor_refuses_a_broken_platform_setup_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from mlless.cli import main

    job = Path(__file__).parent.parent / "examples" / "movielens.yaml"
    args = ["supervisor", "--job", str(job), "--job-id", "t", "--redis-url", "redis://127.0.0.1", "--amqp-url", "amqp://127.0.0.1"]
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("MLLESS_WORKER_BACKEND", "lambda")
    monkeypatch.setenv("MLLESS_WORKER_INVOCATION", "lambda")
    assert main(args) == 2
    assert "MLLESS_WORKER_BACKEND='lambda'" in capsys.readouterr().err
    monkeypatch.setenv("MLLESS_WORKER_BACKEND", "pod")
    monkeypatch.setenv("MLLESS_WORKER_INVOCATION", "external")
    monkeypatch.setenv("MLLESS_JOB_NAME", NAME)
    monkeypatch.setenv("MLLESS_JOB_NAMESPACE", NS)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "no usable Kubernetes configuration" in err and "Traceback" not in err
