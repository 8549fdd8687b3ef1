"""Against a real Kubernetes cluster: skipped unless MLLESS_CLUSTER_KUBECONFIG names a kubeconfig.

The cluster needs the chart installed (`helm install mlless charts/mlless`,
which brings the CRD and the operator) with an image its nodes can pull, and
a prepared dataset the worker pods can read, named by MLLESS_CLUSTER_DATASET
(e.g. s3://bucket/movielens, written by `mlless prepare`). The tests create
their TrainingJobs in MLLESS_CLUSTER_NAMESPACE (default `default`) and delete
them afterwards. Nothing here runs in CI, which has no cluster.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from typing import Any

import pytest
import yaml

KUBECONFIG = os.environ.get("MLLESS_CLUSTER_KUBECONFIG")
DATASET = os.environ.get("MLLESS_CLUSTER_DATASET")
NAMESPACE = os.environ.get("MLLESS_CLUSTER_NAMESPACE", "default")
WAIT = float(os.environ.get("MLLESS_CLUSTER_WAIT", "900"))

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not KUBECONFIG, reason="no kubeconfig: set MLLESS_CLUSTER_KUBECONFIG to test against a real cluster"),
    pytest.mark.skipif(not DATASET, reason="set MLLESS_CLUSTER_DATASET to a prepared dataset the pods can read"),
]


def kubectl(*args: str, stdin: str | None = None) -> str:
    cmd = ["kubectl", "--kubeconfig", str(KUBECONFIG), "-n", NAMESPACE, *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True, timeout=120).stdout


def job_status(name: str) -> dict[str, Any]:
    return json.loads(kubectl("get", "trainingjobs.mlless.io", name, "-o", "json")).get("status") or {}


def wait_for(name: str, predicate, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = job_status(name)
        if predicate(status):
            return status
        time.sleep(5)
    pytest.fail(f"{name}: {what} did not happen within {WAIT:g}s; last status {status}")


@pytest.fixture
def job_name():
    name = f"mlless-test-{secrets.token_hex(3)}"
    yield name
    subprocess.run(["kubectl", "--kubeconfig", str(KUBECONFIG), "-n", NAMESPACE, "delete", "trainingjobs.mlless.io", name,
                    "--ignore-not-found", "--wait=false"], capture_output=True, timeout=120)


@pytest.mark.parametrize("backend", ["pod", "knative", "openfaas"])
def test_a_trainingjob_trains_to_succeeded_and_scales(job_name, backend):
    manifest = {
        "apiVersion": "mlless.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": job_name},
        "spec": {
            "workers": 3,
            "model": {"type": "pmf"},
            "dataset": {"uri": DATASET},
            "stop": {"maxSteps": 400},
            "function": {"backend": backend},
        },
    }
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(manifest))
    wait_for(job_name, lambda s: (s.get("step") or 0) >= 10, "training progress")
    kubectl("scale", f"trainingjobs.mlless.io/{job_name}", "--replicas=2")
    wait_for(job_name, lambda s: s.get("workers") == 2 or s.get("phase") == "Succeeded", "scale-in to 2 workers")
    status = wait_for(job_name, lambda s: s.get("phase") in ("Succeeded", "Failed"), "completion")
    assert status["phase"] == "Succeeded", status
    assert status["step"] > 0 and status["trainLoss"] > 0 and status.get("modelURI")
