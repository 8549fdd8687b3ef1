"""The Helm chart `charts/mlless`, rendered and linted offline: one test group per template.

No cluster, no `helm` binary. `helm-python-sdk` (import `helm_python`) binds Helm v4's Go library
through ctypes. What these tests use of it:

- `helm.Chart.load(path)` loads the chart directory (it is a context manager; `close()` frees it).
  It follows symlinks, logging an INFO line per link, so `crds/trainingjob.yaml` may link to the
  generated CRD at the top of the repository.
- `chart.render(values, name=..., namespace=..., is_install=True)` renders offline and returns
  `{"mlless/templates/<file>": text}`, one entry per template, empty text for a disabled one.
  It validates `values` against `values.schema.json` first and raises `helm.HelmValuesError`.
- `chart.validate_schema(values)` runs only that schema check (`HelmValuesError` naming the key).
  Like an install, both coalesce `values` over the chart's defaults first, so a test passes only
  the overrides, and a `None` (YAML null) deletes a default key.
- `chart.crds` lists what `crds/` holds (`[{name, filename, data}]`); Helm installs these once and
  never templates, upgrades or deletes them.
- `helm.lint(path, values, strict=True, kube_version="v1.32.0")` returns a report
  `{"messages": [{"severity", "path", "error"}], "errors": [...]}` instead of raising; severity is
  1 info, 2 warning, 3 error.
- `helm.package(path, destination=...)` writes the `.tgz`; `helm.Chart.load` reads it back.

Every rendered built-in object is validated with `kubernetes_validate.validate(obj, "1.32",
strict=True)`. kubernetes-validate has no schemas for the Prometheus Operator's kinds, so the
ServiceMonitor and PodMonitor are checked against the small hand-written subset below.
The Grafana dashboard's PromQL must only name series that a real `SupervisorMetrics` exports.
"""
from __future__ import annotations

import dataclasses
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from charts import helmdocs
from mlless.contract import ENV_OPERATOR_PREFIX, GROUP, OPERATOR_HEALTH_PORT, PLURAL, STEP_PHASES as PHASES, SWEEP_PLURAL
from mlless.telemetry.metrics import TUNER_OUTCOMES, SupervisorMetrics

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "mlless"
CRD_FILE = ROOT / "crds" / "trainingjob.yaml"
DASHBOARD = CHART / "dashboards" / "mlless.json"
KUBE_VERSION = "1.32"
RELEASE, NAMESPACE = "mlless", "mlless-system"
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# The value sets every strict-validation and lint test runs over.
VARIATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}, "scrapeTimeout": "10s"}}},
    "supervisor-pod-monitor": {"metrics": {"supervisorPodMonitor": {"enabled": True}}},
    "dashboard-off": {"grafana": {"dashboard": {"enabled": False}}},
    "network-policy-off": {"networkPolicy": {"enabled": False}},
    "image-tag": {"image": {"repository": "registry.example.com/ml/mlless", "tag": "0.1.1", "pullPolicy": "Always"},
                  "imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}]},
    "watch-namespaces": {"operator": {"watchNamespaces": ["team-a", "team-b"], "logLevel": "debug", "logFormat": "json"},
                         "metrics": {"supervisorPodMonitor": {"enabled": True}}},
    "external-service-account": {"serviceAccount": {"create": False, "name": "ml-operator"}, "rbac": {"create": False}},
    "user-roles-off": {"rbac": {"aggregateToDefaultRoles": False}},
    "everything": {
        "fullnameOverride": "ml",
        "operator": {"extraEnv": [{"name": "MLLESS_OPERATOR_STATUS_INTERVAL", "value": "5"}],
                     "defaultBackend": "pod", "workerImage": "registry.example.com/ml/mlless:0.1.1-worker",
                     "extraImages": {"torch": "registry.example.com/ml/mlless:0.1.1-torch", "other": "registry.example.com:5000/x:1"},
                     "openfaas": {"namespace": "functions", "gateway": "http://gw.openfaas:8080"},
                     "podAnnotations": {"a": "b"}, "podLabels": {"team": "ml"}, "nodeSelector": {"kubernetes.io/os": "linux"},
                     "tolerations": [{"key": "ml", "operator": "Exists", "effect": "NoSchedule"}],
                     "affinity": {"nodeAffinity": {}}, "priorityClassName": "system-cluster-critical"},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x"}},
        "metrics": {"service": {"annotations": {"x": "y"}}, "serviceMonitor": {"enabled": True, "namespace": "monitoring"},
                    "supervisorPodMonitor": {"enabled": True, "namespace": "monitoring", "labels": {"release": "prom"}}},
        "grafana": {"dashboard": {"namespace": "grafana", "annotations": {"grafana_folder": "mlless"}}},
    },
}

# What the operator grants each supervisor in its Role (issue 4, §2.4): get and patch on its own
# TrainingJob's status and scale. RBAC refuses to create a Role granting more than its creator holds.
SUPERVISOR_ROLE_RULES = [
    {"apiGroups": ["mlless.io"], "resources": ["trainingjobs/status", "trainingjobs/scale"], "verbs": ["get", "patch"]},
]

