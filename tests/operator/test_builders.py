"""The operator's manifest builders, validated offline: built-ins strictly against Kubernetes 1.32,
Knative and OpenFaaS objects against small schemas written from their documented fields."""
from __future__ import annotations

import base64

import jsonschema
import kubernetes_validate
import pytest

from mlless.contract import ANNOTATION_OWNER, LABEL_JOB, LABEL_RANK
from mlless.transport.credentials import with_password
from mlless_operator import metrics
from mlless_operator.backends import choose_backend, get, worker_endpoint
from mlless_operator.backends import supervisor_pod as build_supervisor_pod
from mlless_operator.backends.knative import build_knative_service, knative_scale_annotations
from mlless_operator.backends.openfaas import build_openfaas_function, build_openfaas_secret, openfaas_scale_labels
from mlless_operator.backends.pod import build_worker_pod, worker_pod_name
from mlless_operator.builders.credentials import build_secret, generate_credentials
from mlless_operator.builders.jobfile import JOB_FILE, build_job_configmap
from mlless_operator.builders.jobref import JobRef
from mlless_operator.builders.network import build_network_policy
from mlless_operator.builders.names import rabbitmq_name, redis_name, secret_name, supervisor_name, worker_selector
from mlless_operator.builders.podspec import SERVICE_UID
from mlless_operator.builders.services import build_rabbitmq_service, build_rabbitmq_statefulset, build_redis_service, build_redis_statefulset
from mlless_operator.builders.supervisor import (
    build_supervisor_role,
    build_supervisor_role_binding,
    build_supervisor_service,
    build_supervisor_service_account,
)
from mlless_operator.conditions import finished_at, is_invalid, is_true, parse_time, seconds_since, set_condition
from mlless_operator.config import Config, load
from mlless_operator.handlers.ttl import applies as ttl_applies
from mlless_operator.kubeapi import PLURALS, VERBS, KubeAPIRejected, check_verb, is_subset
from mlless_operator.ranks import plan_pod_scale, pod_rank
from mlless_operator.reconcile.pod_health import health, pod_problem
from mlless_operator.reconcile.restarts import failure, pod_restarts

SPEC = {"workers": 3, "model": {"type": "pmf"}, "dataset": {"uri": "s3://bucket/ml"}, "function": {"memory": "1Gi", "cpu": "500m", "timeoutSeconds": 600, "env": [{"name": "EXTRA", "value": "1"}]}}
UID = "0a1b2c3d-0000-4000-8000-000000000001"


def job(backend: str = "pod", spec: dict | None = None, config: Config | None = None) -> JobRef:
    return JobRef(name="ml", namespace="team", uid=UID, spec=spec or SPEC, config=config or Config(), backend=backend)


def validate(obj: dict) -> None:
    kubernetes_validate.validate(obj, "1.32", strict=True)


def built_ins(j: JobRef) -> list[dict]:
    policy = build_network_policy(j)  # none when both services are external
    return [*([policy] if policy else []),
        build_secret(j),
        build_job_configmap(j),
        build_redis_service(j),
        build_redis_statefulset(j),
        build_rabbitmq_service(j),
        build_rabbitmq_statefulset(j),
        build_supervisor_service_account(j),
        build_supervisor_role(j),
        build_supervisor_role_binding(j),
        build_supervisor_pod(j),
        build_supervisor_service(j),
        build_worker_pod(j, 0),
        build_worker_pod(j, 2),
    ]


def containers(obj: dict) -> list[dict]:
    spec = obj["spec"]
    if "template" in spec:
        spec = spec["template"]["spec"]
    return spec["containers"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container["env"]}


def test_every_built_in_object_is_strictly_valid_and_owned():
    for obj in built_ins(job()):
        validate(obj)
        meta = obj["metadata"]
        assert meta["namespace"] == "team"
        assert meta["ownerReferences"] == [
            {"apiVersion": "mlless.io/v1alpha1", "kind": "TrainingJob", "name": "ml", "uid": UID, "controller": True, "blockOwnerDeletion": True}
        ]
        assert meta["labels"][LABEL_JOB] == "ml"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "mlless-operator"


def test_external_services_and_persistent_storage_are_valid():
    spec = {**SPEC, "redis": {"url": "redis://cache.example:6380/2", "passwordSecretRef": {"name": "cache", "key": "pw"}},
            "rabbitmq": {"url": "amqp://ml@mq.example:5672/%2F"}}
    j = job(spec=spec)
    for obj in built_ins(j):
        validate(obj)
    env = env_of(containers(build_worker_pod(j, 0))[0])
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "cache", "key": "pw"}
    # The URL as given; the runtime percent-encodes the password into it (`$(VAR)` would paste it raw).
    assert env["REDIS_URL"]["value"] == "redis://cache.example:6380/2"
    assert env["AMQP_URL"]["value"] == "amqp://ml@mq.example:5672/%2F"
    # no service passwords to generate
    assert set(generate_credentials(j)) == {"invoke-token", "identity-issuer", "identity-supervisor", "identity"}
    stored = {**SPEC, "redis": {"storage": "5Gi"}}
    sts = build_redis_statefulset(job(spec=stored))
    validate(sts)
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert "--appendonly" in containers(sts)[0]["args"] and "yes" in containers(sts)[0]["args"]


