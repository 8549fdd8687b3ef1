"""Issue #12 on Kubernetes, the real Kopf operator against the kmock emulator (as test_operator_kmock.py):

- spec.backoffLimit: a supervisor pod that fails, is evicted or is deleted is recreated with the same spec
  (the job stays Running, a SupervisorRestarted condition and status.supervisorRestarts count it), and
  the job fails once the limit is used up, keeping its state;
- PodsHealthy: a pod stuck on its image or the scheduler shows on the job within a status tick, and clears;
- the job's NetworkPolicy, and none with `MLLESS_OPERATOR_NETWORK_POLICY=false`.

The tests play the kubelet and the scheduler by writing the pods' status. Waits poll the emulator's state
with a generous timeout; nothing asserts on elapsed time.
"""
from __future__ import annotations

import kmock
import pytest

from mlless.contract import ANNOTATION_SUPERVISOR_RESTART
from scenario import KUBECTL, NS, PODS, SECRETS, STATE_CHILDREN, kubectl, manifest, owned_by, running_operator

pytestmark = pytest.mark.asyncio

POLICIES = kmock.resource("networking.k8s.io/v1/networkpolicies")
CRASHED = {"phase": "Failed", "containerStatuses": [{"name": "supervisor", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
EVICTED = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
           "containerStatuses": [{"name": "supervisor", "state": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown"}}}]}


async def test_a_failed_evicted_or_deleted_supervisor_is_recreated_until_the_backoff_limit(cluster_factory):
    async with cluster_factory() as c, running_operator():
        await c.running(manifest(backoffLimit=2))
        first = c.get(PODS, "ml-supervisor")
        workers = {n for n in c.names(PODS) if "-worker-" in n}

        def successor(of: dict) -> dict | None:
            pod = c.get(PODS, "ml-supervisor")
            return pod if pod is not None and pod["metadata"]["uid"] != of["metadata"]["uid"] else None

        # The supervisor crashes: a new pod, the same spec (job id, Secret, Redis, RabbitMQ); the job keeps running.
        c.set_pod_status("ml-supervisor", CRASHED)
        second = await c.until(lambda: successor(first), "the crashed supervisor recreated")
        assert second["spec"] == first["spec"] and second["metadata"]["annotations"][ANNOTATION_SUPERVISOR_RESTART] == "1"
        await c.until(lambda: c.job()["status"].get("supervisorRestarts") == 1, "status.supervisorRestarts 1")
        restarted = c.condition("SupervisorRestarted")
        assert restarted["status"] == "True" and restarted["reason"] == "Error"
        assert restarted["message"] == "restart 1 of 2: exit code 1: Error"
        assert c.phase() == "Running" and c.condition("Running")["status"] == "True"
        assert {n for n in c.names(PODS) if "-worker-" in n} == workers
        await c.until_event("SupervisorRestarted")

        # Deleted by something other than the operator (a drain, `kubectl delete pod`): recreated as well.
        c.emu.objects[PODS, NS, "ml-supervisor"].delete()
        third = await c.until(lambda: successor(second), "the deleted supervisor recreated")
        await c.until(lambda: c.job()["status"].get("supervisorRestarts") == 2, "status.supervisorRestarts 2")
        assert third["metadata"]["annotations"][ANNOTATION_SUPERVISOR_RESTART] == "2"
        assert c.condition("SupervisorRestarted")["reason"] == "SupervisorDeleted"
        assert c.condition("SupervisorRestarted")["message"] == "restart 2 of 2: the supervisor pod was deleted"

        # Evicted with no restart left: the job fails, saying why; the pod stays for its logs, and the state stays.
        c.set_pod_status("ml-supervisor", EVICTED)
        await c.until_phase("Failed")
        failed = c.condition("Failed")
        assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
        assert failed["message"] == ("The node was low on resource: memory. (exit code 137: ContainerStatusUnknown); "
                                     "after 2 restarts (spec.backoffLimit=2)")
        assert c.condition("Running")["status"] == "False" and c.job()["status"]["completionTime"]
        assert c.get(PODS, "ml-supervisor")["metadata"]["uid"] == third["metadata"]["uid"]
        assert c.job()["status"]["supervisorRestarts"] == 2
        assert STATE_CHILDREN <= {(r, n) for r, _, n in c.children()}
        await c.until_event("Failed")
        assert c.events()["Failed"] == f"phase Running -> Failed: {failed['message']}"


async def test_no_restart_with_backoff_limit_zero_and_none_after_success(cluster_factory):
    async with cluster_factory() as c, running_operator():
        await c.running(manifest(backoffLimit=0))
        first_uid = c.get(PODS, "ml-supervisor")["metadata"]["uid"]
        c.set_pod_status("ml-supervisor", CRASHED)
        await c.until_phase("Failed")
        assert c.condition("Failed")["message"] == "exit code 1: Error; and spec.backoffLimit allows no restart (spec.backoffLimit=0)"
        assert c.get(PODS, "ml-supervisor")["metadata"]["uid"] == first_uid and c.condition("SupervisorRestarted") is None

        await c.running(manifest("done"))  # backoffLimit 3 by default, but a supervisor that succeeded is never restarted
        uid = c.get(PODS, "done-supervisor")["metadata"]["uid"]
        await c.supervisor_to("Succeeded", name="done")
        assert c.get(PODS, "done-supervisor")["metadata"]["uid"] == uid and "supervisorRestarts" not in c.job("done")["status"]


async def test_stuck_pods_show_in_the_pods_healthy_condition_until_they_recover(cluster_factory):
    healthy = lambda: c.condition("PodsHealthy") or {}  # noqa: E731
    async with cluster_factory() as c, running_operator():
        await c.created(manifest(workers=2))
        await c.until(lambda: healthy().get("status") == "True", "PodsHealthy True")

        c.set_pod_status("ml-worker-1", {"phase": "Pending", "containerStatuses": [{"name": "worker", "state": {"waiting": {
            "reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.example/mlless:test"'}}}]})
        c.set_pod_status("ml-supervisor", {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient memory."}]})
        await c.until(lambda: "ml-worker-1" in healthy().get("message", ""), "PodsHealthy naming both stuck pods")
        stuck = healthy()
        assert stuck["status"] == "False" and stuck["reason"] == "Unschedulable"
        assert stuck["message"] == ("pod ml-supervisor: Unschedulable: 0/3 nodes are available: 3 Insufficient memory.; "
                                    'pod ml-worker-1: ImagePullBackOff: container worker: Back-off pulling image "registry.example/mlless:test"')
        assert c.phase() == "Pending" and c.condition("Created")["status"] == "True"  # nothing else lost
        if KUBECTL is not None:  # what the user sees
            described = await kubectl("describe", "trainingjobs.mlless.io", "ml")
            assert "PodsHealthy" in described and "Insufficient memory" in described

        # The worker crash-loops once its image is there: the reason follows.
        c.set_pod_status("ml-supervisor", {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]})
        c.set_pod_status("ml-worker-1", {"phase": "Running", "containerStatuses": [{"name": "worker", "restartCount": 5, "state": {
            "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 2m40s restarting failed container=worker"}}}]})
        await c.until(lambda: healthy().get("reason") == "CrashLoopBackOff", "PodsHealthy CrashLoopBackOff")
        assert healthy()["message"] == "pod ml-worker-1: CrashLoopBackOff: container worker: back-off 2m40s restarting failed container=worker"

        c.set_pod_status("ml-worker-1", {"containerStatuses": [{"name": "worker", "restartCount": 5, "state": {"running": {}}}]})
        await c.until(lambda: healthy().get("status") == "True", "PodsHealthy True again")
        assert c.phase() == "Running"


async def test_each_job_gets_a_network_policy_unless_turned_off(cluster_factory, monkeypatch):
    async with cluster_factory() as c:
        monkeypatch.setenv("MLLESS_OPERATOR_POD_NAMESPACE", "mlless-system")
        monkeypatch.setenv("MLLESS_OPERATOR_POD_LABELS", "app.kubernetes.io/name=mlless,app.kubernetes.io/component=operator")
        async with running_operator():
            job = await c.created(manifest())
            policy = c.get(POLICIES, "ml-services")
            assert policy is not None and owned_by(policy, job)
            spec = policy["spec"]
            assert spec["podSelector"] == {"matchLabels": {"mlless.io/job": "ml"},
                                           "matchExpressions": [{"key": "mlless.io/role", "operator": "In", "values": ["redis", "rabbitmq"]}]}
            assert spec["policyTypes"] == ["Ingress"]
            (rule,) = spec["ingress"]
            assert rule["from"] == [
                {"podSelector": {"matchLabels": {"mlless.io/job": "ml"},
                                 "matchExpressions": [{"key": "mlless.io/role", "operator": "In", "values": ["supervisor", "worker"]}]}},
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mlless-system"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "mlless", "app.kubernetes.io/component": "operator"}}},
            ]
            assert rule["ports"] == [{"protocol": "TCP", "port": 6379}, {"protocol": "TCP", "port": 5672}]
            # The pods it selects and lets in are the job's own.
            labels = lambda name: c.get(PODS, name)["metadata"]["labels"]  # noqa: E731
            assert labels("ml-supervisor")["mlless.io/role"] == "supervisor" and labels("ml-worker-0")["mlless.io/role"] == "worker"
            template = c.get(kmock.resource("apps/v1/statefulsets"), "ml-redis")["spec"]["template"]["metadata"]["labels"]
            assert template["mlless.io/job"] == "ml" and template["mlless.io/role"] == "redis"

        monkeypatch.setenv("MLLESS_OPERATOR_NETWORK_POLICY", "false")
        async with running_operator():
            await c.created(manifest("open"))
            assert c.get(SECRETS, "open-credentials") is not None and c.get(POLICIES, "open-services") is None
