"""The real Kopf operator (mlless_operator.main, in-loop) against the kmock API emulator.

Each test starts its own emulator on a random port, points a kubeconfig at it
and runs the operator until the test ends. Waits poll the emulator's state with
a generous timeout; nothing asserts on elapsed time.
"""
from __future__ import annotations

import asyncio
import secrets

import kmock
import pytest

from mlless.contract import ANNOTATION_BACKEND, ANNOTATION_HIGHEST_RANK
from mlless.protocol.identity import SUPERVISOR, parse_identity
from mlless_operator import metrics

from scenario import (  # tests/operator/ is on sys.path (rootdir-relative test modules); the fixtures are in conftest.py
    FN_NS, FUNCTIONS, KSVC, NS, PODS, POD_JOB_CHILDREN, SECRETS, STATE_CHILDREN, TJ, WAIT, env, manifest, owned_by, poll,
    running_operator,
)

pytestmark = pytest.mark.asyncio


def identity_ranks(c) -> set[int]:
    """The ranks whose identity the job Secret holds (`mlless_operator.reconcile.identities`)."""
    return {int(k.rsplit("-", 1)[1]) for k in c.get(SECRETS, "ml-credentials")["data"] if k.startswith("identity-rank-")}


def worker_ranks(names: set[str]) -> set[int]:
    return {int(n.rsplit("-", 1)[1]) for n in names}


async def test_pod_backend_creates_every_child_sets_status_and_scales(cluster_factory):
    async with cluster_factory() as c, running_operator():
        job = await c.created(manifest())
        assert {(r, n) for r, ns, n in c.children()} == POD_JOB_CHILDREN
        for res, name, obj in c.child_objects():
            assert owned_by(obj, job), (res, name)
        worker, supervisor, password = c.get(PODS, "ml-worker-1"), c.get(PODS, "ml-supervisor"), c.secret_value("ml-credentials", "redis-password")
        e = env(worker)
        assert e["MLLESS_RANK"]["value"] == "1" and e["MLLESS_JOB_ID"]["value"] == "team.ml"
        assert e["REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ml-credentials", "key": "redis-url"}
        assert e["AMQP_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ml-credentials", "key": "amqp-url"}
        assert worker["spec"]["containers"][0]["image"] == "registry.example/mlless:test"
        assert env(supervisor)["MLLESS_WORKER_BACKEND"]["value"] == "pod"
        assert password not in repr(c.get(kmock.resource("apps/v1/statefulsets"), "ml-redis"))
        # Each worker pod reads its own identity alone, the supervisor its own; no pod reads the issuer.
        assert e["MLLESS_IDENTITY"]["valueFrom"]["secretKeyRef"] == {"name": "ml-credentials", "key": "identity-rank-1",
                                                                     "optional": True}
        assert env(supervisor)["MLLESS_IDENTITY"]["valueFrom"]["secretKeyRef"]["key"] == "identity-supervisor"
        issuer = parse_identity(c.secret_value("ml-credentials", "identity-issuer"))
        for key, signer in (("identity-rank-1", 1), ("identity-supervisor", SUPERVISOR)):
            identity = parse_identity(c.secret_value("ml-credentials", key))
            assert identity.signer == signer and identity.issuer == issuer.public
        assert identity_ranks(c) == {0, 1, 2}
        assert "identity-issuer" not in repr([c.get(PODS, n) for n in c.names(PODS)])

        status, created = job["status"], c.condition("Created")
        assert status["phase"] == "Pending" and status["workers"] == 3
        assert status["selector"] == "mlless.io/job=ml,mlless.io/role=worker"
        assert "startTime" not in status  # set when the supervisor runs
        assert job["metadata"]["annotations"][ANNOTATION_HIGHEST_RANK] == "2"
        assert created["status"] == "True" and created["reason"] == "ChildrenCreated"
        assert created["lastTransitionTime"] and created["observedGeneration"] == 1
        assert job["metadata"]["annotations"][ANNOTATION_BACKEND] == "pod"
        assert "mlless.io/finalizer" in job["metadata"]["finalizers"]
        assert any(k.startswith("operator.mlless.io/") for k in job["metadata"]["annotations"])

        await c.supervisor_to("Running")  # the job follows its supervisor pod, and its running time starts
        assert c.condition("Running")["status"] == "True" and c.job()["status"]["startTime"]
        # kubectl scale tj/ml --replicas=1, then a spec patch back up to 2: the highest ranks go, a new worker gets a new rank.
        await c.scale_to(1, {"ml-supervisor", "ml-worker-0"}, subresource=True)
        await c.scale_to(2, {"ml-supervisor", "ml-worker-0", "ml-worker-3"})
        await c.until(lambda: identity_ranks(c) == {0, 3}, "ranks 1 and 2 retired, rank 3 handed out")
        await c.supervisor_to("Succeeded")  # the supervisor finishes: Succeeded, with a completion time
        assert c.condition("Succeeded")["status"] == "True" and c.job()["status"]["completionTime"]
        assert c.condition("Running")["status"] == "False"
        await c.until_event("Created", "Running", "Scaled", "Succeeded")  # every transition is an Event