# What the operator does to each kind it manages (issue 4 §2), as (group, resource) -> verbs.
# The children's rows are mlless_operator.kubeapi.VERBS, which the operator's client enforces
# (TestOperatorContract checks that they agree).
OPERATOR_NEEDS: dict[tuple[str, str], set[str]] = {
    # Kopf watches and patches (finalizer, annotations); the operator deletes for ttlSecondsAfterFinished.
    # A sweep creates, reads, lists and deletes its trials.
    ("mlless.io", "trainingjobs"): {"create", "get", "list", "watch", "patch", "delete"},
    ("mlless.io", "trainingjobs/status"): {"get", "patch"},
    ("mlless.io", "trainingjobs/scale"): {"get", "patch"},  # only to grant them to the supervisor
    # The children's owner references set blockOwnerDeletion; where the OwnerReferencesPermissionEnforcement
    # admission plugin runs (OpenShift, hardened clusters) that needs update on the owner's finalizers.
    ("mlless.io", "trainingjobs/finalizers"): {"update"},
    # Kopf watches and patches TrainingSweeps; the operator writes their status; trials' owner references block.
    ("mlless.io", "trainingsweeps"): {"get", "list", "watch", "patch"},
    ("mlless.io", "trainingsweeps/status"): {"get", "patch"},
    ("mlless.io", "trainingsweeps/finalizers"): {"update"},
    # Children are addressed by name: no list/watch, above all not on Secrets. Owner references let the
    # garbage collector delete them; the operator deletes only Secrets (the OpenFaaS copy) and pods.
    ("", "secrets"): {"create", "get", "patch", "delete"},
    **{("", r): {"create", "get", "patch"} for r in ("services", "serviceaccounts", "configmaps")},
    # Created once, never patched; scale-in lists a job's worker pods and deletes them by rank,
    # suspension and activeDeadlineSeconds delete the supervisor and the workers, a failed supervisor
    # makes way for its successor, and the status timer lists a job's pods (PodsHealthy).
    ("", "pods"): {"create", "get", "list", "delete"},
    ("apps", "statefulsets"): {"create", "get", "patch"},
    ("networking.k8s.io", "networkpolicies"): {"create", "get", "patch"},
    ("rbac.authorization.k8s.io", "roles"): {"create", "get", "patch"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create", "get", "patch"},
    ("serving.knative.dev", "services"): {"create", "get", "patch"},
    ("openfaas.com", "functions"): {"create", "get", "patch", "delete"},  # out of owner references' reach
    ("", "events"): {"create", "patch"},
    ("", "namespaces"): {"get", "list", "watch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
}


# ---- rendering helpers ----------------------------------------------------------------------------


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    helm.disable_logging()
    with helm.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def render(chart: helm.Chart):
    """render(values) -> {template file name: [documents]} (NOTES.txt kept as text under "NOTES.txt")."""
    cache: dict[str, dict[str, Any]] = {}

    def _render(values: dict[str, Any] | None = None, name: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, Any]:
        key = json.dumps([values, name, namespace], sort_keys=True)
        if key not in cache:
            raw = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
            docs: dict[str, Any] = {}
            for path, text in raw.items():
                file = path.removeprefix(f"{chart.name}/templates/")
                docs[file] = text if file == "NOTES.txt" else [d for d in yaml.load_all(text, Loader=YAML_LOADER) if d]
            cache[key] = docs
        return cache[key]

    return _render


def objects(rendered: dict[str, Any]) -> list[dict[str, Any]]:
    return [doc for file, docs in rendered.items() if file != "NOTES.txt" for doc in docs]


def one(rendered: dict[str, Any], file: str) -> dict[str, Any]:
    docs = rendered[file]
    assert len(docs) == 1, f"{file} rendered {len(docs)} objects"
    return docs[0]


def container(rendered: dict[str, Any]) -> dict[str, Any]:
    (c,) = one(rendered, "deployment.yaml")["spec"]["template"]["spec"]["containers"]
    return c


# ---- Chart.yaml, lint, layout ---------------------------------------------------------------------


class TestChart:
    def test_metadata(self, chart):
        meta = chart.metadata
        assert (meta["apiVersion"], meta["name"], meta["version"], meta["appVersion"]) == ("v2", "mlless", "0.1.0", "0.1.0")
        assert meta["type"] == "application"

    def test_app_version_is_the_package_version(self, chart):
        pyproject = (ROOT / "pyproject.toml").read_text()
        assert f'version = "{chart.metadata["appVersion"]}"' in pyproject

    @pytest.mark.parametrize("variation", VARIATIONS)
    def test_lint_is_clean(self, variation):
        report = helm.lint(CHART, VARIATIONS[variation], strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}.0")
        assert report["errors"] == []
        assert [m for m in report["messages"] if m["severity"] >= 2] == []

    @pytest.mark.parametrize("variation", VARIATIONS)
    def test_one_resource_per_template(self, render, variation):
        for file, docs in render(VARIATIONS[variation]).items():
            if file != "NOTES.txt":
                assert len(docs) <= 1, file

    def test_default_install_renders_the_expected_objects(self, render):
        kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objects(render()))
        assert kinds == [
            ("ClusterRole", "mlless-operator-mlless-system"),
            ("ClusterRole", "mlless-training-editor-mlless-system"),
            ("ClusterRole", "mlless-training-viewer-mlless-system"),
            ("ClusterRoleBinding", "mlless-operator-mlless-system"),
            ("ConfigMap", "mlless-dashboard"),
            ("Deployment", "mlless-operator"),
            ("Service", "mlless-operator-metrics"),
            ("ServiceAccount", "mlless-operator"),
        ]

    def test_two_releases_never_collide(self, render):
        """No fullnameOverride default (kuberay's mistake): two releases get disjoint names,
        and cluster-scoped names carry the namespace so same-named releases in two namespaces do too."""
        def names(rendered):
            return {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects(rendered)}

        assert not names(render(name="a")) & names(render(name="b"))
        cluster_scoped = lambda r: {n for n in names(r) if n[1] is None}
        assert not cluster_scoped(render(namespace="x")) & cluster_scoped(render(namespace="y"))

    def test_every_object_carries_the_standard_labels(self, render):
        for obj in objects(render(VARIATIONS["everything"])):
            labels = obj["metadata"]["labels"]
            assert labels["app.kubernetes.io/managed-by"] == "Helm", obj["kind"]
            assert labels["app.kubernetes.io/instance"] == RELEASE
            assert labels["helm.sh/chart"] == "mlless-0.1.0"

    def test_namespaced_objects_name_their_namespace(self, render):
        for obj in objects(render(VARIATIONS["everything"])):
            if not obj["kind"].startswith("Cluster"):
                assert obj["metadata"].get("namespace"), obj["kind"]


# ---- strict validation of every rendered object ---------------------------------------------------

_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {"port": {"type": "string", "minLength": 1}, "path": {"type": "string"}, "interval": _DURATION,
                   "scrapeTimeout": _DURATION, "honorLabels": {"type": "boolean"}},
}


