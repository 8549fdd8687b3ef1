"""End to end: `kubectl apply` a TrainingJob, and it trains to Succeeded.

The real Kopf operator runs in-loop against the kmock emulator (as in
test_operator_kmock.py) and creates the job's children there; the kubelet
stand-in (`kubelet.py`) runs the pods it creates as local processes. What runs
is the real `mlless supervisor` and `mlless worker`, against the real Redis and
RabbitMQ of `tests/conftest.py` (the job names them as external services, so
no StatefulSet is needed). Waits poll with a generous timeout
(MLLESS_E2E_WAIT seconds); nothing asserts on elapsed time.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import aiohttp
import pytest

from kubelet import Backend, Image, Kubelet, PodRuntime, Sandbox, expand
from scenario import (  # the fixtures are in conftest.py
    FN_NS, KUBECTL, NS, PODS, TERMINAL, Cluster, exit_code, job_status, kubectl, launched, pod_phase, stand_in, until,
)

from mlless.contract import STOP_MAX_STEPS
from mlless.spec.crd import PRINTER_COLUMNS


async def printer_columns(name: str) -> dict[str, str]:
    """The CRD's printer columns as `kubectl get tj -o wide` shows them (the emulator prints no tables: kubectl's
    custom columns, with the CRD's jsonPaths, do it instead)."""
    columns = [c for c in PRINTER_COLUMNS if c["jsonPath"].startswith(".status.")]
    spec = ",".join(f"{c['name']}:{c['jsonPath']}" for c in columns)
    header, row = (await kubectl("get", "trainingjobs.mlless.io", name, "-o", f"custom-columns={spec}")).splitlines()
    return dict(zip(header.split(), row.split()))


async def assert_succeeded(c: Any, kubelet: Kubelet, name: str) -> dict[str, Any]:
    """The job ended on its stop rule with a model, and its status says so with the supervisor's progress; its summary."""
    runtime = kubelet.pod(NS, f"{name}-supervisor")
    assert runtime is not None and runtime.box is not None
    summary = json.loads((runtime.box.volumes["run"] / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == STOP_MAX_STEPS and summary["validation_loss"] is not None
    status = await job_status(c, name)
    assert status["phase"] == "Succeeded" and status.get("completionTime")
    assert next(x for x in status["conditions"] if x["type"] == "Succeeded")["status"] == "True"
    # The supervisor mirrors its progress into the status (mlless.launch.kube.KubePlatform).
    assert status.get("step", 0) > 0, f"status.step is not set: the supervisor did not mirror its progress; status {status}"
    assert isinstance(status.get("trainLoss"), (int, float)) and math.isfinite(status["trainLoss"]), status
    # Its progress, ETA and projected cost (mlless.runtime.supervisor.eta): done, and the projection is the bill.
    assert status["progress"] == 1.0 and status["etaSeconds"] == 0.0 and status["progressLimit"] == "maxSteps", status
    assert status["projectedCostUSD"] == status["costUSD"] == pytest.approx(summary["cost_usd"], abs=1e-6), status
    assert status["epoch"] == pytest.approx(summary["epochs"], abs=1e-4), status
    if KUBECTL is not None:
        shown = await printer_columns(name)
        assert {k: shown[k] for k in ("State", "Step", "Progress", "ETA", "Until", "ETA-Low")} == {
            "State": "Succeeded", "Step": str(summary["steps"]), "Progress": "1", "ETA": "0", "Until": "maxSteps",
            "ETA-Low": "<none>"}, shown  # a limit known in advance: no band
        assert float(shown["Cost"]) == float(shown["Projected"]) == pytest.approx(summary["cost_usd"], abs=1e-6), shown
    return summary


@pytest.mark.asyncio
@pytest.mark.services
@pytest.mark.slow
async def test_pod_backend_trains_to_succeeded_with_the_final_loss(cluster_factory, e2e_job, tmp_path):
    doc = e2e_job("e2e", function={"backend": "pod"})
    async with launched(cluster_factory, tmp_path, doc) as job:
        c, kubelet, name = job
        await job.until(lambda: c.job(name).get("status", {}).get("phase") in TERMINAL, "the job to finish")
        supervisor = c.get(PODS, f"{name}-supervisor")
        assert supervisor is not None and supervisor["status"]["phase"] == "Succeeded", supervisor
        assert exit_code(supervisor) == 0
        workers = c.names(PODS) - {f"{name}-supervisor"}
        assert len(workers) == 2 and all(w.startswith(f"{name}-worker-") for w in workers), workers
        await until(lambda: all(pod_phase(c, w) in TERMINAL for w in workers), "the worker pods to end", kubelet)
        for worker in workers:
            assert pod_phase(c, worker) == "Succeeded" and exit_code(c.get(PODS, worker)) == 0, worker

        summary = await assert_succeeded(c, kubelet, name)
        assert summary["steps"] == 30 and summary["workers_final"] == 2


@pytest.mark.asyncio
@pytest.mark.services
@pytest.mark.slow
async def test_knative_backend_trains_to_succeeded(cluster_factory, e2e_job, tmp_path):
    doc = e2e_job("e2e", function={"backend": "knative", "timeoutSeconds": 120})
    async with launched(cluster_factory, tmp_path, doc, cluster={"knative": True}, knative=True) as job:
        c, kubelet, name = job
        await job.until(lambda: c.job(name).get("status", {}).get("phase") in TERMINAL, "the job to finish")
        supervisor = c.get(PODS, f"{name}-supervisor")
        assert supervisor is not None and supervisor["status"]["phase"] == "Succeeded", supervisor
        assert exit_code(supervisor) == 0
        assert c.names(PODS) == {f"{name}-supervisor"}  # the workers are the Knative Service's copies
        assert len([r for r in kubelet.knative.runtimes() if r.containers["worker"].started]) == 2

        await assert_succeeded(c, kubelet, name)


# ---- the stand-in itself (no operator): what the end-to-end tests rely on -------------------------


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(A)-$(B)", "one-two"),
        ("$$(A)", "$(A)"),  # escaped
        ("$(MISSING)", "$(MISSING)"),  # unresolvable: kept as written
        ("$(A", "$(A"),  # unclosed
        ("cost $5 $", "cost $5 $"),
        ("$$$(A)", "$one"),
    ],
)
def test_expansion_follows_kubernetes(text, expanded):
    assert expand(text, {"A": "one", "B": "two"}) == expanded


