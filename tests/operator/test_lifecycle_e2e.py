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
import signal
from pathlib import Path
from statistics import fmean

import pytest

from kubelet import Image
from mlless.contract import STOP_MAX_SECONDS, STOP_MAX_STEPS, STOP_SUSPENDED
from scenario import (  # the fixtures are in conftest.py
    FN_NS, FUNCTIONS, NS, PODS, SECRETS, TERMINAL, TJ, apply, cached, condition, exit_code, exit_codes, job_status, launched,
    log_text, metrics_rows, phase, pod_phase, run_dir, status, stopped, summary_of, supervisors,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.services, pytest.mark.slow]

#: Steps of the scaling job: enough for a scale-in and a scale-out to be seen before it ends (about 45 steps/s on an
#: idle 2-core machine; a slower one has more time per step). maxSeconds is only the safety net of a stuck job.
SCALE_STEPS = int(os.environ.get("MLLESS_E2E_SCALE_STEPS", "1500"))
SCALE_SECONDS = float(os.environ.get("MLLESS_E2E_SCALE_SECONDS", "120"))
#: Steps the suspended job trains after its resume (its stop rule, raised past the checkpoint while it is suspended).
RESUME_STEPS = int(os.environ.get("MLLESS_E2E_RESUME_STEPS", "300"))
#: Steps of the job whose supervisor is killed at step 20: enough (at over 100 steps/s) not to end before the kill.
FAILOVER_STEPS = int(os.environ.get("MLLESS_E2E_FAILOVER_STEPS", "4000"))
#: A stop rule no job here reaches.
FOREVER = 10_000_000
DEADLINE_SECONDS = int(os.environ.get("MLLESS_E2E_DEADLINE_SECONDS", "8"))
REPO = Path(__file__).resolve().parents[2]
#: The image operator_env gives the operator (MLLESS_OPERATOR_IMAGE).
IMAGE = "registry.example/mlless:test"


# ---- helpers -------------------------------------------------------------------------------------