TLS_SPEC = {**SPEC, "redis": {"url": "rediss://cache.example:6380/2", "caSecretRef": {"name": "cache-tls", "key": "ca.crt"}},
            "rabbitmq": {"url": "amqps://ml@mq.example:5671/%2F", "passwordSecretRef": {"name": "mq", "key": "pw"},
                         "caSecretRef": {"name": "mq-tls", "key": "ca.crt"}}}


def test_an_external_services_ca_bundle_reaches_every_runtime_container():
    """spec.<service>.caSecretRef: that one key of the Secret, mounted read-only, and the variable naming it."""
    for backend in ("pod", "knative"):
        j = job(backend, TLS_SPEC)
        pods = [build_supervisor_pod(j), build_worker_pod(j, 0) if backend == "pod" else build_knative_service(j)]
        for obj in pods:
            spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Service" else obj["spec"]
            validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                      "spec": {k: v for k, v in spec.items() if k not in ("containerConcurrency", "timeoutSeconds")}})
            container = spec["containers"][0]
            env = env_of(container)
            assert env["MLLESS_REDIS_CA_FILE"]["value"] == "/etc/mlless/ca/redis/ca.pem"
            assert env["MLLESS_RABBITMQ_CA_FILE"]["value"] == "/etc/mlless/ca/rabbitmq/ca.pem"
            assert env["AMQP_URL"]["value"] == "amqps://ml@mq.example:5671/%2F"
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["redis-ca"]["secret"] == {"secretName": "cache-tls", "items": [{"key": "ca.crt", "path": "ca.pem"}]}
            assert volumes["rabbitmq-ca"]["secret"]["secretName"] == "mq-tls"
            assert {"name": "redis-ca", "mountPath": "/etc/mlless/ca/redis", "readOnly": True} in container["volumeMounts"]
    plain = env_of(containers(build_worker_pod(job(), 0))[0])  # managed services: no TLS, no CA
    assert "MLLESS_REDIS_CA_FILE" not in plain and "MLLESS_RABBITMQ_CA_FILE" not in plain


def test_secret_holds_generated_credentials_and_urls():
    j = job()
    secret = build_secret(j)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert len(data["redis-password"]) >= 32 and len(data["rabbitmq-password"]) >= 32
    assert data["redis-url"] == f"redis://:{data['redis-password']}@ml-redis.team.svc:6379/0"
    assert data["amqp-url"] == f"amqp://mlless:{data['rabbitmq-password']}@ml-rabbitmq.team.svc:5672/%2F"
    assert build_secret(j)["data"]["redis-password"] != secret["data"]["redis-password"]  # fresh each build


def test_no_password_appears_literally_in_any_pod_spec():
    j = job()
    creds = generate_credentials(j)
    secret = build_secret(j, creds)
    for obj in built_ins(j) + [build_knative_service(j)]:
        if obj is secret or obj["kind"] == "Secret":
            continue
        text = repr(obj)
        assert creds["redis-password"] not in text and creds["rabbitmq-password"] not in text
        assert creds["invoke-token"] not in text and creds["identity-issuer"] not in text
        assert creds["identity-supervisor"] not in text and creds["identity"] not in text


def test_redis_and_rabbitmq_read_passwords_from_the_secret():
    j = job()
    redis = containers(build_redis_statefulset(j))[0]
    assert redis["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert env_of(redis)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "ml-credentials", "key": "redis-password"}
    rabbit = env_of(containers(build_rabbitmq_statefulset(j))[0])
    assert rabbit["RABBITMQ_DEFAULT_USER"]["valueFrom"]["secretKeyRef"] == {"name": "ml-credentials", "key": "rabbitmq-username"}
    assert rabbit["RABBITMQ_DEFAULT_PASS"]["valueFrom"]["secretKeyRef"] == {"name": "ml-credentials", "key": "rabbitmq-password"}
    svc = build_redis_service(j)
    assert svc["spec"]["selector"] == build_redis_statefulset(j)["spec"]["selector"]["matchLabels"]


def test_a_sharded_redis_is_one_statefulset_and_service_per_shard_behind_the_job_policy_and_password():
    """spec.redis.shards: 3 -> three Redis StatefulSets and Services, each Service selecting only its own shard's
    pod, all under the job's NetworkPolicy and one password; the Secret's URL lists the shards in order."""
    j = job(spec={**SPEC, "redis": {"shards": 3}})
    shards = [(build_redis_statefulset(j, k), build_redis_service(j, k)) for k in range(3)]
    names = [sts["metadata"]["name"] for sts, _ in shards]
    assert names == ["ml-redis", "ml-redis-1", "ml-redis-2"] and [svc["metadata"]["name"] for _, svc in shards] == names
    selectors = [svc["spec"]["selector"] for _, svc in shards]
    for k, (sts, svc) in enumerate(shards):
        validate(sts)
        validate(svc)
        pod_labels = sts["spec"]["template"]["metadata"]["labels"]
        assert [all(pod_labels.get(key) == v for key, v in sel.items()) for sel in selectors] == [i == k for i in range(3)]
        redis = containers(sts)[0]
        assert env_of(redis)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "ml-credentials", "key": "redis-password"}
    creds = generate_credentials(j)
    assert creds["redis-url"].split() == [f"redis://:{creds['redis-password']}@{n}.team.svc:6379/0" for n in names]
    guarded = build_network_policy(j)["spec"]["podSelector"]["matchExpressions"][0]["values"]
    assert guarded == ["redis", "redis-1", "redis-2", "rabbitmq"]
    assert build_network_policy(j)["spec"]["ingress"][0]["ports"] == build_network_policy(job())["spec"]["ingress"][0]["ports"]
    # The default is one Redis, built exactly as before sharding.
    assert build_redis_statefulset(job(spec={**SPEC, "redis": {"shards": 1}})) == build_redis_statefulset(job())
    assert generate_credentials(job())["redis-url"].count("redis://") == 1


