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
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterator, Sequence

import aiohttp
import pytest


from kubelet import Image, Kubelet, expand
from test_operator_kmock import NS, PODS, Cluster, cluster_factory, operator_env, running_operator  # noqa: F401  (fixtures)


#: Seconds before a wait gives up (a failure, never a timing assertion); the machine may be busy.
E2E_WAIT = float(os.environ.get("MLLESS_E2E_WAIT", "180"))
KUBECTL = shutil.which("kubectl")
TERMINAL = ("Succeeded", "Failed")


async def assert_succeeded(c: Any, kubelet: Kubelet, name: str) -> dict[str, Any]:
    """The job ended on its stop rule with a model, and its status says so with the supervisor's progress; its summary."""
    runtime = kubelet.pod(NS, f"{name}-supervisor")
    assert runtime is not None and runtime.box is not None
    summary = json.loads((runtime.box.volumes["run"] / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "max steps" and summary["validation_loss"] is not None
    status = await job_status(c, name)
    assert status["phase"] == "Succeeded" and status.get("completionTime")
    assert next(x for x in status["conditions"] if x["type"] == "Succeeded")["status"] == "True"
    # The supervisor mirrors its progress into the status (mlless.runtime.kube.KubePlatform).
    assert status.get("step", 0) > 0, f"status.step is not set: the supervisor did not mirror its progress; status {status}"
    assert isinstance(status.get("trainLoss"), (int, float)) and math.isfinite(status["trainLoss"]), status
    return summary


def training_job(name: str, dataset: Path, redis_url: str, amqp_url: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mlless.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "workers": 2,
            "model": {"type": "pmf"},
            "dataset": {"uri": str(dataset.resolve())},
            "stop": {"maxSteps": 30},
            "redis": {"url": redis_url},
            "rabbitmq": {"url": amqp_url},
            **spec,
        },
    }


async def kubectl(*args: str, stdin: str | None = None) -> str:
    """kubectl against the emulator (operator_env's kubeconfig); run as a subprocess so the loop keeps serving it."""
    assert KUBECTL is not None
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "--kubeconfig", os.environ["KUBECONFIG"], *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), timeout=120)
    assert proc.returncode == 0, f"kubectl {' '.join(args)} exited {proc.returncode}: {err.decode()}"
    return out.decode()


async def apply(c: Cluster, doc: dict[str, Any]) -> None:
    """`kubectl apply --validate=false -f -` (the emulator serves no /openapi); a POST where kubectl is missing."""
    if KUBECTL is None:
        await c.apply(doc)
    else:
        out = await kubectl("apply", "--validate=false", "-f", "-", stdin=json.dumps(doc))
        assert "created" in out, out


async def job_status(c: Cluster, name: str) -> dict[str, Any]:
    """The TrainingJob's status as `kubectl get tj NAME -o json` shows it."""
    if KUBECTL is None:
        return dict(c.job(name).get("status") or {})
    return json.loads(await kubectl("get", "trainingjobs.mlless.io", name, "-o", "json")).get("status") or {}


@contextlib.contextmanager
def explained(kubelet: Kubelet) -> Iterator[None]:
    """A failed assertion carries the pods' statuses and the tails of their logs."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n\n{kubelet.report()}") from None


async def until(check: Any, what: str, kubelet: Kubelet) -> Any:
    """Poll `check` until it is truthy; fail early if a pod crash-loops or cannot run."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + E2E_WAIT
    while True:
        value = check()
        if value:
            return value
        assert not kubelet.errors, kubelet.errors[0]
        for runtime in kubelet.runtimes():
            assert runtime.failure is None, f"{runtime.name} cannot run: {runtime.failure}"
            looping = [s.name for s in runtime.containers.values() if s.restart_count >= 3]
            assert not looping, f"{runtime.name}: container {looping} restarted {runtime.containers[looping[0]].restart_count} times"
        if loop.time() > deadline:
            raise AssertionError(f"gave up after {E2E_WAIT:g}s waiting for {what}")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def running(c: Cluster, tmp_path: Path, **options: Any) -> Any:
    """The operator and the kubelet stand-in (stopped in reverse: the kubelet first); `options` go to `Kubelet`."""
    async with running_operator(), Kubelet(c.url, tmp_path / "kubelet", **options) as kubelet:
        yield kubelet
        assert not kubelet.errors, kubelet.errors


def pod_phase(c: Cluster, name: str) -> str | None:
    return ((c.get(PODS, name) or {}).get("status") or {}).get("phase")


def exit_code(pod: dict[str, Any]) -> int | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return ((statuses[0].get("state") or {}).get("terminated") or {}).get("exitCode")


