"""docs/reference.md and README.md's Defaults: generated from the schema and committed without drift; the reference
names every field of the CRD's spec."""
from __future__ import annotations

import pytest
import yaml

from mlless.spec import readme
from mlless.spec.schema import walk

from generated import ROOT, assert_generated, assert_generated_block
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


def test_readmes_defaults_are_generated_from_the_schema():
    assert_generated_block("README.md", "mlless.spec.readme")


def test_the_readme_check_can_fail():
    text = (ROOT / "README.md").read_text()
    stale = text.replace("| `spec.workers` | ", "| `spec.workers` | 1", 1)
    assert stale != text and readme.splice(stale) == text
    with pytest.raises(ValueError):
        readme.splice(text.replace(readme.END, ""))
