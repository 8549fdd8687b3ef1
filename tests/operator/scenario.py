"""Shared scenario helpers of the operator tests: the mechanics, so that each test reads as what it checks.

- `Cluster`: the kmock emulator as the tests see it (apply a job, read its children, status and events) and the
  steps of a scenario against it (`created`, `until_phase`, `supervisor_to`, `scale_to`, `until_event`, ...);
- `running_operator`: the real Kopf operator, in this event loop;
- the end-to-end mechanics (the kubelet stand-in runs the pods): `running`, `launched` and `JobUnderTest`, kubectl,
  and what the tests read off the stand-in (`metrics_rows`, `log_text`, `exit_codes`, ...);
- `poll`: the one polling loop behind every wait (`Cluster.until`, `until`).

The fixtures that build a `Cluster` (`operator_env`, `cluster_factory`, `e2e`) are in conftest.py.
Waits poll with a generous timeout (MLLESS_TEST_WAIT, MLLESS_E2E_WAIT seconds); nothing asserts on elapsed time.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import runpy
import shutil
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, NamedTuple

import aiohttp
import kmock
import kopf

import mlless_operator.main
from mlless.contract import KIND

from kmock_emulator import Emulator  # tests/operator/ is on sys.path (rootdir-relative test modules)
from kubelet import Kubelet, PodRuntime

NS = "team"
FN_NS = "openfaas-fn"
TJ = kmock.resource("mlless.io/v1alpha1/trainingjobs")
PODS = kmock.resource("v1/pods")
SECRETS = kmock.resource("v1/secrets")
KSVC = kmock.resource("serving.knative.dev/v1/services")
FUNCTIONS = kmock.resource("openfaas.com/v1/functions")
EVENTS = kmock.resource("v1/events")
WAIT = float(os.environ.get("MLLESS_TEST_WAIT", "30"))  # seconds before a wait gives up (a failure, never a timing assertion)
#: Seconds before an end-to-end wait gives up (a failure, never a timing assertion); the machine may be busy.
E2E_WAIT = float(os.environ.get("MLLESS_E2E_WAIT", "180"))
KUBECTL = shutil.which("kubectl")
TERMINAL = ("Succeeded", "Failed")
#: What a pod-backend job holds while it is suspended (its state), and what it adds while it runs.
STATE_CHILDREN = {
    ("/v1/secrets", "ml-credentials"), ("/v1/configmaps", "ml-job"), ("apps/v1/statefulsets", "ml-redis"),
    ("apps/v1/statefulsets", "ml-rabbitmq"), ("/v1/services", "ml-redis"), ("/v1/services", "ml-rabbitmq"),
    ("networking.k8s.io/v1/networkpolicies", "ml-services"),
}
POD_JOB_CHILDREN = STATE_CHILDREN | {
    ("/v1/serviceaccounts", "ml-supervisor"), ("rbac.authorization.k8s.io/v1/roles", "ml-supervisor"),
    ("rbac.authorization.k8s.io/v1/rolebindings", "ml-supervisor"), ("/v1/services", "ml-supervisor"),
    ("/v1/pods", "ml-supervisor"), ("/v1/pods", "ml-worker-0"), ("/v1/pods", "ml-worker-1"), ("/v1/pods", "ml-worker-2"),
}


async def poll(check: Callable[[], Any], what: str, timeout: float, interval: float, guard: Callable[[], None] | None = None) -> Any:
    """Call `check` until it is truthy and return its value; `guard` may fail early; give up after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if guard is not None:
            guard()
        if loop.time() > deadline:
            raise AssertionError(f"gave up after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


# ---- the emulated cluster ------------------------------------------------------------------------


def manifest(name: str = "ml", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mlless.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"workers": 3, "model": {"type": "pmf"}, "dataset": {"uri": "s3://bucket/ml"}, **spec},
    }