def test_supervisor_rbac_is_limited_to_its_own_status_and_scale():
    j = job()
    (rule,) = build_supervisor_role(j)["rules"]
    assert rule == {"apiGroups": ["mlless.io"], "resources": ["trainingjobs/status", "trainingjobs/scale"], "resourceNames": ["ml"], "verbs": ["get", "patch"]}
    binding = build_supervisor_role_binding(j)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ml-supervisor", "namespace": "team"}]
    pod = build_supervisor_pod(j)
    assert pod["spec"]["serviceAccountName"] == "ml-supervisor"
    c = containers(pod)[0]
    assert c["command"][:2] == ["mlless", "supervisor"]
    env = env_of(c)
    assert env["MLLESS_JOB_FILE"]["value"] == JOB_FILE and env["MLLESS_JOB_ID"]["value"] == "team.ml"
    assert env["MLLESS_METRICS_PORT"]["value"] == "9090"
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ml-credentials", "key": "redis-url"}
    assert env["AMQP_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ml-credentials", "key": "amqp-url"}


@pytest.mark.parametrize("obj", ["supervisor", "worker", "redis", "knative"])
def test_containers_run_non_root_with_no_capabilities(obj):
    j = job()
    built = {"supervisor": build_supervisor_pod(j), "worker": build_worker_pod(j, 1), "redis": build_redis_statefulset(j),
             "knative": build_knative_service(j)}[obj]
    spec = built["spec"]["template"]["spec"] if "template" in built["spec"] else built["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == (SERVICE_UID if obj == "redis" else 10001)
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True


def test_worker_pod_runs_its_rank_with_function_resources():
    j = job()
    pod = build_worker_pod(j, 2)
    assert pod["metadata"]["name"] == "ml-worker-2" and pod["metadata"]["labels"][LABEL_RANK] == "2"
    c = containers(pod)[0]
    assert c["command"] == ["mlless", "worker"]
    env = env_of(c)
    assert env["MLLESS_RANK"]["value"] == "2" and env["EXTRA"]["value"] == "1"
    assert c["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert worker_selector(j) == "mlless.io/job=ml,mlless.io/role=worker"


KNATIVE_SERVICE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "serving.knative.dev/v1"},
        "kind": {"const": "Service"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["template"],
            "properties": {
                "template": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "metadata": {
                            "type": "object",
                            "properties": {
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                            },
                        },
                        "spec": {
                            "type": "object",
                            "required": ["containers"],
                            "properties": {
                                "containerConcurrency": {"type": "integer", "minimum": 0, "maximum": 1000},
                                "timeoutSeconds": {"type": "integer", "minimum": 1, "maximum": 600},
                                "containers": {"type": "array", "minItems": 1, "maxItems": 1,
                                               "items": {"type": "object", "required": ["image"],
                                                         "properties": {"ports": {"type": "array", "maxItems": 1,
                                                                                  "items": {"type": "object", "properties": {"name": {"enum": ["http1", "h2c"]}}}}}}},
                            },
                        },
                    },
                }
            },
        },
    },
}

OPENFAAS_FUNCTION_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "openfaas.com/v1"},
        "kind": {"const": "Function"},
        "metadata": {"type": "object", "required": ["name", "namespace"], "not": {"required": ["ownerReferences"]}},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "image"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
                "image": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                "environment": {"type": "object", "additionalProperties": {"type": "string"}},
                "secrets": {"type": "array", "items": {"type": "string"}},
                "constraints": {"type": "array", "items": {"type": "string"}},
                "limits": {"type": "object", "additionalProperties": False, "properties": {"memory": {"type": "string"}, "cpu": {"type": "string"}}},
                "requests": {"type": "object", "additionalProperties": False, "properties": {"memory": {"type": "string"}, "cpu": {"type": "string"}}},
                "readOnlyRootFilesystem": {"type": "boolean"},
            },
        },
    },
}