#: A container that records what it was given, fails on its first run, and succeeds on the second.
RECORDER = """
import json, os, pathlib, sys
out = pathlib.Path(os.environ["OUT"])
runs = len(list(out.glob("run-*")))
(out / f"run-{runs}").write_text(json.dumps({"env": dict(os.environ), "argv": sys.argv[1:], "cfg": pathlib.Path(sys.argv[1]).read_text(), "cwd": os.getcwd()}))
sys.exit(3 if runs == 0 else 0)
"""
#: A container that ends on SIGTERM (after noting it) or, if told to, ignores it.
SLEEPER = """
import os, pathlib, signal, sys, time
def stop(*_):
    pathlib.Path(os.environ["OUT"], "sigterm").write_text("x")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[1:] == ["ignore"] else stop)
pathlib.Path(os.environ["OUT"], "up").write_text("x")
while True:
    time.sleep(0.1)
"""


#: The recorder's environment: a Secret that comes late, $(VAR) expansion, a ConfigMap key, the pod's name, a port, a Service.
RECORDER_ENV = [
    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "late", "key": "password"}}},
    {"name": "URL", "value": "redis://:$(PASSWORD)@host/0"},
    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "PORT", "value": "9090"},
    {"name": "SVC", "value": "http://api.team.svc.cluster.local/v1"},
]


def pod(name: str, script: str, *args: str, env: Sequence[dict[str, Any]] = (), **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {
            "containers": [{
                "name": "main", "image": "ignored", "command": ["python", "-c", script], "args": list(args),
                "env": [{"name": "OUT", "value": "/out"}, *env],
                "ports": [{"containerPort": 9090}],
                "volumeMounts": [{"name": "out", "mountPath": "/out"}, {"name": "cfg", "mountPath": "/etc/cfg", "readOnly": True}],
            }],
            "volumes": [{"name": "out", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "cfg"}}],
            **spec,
        },
    }