def dockerfile_image(path: Path = REPO / "Dockerfile") -> Image:
    """ENTRYPOINT and CMD of the Dockerfile's final stage (exec form), what a container without `command` runs."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    stages: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # what each named stage leaves to its children
    stage: str | None = None
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = rest.split()
            # A stage built on an earlier one inherits its ENTRYPOINT and CMD; a base image's own are not known here.
            entrypoint, cmd = stages.get(words[0], ((), ()))
            stage = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
        elif instruction in ("ENTRYPOINT", "CMD"):
            rest = rest.strip()
            words = tuple(json.loads(rest)) if rest.startswith("[") else ("/bin/sh", "-c", rest)
            if instruction == "ENTRYPOINT":
                entrypoint, cmd = words, ()  # setting ENTRYPOINT clears an inherited CMD
            else:
                cmd = words
        if instruction in ("FROM", "ENTRYPOINT", "CMD") and stage:
            stages[stage] = (entrypoint, cmd)
    return Image(entrypoint=entrypoint, cmd=cmd)


# ---- 1. kubectl scale of a running pod-backend job -----------------------------------------------


#: The protocols the scale test runs under, with their sync settings and their steps to run (`SCALE_STEPS` for a close
#: every step). ISP closes every step; averaging and async hear of a leave or a join at rounds' ends, so their rounds
#: are short, and they run their local steps several times faster, so they get more of them.
SCALE_SYNC = {"isp": ({"protocol": "isp"}, 1),
              "averaging": ({"protocol": "averaging", "localSteps": 4}, 2),
              "async": ({"protocol": "async", "localSteps": 4}, 2)}


@pytest.mark.parametrize("protocol", list(SCALE_SYNC))
async def test_kubectl_scale_in_then_out_of_a_running_pod_job(cluster_factory, e2e_job, tmp_path, protocol):
    output, (sync, more) = tmp_path / "output", SCALE_SYNC[protocol]
    doc = cached(e2e_job("scale", workers=3, function={"backend": "pod"}, output={"uri": str(output)}, sync=sync,
                         stop={"maxSteps": more * SCALE_STEPS, "maxSeconds": SCALE_SECONDS, "patience": 0}))
    async with launched(cluster_factory, tmp_path, doc) as job:
        (c, kubelet, name), worker = job, job.worker
        await job.until_step(10)
        assert c.names(PODS) == {f"{name}-supervisor", *map(worker, (0, 1, 2))}
        # Scale-in: the operator deletes the highest rank; its worker leaves on SIGTERM (exit 0, not killed).
        await job.scaled_in(2, rank=2)
        assert exit_codes(kubelet.pod(NS, worker(2))) == [0], log_text(kubelet, worker(2), "worker")
        # status.workers mirrors the supervisor's steps with 2 workers (not the operator's provisional value, nor rank 2 live).
        await job.until_running(job.trains_with(2), "the supervisor to train on with 2 workers (status.workers 2)")
        # Scale-out: a new rank, never a reused one; the supervisor adopts it as a joiner.
        await job.scaled_out(3, rank=3)
        assert c.get(PODS, worker(2)) is None
        await job.until_running(job.trains_with(3), "the joiner to train (status.workers 3)")
        assert c.job(name)["metadata"]["annotations"]["mlless.io/highest-rank"] == "3"
        final, summary = await job.finished(), json.loads((output / "summary.json").read_text())
        assert final["phase"] == "Succeeded", final
        assert final.get("modelURI") == f"{output}/model.npz", final
        assert summary["stop_reason"] in (STOP_MAX_STEPS, STOP_MAX_SECONDS), summary["stop_reason"]
        assert final["step"] == summary["steps"]
        assert summary["dropped_workers"] == [] and summary["workers_initial"] == 3 and summary["workers_final"] == 3
        events = [(e["event"], e["rank"]) for e in summary["scaling_events"]]
        assert events == [("leave", 2), ("join", 3)], summary["scaling_events"]
        assert summary["scaling_events"][0]["reason"] == "left on its own"
        assert summary["validation_loss"] is not None and (output / "model.npz").exists()
        assert (output / "metrics.jsonl").read_text().count("\n") == summary["steps"]
        supervisor, survivors = c.get(PODS, f"{name}-supervisor"), {worker(r) for r in (0, 1, 3)}
        assert supervisor["status"]["phase"] == "Succeeded" and exit_code(supervisor) == 0
        assert c.names(PODS) == {f"{name}-supervisor", *survivors}
        await job.until(lambda: all(pod_phase(c, w) in TERMINAL for w in survivors), "the worker pods to end")
        assert all(pod_phase(c, w) == "Succeeded" for w in survivors), {w: pod_phase(c, w) for w in survivors}


# ---- 2. spec.suspend, then resume ----------------------------------------------------------------


async def test_suspend_checkpoints_to_redis_and_resume_continues_to_succeeded(cluster_factory, e2e_job, store, tmp_path):
    # The supervisor polls spec.suspend every 5 s: a stop rule in steps would race it, so the job cannot end before
    # its suspension, and gets its real stop rule while suspended (a resume refreshes the job file from the spec).
    doc = cached(e2e_job("suspend", workers=2, function={"backend": "pod"}, stop={"maxSteps": FOREVER, "patience": 0}))
    async with launched(cluster_factory, tmp_path, doc) as job:
        (c, kubelet, name), checkpoint_key = job, job.checkpoint_key
        await job.until_step(10)
        suspended = await job.suspended()
        done, checkpoint_step = condition(c, name, "Suspended"), suspended.get("checkpointStep")
        assert done["status"] == "True" and done["reason"] == "Suspended", done
        assert condition(c, name, "Running")["status"] == "False"
        assert isinstance(checkpoint_step, int) and checkpoint_step > 0, suspended
        assert f"step {checkpoint_step}" in done["message"]
        await job.until(lambda: c.names(PODS) == set(), "the supervisor and worker pods to be deleted")
        assert store.exists(checkpoint_key), f"{checkpoint_key} is not in Redis after the suspension"
        first = supervisors(kubelet, name)
        assert len(first) == 1
        await job.until(lambda: stopped(first[0]), "the first supervisor to exit")
        assert exit_codes(first[0]) == [0]
        before, summary = metrics_rows(first[0]), summary_of(first[0])
        assert before and before[-1]["step"] == checkpoint_step, (checkpoint_step, before[-1:])
        assert summary["stop_reason"] == STOP_SUSPENDED and summary["steps"] == checkpoint_step
        max_steps = checkpoint_step + RESUME_STEPS
        job_file = await job.resumed(stop={"maxSteps": max_steps, "patience": 0})
        assert f"maxSteps: {max_steps}" in job_file, job_file
        final = await job.finished("the resumed job to finish")
        assert final["phase"] == "Succeeded" and final["step"] == max_steps, final
        resumed = condition(c, name, "Suspended")
        assert resumed["status"] == "False" and resumed["reason"] == "Resumed", resumed
        second, log = supervisors(kubelet, name)[1], log_text(kubelet, f"{name}-supervisor", "supervisor")
        summary, after = summary_of(second), metrics_rows(second)
        assert f"run 2 continues at step {checkpoint_step}, from the checkpoint" in log
        assert summary["stop_reason"] == STOP_MAX_STEPS and summary["steps"] == max_steps  # the whole job's
        # It started from the suspended model, not from scratch: its first losses are those of the suspend.
        initial, at_suspend, resumed_at = (fmean(r["loss"] for r in rows) for rows in (before[:5], before[-5:], after[:5]))
        assert abs(resumed_at - at_suspend) < abs(resumed_at - initial), (initial, at_suspend, resumed_at)
        assert not store.exists(checkpoint_key), "the finished job left its suspend checkpoint in Redis"


async def test_a_job_recreated_after_deleting_a_suspended_one_starts_afresh(cluster_factory, e2e_job, store, tmp_path):
    doc = cached(e2e_job("again", workers=2, function={"backend": "pod"}, stop={"maxSteps": FOREVER, "patience": 0}))
    async with launched(cluster_factory, tmp_path, doc) as job:
        c, kubelet, name = job
        await job.until_step(10)
        await job.patch_spec(suspend=True)
        await job.until(lambda: phase(c, name) == "Suspended" and not c.names(PODS), "the suspension")
        assert store.exists(f"mlless:{NS}.{name}:job-checkpoint")
        await job.delete()

        # The same manifest again: a new job, which must train its own 30 steps from scratch.
        doc["spec"]["stop"] = {"maxSteps": 30}
        await apply(c, doc)
        await job.until(lambda: c.get(TJ, name) is not None and phase(c, name) in TERMINAL, "the new job to finish")
        final = await job_status(c, name)
        log = log_text(kubelet, f"{name}-supervisor", "supervisor")
        new_session = log.split("start #0 of pod")[-1]  # the second pod's part of the log
        assert final["phase"] == "Succeeded" and final["step"] == 30, (final, new_session)
        assert "continues at step" not in new_session, new_session


async def test_a_killed_supervisor_pod_is_recreated_and_takes_over_from_its_workers(cluster_factory, e2e_job, tmp_path):
    """kill -9 the supervisor: the operator recreates its pod, which takes the job over from what Redis kept; the
    old rank pods hand in their replicas and exit 75, their containers restart (OnFailure) and join the new run."""
    doc = cached(e2e_job("failover", workers=2, function={"backend": "pod"}, stop={"maxSteps": FAILOVER_STEPS, "patience": 0}))
    async with launched(cluster_factory, tmp_path, doc) as job:
        (c, kubelet, name), worker = job, job.worker
        await job.until_step(20)
        [first] = supervisors(kubelet, name)
        os.kill(first.containers["supervisor"].pid, signal.SIGKILL)
        final = await job.finished("the job to finish after its supervisor was killed")
        assert final["phase"] == "Succeeded" and final["step"] == FAILOVER_STEPS, final
        assert final["supervisorRestarts"] == 1, final
        assert condition(c, name, "SupervisorRestarted")["status"] == "True"
        second = supervisors(kubelet, name)[-1]
        summary = summary_of(second)
        assert summary["stop_reason"] == STOP_MAX_STEPS and summary["steps"] == FAILOVER_STEPS
        [takeover] = summary["takeovers"]
        assert takeover["from"] == "replicas of 2 surviving workers", takeover
        assert summary["dropped_workers"] == [] and summary["workers_final"] == 2
        for rank in (0, 1):  # each handed over (75), was run again, and ended with the job (0)
            runtime = kubelet.pod(NS, worker(rank))
            assert [s.restart_count for s in runtime.containers.values()] == [1], log_text(kubelet, worker(rank), "worker")
            assert exit_codes(runtime) == [0]


# ---- 3. spec.activeDeadlineSeconds ---------------------------------------------------------------


async def test_active_deadline_fails_the_job_and_the_supervisor_ends_cleanly(cluster_factory, e2e_job, tmp_path):
    doc = e2e_job("deadline", workers=2, function={"backend": "pod"}, stop={"maxSteps": FOREVER, "patience": 0}, activeDeadlineSeconds=DEADLINE_SECONDS)
    async with launched(cluster_factory, tmp_path, doc) as job:
        c, kubelet, name = job
        final = await job.finished("the deadline")
        assert final["phase"] == "Failed", final
        failed = condition(c, name, "Failed")
        assert failed["status"] == "True" and failed["reason"] == "DeadlineExceeded", failed
        assert f"spec.activeDeadlineSeconds={DEADLINE_SECONDS}" in failed["message"]
        assert final.get("startTime") and final.get("completionTime")
        assert c.names(PODS) == set()  # the supervisor and the workers

        # The deleted supervisor got SIGTERM and ended the job itself, well within its grace period.
        supervisor = kubelet.pod(NS, f"{name}-supervisor")
        await job.until(lambda: stopped(supervisor), "the supervisor process to exit")
        log = log_text(kubelet, f"{name}-supervisor", "supervisor")
        assert "Traceback" not in log and "done (interrupted)" in log, log
        assert exit_codes(supervisor) != [137], "the supervisor outlived its grace period and was killed"
        assert (run_dir(supervisor) / "summary.json").exists()
        workers = [r for r in kubelet.pods.values() if r.name.startswith(f"{name}-worker-")]
        assert len(workers) == 2
        await job.until(lambda: all(stopped(w) for w in workers), "the workers to exit")
        for w in workers:
            # 143: the SIGTERM of its own deletion found it already finished (the supervisor's Finish came first),
            # past its handler, in the interpreter's shutdown. Either way it did not need SIGKILL.
            assert exit_codes(w) in ([0], [143]), exit_codes(w)
            assert "Traceback" not in log_text(kubelet, w.name, "worker"), log_text(kubelet, w.name, "worker")
        assert status(c, name).get("step", 0) > 0


# ---- 4. the OpenFaaS backend ---------------------------------------------------------------------


async def test_openfaas_backend_trains_to_succeeded_through_the_gateway(cluster_factory, e2e_job, redis_url, amqp_url, tmp_path):
    image = dockerfile_image()
    default_command = shlex.join(image.entrypoint + image.cmd)
    assert default_command.startswith("mlless worker-server"), (
        f"the image's default command is `{default_command}`: an OpenFaaS Function has no command, so it must serve"
    )
    doc = e2e_job("faas", workers=2, function={"backend": "openfaas"})
    async with launched(cluster_factory, tmp_path, doc, cluster={"openfaas": True}, openfaas=True, images={IMAGE: image}) as job:
        c, kubelet, name = job
        function = f"mlless-{NS}-{name}"
        final = await job.finished()
        assert final["phase"] == "Succeeded", final
        assert final.get("step", 0) > 0 and math.isfinite(final["trainLoss"]), final
        supervisor = c.get(PODS, f"{name}-supervisor")
        assert supervisor["status"]["phase"] == "Succeeded" and exit_code(supervisor) == 0
        assert c.names(PODS) == {f"{name}-supervisor"}  # the workers are the Function's copies
        summary = summary_of(kubelet.pod(NS, f"{name}-supervisor"))
        assert summary["stop_reason"] == STOP_MAX_STEPS and summary["validation_loss"] is not None
        assert summary["dropped_workers"] == []

        # The copy of the credentials carries full URLs, the external ones as given, and the job's invocation
        # token; the copies read them as files, and the gateway's calls carried the token (else: 401).
        secret = c.get(SECRETS, f"{function}-credentials", FN_NS)
        copied = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
        token = c.secret_value(f"{name}-credentials", "invoke-token")
        key = c.secret_value(f"{name}-credentials", "identity")
        assert copied == {"redis-url": redis_url, "amqp-url": amqp_url, "invoke-token": token, "identity": key}
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