class Cluster:
    def __init__(self, emu: Emulator, url: str) -> None:
        self.emu = emu
        self.url = url.rstrip("/")

    async def call(self, method: str, path: str, body: Any = None, content_type: str = "application/merge-patch+json") -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session:
            headers = {"Content-Type": "application/json" if method == "POST" else content_type}
            async with session.request(method, self.url + path, json=body, headers=headers) as resp:
                return resp.status, await resp.json(content_type=None)

    async def apply(self, doc: dict[str, Any]) -> dict[str, Any]:
        status, body = await self.call("POST", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingjobs", doc)
        assert status == 201, body
        return body

    async def patch_job(self, name: str, body: dict[str, Any], subresource: str = "") -> None:
        status, answer = await self.call("PATCH", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingjobs/{name}{subresource}", body)
        assert status == 200, answer

    def get(self, resource: kmock.resource, name: str, namespace: str = NS) -> dict[str, Any] | None:
        key = (resource, namespace, name)
        if key not in self.emu.objects or self.emu.objects[key].deleted:
            return None
        return self.emu.objects[key].raw

    def names(self, resource: kmock.resource, namespace: str = NS) -> set[str]:
        return {name for (res, ns, name), obj in self.emu.objects.items() if res == resource and ns == namespace and not obj.deleted}

    def children(self) -> set[tuple[str, str, str]]:
        """Every live object except TrainingJobs and Events."""
        return {
            (f"{res.group}/{res.version}/{res.plural}", ns, name)
            for (res, ns, name), obj in self.emu.objects.items()
            if not obj.deleted and res.plural not in ("trainingjobs", "events")
        }

    def child_objects(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(resource, name, object) of every child (`children`)."""
        for res, ns, name in self.children():
            yield res, name, self.emu.objects[kmock.resource(res), ns, name].raw

    async def until(self, check: Callable[[], Any], what: str) -> Any:
        return await poll(check, what, WAIT, 0.05)

    def job(self, name: str = "ml") -> dict[str, Any]:
        obj = self.get(TJ, name)
        assert obj is not None, f"TrainingJob {name} is gone"
        return obj

    def condition(self, type_: str, name: str = "ml") -> dict[str, Any] | None:
        obj = self.get(TJ, name)
        return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == type_), None)

    def phase(self, name: str = "ml") -> str | None:
        return ((self.get(TJ, name) or {}).get("status") or {}).get("phase")

    def events(self, name: str = "ml", kind: str = KIND) -> dict[str, str]:
        """reason -> message of the Events posted about the `kind` named `name` (the newest per reason)."""
        found = {}
        for (res, _, _), obj in self.emu.objects.items():
            if res == EVENTS and not obj.deleted:
                ref = obj.raw.get("involvedObject") or {}
                if ref.get("kind") == kind and ref.get("name") == name:
                    found[obj.raw.get("reason")] = obj.raw.get("message")
        return found

    def secret_value(self, name: str, key: str, namespace: str = NS) -> str:
        secret = self.get(SECRETS, name, namespace)
        assert secret is not None, f"Secret {name} is missing"
        return base64.b64decode(secret["data"][key]).decode()

    def set_pod_phase(self, name: str, phase: str) -> None:
        """What the kubelet would report."""
        self.set_pod_status(name, {"phase": phase})

    def set_pod_status(self, name: str, status: dict[str, Any]) -> None:
        """What the kubelet (or the scheduler) would report: merged into the pod's status, lists replaced whole."""
        self.emu.objects[PODS, NS, name].patch({"status": status})

    # ---- the steps of a scenario ----

    async def created(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Apply the job, wait for its Created condition, and return it."""
        name = doc["metadata"]["name"]
        await self.apply(doc)
        await self.until(lambda: self.condition("Created", name), "the Created condition")
        return self.job(name)

    async def until_phase(self, phase: str, name: str = "ml") -> None:
        await self.until(lambda: self.phase(name) == phase, f"phase {phase}")

    async def until_event(self, *reasons: str, name: str = "ml") -> None:
        """The Events of each reason posted about the job."""
        await self.until(lambda: set(reasons) <= set(self.events(name)), f"the {', '.join(reasons)} event(s)")

    async def supervisor_to(self, pod_phase: str, job_phase: str | None = None, name: str = "ml") -> None:
        """The supervisor pod reaches `pod_phase`; wait for the job's phase to follow (`job_phase`, by default the same)."""
        self.set_pod_phase(f"{name}-supervisor", pod_phase)
        await self.until_phase(job_phase or pod_phase, name)

    async def running(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Apply the job, and once it is created its supervisor runs: the job is Running."""
        job = await self.created(doc)
        await self.supervisor_to("Running", name=job["metadata"]["name"])
        return job

    async def scale_to(self, workers: int, pods: set[str], subresource: bool = False, name: str = "ml") -> None:
        """Scale the job (by its scale subresource, as `kubectl scale`, or spec.workers) and wait for exactly `pods`
        and for status.workers to follow."""
        if subresource:
            await self.patch_job(name, {"spec": {"replicas": workers}}, "/scale")
        else:
            await self.patch_job(name, {"spec": {"workers": workers}})
        await self.until(lambda: self.names(PODS) == pods, f"scaling to {workers} workers")
        await self.until(lambda: self.job(name)["status"].get("workers") == workers, f"status.workers {workers}")

    async def suspend(self, name: str = "ml") -> dict[str, Any]:
        """Set spec.suspend; return the Suspended condition once it is there."""
        await self.patch_job(name, {"spec": {"suspend": True}})
        return await self.until(lambda: self.condition("Suspended", name), "the Suspended condition")

    async def supervisor_checkpoints(self, step: int, name: str = "ml") -> None:
        """The suspending supervisor saved the model at `step`, said so, and exited 0: wait for phase Suspended."""
        await self.patch_job(name, {"status": {"checkpointStep": step}}, "/status")
        await self.supervisor_to("Succeeded", "Suspended", name)

    async def resume(self, name: str = "ml") -> None:
        """Unset spec.suspend; wait for the new session's phase Pending."""
        await self.patch_job(name, {"spec": {"suspend": False}})
        await self.until_phase("Pending", name)


def declare(emu: Emulator, knative: bool = False, openfaas: bool = False) -> None:
    emu.resources.load_bundled()
    emu.resources["mlless.io/v1alpha1/trainingjobs"] = kmock.ResourceInfo(
        kind="TrainingJob", singular="trainingjob", namespaced=True, shortnames={"tj"},
        verbs={"get", "list", "watch", "create", "patch", "delete"}, subresources={"status", "scale"},
    )
    emu.resources["mlless.io/v1alpha1/trainingsweeps"] = kmock.ResourceInfo(
        kind="TrainingSweep", singular="trainingsweep", namespaced=True, shortnames={"tsw"},
        verbs={"get", "list", "watch", "create", "patch", "delete"}, subresources={"status"},
    )
    if knative:
        emu.resources["serving.knative.dev/v1/services"] = kmock.ResourceInfo(
            kind="Service", singular="service", namespaced=True, shortnames={"ksvc"},
            verbs={"get", "list", "watch", "create", "patch", "delete"}, subresources={"status"},
        )
    if openfaas:
        emu.resources["openfaas.com/v1/functions"] = kmock.ResourceInfo(
            kind="Function", singular="function", namespaced=True, verbs={"get", "list", "watch", "create", "patch", "delete"},
        )


@contextlib.asynccontextmanager
async def running_operator() -> AsyncIterator[None]:
    """Kopf in this event loop with a fresh registry, filled by executing main.py as `kopf run` would."""
    registry = kopf.OperatorRegistry()
    previous = kopf.get_default_registry()
    kopf.set_default_registry(registry)
    try:
        runpy.run_path(mlless_operator.main.__file__, run_name="mlless_operator_main_under_test")
    finally:
        kopf.set_default_registry(previous)
    stop = asyncio.Event()
    task = asyncio.create_task(kopf.operator(registry=registry, standalone=True, clusterwide=True, stop_flag=stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=WAIT)


def owned_by(obj: dict[str, Any], job: dict[str, Any]) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(r["uid"] == job["metadata"]["uid"] and r["kind"] == "TrainingJob" and r.get("controller") for r in refs)


def env(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}


# ---- end to end: the kubelet stand-in runs the pods ----------------------------------------------


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


def cached(doc: dict[str, Any]) -> dict[str, Any]:
    """The job with spec.dataset.cacheBatches: the workers keep the sample in memory (fast, steady steps)."""
    doc["spec"]["dataset"]["cacheBatches"] = True
    return doc


def unique(prefix: str) -> str:
    """A job name of its own: the job id names Redis keys and queues on the shared servers."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


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
        return status(c, name)
    return json.loads(await kubectl("get", "trainingjobs.mlless.io", name, "-o", "json")).get("status") or {}


async def scale(c: Cluster, name: str, replicas: int) -> None:
    """`kubectl scale trainingjobs.mlless.io/NAME --replicas=N` (a PATCH of the scale subresource without kubectl)."""
    if KUBECTL is None:
        await c.patch_job(name, {"spec": {"replicas": replicas}}, "/scale")
        return
    out = await kubectl("scale", f"trainingjobs.mlless.io/{name}", f"--replicas={replicas}")
    assert "scaled" in out, out


async def patch_spec(c: Cluster, name: str, spec: dict[str, Any]) -> None:
    """`kubectl patch trainingjobs.mlless.io NAME --type=merge -p '{"spec": ...}'`."""
    if KUBECTL is None:
        await c.patch_job(name, {"spec": spec})
        return
    out = await kubectl("patch", "trainingjobs.mlless.io", name, "--type=merge", "-p", json.dumps({"spec": spec}))
    assert "patched" in out, out


@contextlib.contextmanager
def explained(kubelet: Kubelet) -> Iterator[None]:
    """A failed assertion carries the pods' statuses and the tails of their logs."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n\n{kubelet.report()}") from None


def healthy(kubelet: Kubelet) -> None:
    """Fail at once if the stand-in failed, or a pod crash-loops or cannot run."""
    assert not kubelet.errors, kubelet.errors[0]
    for runtime in kubelet.runtimes():
        assert runtime.failure is None, f"{runtime.name} cannot run: {runtime.failure}"
        looping = [s.name for s in runtime.containers.values() if s.restart_count >= 3]
        assert not looping, f"{runtime.name}: container {looping} restarted {runtime.containers[looping[0]].restart_count} times"


async def until(check: Any, what: str, kubelet: Kubelet) -> Any:
    """Poll `check` until it is truthy; fail early if a pod crash-loops or cannot run."""
    return await poll(check, what, E2E_WAIT, 0.2, guard=lambda: healthy(kubelet))


@contextlib.asynccontextmanager
async def running(c: Cluster, tmp_path: Path, **options: Any) -> Any:
    """The operator and the kubelet stand-in (stopped in reverse: the kubelet first); `options` go to `Kubelet`."""
    async with running_operator(), Kubelet(c.url, tmp_path / "kubelet", **options) as kubelet:
        yield kubelet
        assert not kubelet.errors, kubelet.errors


@contextlib.asynccontextmanager
async def stand_in(c: Cluster, tmp_path: Path, **options: Any) -> AsyncIterator[Kubelet]:
    """The kubelet stand-in alone (no operator), its failures explained."""
    async with Kubelet(c.url, tmp_path / "kubelet", **options) as kubelet:
        with explained(kubelet):
            yield kubelet


def pod_phase(c: Cluster, name: str) -> str | None:
    return ((c.get(PODS, name) or {}).get("status") or {}).get("phase")


def exit_code(pod: dict[str, Any]) -> int | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return ((statuses[0].get("state") or {}).get("terminated") or {}).get("exitCode")


def status(c: Cluster, name: str) -> dict[str, Any]:
    return dict(c.job(name).get("status") or {})


def phase(c: Cluster, name: str) -> str | None:
    return status(c, name).get("phase")


def condition(c: Cluster, name: str, type_: str) -> dict[str, Any]:
    found = c.condition(type_, name)
    assert found is not None, f"no {type_} condition: {status(c, name)}"
    return found


def while_running(c: Cluster, name: str, check: Callable[[], Any], what: str) -> Callable[[], Any]:
    """`check`, failing at once (rather than at the timeout) if the job finishes before it holds."""

    def probe() -> Any:
        value = check()
        if not value and phase(c, name) in TERMINAL:
            raise AssertionError(
                f"the job ended ({phase(c, name)}, status {status(c, name)}) before {what}; "
                "on a fast machine, raise its MLLESS_E2E_* step count"
            )
        return value

    return probe


def supervisors(kubelet: Kubelet, name: str) -> list[PodRuntime]:
    """Every incarnation of the job's supervisor pod the stand-in ran, oldest first."""
    return [r for r in kubelet.pods.values() if r.namespace == NS and r.name == f"{name}-supervisor"]


def run_dir(runtime: PodRuntime) -> Path:
    """The supervisor's `--out` directory (its `run` emptyDir, on the host)."""
    assert runtime.box is not None, f"{runtime.name} has no sandbox yet"
    return runtime.box.volumes["run"] / "run"


def summary_of(runtime: PodRuntime) -> dict[str, Any]:
    """The supervisor's summary.json."""
    return json.loads((run_dir(runtime) / "summary.json").read_text())


def metrics_rows(runtime: PodRuntime | None) -> list[dict[str, Any]]:
    """The supervisor's metrics.jsonl so far (one row per closed step, written one step late)."""
    if runtime is None or runtime.box is None:
        return []
    path = run_dir(runtime) / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written
    return rows


def log_text(kubelet: Kubelet, pod: str, container: str) -> str:
    path = kubelet.log_dir / f"{NS}_{pod}_{container}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def stopped(runtime: PodRuntime | None) -> bool:
    return runtime is not None and runtime.task.done()


def exit_codes(runtime: PodRuntime) -> list[int | None]:
    return [s.exit_code for s in runtime.containers.values()]


class JobUnderTest(NamedTuple):
    """A TrainingJob applied to the emulated cluster, its pods run by the stand-in: the waits and steps of a scenario."""

    c: Cluster
    kubelet: Kubelet
    name: str

    def worker(self, rank: int) -> str:
        return f"{self.name}-worker-{rank}"

    @property
    def checkpoint_key(self) -> str:
        """The Redis key of the job's suspend checkpoint (mlless.transport.base.key_prefix + keys.job_checkpoint)."""
        return f"mlless:{NS}.{self.name}:job-checkpoint"

    async def until(self, check: Callable[[], Any], what: str) -> Any:
        return await until(check, what, self.kubelet)

    async def until_running(self, check: Callable[[], Any], what: str) -> Any:
        """`until`, failing at once if the job finishes before `check` holds."""
        return await self.until(while_running(self.c, self.name, check, what), what)

    async def until_step(self, step: int) -> None:
        await self.until_running(lambda: status(self.c, self.name).get("step", 0) >= step, f"step {step}")

    async def finished(self, what: str = "the job to finish") -> dict[str, Any]:
        """Wait for a terminal phase; the status as kubectl shows it."""
        await self.until(lambda: phase(self.c, self.name) in TERMINAL, what)
        return await job_status(self.c, self.name)

    async def scale(self, replicas: int) -> None:
        await scale(self.c, self.name, replicas)

    async def patch_spec(self, **spec: Any) -> None:
        await patch_spec(self.c, self.name, spec)

    async def scaled_in(self, replicas: int, rank: int) -> None:
        """`kubectl scale` down; wait for the operator to delete the pod of `rank`, and for its process to end."""
        await self.scale(replicas)
        await self.until(lambda: self.c.get(PODS, self.worker(rank)) is None, f"the operator to delete worker {rank}")
        await self.until_running(lambda: stopped(self.kubelet.pod(NS, self.worker(rank))), f"worker {rank} to stop")

    async def scaled_out(self, replicas: int, rank: int) -> None:
        """`kubectl scale` up; wait for the operator to create the pod of the new `rank`."""
        await self.scale(replicas)
        await self.until_running(lambda: self.c.get(PODS, self.worker(rank)), f"the operator to create worker {rank}")

    async def suspended(self) -> dict[str, Any]:
        """Set spec.suspend; wait for phase Suspended (failing at once if the job ends instead); its status."""
        await self.patch_spec(suspend=True)
        await self.until_running(lambda: phase(self.c, self.name) == "Suspended", "phase Suspended")
        return status(self.c, self.name)

    async def resumed(self, **spec: Any) -> str:
        """Patch `spec` (while still suspended), then unset spec.suspend; wait for the supervisor's next incarnation,
        and return the job file it was given."""
        if spec:
            await self.patch_spec(**spec)
        await self.patch_spec(suspend=False)
        started = lambda: len(runs := supervisors(self.kubelet, self.name)) >= 2 and runs[-1].box is not None  # noqa: E731
        await self.until(started, "a new supervisor")
        return (supervisors(self.kubelet, self.name)[-1].box.volumes["job"] / "job.yaml").read_text()

    async def delete(self) -> None:
        """`kubectl delete` the job; wait for its finalizer to release it; then, as the garbage collector would (kmock
        has none), delete what it owned."""
        uid = self.c.job(self.name)["metadata"]["uid"]
        if KUBECTL is None:
            await self.c.call("DELETE", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingjobs/{self.name}")
        else:
            await kubectl("delete", "trainingjobs.mlless.io", self.name, "--wait=false")
        await self.until(lambda: self.c.get(TJ, self.name) is None, "the job deleted (its finalizer released)")
        for obj in self.c.emu.objects.values():
            if not obj.deleted and any(ref.get("uid") == uid for ref in obj.raw.get("metadata", {}).get("ownerReferences") or []):
                obj.delete()

    def trains_with(self, workers: int) -> Callable[[], bool]:
        """The supervisor closed steps with `workers` workers since the count last changed, and the status mirrors them."""

        def check() -> bool:
            rows = metrics_rows(self.kubelet.pod(NS, f"{self.name}-supervisor"))
            since = max((r["step"] for r in rows if r["workers"] != workers), default=-1)
            after = [r for r in rows if r["workers"] == workers and r["step"] > since]
            now = status(self.c, self.name)
            return bool(after) and now.get("workers") == workers and now.get("step", 0) >= after[0]["step"]

        return check


@contextlib.asynccontextmanager
async def launched(cluster_factory: Callable[..., Any], tmp_path: Path, doc: dict[str, Any], cluster: dict[str, Any] | None = None,
                   **options: Any) -> AsyncIterator[JobUnderTest]:
    """The operator and the stand-in on a fresh cluster (`cluster`: its options), and the job applied with kubectl;
    a failed assertion inside carries the pods' statuses and logs."""
    async with cluster_factory(**(cluster or {})) as c, running(c, tmp_path, **options) as kubelet:
        with explained(kubelet):
            await apply(c, doc)
            yield JobUnderTest(c, kubelet, doc["metadata"]["name"])
