"""Generates charts/octavo/README.md (and the values table of docs/kubernetes.md) from Chart.yaml, values.yaml
(the defaults) and values.schema.json (the descriptions and limits), so that neither can drift from the values:
`test_chart.py` regenerates both and fails when the committed ones differ.

    python charts/tests/readme.py --write      # rewrite the README after changing values or the schema
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "octavo"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
BEGIN, END = "<!-- values:begin -->\n", "<!-- values:end -->\n"

HEAD = """\
# The Octavo Helm chart

Installs the Octavo operator (which runs bookie clusters from `BookieCluster` and `CompactionPolicy`
resources), its CRDs, least-privilege RBAC, an optional 3-member etcd, and an optional example
`BookieCluster` with its `CompactionPolicy`. Chart {version}, Octavo {app_version}, Kubernetes {kube_version}.

```sh
helm install octavo charts/octavo -n octavo --create-namespace
kubectl -n octavo get bookiecluster octavo      # Ready / Writable / Read-Only / Disk-Max
helm test octavo -n octavo                      # writes a ledger through the client, reads it back
```

Bad values fail at `helm install` with the schema's message (wrong types, unknown keys, ratios out of range,
an even etcd member count) or the chart's own (watermarks out of order, bookies below `minWritableBookies`,
external etcd missing). Install, upgrade, uninstall and troubleshooting: [docs/kubernetes.md](../../docs/kubernetes.md).

`helm uninstall` runs a pre-delete Job (`octavo operator uninstall`) that deletes the release's
BookieCluster and CompactionPolicy while the operator still runs, so nothing hangs in Terminating; volumes are
kept unless `bookieCluster.deleteVolumesOnUninstall` / `etcd.deleteVolumesOnUninstall` say otherwise; the CRDs
stay (Helm never deletes CRDs).

## Values

This table is generated from `values.yaml` and `values.schema.json` (`python charts/tests/readme.py --write`).

| Key | Type | Default | Description |
|---|---|---|---|
"""


def _type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " \\| ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(sorted({s.get("type", "?") for s in schema["anyOf"]}))
    kind = schema.get("type", "any")
    limits = []
    if "minimum" in schema:
        limits.append(f">= {schema['minimum']}")
    if "exclusiveMinimum" in schema:
        limits.append(f"> {schema['exclusiveMinimum']}")
    if "maximum" in schema:
        limits.append(f"<= {schema['maximum']}")
    return kind + (f" ({', '.join(limits)})" if limits else "")


def rows(schema: dict[str, Any], values: Any, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """One row per value: objects with their own properties are expanded, free-form objects are one row."""
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        value = values.get(key) if isinstance(values, dict) else None
        expand = sub.get("type") == "object" and sub.get("properties") and sub.get("additionalProperties") is False \
            and key != "bookie" and path not in ("bookieCluster.podTemplate",) and not path.endswith("resources")
        if expand:
            yield from rows(sub, value or {}, path + ".")
            continue
        if key == "global":
            continue
        default = json.dumps(value) if value not in (None, "") else '`""`' if value == "" else ""
        if default and not default.startswith("`"):
            default = f"`{default}`"
        description = sub.get("description", "")
        if key == "bookie":
            description += " Names: " + ", ".join(f"`{k}`" for k in sub["properties"]) + "."
        yield path, _type(sub), default, description


def table() -> str:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    out = "| Key | Type | Default | Description |\n|---|---|---|---|\n"
    for path, kind, default, description in rows(schema, values):
        out += f"| `{path}` | {kind} | {default} | {description} |\n"
    return out


def render() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    head = HEAD.format(version=chart["version"], app_version=chart["appVersion"], kube_version=chart["kubeVersion"])
    return head.removesuffix("| Key | Type | Default | Description |\n|---|---|---|---|\n") + table()


def render_docs(current: str) -> str:
    """docs/kubernetes.md with the table between its markers replaced."""
    start, end = current.index(BEGIN) + len(BEGIN), current.index(END)
    return current[:start] + table() + current[end:]


if __name__ == "__main__":
    text = render()
    if "--write" in sys.argv:
        (CHART / "README.md").write_text(text)
        DOCS.write_text(render_docs(DOCS.read_text()))
    else:
        sys.stdout.write(text)