async def create(c: Cluster, kind: str, body: dict[str, Any], namespace: str = NS) -> None:
    """POST a core object (`kind`: its plural) to the namespace."""
    status, answer = await c.call("POST", f"/api/v1/namespaces/{namespace}/{kind}", body)
    assert status == 201, answer


def waiting_reason(c: Cluster, name: str) -> str | None:
    """Why the pod's first container waits, if it does."""
    statuses = ((c.get(PODS, name) or {}).get("status") or {}).get("containerStatuses") or [{}]
    return (statuses[0].get("state") or {}).get("waiting", {}).get("reason")


def out_dir(kubelet: Kubelet, name: str) -> Path | None:
    """The pod's `out` emptyDir on the host, once it has a sandbox."""
    runtime = kubelet.pod(NS, name)
    return runtime.box.volumes["out"] if runtime is not None and runtime.box is not None else None


async def run_pod(c: Cluster, kubelet: Kubelet, manifest: dict[str, Any], phase: str) -> None:
    """Create the pod, and wait for it to reach `phase`."""
    await create(c, "pods", manifest)
    name = manifest["metadata"]["name"]
    await until(lambda: pod_phase(c, name) == phase, f"{name} {phase}", kubelet)


def recorded_runs(kubelet: Kubelet, name: str) -> tuple[Sandbox, Path, dict[str, Any], dict[str, Any]]:
    """The RECORDER pod's sandbox, its `out` directory, and what its first two runs recorded."""
    box, out = kubelet.pod(NS, name).box, out_dir(kubelet, name)
    first, second = (json.loads((out / f"run-{i}").read_text()) for i in (0, 1))
    return box, out, first, second


async def until_stopped(kubelet: Kubelet, name: str) -> PodRuntime:
    """The pod's runtime, once its processes are gone."""
    runtime = kubelet.pod(NS, name)
    await until(runtime.task.done, f"{name} stopped", kubelet)
    return runtime


async def until_up(c: Cluster, kubelet: Kubelet, name: str) -> None:
    """The SLEEPER pod's process is up (it said so), and the pod is Running."""
    await until(lambda: (out := out_dir(kubelet, name)) and (out / "up").exists(), f"{name} up", kubelet)
    await until(lambda: pod_phase(c, name) == "Running", f"{name} Running", kubelet)