def _monitor_schema(kind: str, endpoints: str) -> dict[str, Any]:
    """A strict subset of the Prometheus Operator's monitoring.coreos.com/v1 CRD schema (v0.7x),
    covering exactly the fields the chart may set, so a typo or a misplaced field fails."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": {"type": "object", "additionalProperties": False, "required": ["name", "namespace"],
                         "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _STR_MAP}},
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", endpoints],
                "properties": {
                    "namespaceSelector": {"type": "object", "additionalProperties": False,
                                          "properties": {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
                    "selector": {"type": "object", "additionalProperties": False, "properties": {"matchLabels": _STR_MAP}},
                    endpoints: {"type": "array", "minItems": 1, "items": _ENDPOINT},
                },
            },
        },
    }


MONITOR_SCHEMAS = {"ServiceMonitor": _monitor_schema("ServiceMonitor", "endpoints"),
                   "PodMonitor": _monitor_schema("PodMonitor", "podMetricsEndpoints")}


@pytest.mark.parametrize("variation", VARIATIONS)
def test_every_rendered_object_is_strictly_valid(render, variation):
    for obj in objects(render(VARIATIONS[variation])):
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            jsonschema.Draft7Validator(MONITOR_SCHEMAS[obj["kind"]]).validate(obj)
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_strict_validation_catches_an_unknown_field(render):
    deployment = json.loads(json.dumps(one(render(), "deployment.yaml")))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)
    monitor = json.loads(json.dumps(one(render(VARIATIONS["service-monitor"]), "servicemonitor.yaml")))
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(MONITOR_SCHEMAS["ServiceMonitor"]).validate(monitor)


# ---- values.yaml and values.schema.json -----------------------------------------------------------


def documented_keys() -> list[str]:
    """The keys of values.yaml with a `# --` description: the rows of the README's values table."""
    return [value.key for value in helmdocs.values((CHART / "values.yaml").read_text())]


class TestValues:
    def test_schema_is_draft7_and_defaults_pass(self, chart):
        schema = json.loads((CHART / "values.schema.json").read_text())
        assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
        jsonschema.Draft7Validator.check_schema(schema)
        jsonschema.Draft7Validator(schema).validate(chart.values)
        chart.validate_schema(chart.values)

    @pytest.mark.parametrize("variation", VARIATIONS)
    def test_variations_pass_the_schema(self, chart, variation):
        chart.validate_schema(VARIATIONS[variation])
        jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text())).validate(
            merge(chart.values, VARIATIONS[variation]))

    @pytest.mark.parametrize(
        "bad, message",
        [
            ({"image": {"tag": 5}}, "/image/tag"),
            ({"image": {"tag": "latest"}}, "/image/tag"),
            ({"image": {"tag": "nightly"}}, "/image/tag"),
            ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
            ({"imageTag": "0.1.0"}, "imageTag"),
            ({"operator": {"replicas": 2}}, "replicas"),
            ({"operator": {"watchNamespaces": ["Team_A"]}}, "/operator/watchNamespaces/0"),
            ({"operator": {"resources": {"requests": {"cpu": None}}}}, "/operator/resources/requests"),  # null deletes a default
            ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "/metrics/serviceMonitor/enabled"),
            ({"metrics": {"serviceMonitor": {"interval": "30"}}}, "/metrics/serviceMonitor/interval"),
            ({"grafana": {"dashboard": {"labels": {"grafana_dashboard": 1}}}}, "grafana_dashboard"),
            ({"fullnameOverride": "Not_A_Name"}, "/fullnameOverride"),
            ({"networkPolicy": {"enabled": "no"}}, "/networkPolicy/enabled"),
            ({"rbac": {"aggregateToDefaultRoles": "yes"}}, "/rbac/aggregateToDefaultRoles"),
            ({"operator": {"extraImages": {"torch": "mlless:latest"}}}, "/operator/extraImages/torch"),
            ({"operator": {"extraImages": {"torch": ""}}}, "/operator/extraImages/torch"),
        ],
        ids=lambda v: json.dumps(v) if isinstance(v, dict) else None,
    )
    def test_schema_rejects_bad_values(self, chart, bad, message):
        with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
            chart.validate_schema(bad)
        with pytest.raises(helm.HelmValuesError):  # install and template refuse it too
            chart.render(bad, name=RELEASE)

    def test_image_tag_defaults_to_app_version_not_a_floating_tag(self, chart):
        assert chart.values["image"]["tag"] == ""
        assert chart.values["fullnameOverride"] == "" and chart.values["nameOverride"] == ""

    def test_schema_covers_every_value_with_a_description(self, chart):
        schema = json.loads((CHART / "values.schema.json").read_text())
        documented = documented_keys()

        def walk(values, node, path):
            for key, value in values.items():
                assert key in node.get("properties", {}), f"{path}{key} missing from values.schema.json"
                child = node["properties"][key]
                if f"{path}{key}" in documented:  # a documented value: described, and typed as a whole
                    assert child.get("description"), f"{path}{key} has no description"
                else:  # a group of values
                    assert child.get("additionalProperties") is False, f"{path}{key} accepts unknown keys"
                    walk(value, child, f"{path}{key}.")

        walk(chart.values, schema, "")


# ---- crds/ ----------------------------------------------------------------------------------------


CRD_FILES = {"crds/trainingjob.yaml": CRD_FILE, "crds/trainingsweep.yaml": ROOT / "crds" / "trainingsweep.yaml"}


