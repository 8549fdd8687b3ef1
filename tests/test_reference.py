"""docs/reference.md: generated from the schema, committed without drift, and naming every field of the CRD's spec."""
from __future__ import annotations

import yaml

from mlless.spec.schema import walk

from generated import ROOT, assert_generated
from test_crd import CRD_FILE

REFERENCE = "docs/reference.md"


def test_committed_reference_is_generated_from_the_schema():
    assert_generated(REFERENCE, "mlless.spec.reference")


def test_reference_has_a_row_for_every_spec_field_of_the_crd():
    crd = yaml.safe_load(CRD_FILE.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    text = (ROOT / REFERENCE).read_text()
    fields = [path for path, _ in walk(spec, "spec") if path != "spec" and not path.endswith("[]")]
    assert len(fields) > 50
    missing = [path for path in fields if f"| `{path}` |" not in text]
    assert not missing, f"docs/reference.md lacks {missing}"