@pytest.mark.asyncio
@pytest.mark.services
@pytest.mark.slow
async def test_pod_backend_trains_to_succeeded_with_the_final_loss(cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    name = f"e2e-{uuid.uuid4().hex[:6]}"  # the job id names Redis keys and queues on the shared servers
    doc = training_job(name, movielens_dir, redis_url, amqp_url, function={"backend": "pod"})
    async with cluster_factory() as c, running(c, tmp_path) as kubelet:
        with explained(kubelet):
            await apply(c, doc)
            await until(lambda: c.job(name).get("status", {}).get("phase") in TERMINAL, "the job to finish", kubelet)
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
async def test_knative_backend_trains_to_succeeded(cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    doc = training_job(name, movielens_dir, redis_url, amqp_url, function={"backend": "knative", "timeoutSeconds": 120})
    async with cluster_factory(knative=True) as c, running(c, tmp_path, knative=True) as kubelet:
        with explained(kubelet):
            await apply(c, doc)
            await until(lambda: c.job(name).get("status", {}).get("phase") in TERMINAL, "the job to finish", kubelet)
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


@pytest.mark.asyncio
async def test_stand_in_resolves_env_volumes_restarts_and_stops_pods(cluster_factory, tmp_path):
    async with cluster_factory() as c, Kubelet(c.url, tmp_path / "kubelet") as kubelet:
        with explained(kubelet):
            post = lambda path, body: c.call("POST", f"/api/v1/namespaces/{NS}/{path}", body)  # noqa: E731
            await post("configmaps", {"metadata": {"name": "cfg", "namespace": NS}, "data": {"key.txt": "from the ConfigMap", "mode": "fast"}})
            env = [
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "late", "key": "password"}}},
                {"name": "URL", "value": "redis://:$(PASSWORD)@host/0"},
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "PORT", "value": "9090"},
                {"name": "SVC", "value": "http://api.team.svc.cluster.local/v1"},
            ]
            await post("pods", pod("recorder", RECORDER, "/etc/cfg/key.txt", "$(MODE)", "$$(MODE)", "--out=/out/x", env=env,
                                   restartPolicy="OnFailure", serviceAccountName="robot"))
            # Its Secret does not exist yet: the container waits, as on a node.
            waiting = lambda: ((c.get(PODS, "recorder") or {}).get("status") or {}).get("containerStatuses", [{}])[0].get("state", {}).get("waiting", {})  # noqa: E731
            await until(lambda: waiting().get("reason") == "CreateContainerConfigError", "CreateContainerConfigError", kubelet)
            assert c.get(PODS, "recorder")["status"]["phase"] == "Pending"
            await post("secrets", {"metadata": {"name": "late", "namespace": NS}, "data": {"password": base64.b64encode(b"s3cr$t").decode()}})
            await until(lambda: pod_phase(c, "recorder") == "Succeeded", "the recorder to succeed on its second run", kubelet)

            status = c.get(PODS, "recorder")["status"]["containerStatuses"][0]
            assert status["restartCount"] == 1 and status["lastState"]["terminated"]["exitCode"] == 3
            assert status["state"]["terminated"]["exitCode"] == 0 and status["state"]["terminated"]["reason"] == "Completed"
            box = kubelet.pod(NS, "recorder").box
            out = box.volumes["out"]
            first, second = (json.loads((out / f"run-{i}").read_text()) for i in (0, 1))
            seen = second["env"]
            assert seen["PASSWORD"] == "s3cr$t" and seen["URL"] == "redis://:s3cr$t@host/0" and seen["MODE"] == "fast"
            assert seen["POD"] == "recorder" and seen["OUT"] == str(out) and seen["PORT"] == str(box.ports[9090]) != "9090"
            assert seen["SVC"] == f"http://127.0.0.1:{kubelet.proxies[NS, 'api'].port}/v1"
            assert second["argv"] == [str(box.volumes["cfg"] / "key.txt"), "fast", "$(MODE)", f"--out={out}/x"]
            assert second["cfg"] == "from the ConfigMap" and second["cwd"] == str(box.root / "cwd")
            assert "KUBERNETES_SERVICE_HOST" not in seen and "robot" in Path(seen["KUBECONFIG"]).read_text()
            assert first["env"] == {**seen, "KUBECONFIG": first["env"]["KUBECONFIG"]}

            # Never restarts a failure; Failed, with the exit code.
            await post("pods", pod("failing", "import sys; sys.exit(4)", restartPolicy="Never"))
            await until(lambda: pod_phase(c, "failing") == "Failed", "the failing pod to fail", kubelet)
            assert exit_code(c.get(PODS, "failing")) == 4 and c.get(PODS, "failing")["status"]["containerStatuses"][0]["restartCount"] == 0

            # Deletion: SIGTERM, and SIGKILL after the grace period for a process that ignores it.
            await post("pods", pod("polite", SLEEPER, restartPolicy="Always"))
            await post("pods", pod("stubborn", SLEEPER, "ignore", restartPolicy="Always", terminationGracePeriodSeconds=1))
            for name in ("polite", "stubborn"):
                up = lambda: (r := kubelet.pod(NS, name)) and r.box and (r.box.volumes["out"] / "up").exists()  # noqa: E731
                await until(up, f"{name} up", kubelet)
                await until(lambda: pod_phase(c, name) == "Running", f"{name} Running", kubelet)
                status, _ = await c.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}")
                assert status == 200
            for name, code in (("polite", 0), ("stubborn", 137)):
                runtime = kubelet.pod(NS, name)
                await until(runtime.task.done, f"{name} stopped", kubelet)
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
#: A pod that records its environment.
ENV_RECORDER = "import json, os, pathlib; pathlib.Path(os.environ['OUT'], 'env').write_text(json.dumps(dict(os.environ)))"


