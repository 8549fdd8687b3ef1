"""What a job's model type sets in its pods (mlless.spec.models: a network's memory and image) and what every
backend's workers learn of their CPU request (MLLESS_CPU_CORES), built offline as in test_builders.py."""
from __future__ import annotations

import dataclasses

import pytest

from mlless_operator.backends import supervisor_pod as build_supervisor_pod
from mlless_operator.backends.knative import build_knative_service
from mlless_operator.backends.openfaas import build_openfaas_function
from mlless_operator.backends.pod import build_worker_pod
from mlless_operator.builders.jobref import JobRef
from mlless_operator.config import Config, load

from test_builders import SPEC, _job_body, containers, env_of, job


def test_spec_error_names_a_cpu_or_memory_that_is_no_quantity():
    from mlless_operator.handlers.create import spec_error

    assert spec_error(_job_body(function={"cpu": "1500m", "memory": "3Gi"})) is None
    assert spec_error(_job_body(function={"cpu": "two"})) == "spec.function.cpu: 'two' is not a Kubernetes quantity (e.g. 1, 500m, 2.5)"
    assert spec_error(_job_body(function={"memory": "3 GB"})).startswith("spec.function.memory: '3 GB' is not a Kubernetes quantity")


#: A network's job: its model type asks for larger functions and the torch extra (mlless.spec.models).
NET_SPEC = {"workers": 2, "model": {"type": "neural-net", "network": "lenet"}, "dataset": {"uri": "s3://bucket/digits"}}


def worker_containers(j: JobRef) -> list[dict]:
    """The worker container of each backend's manifest for `j`, the OpenFaaS Function's as a container would be."""
    fn = build_openfaas_function(dataclasses.replace(j, backend="openfaas"))["spec"]
    return [containers(build_worker_pod(j, 0))[0], containers(build_knative_service(dataclasses.replace(j, backend="knative")))[0],
            {"image": fn["image"], "resources": {"requests": fn["requests"], "limits": {"memory": fn["limits"]["memory"]}},
             "env": [{"name": k, "value": v} for k, v in fn["environment"].items()]}]


def test_a_networks_functions_get_the_model_types_memory_unless_the_job_sets_one():
    assert {c["resources"]["limits"]["memory"] for c in worker_containers(job(spec=NET_SPEC))} == {"3Gi"}
    assert {c["resources"]["requests"]["memory"] for c in worker_containers(job(spec=NET_SPEC))} == {"3Gi"}
    assert {c["resources"]["limits"]["memory"] for c in worker_containers(job(spec={**SPEC, "function": {}}))} == {"2Gi"}
    own = job(spec={**NET_SPEC, "function": {"memory": "6Gi"}})
    assert {c["resources"]["limits"]["memory"] for c in worker_containers(own)} == {"6Gi"}
    # A type this process has not registered (a plugin's) gets every model's default.
    assert {c["resources"]["limits"]["memory"] for c in worker_containers(job(spec={**NET_SPEC, "model": {"type": "x"}}))} == {"2Gi"}


@pytest.mark.parametrize(("cpu", "cores"), [(None, "1"), ("500m", "1"), ("1", "1"), ("1500m", "2"), ("2.5", "3"), ("4", "4")])
def test_every_backends_workers_learn_their_cores_from_the_cpu_request(cpu, cores):
    """MLLESS_CPU_CORES, a network worker's torch threads: the request rounded up, as the downward API's requests.cpu
    with divisor 1 gives it; as a literal, which Knative and OpenFaaS admit."""
    j = job(spec={**NET_SPEC, "function": {} if cpu is None else {"cpu": cpu}})
    for container in worker_containers(j):
        assert env_of(container)["MLLESS_CPU_CORES"] == {"name": "MLLESS_CPU_CORES", "value": cores}
    assert "MLLESS_CPU_CORES" not in env_of(containers(build_supervisor_pod(j))[0])  # its own, unrelated, resources


def test_a_job_whose_model_needs_an_extra_runs_on_the_image_given_for_it():
    config = Config(image="reg/mlless:1", worker_image="reg/mlless:1-worker", extra_images=(("torch", "reg/mlless:1-torch"),))
    net = job(spec=NET_SPEC, config=config)
    assert {c["image"] for c in worker_containers(net)} == {"reg/mlless:1-torch"}
    assert containers(build_supervisor_pod(net))[0]["image"] == "reg/mlless:1-torch"  # it evaluates the network
    pmf = job(spec=SPEC, config=config)
    assert {c["image"] for c in worker_containers(pmf)} == {"reg/mlless:1-worker"} and pmf.image == "reg/mlless:1"
    own = job(spec={**NET_SPEC, "function": {"image": "mine:2"}}, config=config)
    assert {c["image"] for c in worker_containers(own)} == {"mine:2"} and own.image == "mine:2"
    # Without an image for the extra, the chart's images, which must then hold it.
    plain = job(spec=NET_SPEC, config=Config(image="reg/mlless:1", worker_image="reg/mlless:1-worker"))
    assert (plain.image, plain.worker_image) == ("reg/mlless:1", "reg/mlless:1-worker")
    assert load({"MLLESS_OPERATOR_EXTRA_IMAGES": "torch=reg:5000/mlless:1-torch, other=x"}).extra_images == (
        ("torch", "reg:5000/mlless:1-torch"), ("other", "x"))
    with pytest.raises(ValueError, match="MLLESS_OPERATOR_EXTRA_IMAGES: cannot parse"):
        load({"MLLESS_OPERATOR_EXTRA_IMAGES": "reg/mlless:1-torch"})
