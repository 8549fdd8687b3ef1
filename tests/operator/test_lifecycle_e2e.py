"""End to end through the kubelet stand-in: a running job's lifecycle, and the OpenFaaS backend.

As in test_kubelet_e2e.py: the real operator in-loop against the kmock
emulator, the real `mlless supervisor` and workers as local processes (the
stand-in, `kubelet.py`), the real Redis and RabbitMQ of `tests/conftest.py`
named as external services, and kubectl against the emulator.

- kubectl scale of a running pod-backend job, in and back out: the operator
  deletes the highest rank, whose worker leaves on SIGTERM, then creates a new
  rank, which the supervisor adopts as a joiner;
- spec.suspend and back: the supervisor checkpoints to Redis and exits, the
  job is Suspended, and a new session resumes from the checkpoint (and a job
  re-created after deleting a suspended one must not: the delete handler
  removes its keys from the external Redis);
- spec.activeDeadlineSeconds: the job fails with DeadlineExceeded, and the
  deleted supervisor ends cleanly on SIGTERM;
- the OpenFaaS backend: the stand-in plays faas-netes and the gateway, and the
  Function runs the image's default command (read from the Dockerfile).

Waits poll with a generous timeout (MLLESS_E2E_WAIT seconds); nothing asserts
on elapsed time. Stop rules are in steps (MLLESS_E2E_*_STEPS); where a step
count would race a fixed delay (the supervisor polls spec.suspend every 5 s),
the job cannot end before the event, and gets its stop rule afterwards.
"""
from __future__ import annotations

import base64
import json
import math
import os
import re
import shlex
import uuid
from pathlib import Path
from statistics import fmean
from typing import Any, Callable

import pytest
import redis

from kubelet import Image, Kubelet, PodRuntime
from test_kubelet_e2e import KUBECTL, TERMINAL, apply, exit_code, explained, job_status, kubectl, pod_phase, running, training_job, until
from test_operator_kmock import FN_NS, FUNCTIONS, NS, PODS, SECRETS, TJ, Cluster, cluster_factory, operator_env  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.asyncio, pytest.mark.services, pytest.mark.slow]

#: Steps of the scaling job: enough for a scale-in and a scale-out to be seen before it ends (about 45 steps/s on an
#: idle 2-core machine; a slower one has more time per step). maxSeconds is only the safety net of a stuck job.
SCALE_STEPS = int(os.environ.get("MLLESS_E2E_SCALE_STEPS", "1500"))
SCALE_SECONDS = float(os.environ.get("MLLESS_E2E_SCALE_SECONDS", "120"))
#: Steps the suspended job trains after its resume (its stop rule, raised past the checkpoint while it is suspended).
RESUME_STEPS = int(os.environ.get("MLLESS_E2E_RESUME_STEPS", "300"))
#: A stop rule no job here reaches.
FOREVER = 10_000_000
DEADLINE_SECONDS = int(os.environ.get("MLLESS_E2E_DEADLINE_SECONDS", "8"))
REPO = Path(__file__).resolve().parents[2]
#: The image operator_env gives the operator (MLLESS_OPERATOR_IMAGE).
IMAGE = "registry.example/mlless:test"


# ---- helpers -------------------------------------------------------------------------------------


def cached(doc: dict[str, Any]) -> dict[str, Any]:
    """The job with spec.dataset.cacheBatches: the workers keep the sample in memory (fast, steady steps)."""
    doc["spec"]["dataset"]["cacheBatches"] = True
    return doc


def unique(prefix: str) -> str:
    """A job name of its own: the job id names Redis keys and queues on the shared servers."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


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


def dockerfile_image(path: Path = REPO / "Dockerfile") -> Image:
    """ENTRYPOINT and CMD of the Dockerfile's final stage (exec form), what a container without `command` runs."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            entrypoint, cmd = (), ()  # a new stage (the base image's own CMD is not known here)
        elif instruction in ("ENTRYPOINT", "CMD"):
            rest = rest.strip()
            words = tuple(json.loads(rest)) if rest.startswith("[") else ("/bin/sh", "-c", rest)
            if instruction == "ENTRYPOINT":
                entrypoint, cmd = words, ()  # setting ENTRYPOINT clears an inherited CMD
            else:
                cmd = words
    return Image(entrypoint=entrypoint, cmd=cmd)