@pytest.mark.asyncio
async def test_stand_in_resolves_env_volumes_restarts_and_stops_pods(cluster_factory, tmp_path):
    async with cluster_factory() as c, stand_in(c, tmp_path) as kubelet:
        await create(c, "configmaps", {"metadata": {"name": "cfg", "namespace": NS}, "data": {"key.txt": "from the ConfigMap", "mode": "fast"}})
        await create(c, "pods", pod("recorder", RECORDER, "/etc/cfg/key.txt", "$(MODE)", "$$(MODE)", "--out=/out/x", env=RECORDER_ENV,
                                    restartPolicy="OnFailure", serviceAccountName="robot"))
        # Its Secret does not exist yet: the container waits, as on a node.
        await until(lambda: waiting_reason(c, "recorder") == "CreateContainerConfigError", "CreateContainerConfigError", kubelet)
        assert c.get(PODS, "recorder")["status"]["phase"] == "Pending"
        await create(c, "secrets", {"metadata": {"name": "late", "namespace": NS}, "data": {"password": base64.b64encode(b"s3cr$t").decode()}})
        await until(lambda: pod_phase(c, "recorder") == "Succeeded", "the recorder to succeed on its second run", kubelet)
        status = c.get(PODS, "recorder")["status"]["containerStatuses"][0]
        assert status["restartCount"] == 1 and status["lastState"]["terminated"]["exitCode"] == 3
        assert status["state"]["terminated"]["exitCode"] == 0 and status["state"]["terminated"]["reason"] == "Completed"
        box, out, first, second = recorded_runs(kubelet, "recorder")
        seen = second["env"]
        assert seen["PASSWORD"] == "s3cr$t" and seen["URL"] == "redis://:s3cr$t@host/0" and seen["MODE"] == "fast"
        assert seen["POD"] == "recorder" and seen["OUT"] == str(out) and seen["PORT"] == str(box.ports[9090]) != "9090"
        assert seen["SVC"] == f"http://127.0.0.1:{kubelet.proxies[NS, 'api'].port}/v1"
        assert second["argv"] == [str(box.volumes["cfg"] / "key.txt"), "fast", "$(MODE)", f"--out={out}/x"]
        assert second["cfg"] == "from the ConfigMap" and second["cwd"] == str(box.root / "cwd")
        assert "KUBERNETES_SERVICE_HOST" not in seen and "robot" in Path(seen["KUBECONFIG"]).read_text()
        assert first["env"] == {**seen, "KUBECONFIG": first["env"]["KUBECONFIG"]}
        # Never restarts a failure; Failed, with the exit code.
        await run_pod(c, kubelet, pod("failing", "import sys; sys.exit(4)", restartPolicy="Never"), "Failed")
        assert exit_code(c.get(PODS, "failing")) == 4 and c.get(PODS, "failing")["status"]["containerStatuses"][0]["restartCount"] == 0
        # Deletion: SIGTERM, and SIGKILL after the grace period for a process that ignores it.
        await create(c, "pods", pod("polite", SLEEPER, restartPolicy="Always"))
        await create(c, "pods", pod("stubborn", SLEEPER, "ignore", restartPolicy="Always", terminationGracePeriodSeconds=1))
        for name in ("polite", "stubborn"):
            await until_up(c, kubelet, name)
            status, _ = await c.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}")
            assert status == 200
        for name, code in (("polite", 0), ("stubborn", 137)):
            runtime = await until_stopped(kubelet, name)
            assert runtime.containers["main"].state["terminated"]["exitCode"] == code, name
        assert (kubelet.pod(NS, "polite").box.volumes["out"] / "sigterm").exists()
        assert not kubelet.errors, kubelet.errors


#: A function image's default command: answers every request with what it sees (a POST first sleeps its body's seconds).
ECHO = """
import http.server, json, os, pathlib, sys, time
class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.answer()
    def do_POST(self):
        time.sleep(float(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or 0))
        self.answer()
    def answer(self):
        secrets = {p.name: p.read_text() for p in pathlib.Path(os.environ["SECRETS_DIR"]).iterdir()}
        body = json.dumps({"path": self.path, "copy": os.environ["HOSTNAME"], "greeting": os.environ.get("GREETING"),
                           "secrets": secrets, "tmp": os.environ.get("TMPDIR")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"""
ECHO_SECRET = {"metadata": {"name": "creds", "namespace": FN_NS}, "data": {"token": base64.b64encode(b"s3cret").decode()}}
#: The Function that serves ECHO: two copies, with an environment and a secret.
ECHO_FUNCTION = {
    "apiVersion": "openfaas.com/v1", "kind": "Function", "metadata": {"name": "echo", "namespace": FN_NS},
    "spec": {
        "name": "echo", "image": "echo:1", "labels": {"com.openfaas.scale.min": "2", "com.openfaas.scale.max": "2"},
        "environment": {"GREETING": "hi", "SECRETS_DIR": "/var/openfaas/secrets", "max_inflight": "1"},
        "secrets": ["creds"], "readOnlyRootFilesystem": True,
    },
}
#: A pod that records its environment.
ENV_RECORDER = "import json, os, pathlib; pathlib.Path(os.environ['OUT'], 'env').write_text(json.dumps(dict(os.environ)))"


def function_copies(kubelet: Kubelet) -> list[Backend]:
    """The live copies of every OpenFaaS Function."""
    return [b for dep in kubelet.openfaas.functions.values() for b in dep.live()]


async def patch_function(c: Cluster, name: str, spec: dict[str, Any]) -> None:
    status, answer = await c.call("PATCH", f"/apis/openfaas.com/v1/namespaces/{FN_NS}/functions/{name}", {"spec": spec})
    assert status == 200, answer


