"""Every manifest in examples/ passes `mlless validate`, and the cluster ones would pass the operator too.

tests/test_crd.py already checks each example against the CRD's openAPIV3Schema
and the CLI's schema; this adds the command users run, and the operator's own
check (a pod cannot resolve a relative dataset or output path).
"""
from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from mlless.cli import main
from mlless_operator.handlers.create import spec_error

ROOT = Path(__file__).resolve().parent.parent
# The TrainingJobs; the sweep examples (sweep-*.yaml) are tests/test_sweep.py's.
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if not p.name.startswith("sweep-"))
CLUSTER_FIELDS = {"function", "redis", "rabbitmq", "supervisor", "suspend", "ttlSecondsAfterFinished", "activeDeadlineSeconds"}


def cluster_examples() -> list[Path]:
    return [p for p in EXAMPLES if CLUSTER_FIELDS & set(yaml.safe_load(p.read_text())["spec"])]


def test_there_is_an_example_per_backend_and_one_with_external_services():
    names = {p.name for p in EXAMPLES}
    assert {"trainingjob.yaml", "trainingjob-knative.yaml", "trainingjob-openfaas.yaml", "trainingjob-pod.yaml",
            "trainingjob-external-services.yaml"} <= names


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_mlless_validate_accepts_it(example, capsys):
    assert main(["validate", str(example)]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["name"] == yaml.safe_load(example.read_text())["metadata"]["name"]


@pytest.mark.parametrize("example", cluster_examples(), ids=lambda p: p.name)
def test_the_operator_accepts_the_cluster_examples(example):
    doc = yaml.safe_load(example.read_text())
    body = {**doc, "metadata": {**doc["metadata"], "namespace": "default"}}
    assert spec_error(body) is None


@pytest.mark.parametrize("backend", ["knative", "openfaas", "pod"])
def test_each_backend_example_asks_for_its_backend(backend):
    doc = yaml.safe_load((ROOT / "examples" / f"trainingjob-{backend}.yaml").read_text())
    assert doc["spec"]["function"]["backend"] == backend


def test_the_external_services_example_names_both_with_password_secrets():
    spec = yaml.safe_load((ROOT / "examples" / "trainingjob-external-services.yaml").read_text())["spec"]
    for service in ("redis", "rabbitmq"):
        assert urlsplit(spec[service]["url"]).password is None, "the password belongs in the Secret, not the URL"
        assert set(spec[service]["passwordSecretRef"]) == {"name", "key"}