def test_knative_service_pins_scale_and_concurrency():
    j = job("knative")
    svc = build_knative_service(j)
    jsonschema.validate(svc, KNATIVE_SERVICE_SCHEMA)
    template = svc["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "autoscaling.knative.dev/min-scale": "3", "autoscaling.knative.dev/max-scale": "3", "autoscaling.knative.dev/initial-scale": "3"}
    assert template["spec"]["containerConcurrency"] == 1 and template["spec"]["timeoutSeconds"] == 600
    env = env_of(template["spec"]["containers"][0])
    assert env["REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "ml-credentials"
    assert svc["metadata"]["ownerReferences"][0]["uid"] == UID
    # The containers are a core/v1 PodSpec subset: check them with the built-in schema through a Pod.
    validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
              "spec": {k: v for k, v in template["spec"].items() if k not in ("containerConcurrency", "timeoutSeconds")}})
    assert worker_endpoint(j) == "http://ml-worker.team.svc.cluster.local"


def test_openfaas_function_pins_scale_and_lives_in_the_openfaas_namespace():
    j = job("openfaas", config=Config(openfaas_namespace="fn"))
    fn = build_openfaas_function(j)
    jsonschema.validate(fn, OPENFAAS_FUNCTION_SCHEMA)
    assert fn["metadata"]["namespace"] == "fn" and fn["metadata"]["name"] == "mlless-team-ml" == fn["spec"]["name"]
    assert fn["spec"]["labels"]["com.openfaas.scale.min"] == fn["spec"]["labels"]["com.openfaas.scale.max"] == "3"
    assert fn["spec"]["secrets"] == ["mlless-team-ml-credentials"]
    assert fn["metadata"]["annotations"][ANNOTATION_OWNER] == "team/ml"
    environment = fn["spec"]["environment"]
    assert environment["max_inflight"] == "1"  # one invocation (one rank) per replica
    assert environment["MLLESS_SECRETS_DIR"] == "/var/openfaas/secrets" and environment["EXTRA"] == "1"
    assert environment["exec_timeout"] == environment["read_timeout"] == environment["write_timeout"] == "600s"
    assert fn["spec"]["labels"]["com.openfaas.scale.zero"] == "false"
    secret = build_openfaas_secret(j, {"redis-url": "redis://:pw@r:6379/0", "amqp-url": "amqp://u:pw@q:5672/%2F", "redis-password": "pw"})
    validate(secret)
    assert secret["metadata"]["namespace"] == "fn" and set(secret["data"]) == {"redis-url", "amqp-url"}  # files under MLLESS_SECRETS_DIR
    assert base64.b64decode(secret["data"]["redis-url"]).decode() == "redis://:pw@r:6379/0"
    assert "ownerReferences" not in secret["metadata"]
    assert worker_endpoint(j) == "http://gateway.openfaas:8080/function/mlless-team-ml.fn"


def test_long_names_stay_valid_and_distinct():
    long = "x" * 63
    j = JobRef(name=long, namespace="team", uid=UID, spec=SPEC, config=Config())
    names = {redis_name(j), rabbitmq_name(j), supervisor_name(j), secret_name(j), worker_pod_name(j, 0), worker_pod_name(j, 1)}
    assert len(names) == 6 and all(len(n) <= 63 for n in names)
    for obj in (build_redis_service(j), build_supervisor_pod(j)):
        validate(obj)