class TestCRD:
    def test_chart_ships_exactly_the_generated_crds(self, chart):
        assert {crd["name"]: crd["data"] for crd in chart.crds} == {n: f.read_text() for n, f in CRD_FILES.items()}

    @pytest.mark.parametrize("name", CRD_FILES)
    def test_chart_crd_is_a_link_to_the_generated_file(self, name):
        link = CHART / name
        assert link.is_symlink() and link.resolve() == CRD_FILES[name].resolve()

    def test_packaged_chart_carries_the_crd_contents(self, tmp_path):
        archive = helm.package(CHART, destination=tmp_path)
        with tarfile.open(archive) as tar:
            for name, generated in CRD_FILES.items():
                member = tar.getmember(f"mlless/{name}")
                assert member.isfile()  # the link is resolved, not archived as a dangling symlink
                assert tar.extractfile(member).read().decode() == generated.read_text()
        with helm.Chart.load(archive) as packaged:
            assert sorted(c["data"] for c in packaged.crds) == sorted(f.read_text() for f in CRD_FILES.values())

    @pytest.mark.parametrize("variation", VARIATIONS)
    def test_crd_is_never_templated(self, render, variation):
        """CRDs in crds/ are installed once and never deleted by `helm uninstall`; a templated CRD would be."""
        assert all(o["kind"] != "CustomResourceDefinition" for o in objects(render(VARIATIONS[variation])))


# ---- templates/deployment.yaml --------------------------------------------------------------------


