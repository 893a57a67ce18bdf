"""The real Kubernetes control plane (octavo.cli.kubecontrolplane, built by `make kube`) with our CRDs: the API
server validates them (OpenAPI schema and CEL rules), serves kubectl's explain and printer columns, and its
garbage collector removes dependents. No nodes are needed for these."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from octavo.cli.kubecontrolplane import KubeControlPlane, pinned_version

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localplane import reset_namespace

ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "charts" / "octavo" / "crds"


@pytest.fixture(scope="module")
def plane(kube_plane: Any) -> Iterator[KubeControlPlane]:
    """The session's control plane (conftest.py: it skips without `make kube`'s binaries or root), with the
    CRDs applied here from the chart, and the namespace emptied before and after."""
    kube_plane.plane.kubectl("apply", "--server-side", "-f", str(CRDS))
    kube_plane.plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/bookieclusters.octavo.io",
                             "crd/compactionpolicies.octavo.io")
    reset_namespace(kube_plane.k, kube_plane.agent)
    yield kube_plane.plane
    reset_namespace(kube_plane.k, kube_plane.agent)


def cluster(name: str, **spec: object) -> str:
    body = {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster", "metadata": {"name": name},
            "spec": {"replicas": 3, "minWritableBookies": 3, "image": "octavo:dev", "storage": {"size": "1Gi"},
                     "etcd": {"endpoints": "127.0.0.1:2379"}, **spec}}
    return json.dumps(body)


def test_the_server_is_the_pinned_release(plane: KubeControlPlane) -> None:
    version = json.loads(plane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == pinned_version()
    assert plane.get("/readyz") == "ok"


def test_objects_that_break_the_schema_or_a_cel_rule_are_refused_by_the_server(plane: KubeControlPlane) -> None:
    out = plane.kubectl("apply", "-f", "-", input_text=cluster("too-few", replicas=2), check=False)
    assert out.returncode != 0
    assert "replicas must be at least minWritableBookies" in out.stderr  # the CEL rule's message
    out = plane.kubectl("apply", "-f", "-", input_text=cluster("negative", replicas=0, minWritableBookies=0),
                        check=False)
    assert out.returncode != 0 and "spec.replicas" in out.stderr and "should be greater than or equal to 1" in (
        out.stderr)
    out = plane.kubectl("apply", "-f", "-", check=False,
                        input_text=cluster("both", etcd={"endpoints": "a:1", "endpointsFrom": {
                            "configMapKeyRef": {"name": "x", "key": "endpoints"}}}))
    assert out.returncode != 0 and "set exactly one of etcd.endpoints and etcd.endpointsFrom" in out.stderr
    out = plane.kubectl("apply", "-f", "-", input_text=cluster("unknown", replcas=3), check=False)
    assert out.returncode != 0 and 'unknown field "spec.replcas"' in out.stderr  # strict field validation
    plane.kubectl("apply", "-f", "-", input_text=cluster("good"))
    table = plane.kubectl("get", "bookieclusters").stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "WRITABLE", "READ-ONLY", "DISK-MAX", "ETCD-DB", "AGE"]
    assert table[1].split()[0] == "good"
    explained = plane.kubectl("explain", "bookiecluster.spec.replicas").stdout
    assert "Bookies to run" in explained


def test_the_garbage_collector_removes_what_a_deleted_owner_owned(plane: KubeControlPlane) -> None:
    plane.kubectl("apply", "-f", "-", input_text=cluster("owner"))
    owner = json.loads(plane.kubectl("get", "bookiecluster", "owner", "-o", "json").stdout)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "owned", "ownerReferences": [{"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
                                              "name": "owner", "uid": owner["metadata"]["uid"]}]},
        "data": {"k": "v"}}
    plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(config))
    plane.kubectl("delete", "bookiecluster", "owner")
    deadline = time.monotonic() + 60
    while plane.kubectl("get", "configmap", "owned", check=False).returncode == 0:
        assert time.monotonic() < deadline, "the garbage collector did not delete the owned ConfigMap"
        time.sleep(0.5)