def test_conditions_keep_transition_time_until_status_changes():
    c1 = set_condition(None, "Created", "True", "ChildrenCreated", "ok", 1, "2026-01-01T00:00:00Z")
    c2 = set_condition(c1, "Created", "True", "ChildrenCreated", "again", 2, "2026-01-02T00:00:00Z")
    assert c2[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z" and c2[0]["observedGeneration"] == 2
    c3 = set_condition(c2, "Created", "False", "Gone", "x", 2, "2026-01-03T00:00:00Z")
    assert c3[0]["lastTransitionTime"] == "2026-01-03T00:00:00Z"
    assert is_invalid({"conditions": set_condition(None, "Failed", "True", "InvalidSpec", "spec.workers", 1)})


def test_backend_choice_falls_back_to_pods():
    assert choose_backend(None, {"pod", "knative", "openfaas"}) == ("knative", None)
    assert choose_backend(None, {"pod", "openfaas"}) == ("openfaas", None)
    assert choose_backend("openfaas", {"pod", "openfaas"}) == ("openfaas", None)
    backend, why = choose_backend("knative", {"pod"})
    assert backend == "pod" and "serving.knative.dev/v1" in why
    assert choose_backend(None, {"pod", "knative"}, default="pod") == ("pod", None)


def test_config_reads_prefixed_environment():
    cfg = load({"MLLESS_OPERATOR_IMAGE": "reg/mlless:1", "MLLESS_OPERATOR_NAMESPACES": "a, b", "MLLESS_OPERATOR_STATUS_INTERVAL": "0.5",
                "MLLESS_OPERATOR_METRICS_PORT": "0"})
    assert cfg.image == "reg/mlless:1" and cfg.namespaces == ("a", "b") and cfg.status_interval == 0.5 and cfg.metrics_port == 0
    with pytest.raises(ValueError, match="MLLESS_OPERATOR_METRICS_PORT"):
        load({"MLLESS_OPERATOR_METRICS_PORT": "x"})
    with pytest.raises(ValueError, match="DEFAULT_BACKEND"):
        load({"MLLESS_OPERATOR_DEFAULT_BACKEND": "lambda"})
    cfg = load({"MLLESS_OPERATOR_NETWORK_POLICY": "False", "MLLESS_OPERATOR_POD_LABELS": "a=1, b = 2"})
    assert cfg.network_policy is False and cfg.pod_labels == (("a", "1"), ("b", "2")) and Config().network_policy is True
    for name, raw in (("NETWORK_POLICY", "maybe"), ("POD_LABELS", "a=1,b"), ("POD_LABELS", "=1")):
        with pytest.raises(ValueError, match=f"MLLESS_OPERATOR_{name}: cannot parse"):
            load({f"MLLESS_OPERATOR_{name}": raw})


def test_subset_comparison_tolerates_server_defaults():
    assert is_subset({"a": {"b": 1}, "l": [{"x": 1}]}, {"a": {"b": 1, "c": 2}, "l": [{"x": 1, "y": 2}], "z": 0})
    assert not is_subset({"l": [{"x": 1}]}, {"l": [{"x": 1}, {"x": 2}]})
    assert not is_subset({"a": "1"}, {"a": 1})


def test_openfaas_scale_labels_allow_zero_only_when_suspended():
    assert openfaas_scale_labels(0) == {"com.openfaas.scale.min": "0", "com.openfaas.scale.max": "0", "com.openfaas.scale.zero": "true"}
    assert openfaas_scale_labels(2)["com.openfaas.scale.zero"] == "false"
    assert set(knative_scale_annotations(0).values()) == {"0"}


def test_external_url_gets_its_password_percent_encoded():
    assert with_password("redis://cache.example:6380/2", "p@ss/w:rd") == "redis://:p%40ss%2Fw%3Ard@cache.example:6380/2"
    assert with_password("amqp://ml@mq.example:5672/%2F", "x y") == "amqp://ml:x%20y@mq.example:5672/%2F"
    assert with_password("amqp://ml@mq.example/%2F", None) == "amqp://ml@mq.example/%2F"


@pytest.mark.parametrize("backend, url", [("pod", ""), ("knative", "http://ml-worker.team.svc.cluster.local"),
                                          ("openfaas", "http://gateway.openfaas:8080/function/mlless-team-ml.openfaas-fn")])
def test_supervisor_pod_has_what_the_supervisor_needs(backend, url):
    pod = build_supervisor_pod(job(backend))
    env = env_of(containers(pod)[0])
    assert {k: env[k]["value"] for k in ("MLLESS_JOB_NAME", "MLLESS_JOB_NAMESPACE", "MLLESS_WORKER_BACKEND", "MLLESS_WORKER_URL")} == {
        "MLLESS_JOB_NAME": "ml", "MLLESS_JOB_NAMESPACE": "team", "MLLESS_WORKER_BACKEND": backend, "MLLESS_WORKER_URL": url}
    # SIGTERM (deadline, or a suspension past its grace) is a clean interrupt: time to save the model.
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 60 and pod["spec"]["restartPolicy"] == "Never"


def _pod(rank, phase="Running", deleting=False, label=None):
    meta = {"name": f"ml-worker-{rank}", "labels": {LABEL_RANK: str(rank) if label is None else label}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def test_scale_in_deletes_removed_ranks_then_finished_pods_then_the_highest():
    pods = [_pod(r) for r in range(5)]
    plan = plan_pod_scale(pods, 3, removed=[1])
    assert plan.delete == ["ml-worker-1", "ml-worker-4"] and plan.create == [] and plan.highest == 4
    pods[3]["status"]["phase"] = "Succeeded"
    plan = plan_pod_scale(pods, 2, removed=[1])
    assert plan.delete == ["ml-worker-1", "ml-worker-3", "ml-worker-4"]
    # Removed and finished pods never count as workers: they go even without a scale-in.
    assert plan_pod_scale(pods, 5, removed=[1]).delete == ["ml-worker-1", "ml-worker-3"]
    assert plan_pod_scale(pods, 0).delete == ["ml-worker-3", "ml-worker-4", "ml-worker-2", "ml-worker-1", "ml-worker-0"]


def test_scale_out_never_reuses_a_rank():
    pods = [_pod(0), _pod(2), _pod(6, deleting=True)]
    assert plan_pod_scale(pods, 4).create == [7, 8]  # a terminating pod's rank is still taken
    assert plan_pod_scale(pods, 4, removed=[9]).create == [10, 11]
    plan = plan_pod_scale(pods, 4, highest_used=12)  # deleted without a trace, remembered on the job
    assert plan.create == [13, 14] and plan.highest == 14 and plan.delete == []
    assert plan_pod_scale([], 3) == plan_pod_scale([], 3, highest_used=-1)
    assert plan_pod_scale([], 3).create == [0, 1, 2]
    assert plan_pod_scale([_pod(0), _pod(1)], 2).create == [] and plan_pod_scale([_pod(0), _pod(1)], 2).highest == 1


def test_pods_without_a_rank_are_not_ours():
    assert pod_rank(_pod(3)) == 3 and pod_rank(_pod(0, label="x")) is None and pod_rank(_pod(0, label="-1")) is None
    assert plan_pod_scale([_pod(0, label="x"), _pod(1)], 1).delete == []


def test_time_helpers_and_finish_time():
    assert parse_time("2026-01-01T00:00:00Z").isoformat() == "2026-01-01T00:00:00+00:00"
    assert parse_time("2026-01-01T00:00:00.5+00:00") is not None and parse_time("yesterday") is None and parse_time(None) is None
    assert seconds_since("2026-01-01T00:00:00Z", parse_time("2026-01-01T00:01:30Z")) == 90
    succeeded = {"phase": "Succeeded", "completionTime": "2026-01-01T00:00:00Z"}
    assert finished_at(succeeded) == "2026-01-01T00:00:00Z"
    failed = {"phase": "Failed", "conditions": set_condition(None, "Failed", "True", "X", "y", 1, "2026-01-02T00:00:00Z")}
    assert finished_at(failed) == "2026-01-02T00:00:00Z"
    assert finished_at({"phase": "Suspended", "completionTime": "2026-01-01T00:00:00Z"}) is None
    assert is_true(failed, "Failed") and not is_true(failed, "Running")


def test_ttl_timer_runs_only_for_finished_jobs_with_a_ttl():
    assert ttl_applies(spec={"ttlSecondsAfterFinished": 0}, status={"phase": "Failed"})
    assert not ttl_applies(spec={"ttlSecondsAfterFinished": 60}, status={"phase": "Running"})
    assert not ttl_applies(spec={}, status={"phase": "Succeeded"})


def test_lifecycle_config_from_environment():
    cfg = load({"MLLESS_OPERATOR_SUSPEND_GRACE_SECONDS": "1.5", "MLLESS_OPERATOR_TTL_INTERVAL": "0.2"})
    assert cfg.suspend_grace_seconds == 1.5 and cfg.ttl_interval == 0.2
    assert Config().suspend_grace_seconds == 120


def test_every_verb_the_client_uses_is_declared():
    assert set(VERBS) == set(PLURALS)
    check_verb("v1", "Pod", "delete")
    check_verb("mlless.io/v1alpha1", "TrainingJob", "delete")  # ttlSecondsAfterFinished
    with pytest.raises(KubeAPIRejected, match="not declared"):
        check_verb("v1", "Pod", "patch")  # pods are never patched: created once, deleted
    with pytest.raises(KubeAPIRejected):
        check_verb("v1", "Secret", "list")  # never enumerate Secrets


def test_metrics_count_jobs_by_phase_including_suspended():
    assert "Suspended" in metrics.PHASES
    before = metrics.JOBS.labels("Suspended")._value.get()
    metrics.observe_phase("unit-test-uid", "Running")
    metrics.observe_phase("unit-test-uid", "Suspended")
    assert metrics.JOBS.labels("Suspended")._value.get() == before + 1
    metrics.forget("unit-test-uid")
    assert metrics.JOBS.labels("Suspended")._value.get() == before


def test_openfaas_copy_holds_full_urls_and_the_invocation_token():
    import asyncio

    from mlless_operator.backends.openfaas import openfaas_secrets

    class FakeAPI:
        def __init__(self, secrets: dict[str, dict]):
            self.secrets = secrets

        async def get(self, api_version, kind, namespace, name):
            assert (api_version, kind, namespace) == ("v1", "Secret", "team")
            return self.secrets.get(name)

    managed = build_secret(job(), {"redis-url": "redis://:a@ml-redis.team.svc:6379/0", "amqp-url": "amqp://mlless:b@ml-rabbitmq.team.svc:5672/%2F",
                                     "invoke-token": "t0k", "identity": "1d", "identity-issuer": "never copied"})
    assert asyncio.run(openfaas_secrets(FakeAPI({"ml-credentials": managed}), job("openfaas"))) == {
        "redis-url": "redis://:a@ml-redis.team.svc:6379/0", "amqp-url": "amqp://mlless:b@ml-rabbitmq.team.svc:5672/%2F", "invoke-token": "t0k",
        "identity": "1d"}
    # External services have no URL in the job Secret: their URL, with the password from passwordSecretRef.
    spec = {**SPEC, "redis": {"url": "redis://cache.example:6380/2", "passwordSecretRef": {"name": "cache", "key": "pw"}},
            "rabbitmq": {"url": "amqp://ml:open@mq.example:5672/%2F"}}
    cache = {"data": {"pw": base64.b64encode(b"s3cr/t").decode()}}
    urls = asyncio.run(openfaas_secrets(FakeAPI({"ml-credentials": {"data": {}}, "cache": cache}), job("openfaas", spec)))
    assert urls == {"redis-url": "redis://:s3cr%2Ft@cache.example:6380/2", "amqp-url": "amqp://ml:open@mq.example:5672/%2F"}
    # With TLS, the CA bundles too, as files the Function's environment names (OpenFaaS has no Secret volumes of ours).
    tls = {name: {"data": {key: base64.b64encode(value.encode()).decode()}} for name, key, value in
           [("cache-tls", "ca.crt", "PEM 1"), ("mq", "pw", "pw"), ("mq-tls", "ca.crt", "PEM 2")]}
    values = asyncio.run(openfaas_secrets(FakeAPI({"ml-credentials": {"data": {}}, **tls}), job("openfaas", TLS_SPEC)))
    assert values == {"redis-url": "rediss://cache.example:6380/2", "amqp-url": "amqps://ml:pw@mq.example:5671/%2F",
                      "redis-ca": "PEM 1", "rabbitmq-ca": "PEM 2"}
    assert set(build_openfaas_secret(job("openfaas", TLS_SPEC), values)["data"]) == set(values)
    environment = build_openfaas_function(job("openfaas", TLS_SPEC))["spec"]["environment"]
    assert environment["MLLESS_REDIS_CA_FILE"] == "/var/openfaas/secrets/redis-ca"
    assert environment["MLLESS_RABBITMQ_CA_FILE"] == "/var/openfaas/secrets/rabbitmq-ca"
    assert "MLLESS_REDIS_CA_FILE" not in build_openfaas_function(job("openfaas"))["spec"]["environment"]


# ---- spec validation -----------------------------------------------------------------------------


def _job_body(**spec):
    return {
        "apiVersion": "mlless.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "ml", "namespace": "team"},
        "spec": {"model": {"type": "pmf"}, "dataset": {"uri": "s3://bucket/movielens"}, **spec},
    }


def test_spec_error_names_fields_and_rejects_paths_a_pod_cannot_resolve():
    from mlless_operator.handlers.create import spec_error

    assert spec_error(_job_body()) is None
    assert spec_error(_job_body(dataset={"uri": "/data/movielens"}, output={"uri": "s3://bucket/runs/ml"})) is None
    assert "spec.sync.protocol" in spec_error(_job_body(sync={"protocol": "gossip"}))
    relative = spec_error(_job_body(dataset={"uri": "data/movielens"}))
    assert relative.startswith("spec.dataset.uri: 'data/movielens' is a relative path")
    assert spec_error(_job_body(output={"uri": "runs"})).startswith("spec.output.uri: 'runs' is a relative path")


def test_function_env_reaches_the_workers_and_the_supervisor():
    user_env = [{"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}}]
    j = job(spec={**SPEC, "function": {"env": user_env}})
    for pod in (build_supervisor_pod(j), build_worker_pod(j, 0)):
        assert env_of(containers(pod)[0])["AWS_ACCESS_KEY_ID"] == user_env[0]


def test_every_job_gets_an_invocation_token_that_reaches_the_supervisor_and_the_functions():
    j = job("knative")
    creds, other = generate_credentials(j), generate_credentials(j)
    assert len(creds["invoke-token"]) >= 40 and creds["invoke-token"] != other["invoke-token"]  # per job, random
    token_ref = {"secretKeyRef": {"name": "ml-credentials", "key": "invoke-token", "optional": True}}
    assert env_of(containers(build_supervisor_pod(j))[0])["MLLESS_INVOKE_TOKEN"]["valueFrom"] == token_ref
    knative = build_knative_service(j)["spec"]["template"]["spec"]["containers"][0]
    assert env_of(knative)["MLLESS_INVOKE_TOKEN"]["valueFrom"] == token_ref
    copy_ = build_openfaas_secret(job("openfaas"), {**creds, "redis-password": "never copied"})
    assert set(copy_["data"]) == {"redis-url", "amqp-url", "invoke-token", "identity"}  # never the issuer


def test_every_process_reads_its_own_identity_and_no_pod_the_issuer():
    """The job Secret holds a fresh issuer per job and the identities it certified: the supervisor's pod reads only
    the supervisor's, worker pod RANK only `identity-rank-RANK` (handed out by the operator: tests/operator/
    test_operator_kmock.py), and a function backend's replicas the workers' shared one (OpenFaaS: a file of the
    Secret's copy, which never holds the issuer)."""
    from mlless.protocol.identity import ANY_WORKER, SUPERVISOR, Identity, Issuer, parse_identity

    j = job("knative")
    secret = build_secret(j)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    issuer = parse_identity(data["identity-issuer"])
    assert isinstance(issuer, Issuer) and build_secret(j)["data"]["identity-issuer"] != secret["data"]["identity-issuer"]
    for key, signer in (("identity-supervisor", SUPERVISOR), ("identity", ANY_WORKER)):
        identity = parse_identity(data[key])
        assert isinstance(identity, Identity) and identity.signer == signer and identity.issuer == issuer.public
    def ref(key: str) -> dict:
        return {"secretKeyRef": {"name": "ml-credentials", "key": key, "optional": True}}

    expected = [(containers(build_supervisor_pod(j))[0], "identity-supervisor"),
                (containers(build_worker_pod(job("pod"), 3))[0], "identity-rank-3"),
                (build_knative_service(j)["spec"]["template"]["spec"]["containers"][0], "identity")]
    for container, key in expected:
        assert env_of(container)["MLLESS_IDENTITY"]["valueFrom"] == ref(key), container["name"]
        assert "identity-issuer" not in repr(container) and data["identity-issuer"] not in repr(container)
    copy_ = build_openfaas_secret(job("openfaas"), {**data, "redis-url": "redis://r", "amqp-url": "amqp://a"})
    assert base64.b64decode(copy_["data"]["identity"]).decode() == data["identity"]
    assert "identity-issuer" not in copy_["data"] and "identity-supervisor" not in copy_["data"]


def test_workers_run_the_worker_image_and_the_supervisor_keeps_the_full_one():
    config = Config(image="reg/mlless:1", worker_image="reg/mlless:1-worker")
    workers = [build_worker_pod(job("pod", config=config), 0), build_knative_service(job("knative", config=config)),
               build_openfaas_function(job("openfaas", config=config))]
    images = [w["spec"]["containers"][0]["image"] if w["kind"] == "Pod" else
              w["spec"]["template"]["spec"]["containers"][0]["image"] if w["kind"] == "Service" else w["spec"]["image"]
              for w in workers]
    assert images == ["reg/mlless:1-worker"] * 3
    assert build_supervisor_pod(job("pod", config=config))["spec"]["containers"][0]["image"] == "reg/mlless:1"
    own = job("pod", spec={**SPEC, "function": {"image": "mine:2"}}, config=config)
    assert build_worker_pod(own, 0)["spec"]["containers"][0]["image"] == build_supervisor_pod(own)["spec"]["containers"][0]["image"] == "mine:2"
    assert job("pod").worker_image == job("pod").image  # without a worker image, one image for all


def test_network_policy_guards_only_the_managed_services_and_lets_openfaas_workers_in():
    external_redis = {**SPEC, "redis": {"url": "redis://cache.example:6380/2"}}
    policy = build_network_policy(job(spec=external_redis))
    validate(policy)
    assert policy["spec"]["podSelector"]["matchExpressions"][0]["values"] == ["rabbitmq"]
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 5672}]
    # No namespace known for the operator: a bare pod selector, which looks in the job's own namespace.
    assert {"podSelector": {"matchLabels": dict(Config().pod_labels)}} in policy["spec"]["ingress"][0]["from"]
    both_external = {**external_redis, "rabbitmq": {"url": "amqp://ml@mq.example:5672/%2F"}}
    assert build_network_policy(job(spec=both_external)) is None

    fn_job = job("openfaas", config=Config(openfaas_namespace="fn"))
    peers = build_network_policy(fn_job, get("openfaas").foreign_pods(fn_job))["spec"]["ingress"][0]["from"]
    assert peers[-1] == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "fn"}},
                         "podSelector": {"matchLabels": {"faas_function": "mlless-team-ml"}}}