@pytest.mark.asyncio
async def test_stand_in_plays_openfaas_functions_behind_the_gateway(cluster_factory, tmp_path):
    images = {"echo:1": Image(entrypoint=("python", "-c", ECHO), cmd=("8080",))}
    async with cluster_factory(openfaas=True) as c, Kubelet(c.url, tmp_path / "kubelet", openfaas=True, images=images) as kubelet:
        with explained(kubelet):
            fn_ns = "openfaas-fn"
            status, _ = await c.call("POST", f"/api/v1/namespaces/{fn_ns}/secrets",
                                     {"metadata": {"name": "creds", "namespace": fn_ns}, "data": {"token": base64.b64encode(b"s3cret").decode()}})
            assert status == 201
            function = {
                "apiVersion": "openfaas.com/v1", "kind": "Function", "metadata": {"name": "echo", "namespace": fn_ns},
                "spec": {
                    "name": "echo", "image": "echo:1", "labels": {"com.openfaas.scale.min": "2", "com.openfaas.scale.max": "2"},
                    "environment": {"GREETING": "hi", "SECRETS_DIR": "/var/openfaas/secrets", "max_inflight": "1"},
                    "secrets": ["creds"], "readOnlyRootFilesystem": True,
                },
            }
            status, _ = await c.call("POST", f"/apis/openfaas.com/v1/namespaces/{fn_ns}/functions", function)
            assert status == 201
            copies = lambda: [b for dep in kubelet.openfaas.functions.values() for b in dep.live()]  # noqa: E731
            await until(lambda: len(copies()) == 2 and all(b.ready for b in copies()), "two ready copies", kubelet)

            # A pod reaches the gateway under its short cluster name; other two-label hosts are left alone.
            await c.call("POST", f"/api/v1/namespaces/{NS}/configmaps", {"metadata": {"name": "cfg", "namespace": NS}, "data": {}})
            env = [{"name": "GATEWAY", "value": "http://gateway.openfaas:8080/function/echo"}, {"name": "OTHER", "value": "http://example.com/x"}]
            await c.call("POST", f"/api/v1/namespaces/{NS}/pods", pod("client", ENV_RECORDER, env=env, restartPolicy="Never"))
            await until(lambda: pod_phase(c, "client") == "Succeeded", "the client pod", kubelet)
            seen = json.loads((kubelet.pod(NS, "client").box.volumes["out"] / "env").read_text())
            gateway = f"http://127.0.0.1:{kubelet.openfaas.gateway.port}"
            assert seen["GATEWAY"] == f"{gateway}/function/echo" and seen["OTHER"] == "http://example.com/x"

            async with aiohttp.ClientSession() as session:
                async def call(path: str, body: str = "0") -> tuple[int, Any]:
                    async with session.post(gateway + path, data=body) as resp:
                        return resp.status, await resp.json(content_type=None) if resp.status == 200 else await resp.text()

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
            await c.call("PATCH", f"/apis/openfaas.com/v1/namespaces/{fn_ns}/functions/echo", {"spec": {"labels": {"com.openfaas.scale.min": "1"}}})
            await until(lambda: len(copies()) == 1, "one copy", kubelet)
            first = copies()[0].runtime
            await c.call("PATCH", f"/apis/openfaas.com/v1/namespaces/{fn_ns}/functions/echo", {"spec": {"environment": {"GREETING": "hello"}}})
            await until(lambda: len(copies()) == 1 and copies()[0].runtime is not first and copies()[0].ready, "the redeployed copy", kubelet)
            await until(first.task.done, "the old copy to stop", kubelet)
            await c.call("DELETE", f"/apis/openfaas.com/v1/namespaces/{fn_ns}/functions/echo")
            await until(lambda: all(r.task.done() for r in kubelet.openfaas.runtimes()), "every copy to stop", kubelet)