# ---- 1. kubectl scale of a running pod-backend job -----------------------------------------------


async def test_kubectl_scale_in_then_out_of_a_running_pod_job(cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    name = unique("scale")
    output = tmp_path / "output"
    doc = cached(training_job(
        name, movielens_dir, redis_url, amqp_url, workers=3, function={"backend": "pod"},
        stop={"maxSteps": SCALE_STEPS, "maxSeconds": SCALE_SECONDS}, output={"uri": str(output)},
    ))
    worker = lambda rank: f"{name}-worker-{rank}"  # noqa: E731
    async with cluster_factory() as c, running(c, tmp_path) as kubelet:
        with explained(kubelet):
            await apply(c, doc)
            await until(while_running(c, name, lambda: status(c, name).get("step", 0) >= 10, "step 10"), "step 10", kubelet)
            assert c.names(PODS) == {f"{name}-supervisor", *map(worker, (0, 1, 2))}
            rows = lambda: metrics_rows(kubelet.pod(NS, f"{name}-supervisor"))  # noqa: E731

            # Scale-in: the operator deletes the highest rank; its worker leaves on SIGTERM (exit 0, not killed).
            await scale(c, name, 2)
            await until(lambda: c.get(PODS, worker(2)) is None, "the operator to delete worker 2", kubelet)
            await until(while_running(c, name, lambda: stopped(kubelet.pod(NS, worker(2))), "worker 2 stopped"), "worker 2 to stop", kubelet)
            assert exit_codes(kubelet.pod(NS, worker(2))) == [0], log_text(kubelet, worker(2), "worker")
            # status.workers is the supervisor's mirror once it closes steps with two workers (the operator's
            # provisional value says 2 at once; the supervisor's next patch would say 3 while rank 2 is still live).
            two = lambda: any(r["workers"] == 2 for r in rows()) and status(c, name).get("workers") == 2  # noqa: E731
            await until(while_running(c, name, two, "the supervisor to train on with 2 workers"), "status.workers 2", kubelet)

            # Scale-out: a new rank, never a reused one; the supervisor adopts it as a joiner.
            await scale(c, name, 3)
            await until(while_running(c, name, lambda: c.get(PODS, worker(3)), "worker 3 created"), "the operator to create worker 3", kubelet)
            assert c.get(PODS, worker(2)) is None

            def three() -> bool:
                after = [r for r in rows() if r["workers"] == 3 and r["step"] > max(x["step"] for x in rows() if x["workers"] == 2)]
                return bool(after) and status(c, name).get("workers") == 3 and status(c, name).get("step", 0) >= after[0]["step"]

            await until(while_running(c, name, three, "the joiner to train (status.workers 3)"), "status.workers 3", kubelet)
            assert c.job(name)["metadata"]["annotations"]["mlless.io/highest-rank"] == "3"

            await until(lambda: phase(c, name) in TERMINAL, "the job to finish", kubelet)
            final = await job_status(c, name)
            assert final["phase"] == "Succeeded", final
            assert final.get("modelURI") == f"{output}/model.npz", final
            summary = json.loads((output / "summary.json").read_text())
            assert summary["stop_reason"] in ("max steps", "max seconds"), summary["stop_reason"]
            assert final["step"] == summary["steps"]
            assert summary["dropped_workers"] == [] and summary["workers_initial"] == 3 and summary["workers_final"] == 3
            events = [(e["event"], e["rank"]) for e in summary["scaling_events"]]
            assert events == [("leave", 2), ("join", 3)], summary["scaling_events"]
            assert summary["scaling_events"][0]["reason"] == "left on its own"
            assert summary["validation_loss"] is not None and (output / "model.npz").exists()
            assert (output / "metrics.jsonl").read_text().count("\n") == summary["steps"]

            supervisor = c.get(PODS, f"{name}-supervisor")
            assert supervisor["status"]["phase"] == "Succeeded" and exit_code(supervisor) == 0
            survivors = {worker(r) for r in (0, 1, 3)}
            assert c.names(PODS) == {f"{name}-supervisor", *survivors}
            await until(lambda: all(pod_phase(c, w) in TERMINAL for w in survivors), "the worker pods to end", kubelet)
            assert all(pod_phase(c, w) == "Succeeded" for w in survivors), {w: pod_phase(c, w) for w in survivors}


# ---- 2. spec.suspend, then resume ----------------------------------------------------------------


async def test_suspend_checkpoints_to_redis_and_resume_continues_to_succeeded(cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    name = unique("suspend")
    # The supervisor polls spec.suspend every 5 s: a stop rule in steps would race it, so the job cannot end before
    # its suspension, and gets its real stop rule while suspended (a resume refreshes the job file from the spec).
    doc = cached(training_job(name, movielens_dir, redis_url, amqp_url, workers=2, function={"backend": "pod"}, stop={"maxSteps": FOREVER}))
    checkpoint_key = f"mlless:{NS}.{name}:job-checkpoint"  # mlless.transport.base.key_prefix + keys.job_checkpoint
    store = redis.Redis.from_url(redis_url)
    async with cluster_factory() as c, running(c, tmp_path) as kubelet:
        with explained(kubelet):
            await apply(c, doc)
            await until(while_running(c, name, lambda: status(c, name).get("step", 0) >= 10, "step 10"), "step 10", kubelet)

            await patch_spec(c, name, {"suspend": True})
            await until(while_running(c, name, lambda: phase(c, name) == "Suspended", "the suspension"), "phase Suspended", kubelet)
            suspended = status(c, name)
            done = condition(c, name, "Suspended")
            assert done["status"] == "True" and done["reason"] == "Suspended", done
            assert condition(c, name, "Running")["status"] == "False"
            checkpoint_step = suspended.get("checkpointStep")
            assert isinstance(checkpoint_step, int) and checkpoint_step > 0, suspended
            assert f"step {checkpoint_step}" in done["message"]
            await until(lambda: c.names(PODS) == set(), "the supervisor and worker pods to be deleted", kubelet)
            assert store.exists(checkpoint_key), f"{checkpoint_key} is not in Redis after the suspension"
            first = supervisors(kubelet, name)
            assert len(first) == 1
            await until(lambda: stopped(first[0]), "the first supervisor to exit", kubelet)
            assert exit_codes(first[0]) == [0]
            before = metrics_rows(first[0])
            assert before and before[-1]["step"] == checkpoint_step, (checkpoint_step, before[-1:])
            summary = json.loads((run_dir(first[0]) / "summary.json").read_text())
            assert summary["stop_reason"] == "suspended" and summary["steps"] == checkpoint_step

            max_steps = checkpoint_step + RESUME_STEPS
            await patch_spec(c, name, {"stop": {"maxSteps": max_steps}})
            await patch_spec(c, name, {"suspend": False})
            started = lambda: len(supervisors(kubelet, name)) == 2 and supervisors(kubelet, name)[1].box is not None  # noqa: E731
            await until(started, "a new supervisor", kubelet)
            job_file = (supervisors(kubelet, name)[1].box.volumes["job"] / "job.yaml").read_text()
            assert f"maxSteps: {max_steps}" in job_file, job_file
            await until(lambda: phase(c, name) in TERMINAL, "the resumed job to finish", kubelet)
            final = await job_status(c, name)
            assert final["phase"] == "Succeeded" and final["step"] == max_steps, final
            resumed = condition(c, name, "Suspended")
            assert resumed["status"] == "False" and resumed["reason"] == "Resumed", resumed

            second = supervisors(kubelet, name)[1]
            log = log_text(kubelet, f"{name}-supervisor", "supervisor")
            assert f"resuming from the checkpoint of step {checkpoint_step}" in log
            summary = json.loads((run_dir(second) / "summary.json").read_text())
            assert summary["stop_reason"] == "max steps" and summary["steps"] == RESUME_STEPS
            # It started from the suspended model, not from scratch: its first losses are those of the suspend.
            after = metrics_rows(second)
            initial, at_suspend, resumed_at = (fmean(r["loss"] for r in rows) for rows in (before[:5], before[-5:], after[:5]))
            assert abs(resumed_at - at_suspend) < abs(resumed_at - initial), (initial, at_suspend, resumed_at)
            assert not store.exists(checkpoint_key), "the finished job left its suspend checkpoint in Redis"


async def test_a_job_recreated_after_deleting_a_suspended_one_starts_afresh(cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    name = unique("again")
    doc = cached(training_job(name, movielens_dir, redis_url, amqp_url, workers=2, function={"backend": "pod"}, stop={"maxSteps": FOREVER}))
    store = redis.Redis.from_url(redis_url)
    async with cluster_factory() as c, running(c, tmp_path) as kubelet:
        with explained(kubelet):
            await apply(c, doc)
            await until(while_running(c, name, lambda: status(c, name).get("step", 0) >= 10, "step 10"), "step 10", kubelet)
            await patch_spec(c, name, {"suspend": True})
            await until(lambda: phase(c, name) == "Suspended" and not c.names(PODS), "the suspension", kubelet)
            old_uid = c.job(name)["metadata"]["uid"]
            assert store.exists(f"mlless:{NS}.{name}:job-checkpoint")

            # kubectl delete, then the garbage collector (kmock has none) takes what the job owned.
            if KUBECTL is None:
                await c.call("DELETE", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingjobs/{name}")
            else:
                await kubectl("delete", "trainingjobs.mlless.io", name, "--wait=false")
            await until(lambda: c.get(TJ, name) is None, "the job deleted (its finalizer released)", kubelet)
            for obj in c.emu.objects.values():
                if not obj.deleted and any(ref.get("uid") == old_uid for ref in obj.raw.get("metadata", {}).get("ownerReferences") or []):
                    obj.delete()

            # The same manifest again: a new job, which must train its own 30 steps from scratch.
            doc["spec"]["stop"] = {"maxSteps": 30}
            await apply(c, doc)
            await until(lambda: c.get(TJ, name) is not None and phase(c, name) in TERMINAL, "the new job to finish", kubelet)
            final = await job_status(c, name)
            log = log_text(kubelet, f"{name}-supervisor", "supervisor")
            new_session = log.split("start #0 of pod")[-1]  # the second pod's part of the log
            assert final["phase"] == "Succeeded" and final["step"] == 30, (final, new_session)
            assert "resuming from the checkpoint" not in new_session, new_session


# ---- 3. spec.activeDeadlineSeconds ---------------------------------------------------------------


async def test_active_deadline_fails_the_job_and_the_supervisor_ends_cleanly(cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    name = unique("deadline")
    doc = training_job(
        name, movielens_dir, redis_url, amqp_url, workers=2, function={"backend": "pod"},
        stop={"maxSteps": FOREVER}, activeDeadlineSeconds=DEADLINE_SECONDS,
    )
    async with cluster_factory() as c, running(c, tmp_path) as kubelet:
        with explained(kubelet):
            await apply(c, doc)
            await until(lambda: phase(c, name) in TERMINAL, "the deadline", kubelet)
            final = await job_status(c, name)
            assert final["phase"] == "Failed", final
            failed = condition(c, name, "Failed")
            assert failed["status"] == "True" and failed["reason"] == "DeadlineExceeded", failed
            assert f"spec.activeDeadlineSeconds={DEADLINE_SECONDS}" in failed["message"]
            assert final.get("startTime") and final.get("completionTime")
            assert c.names(PODS) == set()  # the supervisor and the workers

            # The deleted supervisor got SIGTERM and ended the job itself, well within its grace period.
            supervisor = kubelet.pod(NS, f"{name}-supervisor")
            await until(lambda: stopped(supervisor), "the supervisor process to exit", kubelet)
            log = log_text(kubelet, f"{name}-supervisor", "supervisor")
            assert "Traceback" not in log and "done (interrupted)" in log, log
            assert exit_codes(supervisor) != [137], "the supervisor outlived its grace period and was killed"
            assert (run_dir(supervisor) / "summary.json").exists()
            workers = [r for r in kubelet.pods.values() if r.name.startswith(f"{name}-worker-")]
            assert len(workers) == 2
            await until(lambda: all(stopped(w) for w in workers), "the workers to exit", kubelet)
            for w in workers:
                # 143: the SIGTERM of its own deletion found it already finished (the supervisor's Finish came first),
                # past its handler, in the interpreter's shutdown. Either way it did not need SIGKILL.
                assert exit_codes(w) in ([0], [143]), exit_codes(w)
                assert "Traceback" not in log_text(kubelet, w.name, "worker"), log_text(kubelet, w.name, "worker")
            assert status(c, name).get("step", 0) > 0


# ---- 4. the OpenFaaS backend ---------------------------------------------------------------------


async def test_openfaas_backend_trains_to_succeeded_through_the_gateway(cluster_factory, movielens_dir, redis_url, amqp_url, tmp_path):
    name = unique("faas")
    function = f"mlless-{NS}-{name}"
    image = dockerfile_image()
    default_command = shlex.join(image.entrypoint + image.cmd)
    assert default_command.startswith("mlless worker-server"), (
        f"the image's default command is `{default_command}`: an OpenFaaS Function has no command, so it must serve"
    )
    doc = training_job(name, movielens_dir, redis_url, amqp_url, workers=2, function={"backend": "openfaas"})
    async with cluster_factory(openfaas=True) as c, running(c, tmp_path, openfaas=True, images={IMAGE: image}) as kubelet:
        with explained(kubelet):
            await apply(c, doc)
            await until(lambda: phase(c, name) in TERMINAL, "the job to finish", kubelet)
            final = await job_status(c, name)
            assert final["phase"] == "Succeeded", final
            assert final.get("step", 0) > 0 and math.isfinite(final["trainLoss"]), final
            supervisor = c.get(PODS, f"{name}-supervisor")
            assert supervisor["status"]["phase"] == "Succeeded" and exit_code(supervisor) == 0
            assert c.names(PODS) == {f"{name}-supervisor"}  # the workers are the Function's copies
            summary = json.loads((run_dir(kubelet.pod(NS, f"{name}-supervisor")) / "summary.json").read_text())
            assert summary["stop_reason"] == "max steps" and summary["validation_loss"] is not None
            assert summary["dropped_workers"] == []

            # The copy of the credentials carries full URLs, the external ones as given, and the job's invocation
            # token; the copies read them as files, and the gateway's calls carried the token (else: 401).
            secret = c.get(SECRETS, f"{function}-credentials", FN_NS)
            copied = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
            job_secret = c.get(SECRETS, f"{name}-credentials")
            token = base64.b64decode(job_secret["data"]["invoke-token"]).decode()
            assert copied == {"redis-url": redis_url, "amqp-url": amqp_url, "invoke-token": token}
            fn = c.get(FUNCTIONS, function, FN_NS)
            assert fn["spec"]["labels"]["com.openfaas.scale.min"] == "2"
            copies = kubelet.openfaas.runtimes()
            assert len(copies) == 2 and all(r.containers[function].started for r in copies)
            for copy in copies:
                first_line = (kubelet.log_dir / f"{FN_NS}_{copy.name}_{function}.log").read_text().splitlines()[0]
                assert "worker-server" in first_line, first_line  # the image's default command ran

            # Each rank was one invocation through the gateway, with its prefix stripped, on a copy of its own.
            invocations = [h for h in kubelet.openfaas.gateway.handled if h.method == "POST"]
            assert [(h.target, h.path, h.status) for h in invocations] == [(f"{function}.{FN_NS}", "/", 200)] * 2, invocations
            assert len({h.copy for h in invocations}) == 2
