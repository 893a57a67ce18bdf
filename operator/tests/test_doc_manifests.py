"""The BookieCluster and CompactionPolicy shown in docs/kubernetes.md and docs/operations.md (issue 29 item 7):
complete (every field of both CRDs' specs appears), accepted by the CRDs' schemas and CEL rules as the API
server checks them, and by the operator's own parsing; every field has a description for kubectl explain."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from octavo.operator.resources import parse_cluster, parse_policy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "charts" / "tests"))
from crschema import load_crds, validate  # type: ignore[import-not-found]  # noqa: E402

# Objects whose fields are Kubernetes' own (or the bookie's settings, checked in test_resources.py).
FREE_FORM = {"resources", "bookie", "podTemplate.affinity", "podTemplate.tolerations",
             "podTemplate.topologySpreadConstraints", "podTemplate.labels", "podTemplate.annotations",
             "podTemplate.nodeSelector"}


def manifests(doc: str) -> list[dict[str, Any]]:
    text = (ROOT / "docs" / doc).read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return [d for block in blocks for d in yaml.safe_load_all(block)
            if isinstance(d, dict) and d.get("apiVersion") == "octavo.io/v1alpha1"]


def paths(schema: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}{name}"
        yield path, sub
        if path not in FREE_FORM:
            yield from paths(sub.get("items", sub) if sub.get("type") == "array" else sub, f"{path}.")


@pytest.mark.parametrize("doc", ["kubernetes.md", "operations.md"])
def test_the_docs_show_a_complete_valid_bookiecluster_and_compactionpolicy(doc: str) -> None:
    found = {m["kind"]: m for m in manifests(doc)}
    assert set(found) == {"BookieCluster", "CompactionPolicy"}, f"docs/{doc} shows {sorted(found)}"
    schemas = load_crds()
    text = (ROOT / "docs" / doc).read_text()
    for kind, manifest in found.items():
        assert validate(manifest, schemas) == [], (kind, validate(manifest, schemas))
        spec_schema = schemas[("octavo.io/v1alpha1", kind)]["properties"]["spec"]
        for path, sub in paths(spec_schema):
            # Alternatives (endpointsFrom and its two refs) appear as comments: the name must be in the block.
            assert re.search(rf"\b{re.escape(path.rsplit('.', 1)[-1])}:", text), f"docs/{doc}: {kind} lacks {path}"
            assert sub.get("description"), f"{kind} spec.{path} has no description for kubectl explain"
    parse_policy(found["CompactionPolicy"]["spec"])
    parsed = parse_cluster("logs", found["BookieCluster"]["spec"])
    assert parsed.policy_name == found["CompactionPolicy"]["metadata"]["name"]


def test_both_docs_show_the_same_manifests() -> None:
    assert manifests("kubernetes.md") == manifests("operations.md")
