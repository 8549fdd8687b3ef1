"""The TrainingJob CRD: generated from the CLI's schema, committed without drift, valid for Kubernetes."""
from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from mlless.spec import SpecError, from_manifest
from mlless.spec.crd import crd_manifest
from mlless.spec.schema import walk

from generated import assert_generated

ROOT = Path(__file__).resolve().parent.parent
CRD_FILE = ROOT / "crds" / "trainingjob.yaml"


@pytest.fixture(scope="module")
def crd():
    return yaml.safe_load(CRD_FILE.read_text())


def test_committed_crd_is_generated_from_the_schema():
    assert_generated("crds/trainingjob.yaml", "mlless.spec.crd")


def test_crd_is_a_valid_kubernetes_object(crd):
    kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)


def test_schema_is_structural(crd):
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema, "openAPIV3Schema"):
        assert "type" in node, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), f"{path}.{key} must be a boolean in OpenAPI 3.0"


def test_scale_subresource_and_printer_columns_point_at_real_fields(crd):
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    fields = {path.removeprefix("openAPIV3Schema"): node["type"] for path, node in walk(schema, "openAPIV3Schema")}
    scale = version["subresources"]["scale"]
    assert fields[scale["specReplicasPath"]] == fields[scale["statusReplicasPath"]] == "integer"
    assert fields[scale["labelSelectorPath"]] == "string"
    assert "status" in version["subresources"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == ["State", "Workers", "Step", "Progress", "ETA", "Loss", "Cost", "Age", "Restarts", "Projected",
                             "Until", "ETA-Low", "ETA-High"]
    assert [name for name, c in columns.items() if c.get("priority")] == [
        "Restarts", "Projected", "Until", "ETA-Low", "ETA-High"]  # -o wide
    for column in columns.values():
        if column["jsonPath"] != ".metadata.creationTimestamp":
            assert column["jsonPath"] in fields, column
    assert crd["spec"]["names"]["shortNames"] == ["tj"]


def test_condition_items_have_the_metav1_condition_shape(crd):
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    item = status["properties"]["conditions"]["items"]
    assert set(item["properties"]) == {"type", "status", "reason", "message", "lastTransitionTime", "observedGeneration"}
    assert set(item["required"]) == {"type", "status", "reason", "message", "lastTransitionTime"}
    assert item["properties"]["type"]["enum"] == ["Created", "Running", "Suspended", "Succeeded", "Failed", "SupervisorRestarted", "PodsHealthy"]


@pytest.mark.parametrize("example", sorted(p for p in (ROOT / "examples").glob("*.yaml") if not p.name.startswith("sweep-")),
                         ids=lambda p: p.name)
def test_examples_are_valid_for_the_crd_and_the_cli(example, crd):
    doc = yaml.safe_load(example.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft4Validator(schema).validate(doc)
    from_manifest(doc, base_dir=example.parent)


def test_cli_and_crd_reject_the_same_bad_value(crd):
    doc = yaml.safe_load((ROOT / "examples" / "movielens.yaml").read_text())
    doc["spec"]["optimizer"] = {"learningRate": 0}  # exclusive minimum
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(doc)
    with pytest.raises(SpecError, match="spec.optimizer.learningRate"):
        from_manifest(doc)


def test_crd_manifest_matches_the_cli_spec_schema():
    from mlless.spec import SPEC_SCHEMA

    assert crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] == SPEC_SCHEMA


def test_backoff_limit_defaults_to_three_and_both_reject_a_negative_one(crd):
    """spec.backoffLimit, as a batch Job's: how often the operator recreates a failed supervisor pod."""
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["backoffLimit"]
    assert (field["type"], field["default"], field["minimum"]) == ("integer", 3, 0)
    assert schema["properties"]["status"]["properties"]["supervisorRestarts"]["type"] == "integer"
    doc = yaml.safe_load((ROOT / "examples" / "movielens.yaml").read_text())
    doc["spec"]["backoffLimit"] = -1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(doc)
    with pytest.raises(SpecError, match="spec.backoffLimit"):
        from_manifest(doc)
