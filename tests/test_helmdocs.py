"""charts/mlless/README.md: generated from README.md.gotmpl, values.yaml and Chart.yaml, and committed without drift.

The generator (charts/helmdocs.py) reads helm-docs' `# --` comments; these tests hold the committed table to a
plain YAML reading of values.yaml, and the generator to refusing a value without a description.
"""
from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from charts import helmdocs

from generated import ROOT, assert_generated

README = "charts/mlless/README.md"
VALUES = ROOT / "charts" / "mlless" / "values.yaml"
#: A row of the values table: key, type, default (JSON in backticks), description.
ROW = re.compile(r"^\| `([\w.]+)` \| (\w+) \| `(.*)` \| (.+) \|$")
PYTHON_TYPES = {"bool": bool, "int": int, "float": float, "string": str, "list": list, "object": dict}


def test_committed_readme_is_generated():
    assert_generated(README, "charts.helmdocs")


def _lookup(values: dict[str, Any], key: str) -> Any:
    node: Any = values
    for part in key.split("."):
        node = node[part]
    return node


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for name, value in node.items() for leaf in _leaves(value, f"{prefix}{name}.")]
    return [prefix.removesuffix(".")]


def test_the_table_is_every_value_of_values_yaml_with_its_type_and_default():
    values = yaml.safe_load(VALUES.read_text())
    rows = [ROW.match(line) for line in (ROOT / README).read_text().splitlines()]
    table = {row.group(1): row.groups()[1:] for row in rows if row is not None}
    assert len(table) > 40
    for key, (kind, default, description) in table.items():
        value = _lookup(values, key)
        assert json.loads(default) == value, key
        assert isinstance(value, PYTHON_TYPES[kind]) and (kind == "bool") == isinstance(value, bool), key
        assert description.strip(), key
    uncovered = [leaf for leaf in _leaves(values) if not any(leaf == key or leaf.startswith(f"{key}.") for key in table)]
    assert uncovered == []
    assert "rbac.aggregateToDefaultRoles" in table and "metrics.supervisorPodMonitor.podSelector" in table


def test_a_changed_value_changes_the_table():
    text = VALUES.read_text()
    readme = (ROOT / README).read_text()
    assert helmdocs.values_table(text) in readme
    changed = text.replace("  aggregateToDefaultRoles: true", "  aggregateToDefaultRoles: false")
    assert changed != text and helmdocs.values_table(changed) not in readme


def test_a_description_is_the_comment_block_right_above_its_key():
    text = "# -- one\n# two\nx: 1\ngroup:\n  # plain\n  # -- inner\n  y: [1]\n# -- lost\n\nz: 2\n"
    assert helmdocs.descriptions(text) == {"x": "one two", "group.y": "inner"}


@pytest.mark.parametrize("text, missing", [
    ("a:\n  # -- documented\n  b: 1\n  c: 2\n", "a.c"),  # a group's every key needs its own
    ("# -- lost to the blank line\n\nd: {}\n", "d"),
    ("# --\ne: 1\n", "e"),  # an empty description
])
def test_a_value_without_a_description_is_refused(text, missing):
    with pytest.raises(ValueError, match=rf"no `# --` description for {re.escape(missing)}$"):
        helmdocs.values(text)


def test_a_description_inside_a_documented_value_is_refused():
    with pytest.raises(ValueError, match="inside a documented value: a.b"):
        helmdocs.values("# -- whole\na:\n  # -- part\n  b: 1\n")


def test_rows_carry_helm_docs_types_and_json_defaults():
    table = helmdocs.values_table("# -- a|b\nx: {k: [1, true]}\n# -- n\ny: 0.5\n")
    assert table.splitlines()[2:] == ['| `x` | object | `{"k": [1, true]}` | a\\|b |', "| `y` | float | `0.5` | n |"]


def test_only_the_known_template_calls_are_filled():
    assert helmdocs.fill('a {{ template "t" . }}\n{{ template "t" . }} b', {"t": "X"}) == "a X\nX b"
    with pytest.raises(ValueError, match="unknown template 'chart.description'"):
        helmdocs.fill('{{ template "chart.description" . }}', {"t": "X"})
    with pytest.raises(ValueError, match="other than"):
        helmdocs.fill("{{ .Values.x }}", {"t": "X"})
    with pytest.raises(ValueError, match="other than"):  # Go's whitespace trimming is not done here
        helmdocs.fill('{{- template "t" . }}', {"t": "X"})


def test_badges_escape_what_shields_io_reads_as_separators():
    assert helmdocs.badge("Version", "0.2.0-rc_1") == (
        "![Version: 0.2.0-rc_1](https://img.shields.io/badge/Version-0.2.0--rc__1-informational)")