async def env_seen_by_a_pod(c: Cluster, kubelet: Kubelet, name: str, env: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Run an ENV_RECORDER pod (and the ConfigMap every `pod` mounts) to Succeeded: the environment it was given."""
    await create(c, "configmaps", {"metadata": {"name": "cfg", "namespace": NS}, "data": {}})
    await run_pod(c, kubelet, pod(name, ENV_RECORDER, env=env, restartPolicy="Never"), "Succeeded")
    return json.loads((out_dir(kubelet, name) / "env").read_text())


@contextlib.asynccontextmanager
async def gateway_client(gateway: str) -> AsyncIterator[Callable[..., Awaitable[tuple[int, Any]]]]:
    """`call(path, body="0")`: a POST to the gateway; the status, and the JSON answer (the text of an error)."""
    async with aiohttp.ClientSession() as session:
        async def call(path: str, body: str = "0") -> tuple[int, Any]:
            async with session.post(gateway + path, data=body) as resp:
                return resp.status, await resp.json(content_type=None) if resp.status == 200 else await resp.text()

        yield call


@pytest.mark.asyncio
async def test_stand_in_plays_openfaas_functions_behind_the_gateway(cluster_factory, tmp_path):
    images = {"echo:1": Image(entrypoint=("python", "-c", ECHO), cmd=("8080",))}
    async with cluster_factory(openfaas=True) as c, stand_in(c, tmp_path, openfaas=True, images=images) as kubelet:
        status, _ = await c.call("POST", f"/api/v1/namespaces/{FN_NS}/secrets", ECHO_SECRET)
        assert status == 201
        status, _ = await c.call("POST", f"/apis/openfaas.com/v1/namespaces/{FN_NS}/functions", ECHO_FUNCTION)
        assert status == 201
        copies = lambda: function_copies(kubelet)  # noqa: E731
        await until(lambda: len(copies()) == 2 and all(b.ready for b in copies()), "two ready copies", kubelet)
        # A pod reaches the gateway under its short cluster name; other two-label hosts are left alone.
        env = [{"name": "GATEWAY", "value": "http://gateway.openfaas:8080/function/echo"}, {"name": "OTHER", "value": "http://example.com/x"}]
        seen, gateway = await env_seen_by_a_pod(c, kubelet, "client", env), f"http://127.0.0.1:{kubelet.openfaas.gateway.port}"
        assert seen["GATEWAY"] == f"{gateway}/function/echo" and seen["OTHER"] == "http://example.com/x"
        async with gateway_client(gateway) as call:
            # The /function/NAME[.NS] prefix is stripped; the copy has the Function's environment and secret files.
            status, answer = await call("/function/echo.openfaas-fn/hello?x=1")
            assert status == 200 and answer["path"] == "/hello?x=1", answer
            assert answer["greeting"] == "hi" and answer["secrets"] == {"token": "s3cret"}
            copy = next(r for r in kubelet.openfaas.runtimes() if r.name == answer["copy"])
            assert answer["tmp"] == str(copy.box.volumes["temp"])
            assert (await call("/function/echo"))[1]["path"] == "/"  # the functions namespace by default
            assert (await call("/function/missing"))[0] == 404
            # max_inflight 1: two requests at once go to two idle copies.
            both = await asyncio.gather(call("/function/echo", "1"), call("/function/echo", "1"))
            assert {a["copy"] for _, a in both} == {r.name for r in kubelet.openfaas.runtimes()}
        # A scale label changes the copies, anything else redeploys; a deleted Function stops them.
        await patch_function(c, "echo", {"labels": {"com.openfaas.scale.min": "1"}})
        await until(lambda: len(copies()) == 1, "one copy", kubelet)
        first = copies()[0].runtime
        await patch_function(c, "echo", {"environment": {"GREETING": "hello"}})
        await until(lambda: len(copies()) == 1 and copies()[0].runtime is not first and copies()[0].ready, "the redeployed copy", kubelet)
        await until(first.task.done, "the old copy to stop", kubelet)
        await c.call("DELETE", f"/apis/openfaas.com/v1/namespaces/{FN_NS}/functions/echo")
        await until(lambda: all(r.task.done() for r in kubelet.openfaas.runtimes()), "every copy to stop", kubelet)