class TestDeployment:
    def test_single_replica_recreated_never_overlapping(self, render):
        spec = one(render(), "deployment.yaml")["spec"]
        assert spec["replicas"] == 1
        assert spec["strategy"] == {"type": "Recreate"}

    def test_runs_kopf_standalone_on_the_operator_module(self, render):
        c = container(render())
        assert c["command"] == ["kopf"]
        assert c["args"][:3] == ["run", "--standalone", "--module=mlless_operator.main"]
        assert "--all-namespaces" in c["args"]
        assert "--liveness=http://0.0.0.0:8080/healthz" in c["args"]

    def test_liveness_probe_hits_kopf_healthz(self, render):
        c = container(render())
        probe = c["livenessProbe"]["httpGet"]
        assert probe["path"] == "/healthz"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports[probe["port"]] == 8080

    def test_default_health_port_is_the_operators_own(self):
        """`mlless-operator` (python -m mlless_operator) serves /healthz on OPERATOR_HEALTH_PORT; the chart repeats it."""
        assert yaml.safe_load((CHART / "values.yaml").read_text())["operator"]["healthPort"] == OPERATOR_HEALTH_PORT

    def test_pod_security(self, render):
        pod = one(render(), "deployment.yaml")["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's user
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        sc = container(render())["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}

    def test_dockerfile_user_matches(self):
        assert "USER 10001" in (ROOT / "Dockerfile").read_text()

    def test_resource_requests(self, render):
        resources = container(render())["resources"]
        assert set(resources["requests"]) == {"cpu", "memory"}
        assert "memory" in resources["limits"]

    def test_image_defaults_to_app_version(self, render, chart):
        c = container(render())
        assert c["image"] == f"mlless:{chart.metadata['appVersion']}"
        assert c["imagePullPolicy"] == "IfNotPresent"

    def test_custom_image_reaches_the_operator_and_its_pods(self, render):
        rendered = render(VARIATIONS["image-tag"])
        c = container(rendered)
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert c["image"] == env["MLLESS_OPERATOR_IMAGE"] == "registry.example.com/ml/mlless:0.1.1"
        assert c["imagePullPolicy"] == "Always"
        pod = one(rendered, "deployment.yaml")["spec"]["template"]["spec"]
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]

    def test_image_digest(self, render):
        digest = "sha256:" + "a" * 64
        assert container(render({"image": {"tag": digest}}))["image"] == f"mlless@{digest}"

    def test_watch_namespaces(self, render):
        args = container(render(VARIATIONS["watch-namespaces"]))["args"]
        assert "--all-namespaces" not in args
        assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
        assert "--debug" in args and "--log-format=json" in args
        env = {e["name"]: e["value"] for e in container(render(VARIATIONS["watch-namespaces"]))["env"]}
        assert env["MLLESS_OPERATOR_NAMESPACES"] == "team-a,team-b"

    def test_operator_environment(self, render):
        env = {e["name"]: e["value"] for e in container(render(VARIATIONS["everything"]))["env"]}
        assert env["MLLESS_OPERATOR_METRICS_PORT"] == "9090"
        assert env["MLLESS_OPERATOR_DEFAULT_BACKEND"] == "pod"
        assert env["MLLESS_OPERATOR_OPENFAAS_NAMESPACE"] == "functions"
        assert env["MLLESS_OPERATOR_STATUS_INTERVAL"] == "5"  # extraEnv
        assert all(name.startswith("MLLESS_OPERATOR_") for name in env)
        assert "MLLESS_OPERATOR_NAMESPACES" not in env  # all namespaces

    def test_extra_images_reach_the_operator_as_it_reads_them(self, render):
        from mlless_operator import config as operator_config

        cfg = operator_config.load({e["name"]: e["value"] for e in container(render(VARIATIONS["everything"]))["env"]})
        assert dict(cfg.extra_images) == {"torch": "registry.example.com/ml/mlless:0.1.1-torch",
                                          "other": "registry.example.com:5000/x:1"}
        assert "MLLESS_OPERATOR_EXTRA_IMAGES" not in {e["name"] for e in container(render())["env"]}

    def test_network_policy_setting_and_the_pod_it_lets_in(self, render):
        """networkPolicy.enabled reaches the operator, and so do the namespace and labels its own pod has."""
        from mlless_operator import config as operator_config

        for values, enabled in (({}, True), (VARIATIONS["network-policy-off"], False)):
            rendered = render(values)
            cfg = operator_config.load({e["name"]: e["value"] for e in container(rendered)["env"]})
            assert cfg.network_policy is enabled
            assert cfg.pod_namespace == NAMESPACE
            pod_labels = one(rendered, "deployment.yaml")["spec"]["template"]["metadata"]["labels"]
            assert dict(cfg.pod_labels).items() <= pod_labels.items()
            assert dict(cfg.pod_labels) == {"app.kubernetes.io/name": "mlless", "app.kubernetes.io/instance": RELEASE,
                                            "app.kubernetes.io/component": "operator"}

    def test_metrics_port_is_exposed(self, render):
        c = container(render({"metrics": {"port": 9191}}))
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"] == int(env["MLLESS_OPERATOR_METRICS_PORT"]) == 9191

    def test_pod_placement_values(self, render):
        pod = one(render(VARIATIONS["everything"]), "deployment.yaml")["spec"]["template"]
        assert pod["metadata"]["annotations"] == {"a": "b"} and pod["metadata"]["labels"]["team"] == "ml"
        spec = pod["spec"]
        assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
        assert spec["tolerations"][0]["key"] == "ml" and spec["priorityClassName"] == "system-cluster-critical"

    def test_selector_is_stable_and_matches_the_pod(self, render):
        spec = one(render(VARIATIONS["everything"]), "deployment.yaml")["spec"]
        selector = spec["selector"]["matchLabels"]
        assert selector.items() <= spec["template"]["metadata"]["labels"].items()
        assert "app.kubernetes.io/version" not in selector and "helm.sh/chart" not in selector


# ---- templates/serviceaccount.yaml ----------------------------------------------------------------


class TestServiceAccount:
    def test_created_and_used(self, render):
        rendered = render()
        sa = one(rendered, "serviceaccount.yaml")
        pod = one(rendered, "deployment.yaml")["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == sa["metadata"]["name"] == "mlless-operator"
        assert sa["automountServiceAccountToken"] is False  # only the operator pod mounts it
        assert pod["automountServiceAccountToken"] is True

    def test_existing_service_account(self, render):
        rendered = render(VARIATIONS["external-service-account"])
        assert rendered["serviceaccount.yaml"] == [] and rendered["clusterrole.yaml"] == [] and rendered["clusterrolebinding.yaml"] == []
        assert one(rendered, "deployment.yaml")["spec"]["template"]["spec"]["serviceAccountName"] == "ml-operator"

    def test_existing_service_account_needs_a_name(self, chart):
        with pytest.raises(helm.HelmRenderError, match="serviceAccount.name is required"):
            chart.render({"serviceAccount": {"create": False}}, name=RELEASE)


# ---- templates/clusterrole.yaml and clusterrolebinding.yaml ---------------------------------------


def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", []) and verb in r["verbs"] and not r.get("resourceNames")
               for r in rules)


class TestRBAC:
    @pytest.fixture(scope="class")
    @classmethod
    def rules(cls, render):
        return one(render(), "clusterrole.yaml")["rules"]

    def test_no_wildcards(self, rules):
        for rule in rules:
            for field in ("apiGroups", "resources", "verbs"):
                assert all("*" not in item for item in rule[field]), rule
            assert "nonResourceURLs" not in rule

    def test_no_privilege_escalation_verbs(self, rules):
        verbs = {v for r in rules for v in r["verbs"]}
        assert not verbs & {"escalate", "bind", "impersonate", "deletecollection"}
        # The operator patches; it never PUTs a whole object. The `update`s are on the owners' finalizers
        # subresources (jobs own children, sweeps own trials), which owner-reference admission checks and nothing calls.
        assert {(res, v) for r in rules for res in r["resources"] for v in r["verbs"] if v == "update"} == {
            ("trainingjobs/finalizers", "update"), ("trainingsweeps/finalizers", "update")}

    def test_exactly_what_the_operator_needs(self, rules):
        granted: dict[tuple[str, str], set[str]] = {}
        for rule in rules:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.setdefault((group, resource), set()).update(rule["verbs"])
        assert granted == OPERATOR_NEEDS

    def test_operator_may_grant_the_supervisor_role(self, rules):
        """The operator creates each supervisor's Role; the API server refuses a Role that grants
        verbs its creator does not hold (the operator has no `escalate`)."""
        for rule in SUPERVISOR_ROLE_RULES:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert allows(rules, group, resource, verb), (group, resource, verb)

    def test_cannot_touch_what_it_does_not_manage(self, rules):
        for group, resource in [("", "nodes"), ("apps", "deployments"), ("", "persistentvolumes"),
                                ("rbac.authorization.k8s.io", "clusterroles"), ("rbac.authorization.k8s.io", "clusterrolebindings"),
                                ("apiextensions.k8s.io", "customresourcedefinitions")]:
            for verb in ("create", "patch", "delete"):
                assert not allows(rules, group, resource, verb), (group, resource, verb)

    @pytest.mark.parametrize("template", sorted(p.name for p in (CHART / "templates").glob("clusterrole-*.yaml")) + ["clusterrole.yaml"])
    def test_every_rule_says_why(self, template):
        lines = (CHART / "templates" / template).read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                assert lines[i - 1].strip().startswith("#"), f"{template}:{i + 1} has no comment"

    def test_binding_names_the_role_and_the_service_account(self, render):
        rendered = render()
        binding = one(rendered, "clusterrolebinding.yaml")
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": one(rendered, "clusterrole.yaml")["metadata"]["name"]}
        sa = one(rendered, "serviceaccount.yaml")["metadata"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]


# ---- templates/clusterrole-training-editor.yaml and clusterrole-training-viewer.yaml -------------

AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"
#: template -> (the built-in roles it joins, verbs on the CRDs' resources, verbs on each subresource by name).
#: A subresource a CRD gains that is not named here fails the tests until someone decides who may use it.
USER_ROLES: dict[str, tuple[set[str], set[str], dict[str, set[str]]]] = {
    # Status is the operator's and the supervisor's to write: a user who could would fake a job's outcome.
    "clusterrole-training-editor.yaml": ({"admin", "edit"}, {"create", "delete", "get", "list", "patch", "update", "watch"},
                                         {"status": {"get"}, "scale": {"get", "patch", "update"}}),
    "clusterrole-training-viewer.yaml": ({"view"}, {"get", "list", "watch"}, {"status": {"get"}, "scale": {"get"}}),
}


def crd_resources() -> dict[tuple[str, str], str | None]:
    """(API group, resource) -> subresource name (None for the resource itself) of every CRD the chart ships."""
    resources: dict[tuple[str, str], str | None] = {}
    for file in CRD_FILES.values():
        spec = yaml.safe_load(file.read_text())["spec"]
        plural = spec["names"]["plural"]
        resources[(spec["group"], plural)] = None
        for version in spec["versions"]:
            for sub in version.get("subresources", {}):
                resources[(spec["group"], f"{plural}/{sub}")] = sub
    return resources


def granted(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


class TestUserRoles:
    """ClusterRoles aggregated into the built-in admin/edit/view, so namespace users may use TrainingJobs and sweeps."""

    def test_the_crds_are_the_contracts(self):
        assert {(group, resource) for (group, resource), sub in crd_resources().items() if sub is None} == {
            (GROUP, PLURAL), (GROUP, SWEEP_PLURAL)}

    @pytest.mark.parametrize("template", USER_ROLES)
    def test_joins_exactly_its_built_in_roles(self, render, template):
        labels = one(render(), template)["metadata"]["labels"]
        aggregated = {key.removeprefix(AGGREGATE): value for key, value in labels.items() if key.startswith(AGGREGATE)}
        assert aggregated == {role: "true" for role in USER_ROLES[template][0]}

    @pytest.mark.parametrize("template", USER_ROLES)
    def test_names_exactly_what_the_crds_define_with_least_privilege(self, render, template):
        _, verbs, sub_verbs = USER_ROLES[template]
        rules = one(render(), template)["rules"]
        assert all(not r.get("resourceNames") and not r.get("nonResourceURLs") for r in rules)
        expected = {key: verbs if sub is None else sub_verbs[sub] for key, sub in crd_resources().items()}
        assert granted(rules) == expected

    def test_a_viewer_writes_nothing_and_an_editor_no_status(self, render):
        """The table above, read as the docs state it."""
        rendered = render()
        viewer = granted(one(rendered, "clusterrole-training-viewer.yaml")["rules"])
        assert set().union(*viewer.values()) == {"get", "list", "watch"}
        editor = granted(one(rendered, "clusterrole-training-editor.yaml")["rules"])
        assert {resource: verbs for (_, resource), verbs in editor.items() if resource.endswith("/status")} == {
            f"{PLURAL}/status": {"get"}, f"{SWEEP_PLURAL}/status": {"get"}}
        assert editor[(GROUP, f"{PLURAL}/scale")] >= {"get", "patch"}  # what `kubectl scale` calls

    @pytest.mark.parametrize("variation", ["user-roles-off", "external-service-account"])
    def test_switched_off_by_either_value(self, render, variation):
        rendered = render(VARIATIONS[variation])
        assert all(rendered[template] == [] for template in USER_ROLES)


# ---- templates/service.yaml -----------------------------------------------------------------------


class TestMetricsService:
    def test_selects_the_operator_pod_metrics_port(self, render):
        rendered = render()
        svc = one(rendered, "service.yaml")
        pod_labels = one(rendered, "deployment.yaml")["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= pod_labels.items()
        (port,) = svc["spec"]["ports"]
        assert port["name"] == "metrics" and port["port"] == 9090
        assert port["targetPort"] in {p["name"] for p in container(rendered)["ports"]}

    def test_can_be_disabled(self, render):
        assert render({"metrics": {"service": {"enabled": False}}})["service.yaml"] == []


# ---- templates/servicemonitor.yaml ----------------------------------------------------------------


class TestServiceMonitor:
    def test_off_by_default(self, render):
        assert render()["servicemonitor.yaml"] == []

    def test_scrapes_the_metrics_service(self, render):
        rendered = render(VARIATIONS["service-monitor"])
        sm = one(rendered, "servicemonitor.yaml")
        svc = one(rendered, "service.yaml")
        assert sm["metadata"]["labels"]["release"] == "prom"
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        (endpoint,) = sm["spec"]["endpoints"]
        assert endpoint["port"] == svc["spec"]["ports"][0]["name"]
        assert (endpoint["interval"], endpoint["scrapeTimeout"], endpoint["honorLabels"]) == ("30s", "10s", False)

    def test_other_namespace(self, render):
        sm = one(render(VARIATIONS["everything"]), "servicemonitor.yaml")
        assert sm["metadata"]["namespace"] == "monitoring"
        assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}

    def test_needs_the_service(self, chart):
        with pytest.raises(helm.HelmRenderError, match="needs metrics.service.enabled"):
            chart.render({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}}, name=RELEASE)


# ---- templates/podmonitor.yaml --------------------------------------------------------------------


class TestSupervisorPodMonitor:
    def test_off_by_default(self, render):
        assert render()["podmonitor.yaml"] == []

    def test_scrapes_supervisors_keeping_their_job_label(self, render):
        pm = one(render(VARIATIONS["supervisor-pod-monitor"]), "podmonitor.yaml")
        assert pm["spec"]["namespaceSelector"] == {"any": True}
        assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "mlless", "app.kubernetes.io/component": "supervisor"}
        (endpoint,) = pm["spec"]["podMetricsEndpoints"]
        assert endpoint["honorLabels"] is True  # the dashboard filters on job = the TrainingJob
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"

    def test_follows_watched_namespaces(self, render):
        pm = one(render(VARIATIONS["watch-namespaces"]), "podmonitor.yaml")
        assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