def _container_status(state: dict) -> dict:
    return {"status": {"phase": "Pending", "containerStatuses": [{"name": "worker", "state": state}]}, "metadata": {"name": "p"}}


def test_pod_problems_are_stuck_waits_and_unschedulable_pods_only():
    pulling = _container_status({"waiting": {"reason": "ErrImagePull", "message": "not found"}})
    assert pod_problem(pulling) == ("ErrImagePull", "container worker: not found")
    assert pod_problem(_container_status({"waiting": {"reason": "ContainerCreating"}})) is None  # on its way
    assert pod_problem(_container_status({"running": {}})) is None
    config = {"metadata": {"name": "q"}, "status": {"initContainerStatuses": [
        {"name": "init", "state": {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "x" not found'}}}]}}
    assert pod_problem(config) == ("CreateContainerConfigError", 'container init: secret "x" not found')
    unschedulable = {"metadata": {"name": "r"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available"}]}}
    assert pod_problem(unschedulable) == ("Unschedulable", "0/1 nodes are available")
    going = {**pulling, "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert pod_problem(going) is None and pod_problem({**pulling, "status": {**pulling["status"], "phase": "Failed"}}) is None
    assert health([]) == ("True", "PodsHealthy", "no pod of the job is stuck")
    status, reason, message = health([unschedulable, pulling] * 100)
    assert (status, reason) == ("False", "ErrImagePull") and len(message) == 1024 and message.startswith("pod p: ErrImagePull")


def test_supervisor_restart_count_and_failure_cause():
    pod = {"metadata": {"annotations": {"mlless.io/supervisor-restart": "2"}}, "status": {"phase": "Failed", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}
    assert pod_restarts(pod, {}) == 2 and pod_restarts(pod, {"supervisorRestarts": 3}) == 3 and pod_restarts(None, {}) == 0
    assert failure(pod) == ("OOMKilled", "exit code 137: OOMKilled")
    assert failure(None) == ("SupervisorDeleted", "the supervisor pod was deleted")
    assert failure({"status": {"phase": "Failed", "reason": "node lost!"}}) == ("SupervisorFailed", "the supervisor pod failed")
    assert build_supervisor_pod(job(), 2)["metadata"]["annotations"] == {"mlless.io/supervisor-restart": "2"}
    assert job().backoff_limit == 3 and job(spec={**SPEC, "backoffLimit": 0}).backoff_limit == 0
