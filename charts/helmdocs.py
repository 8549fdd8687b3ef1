"""charts/mlless/README.md: the chart's README, with its values table generated from values.yaml (helm-docs' job).

    python -m charts.helmdocs > charts/mlless/README.md

It follows helm-docs' conventions, the part of them this chart uses. A `# -- description` comment right above a key
in values.yaml documents that key and everything below it as one row of the table; the description may go on over
further `#` lines. A key without one is a group, and each of its keys needs its own: a value without a description
is an error, so every value is documented. README.md.gotmpl holds the prose, and helm-docs' template calls
`{{ template "chart.valuesTable" . }}`, `"chart.versionBadge"` and `"chart.appVersionBadge"` mark where the
generated parts go. A test fails if the committed README and its sources drift apart (tests/test_helmdocs.py), as
for the CRDs and docs/reference.md (tests/generated.py).
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "mlless"
TEMPLATE = "README.md.gotmpl"

#: A mapping key of values.yaml: its indentation, then the key, plain or double-quoted.
_KEY = re.compile(r'^( *)([\w.\-/]+|"[^"]+"):')
#: A helm-docs template call, `{{ template "chart.valuesTable" . }}` (no whitespace trimming: the text stays as is).
_CALL = re.compile(r'\{\{ template "([\w.]+)" \. \}\}')
#: How helm-docs names the type of a value (bool before int: a bool is an int in Python).
_TYPES: tuple[tuple[type, str], ...] = ((bool, "bool"), (int, "int"), (float, "float"), (str, "string"),
                                        (list, "list"), (dict, "object"), (type(None), "null"))


@dataclass(frozen=True)
class Value:
    """One row of the table: a documented key of values.yaml, with its default and description."""

    key: str
    default: Any
    description: str

    @property
    def type(self) -> str:
        return next(name for kind, name in _TYPES if isinstance(self.default, kind))


def descriptions(values_yaml: str) -> dict[str, str]:
    """Dotted key -> the `# --` description right above it, in file order."""
    found: dict[str, str] = {}
    path: list[tuple[int, str]] = []  # (indentation, key) of the mapping keys enclosing the current line
    comment: list[str] | None = None  # the `# --` block being read
    for line in values_yaml.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped.removeprefix("# --").strip()]
        elif stripped.startswith("#"):
            if comment is not None:
                comment.append(stripped.removeprefix("#").strip())
        elif (key := _KEY.match(line)) is not None:
            indent = len(key.group(1))
            while path and path[-1][0] >= indent:
                path.pop()
            path.append((indent, key.group(2).strip('"')))
            if comment is not None:
                found[".".join(name for _, name in path)] = " ".join(comment).strip()
            comment = None
        else:  # a blank line, a list item or a flow continuation: a description must sit right above its key
            comment = None
    return found


def values(values_yaml: str) -> list[Value]:
    """Every documented value, in file order; raises ValueError when a value has no description."""
    described = descriptions(values_yaml)
    rows: list[Value] = []
    undocumented: list[str] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for name, value in node.items():
            key = f"{prefix}{name}"
            if key in described:
                rows.append(Value(key, value, described[key]))
            elif isinstance(value, dict) and value:
                walk(value, f"{key}.")
            else:
                undocumented.append(key)

    walk(yaml.safe_load(values_yaml), "")
    undocumented += [row.key for row in rows if not row.description]
    if undocumented:
        raise ValueError(f"values.yaml: no `# --` description for {', '.join(undocumented)}")
    nested = described.keys() - {row.key for row in rows}
    if nested:
        raise ValueError(f"values.yaml: `# --` descriptions inside a documented value: {', '.join(sorted(nested))}")
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def values_table(values_yaml: str) -> str:
    """The Markdown table: key, type, default (as JSON, like helm-docs) and description of every value."""
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for row in values(values_yaml):
        default = json.dumps(row.default, ensure_ascii=False)
        lines.append(f"| `{row.key}` | {row.type} | {_cell(f'`{default}`')} | {_cell(row.description)} |")
    return "\n".join(lines)


def badge(label: str, version: str) -> str:
    """A shields.io badge; shields.io reads `-` and `_` in a label or message as separators unless doubled."""
    escaped = version.replace("-", "--").replace("_", "__")
    return f"![{label}: {version}](https://img.shields.io/badge/{label}-{escaped}-informational)"


def fill(template: str, parts: dict[str, str]) -> str:
    """The template with each helm-docs template call replaced by its part; refuses any other template action."""
    def part(call: re.Match[str]) -> str:
        if call.group(1) not in parts:
            raise ValueError(f"{TEMPLATE}: unknown template {call.group(1)!r}, not one of {sorted(parts)}")
        return parts[call.group(1)]

    filled = _CALL.sub(part, template)
    if "{{" in filled:
        raise ValueError(f"{TEMPLATE}: a template action other than {sorted(parts)}: {filled[filled.index('{{'):][:60]!r}")
    return filled


def render(chart: Path = CHART) -> str:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    where = chart.relative_to(ROOT)
    header = (f"<!-- Generated from {where}/{TEMPLATE}, values.yaml and Chart.yaml by "
              f"`python -m charts.helmdocs > {where}/README.md`; edit those, not this file. -->\n")
    parts = {
        "chart.valuesTable": values_table((chart / "values.yaml").read_text()),
        "chart.versionBadge": badge("Version", meta["version"]),
        "chart.appVersionBadge": badge("AppVersion", meta["appVersion"]),
    }
    return header + fill((chart / TEMPLATE).read_text(), parts)


if __name__ == "__main__":
    sys.stdout.write(render())