# ---- templates/dashboard-configmap.yaml -----------------------------------------------------------


class TestDashboardConfigMap:
    def test_labelled_for_the_grafana_sidecar(self, render):
        cm = one(render(), "dashboard-configmap.yaml")
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["data"]["mlless.json"] == DASHBOARD.read_text().rstrip("\n")
        assert len(json.dumps(cm).encode()) < 1024 * 1024  # ConfigMap size limit

    def test_can_be_disabled(self, render):
        assert render(VARIATIONS["dashboard-off"])["dashboard-configmap.yaml"] == []

    def test_grafana_namespace_and_folder(self, render):
        cm = one(render(VARIATIONS["everything"]), "dashboard-configmap.yaml")
        assert cm["metadata"]["namespace"] == "grafana"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "mlless"}


# ---- dashboards/mlless.json -----------------------------------------------------------------------

PROMQL_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
    "count_over_time", "delta", "deriv", "exp", "floor", "histogram_quantile", "idelta", "increase", "irate",
    "label_replace", "last_over_time", "ln", "log10", "log2", "max_over_time", "min_over_time", "predict_linear",
    "quantile_over_time", "rate", "resets", "round", "scalar", "sort", "sort_desc", "sqrt", "sum_over_time",
    "time", "timestamp", "vector",
    # aggregation operators
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Strings (label values, Grafana variables in them), label matchers `{...}`, ranges `[...]` and
    `by/without/on/ignoring(...)` label lists are removed first; every remaining identifier is a
    function (if a `(` follows), a keyword, or a metric name. An unknown function fails loudly
    rather than being mistaken for a metric.
    """
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"(?<![\w.:$])([A-Za-z_:][\w:]*)\s*(\()?", e):
        ident, call = m.group(1), m.group(2)
        if call:
            assert ident in PROMQL_FUNCTIONS, f"unknown PromQL function {ident!r} in {expr!r}"
        elif ident.lower() not in PROMQL_KEYWORDS:
            names.add(ident)
    return names


def exported_series_names() -> set[str]:
    """Every series name a real SupervisorMetrics registry can expose, with the exposition suffixes:
    counters `_total` (and `_created`), histograms `_bucket`, `_sum`, `_count`."""
    metrics = SupervisorMetrics("test-job")
    metrics.worker_billed(0, "pod-0", 1.0)  # series with unbounded labels appear on first use
    metrics.cost({"workers": 0.1})
    names = set()
    for family in metrics.registry.collect():
        suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_sum", "_count", "_created"], "gauge": [""]}[family.type]
        names.update(family.name + s for s in suffixes)
        names.update(sample.name for sample in family.samples)
    return names


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable (label_values(metric, label))."""
    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dashboard["panels"]):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} {t['refId']}", t["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert m, f"variable {var['name']}: unsupported query {query!r}"
            yield f"variable {var['name']}", m.group(1)