async def test_knative_backend_creates_a_pinned_service_and_scales_it(cluster_factory):
    async with cluster_factory(knative=True) as c, running_operator():
        job = await c.created(manifest(function={"backend": "knative", "timeoutSeconds": 600}))
        ksvc = c.get(KSVC, "ml-worker")
        assert ksvc is not None and owned_by(ksvc, job)
        template = ksvc["spec"]["template"]
        assert template["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "3"
        assert template["metadata"]["annotations"]["autoscaling.knative.dev/max-scale"] == "3"
        assert template["metadata"]["annotations"]["autoscaling.knative.dev/initial-scale"] == "3"
        assert template["spec"]["containerConcurrency"] == 1 and template["spec"]["timeoutSeconds"] == 600
        assert env(template)["REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "ml-credentials"
        assert c.names(PODS) == {"ml-supervisor"}
        assert env(c.get(PODS, "ml-supervisor"))["MLLESS_WORKER_URL"]["value"] == "http://ml-worker.team.svc.cluster.local"

        await c.patch_job("ml", {"spec": {"workers": 5}})
        scale = lambda: c.get(KSVC, "ml-worker")["spec"]["template"]["metadata"]["annotations"]  # noqa: E731
        await c.until(lambda: scale()["autoscaling.knative.dev/min-scale"] == "5", "Knative scale 5")
        assert scale()["autoscaling.knative.dev/max-scale"] == scale()["autoscaling.knative.dev/initial-scale"] == "5"


async def test_requested_backend_that_is_not_served_falls_back_to_pods(cluster_factory):
    async with cluster_factory() as c, running_operator():
        await c.created(manifest(workers=2, function={"backend": "knative"}))
        assert c.names(PODS) == {"ml-supervisor", "ml-worker-0", "ml-worker-1"}
        assert c.job()["metadata"]["annotations"][ANNOTATION_BACKEND] == "pod"


async def test_openfaas_backend_function_scaled_and_cleaned_up_on_delete(cluster_factory):
    async with cluster_factory(openfaas=True) as c, running_operator():
        await c.apply(manifest())  # no backend given: auto picks the served OpenFaaS
        await c.until(lambda: c.condition("Created"), "the Created condition")
        fn = c.get(FUNCTIONS, "mlless-team-ml", FN_NS)
        assert fn is not None and "ownerReferences" not in fn["metadata"]
        assert fn["spec"]["labels"]["com.openfaas.scale.min"] == fn["spec"]["labels"]["com.openfaas.scale.max"] == "3"
        assert fn["spec"]["secrets"] == ["mlless-team-ml-credentials"]
        assert fn["spec"]["environment"]["max_inflight"] == "1"
        copy_ = c.get(SECRETS, "mlless-team-ml-credentials", FN_NS)
        original = c.get(SECRETS, "ml-credentials")
        assert copy_["data"]["redis-url"] == original["data"]["redis-url"]
        assert copy_["data"]["amqp-url"] == original["data"]["amqp-url"]
        assert copy_["data"]["invoke-token"] == original["data"]["invoke-token"]
        assert copy_["data"]["identity"] == original["data"]["identity"]
        # never the bare passwords, the issuer or the supervisor's identity
        assert set(copy_["data"]) == {"redis-url", "amqp-url", "invoke-token", "identity"}
        supervisor_env = env(c.get(PODS, "ml-supervisor"))
        assert supervisor_env["MLLESS_WORKER_BACKEND"]["value"] == "openfaas"
        assert supervisor_env["MLLESS_WORKER_URL"]["value"] == f"http://gateway.openfaas:8080/function/mlless-team-ml.{FN_NS}"

        labels = lambda: c.get(FUNCTIONS, "mlless-team-ml", FN_NS)["spec"]["labels"]  # noqa: E731
        await c.patch_job("ml", {"spec": {"workers": 2}})
        await c.until(lambda: labels()["com.openfaas.scale.max"] == "2", "OpenFaaS scale 2")
        assert labels()["com.openfaas.scale.min"] == "2"

        # Suspended (the supervisor has checkpointed and exited): the Function is pinned to zero, its Secret stays.
        await c.patch_job("ml", {"spec": {"suspend": True}})
        c.set_pod_phase("ml-supervisor", "Succeeded")
        await c.until_phase("Suspended")
        assert labels()["com.openfaas.scale.min"] == labels()["com.openfaas.scale.max"] == "0"
        assert labels()["com.openfaas.scale.zero"] == "true"
        assert c.get(SECRETS, "mlless-team-ml-credentials", FN_NS) is not None and c.get(PODS, "ml-supervisor") is None

        status, _ = await c.call("DELETE", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingjobs/ml")
        assert status == 200
        await c.until(lambda: c.get(TJ, "ml") is None, "the job released by its finalizer")
        assert c.get(FUNCTIONS, "mlless-team-ml", FN_NS) is None
        assert c.get(SECRETS, "mlless-team-ml-credentials", FN_NS) is None


async def test_invalid_spec_fails_with_invalid_spec_and_creates_nothing(cluster_factory):
    async with cluster_factory() as c, running_operator():
        await c.apply(manifest(sync={"protocol": "gossip"}))
        failed = await c.until(lambda: c.condition("Failed"), "the Failed condition")
        assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
        assert "spec.sync.protocol" in failed["message"] and "gossip" in failed["message"]
        assert c.job()["status"]["phase"] == "Failed"
        # A later valid job in the same namespace is reconciled, so the operator got past the invalid one.
        await c.apply(manifest("ok", workers=1))
        await c.until(lambda: c.condition("Created", "ok"), "the valid job's Created condition")
        assert not {n for _, _, n in c.children() if n.startswith("ml-")}
        assert c.condition("Created") is None


async def test_operator_restart_is_idempotent(cluster_factory):
    async with cluster_factory() as c:
        async with running_operator():
            await c.created(manifest())
        before = c.children()
        secret = dict(c.get(SECRETS, "ml-credentials")["data"])
        created_at = c.condition("Created")["lastTransitionTime"]
        # As if the operator had crashed before recording its progress, and a worker pod had vanished.
        annotations = {k: None for k in c.job()["metadata"]["annotations"] if k.startswith("operator.mlless.io/")}
        await c.patch_job("ml", {"metadata": {"annotations": annotations}})
        c.emu.objects[PODS, NS, "ml-worker-2"].delete()
        errors = metrics.ERRORS.labels("reconcile")._value.get()

        async with running_operator():
            await c.until(lambda: c.get(PODS, "ml-worker-2"), "the vanished worker pod re-created")
            await c.until(lambda: any(k.startswith("operator.mlless.io/") for k in c.job()["metadata"]["annotations"]), "progress recorded")
        assert c.children() == before  # nothing duplicated, nothing missing
        assert c.get(SECRETS, "ml-credentials")["data"] == secret  # passwords unchanged
        assert c.condition("Created")["lastTransitionTime"] == created_at
        assert metrics.ERRORS.labels("reconcile")._value.get() == errors

        # A restart with the progress recorded resumes the session: a worker pod lost meanwhile is replaced by a
        # new rank (its own may have left keys and a queue behind), never re-created under its old one.
        c.emu.objects[PODS, NS, "ml-worker-1"].delete()
        async with running_operator():
            # On a loaded machine the previous operator's status timer may still be finishing its tick (kopf leaves
            # it orphaned), and the resume handler waits out a retry (its backoff is 10 s): more than WAIT.
            await poll(lambda: c.get(PODS, "ml-worker-3"), "a new rank for the lost worker", 3 * WAIT, 0.05)
            await c.until(lambda: c.job()["metadata"]["annotations"][ANNOTATION_HIGHEST_RANK] == "3", "the new highest rank recorded")
        assert {n for _, _, n in c.children() if "-worker-" in n} == {"ml-worker-0", "ml-worker-2", "ml-worker-3"}
        assert metrics.ERRORS.labels("reconcile")._value.get() == errors


async def test_pod_scaling_is_rank_aware_and_never_reuses_a_rank(cluster_factory):
    workers = lambda: {n for n in c.names(PODS) if n != "ml-supervisor"}  # noqa: E731
    async with cluster_factory() as c, running_operator():
        await c.created(manifest())
        assert workers() == {"ml-worker-0", "ml-worker-1", "ml-worker-2"}

        # The tuner took rank 1 out: the supervisor records it, then lowers the scale. Rank 1 goes, not rank 2.
        await c.patch_job("ml", {"status": {"removedRanks": [1]}}, "/status")
        await c.patch_job("ml", {"spec": {"replicas": 2}}, "/scale")
        await c.until(lambda: workers() == {"ml-worker-0", "ml-worker-2"}, "the removed rank deleted")
        await c.until(lambda: identity_ranks(c) == {0, 2}, "the removed rank's identity retired")

        # Scale-out: new ranks above every rank used so far.
        await c.patch_job("ml", {"spec": {"workers": 4}})
        await c.until(lambda: workers() == {"ml-worker-0", "ml-worker-2", "ml-worker-3", "ml-worker-4"}, "ranks 3 and 4 created")
        assert identity_ranks(c) == {0, 2, 3, 4}  # handed out before the pods were made
        for rank in (3, 4):
            ref = env(c.get(PODS, f"ml-worker-{rank}"))["MLLESS_IDENTITY"]["valueFrom"]["secretKeyRef"]
            assert ref["key"] == f"identity-rank-{rank}"
            assert parse_identity(c.secret_value("ml-credentials", ref["key"])).signer == rank

        # A finished pod goes first, then the highest rank.
        c.set_pod_phase("ml-worker-0", "Succeeded")
        await c.patch_job("ml", {"spec": {"workers": 2}})
        await c.until(lambda: workers() == {"ml-worker-2", "ml-worker-3"}, "the finished pod and rank 4 deleted")

        # Rank 4 left no trace in status.removedRanks; the job's annotation remembers it, so the next rank is 5.
        await c.patch_job("ml", {"spec": {"workers": 3}})
        await c.until(lambda: workers() == {"ml-worker-2", "ml-worker-3", "ml-worker-5"}, "rank 5 created")
        await c.until(lambda: identity_ranks(c) == worker_ranks(workers()), "identities follow the ranks")
        await c.until(lambda: c.job()["metadata"]["annotations"][ANNOTATION_HIGHEST_RANK] == "5", "the highest rank recorded")
        assert c.job()["status"]["removedRanks"] == [1]  # the supervisor's field, untouched


async def test_suspend_waits_for_the_checkpoint_keeps_the_state_and_resumes(cluster_factory):
    async with cluster_factory() as c, running_operator():
        await c.running(manifest())
        suspended_jobs = metrics.JOBS.labels("Suspended")._value.get()
        suspending = await c.suspend()
        assert suspending["status"] == "True" and suspending["reason"] == "Suspending"
        await c.until_event("Suspending")
        # The supervisor is still checkpointing (well within its grace period): nothing is stopped yet.
        assert c.phase() == "Running" and len(c.names(PODS)) == 4

        await c.supervisor_checkpoints(42)  # it saved the model to Redis and exited 0: Suspended, not Succeeded
        assert c.names(PODS) == set()
        assert STATE_CHILDREN <= {(r, n) for r, _, n in c.children()}
        done = c.condition("Suspended")
        assert done["status"] == "True" and done["reason"] == "Suspended" and "step 42" in done["message"]
        assert done["lastTransitionTime"] == suspending["lastTransitionTime"]
        assert c.condition("Running")["status"] == "False" and c.condition("Running")["reason"] == "Suspended"
        assert "startTime" not in c.job()["status"] and c.job()["status"]["checkpointStep"] == 42
        assert metrics.JOBS.labels("Suspended")._value.get() == suspended_jobs + 1
        await c.until_event("Suspended")

        # Scaling a suspended job creates nothing (through a few status-timer ticks); the resume starts the new count.
        await c.patch_job("ml", {"spec": {"workers": 2}})
        await c.until(lambda: c.job()["metadata"]["generation"] == 3, "the spec change seen")
        await asyncio.sleep(1)
        assert c.phase() == "Suspended" and c.names(PODS) == set() and c.condition("Succeeded") is None
        await c.resume()
        resumed = c.condition("Suspended")
        assert resumed["status"] == "False" and resumed["reason"] == "Resumed" and "step 42" in resumed["message"]
        assert c.names(PODS) == {"ml-supervisor", "ml-worker-0", "ml-worker-1"}  # a new session: ranks 0..N-1
        assert identity_ranks(c) == {0, 1}  # and only their identities: rank 2's is retired
        assert "workers: 2" in c.get(kmock.resource("v1/configmaps"), "ml-job")["data"]["job.yaml"]
        await c.until_event("Resumed")
        c.set_pod_phase("ml-supervisor", "Running")
        await c.until(lambda: c.phase() == "Running" and c.job()["status"].get("startTime"), "running again")
        assert metrics.JOBS.labels("Suspended")._value.get() == suspended_jobs


async def test_suspend_grace_period_then_knative_scaled_to_zero_and_back(cluster_factory, monkeypatch):
    scale = {f"autoscaling.knative.dev/{k}-scale" for k in ("min", "max", "initial")}
    annotations = lambda: c.get(KSVC, "ml-worker")["spec"]["template"]["metadata"]["annotations"]  # noqa: E731
    async with cluster_factory(knative=True) as c:
        monkeypatch.setenv("MLLESS_OPERATOR_SUSPEND_GRACE_SECONDS", "1")
        async with running_operator():
            await c.created(manifest(function={"backend": "knative"}))
            await c.supervisor_to("Running")
            assert env(c.get(PODS, "ml-supervisor"))["MLLESS_WORKER_BACKEND"]["value"] == "knative"

            # The supervisor never exits: after the grace period its pod is deleted anyway.
            await c.patch_job("ml", {"spec": {"suspend": True}})
            await c.until_phase("Suspended")
            assert c.get(PODS, "ml-supervisor") is None
            assert {annotations()[k] for k in scale} == {"0"}
            assert "did not exit within 1s" in c.condition("Suspended")["message"]
            await c.until_event("Suspended")

            await c.patch_job("ml", {"spec": {"suspend": False}})
            await c.until(lambda: c.get(PODS, "ml-supervisor"), "the supervisor re-created")
            await c.until(lambda: {annotations()[k] for k in scale} == {"3"}, "Knative scaled back to 3")
            await c.until(lambda: c.phase() == "Pending", "phase Pending after the resume")


async def test_active_deadline_fails_the_job_then_ttl_deletes_it(cluster_factory):
    async with cluster_factory() as c, running_operator():
        await c.created(manifest(activeDeadlineSeconds=1, ttlSecondsAfterFinished=2))
        await c.supervisor_to("Running", "Failed")
        job = c.job()
        failed = c.condition("Failed")
        assert failed["status"] == "True" and failed["reason"] == "DeadlineExceeded"
        assert "spec.activeDeadlineSeconds=1" in failed["message"]
        assert c.condition("Running")["status"] == "False" and c.condition("Running")["reason"] == "DeadlineExceeded"
        assert job["status"]["startTime"] and job["status"]["completionTime"]
        assert c.names(PODS) == set()  # supervisor (SIGTERM: a clean interrupt) and workers
        assert c.get(SECRETS, "ml-credentials") is not None
        await c.until_event("DeadlineExceeded")

        # Two seconds after it finished, the job goes (and its finalizer ran its cleanup).
        await c.until(lambda: c.get(TJ, "ml") is None, "the job deleted by its TTL")
        assert "Expired" in c.events()


async def test_a_job_created_suspended_gets_its_state_but_no_runtime_until_resumed(cluster_factory):
    async with cluster_factory() as c, running_operator():
        await c.apply(manifest(workers=2, suspend=True))
        # The phase and the Created condition come from two handlers, in either order.
        await c.until(lambda: c.phase() == "Suspended" and c.condition("Created"), "phase Suspended and Created")
        assert c.condition("Created")["status"] == "True" and c.condition("Suspended")["status"] == "True"
        assert c.names(PODS) == set() and c.get(SECRETS, "ml-credentials") and c.get(kmock.resource("apps/v1/statefulsets"), "ml-redis")
        await c.patch_job("ml", {"spec": {"suspend": None}})  # unset, as `kubectl patch --type=json -p '[{"op":"remove",…}]'`
        await c.until(lambda: c.names(PODS) == {"ml-supervisor", "ml-worker-0", "ml-worker-1"}, "the runtime started")
        await c.until(lambda: c.phase() == "Pending" and c.condition("Suspended")["reason"] == "Resumed", "resumed")


async def test_a_sharded_redis_is_created_shard_by_shard_and_reaches_the_pods_in_one_url_list(cluster_factory):
    async with cluster_factory() as c, running_operator():
        await c.created(manifest(redis={"shards": 2}))
        shard = {("apps/v1/statefulsets", "ml-redis-1"), ("/v1/services", "ml-redis-1")}
        assert {(r, n) for r, ns, n in c.children()} == POD_JOB_CHILDREN | shard
        urls = c.secret_value("ml-credentials", "redis-url").split()
        assert [u.split("@")[1] for u in urls] == ["ml-redis.team.svc:6379/0", "ml-redis-1.team.svc:6379/0"]
        assert env(c.get(PODS, "ml-worker-0"))["REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "redis-url"
        policy = c.get(kmock.resource("networking.k8s.io/v1/networkpolicies"), "ml-services")
        assert "redis-1" in policy["spec"]["podSelector"]["matchExpressions"][0]["values"]


async def test_delete_removes_the_jobs_keys_from_an_external_redis(cluster_factory, redis_url):
    import redis as redis_client

    name = f"ext-{secrets.token_hex(3)}"
    store = redis_client.Redis.from_url(redis_url)
    # A suspended job's checkpoint (no supervisor is left to delete it), and another job's key that must stay.
    store.set(f"mlless:{NS}.{name}:job-checkpoint", b"model", ex=600)
    store.set(f"mlless:{NS}.{name}-other:job-checkpoint", b"model", ex=600)
    try:
        async with cluster_factory() as c, running_operator():
            spec = {"redis": {"url": redis_url}, "rabbitmq": {"url": "amqp://guest:guest@127.0.0.1:5672/%2F"}}
            await c.apply(manifest(name, **spec))
            await c.until(lambda: c.condition("Created", name), "the Created condition")
            status, _ = await c.call("DELETE", f"/apis/mlless.io/v1alpha1/namespaces/{NS}/trainingjobs/{name}")
            assert status == 200
            await c.until(lambda: c.get(TJ, name) is None, "the job released by its finalizer")
        assert store.exists(f"mlless:{NS}.{name}:job-checkpoint") == 0
        assert store.exists(f"mlless:{NS}.{name}-other:job-checkpoint") == 1
    finally:
        store.delete(f"mlless:{NS}.{name}-other:job-checkpoint")