class TestDashboard:
    @pytest.fixture(scope="class")
    @classmethod
    def dashboard(cls):
        return json.loads(DASHBOARD.read_text())

    def test_parses_as_a_dashboard(self, dashboard):
        assert dashboard["uid"] == "mlless-training" and dashboard["title"]
        assert "id" not in dashboard  # Grafana assigns ids; a fixed one would clash on import
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids))

    def test_every_metric_exists_in_supervisor_metrics(self, dashboard):
        exported = exported_series_names()
        used = {}
        for where, expr in dashboard_queries(dashboard):
            names = promql_metric_names(expr)
            assert names, f"{where}: no metric in {expr!r}"
            for name in names:
                used.setdefault(name, where)
        unknown = {name: where for name, where in used.items() if name not in exported}
        assert unknown == {}

    def test_the_checker_catches_a_wrong_name(self):
        exported = exported_series_names()
        assert promql_metric_names('sum by (le, phase) (rate(mlless_step_phase_seconds_bucket{job=~"$job"}[$__rate_interval]))') == {
            "mlless_step_phase_seconds_bucket"}
        for typo in ("mlless_step_total", "mlless_steps", "mlless_step_phase_seconds", "mlless_cost_usd_total"):
            assert typo not in exported
        with pytest.raises(AssertionError, match="unknown PromQL function"):
            promql_metric_names("rates(mlless_steps_total[5m])")

    def test_shows_what_the_issue_asks_for(self, dashboard):
        exprs = [expr for _, expr in dashboard_queries(dashboard)]
        compact = [re.sub(r"\s+", "", e) for e in exprs]
        def has(pattern):
            return any(re.search(pattern, e) for e in compact)

        assert has(r"^mlless_train_loss\{") and has(r"^mlless_validation_loss\{")
        assert has(r"^mlless_active_workers\{")
        assert has(r"sumby\(job,pod\)\(rate\(mlless_worker_billed_gigabyte_seconds_total\{")  # billed GB-s per pod
        assert has(r"mlless_cost_usd\{[^}]*component!=\"total\"")  # cost by component
        assert has(r"^rate\(mlless_steps_total\{")  # step rate
        for q in ("0.5", "0.9"):
            assert has(rf"histogram_quantile\({q},sumby\(le,phase\)\(rate\(mlless_step_phase_seconds_bucket\{{")
        assert has(r"sumby\(outcome\)\(increase\(mlless_tuner_decisions_total\{")
        # issue #24: progress, the ETA with its band, and the projected cost
        assert has(r"^mlless_progress_ratio\{") and has(r"^mlless_eta_seconds\{")
        assert has(r"^mlless_eta_band_seconds\{[^}]*bound=\"low\"") and has(r"^mlless_eta_band_seconds\{[^}]*bound=\"high\"")
        assert has(r"^mlless_projected_cost_usd\{")

    def test_every_query_is_scoped_to_the_job_variable(self, dashboard):
        (job,) = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
        assert job["multi"] and job["includeAll"]
        for where, expr in dashboard_queries(dashboard):
            if where.startswith("panel"):
                selectors = re.findall(r"mlless_\w+(\{[^}]*\})?", expr)
                assert selectors and all('job=~"$job"' in s for s in selectors), f"{where}: {expr}"

    def test_datasource_is_a_variable(self, dashboard):
        assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in dashboard["templating"]["list"])
        for p in dashboard["panels"]:
            if p["type"] != "row":
                assert p["datasource"]["uid"] == "${datasource}", p["title"]

    def test_label_values_used_exist(self, dashboard):
        """Labels the dashboard groups or legends by are labels the metrics carry."""
        labels = {"job", "worker", "pod", "component", "outcome", "phase", "le"}
        for where, expr in dashboard_queries(dashboard):
            for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
                assert {g.strip() for g in group.split(",")} <= labels, where
        assert set(PHASES) and set(TUNER_OUTCOMES)  # the label values the legends show


# ---- the contract with the operator (operator/mlless_operator) ------------------------------------


class TestOperatorContract:
    """What the chart sets up is what the operator reads and does. These fail when either side drifts."""

    @pytest.fixture(scope="class")
    @classmethod
    def example_job(cls):
        from mlless_operator import config as operator_config
        from mlless_operator.builders.jobref import JobRef

        body = yaml.safe_load((ROOT / "examples" / "trainingjob.yaml").read_text())
        body["metadata"].update(namespace="team-a", uid="00000000-0000-0000-0000-000000000001")
        return JobRef.from_body(body, operator_config.Config())

    def test_the_module_kopf_runs_exists(self, render):
        import importlib.util

        (module,) = [a.removeprefix("--module=") for a in container(render())["args"] if a.startswith("--module=")]
        assert importlib.util.find_spec(module) is not None, module

    @pytest.mark.parametrize("variation", VARIATIONS)
    def test_operator_config_reads_every_variable_the_chart_sets(self, render, variation):
        from mlless_operator import config as operator_config

        values = VARIATIONS[variation]
        env = {e["name"]: e["value"] for e in container(render(values))["env"]}
        fields = {f"{ENV_OPERATOR_PREFIX}{f.name.upper()}" for f in dataclasses.fields(operator_config.Config)}
        assert set(env) <= fields, f"not read by mlless_operator.config: {set(env) - fields}"
        cfg = operator_config.load(env)
        c = container(render(values))
        assert cfg.image == c["image"]
        assert cfg.metrics_port == {p["name"]: p["containerPort"] for p in c["ports"]}["metrics"]
        assert list(cfg.namespaces) == [a.removeprefix("--namespace=") for a in c["args"] if a.startswith("--namespace=")]

    def test_cluster_role_grants_every_verb_the_operator_client_may_use(self, render):
        """kubeapi.VERBS is what the operator's client lets itself do (it refuses anything else)."""
        from mlless_operator.kubeapi import PLURALS, VERBS

        rules = one(render(), "clusterrole.yaml")["rules"]
        for (api_version, kind), verbs in VERBS.items():
            for verb in verbs:
                assert allows(rules, api_version.rpartition("/")[0], PLURALS[(api_version, kind)], verb), (api_version, kind, verb)

    def test_children_get_exactly_the_verbs_the_operator_client_declares(self):
        """Both ways: a verb the code no longer uses is not granted (TrainingJobs also get what Kopf needs)."""
        from mlless_operator.kubeapi import PLURALS, VERBS

        for (api_version, kind), verbs in VERBS.items():
            needed = OPERATOR_NEEDS[(api_version.rpartition("/")[0], PLURALS[(api_version, kind)])]
            if kind in ("TrainingJob", "TrainingSweep"):
                assert verbs <= needed
            else:
                assert needed == verbs, (api_version, kind)

    def test_cluster_role_allows_every_list_the_operator_makes(self, render):
        """Static check: each `api.list("<apiVersion>", "<Kind>", ...)` in the operator's code is allowed."""
        from mlless_operator.kubeapi import PLURALS

        rules = one(render(), "clusterrole.yaml")["rules"]
        source = "\n".join(p.read_text() for p in (ROOT / "operator" / "mlless_operator").rglob("*.py"))
        calls = re.findall(r"\.list\(\s*\"([^\"]+)\",\s*\"([^\"]+)\"", source)
        assert calls, "no api.list calls found: has kubeapi changed?"
        for api_version, kind in calls:
            assert allows(rules, api_version.rpartition("/")[0], PLURALS[(api_version, kind)], "list"), (api_version, kind)

    def test_operator_may_grant_the_supervisor_role_it_builds(self, render, example_job):
        from mlless_operator.builders.supervisor import build_supervisor_role

        rules = one(render(), "clusterrole.yaml")["rules"]
        for rule in build_supervisor_role(example_job)["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert allows(rules, group, resource, verb), (group, resource, verb)

    def test_pod_monitor_selects_the_supervisor_pod_and_its_metrics_port(self, render, example_job):
        from mlless_operator.backends import supervisor_pod as build_supervisor_pod

        pod = build_supervisor_pod(example_job)
        pm = one(render(VARIATIONS["watch-namespaces"]), "podmonitor.yaml")
        assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert pod["metadata"]["namespace"] in pm["spec"]["namespaceSelector"]["matchNames"]
        ports = {p.get("name") for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert pm["spec"]["podMetricsEndpoints"][0]["port"] in ports

    def test_operator_service_does_not_select_supervisors(self, render, example_job):
        from mlless_operator.backends import supervisor_pod as build_supervisor_pod

        selector = one(render(), "service.yaml")["spec"]["selector"]
        assert not selector.items() <= build_supervisor_pod(example_job)["metadata"]["labels"].items()


# ---- templates/NOTES.txt --------------------------------------------------------------------------


class TestNotes:
    def test_tells_how_to_use_it(self, render):
        notes = render()["NOTES.txt"]
        for text in ("kubectl apply -f examples/trainingjob.yaml", "kubectl get tj", "kubectl scale tj/",
                     "mlless-system/mlless-dashboard", "grafana_dashboard=1", "deployment/mlless-operator"):
            assert text in notes

    def test_follows_the_values(self, render):
        notes = render(VARIATIONS["watch-namespaces"])["NOTES.txt"]
        assert "team-a, team-b" in notes and "PodMonitor mlless-supervisors" in notes
        assert "dashboard is disabled" in render(VARIATIONS["dashboard-off"])["NOTES.txt"]
        assert "--clusterrole=edit" in render()["NOTES.txt"]
        assert "--clusterrole=edit" not in render(VARIATIONS["user-roles-off"])["NOTES.txt"]
