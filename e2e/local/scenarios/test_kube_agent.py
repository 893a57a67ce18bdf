"""The node agent (octavo.cli.kubeagent) on the real control plane (octavo.cli.kubecontrolplane): nodes that
become Ready, pods run as local processes with their environment and volumes at absolute paths, `kubectl logs`
through the API server, a StatefulSet's pods on local PersistentVolumes that outlive them, restarts after a
crash, and graceful deletion. Needs the binaries `make kube` builds, and root (the agent's mount and network
namespaces); without them these tests skip (under CI=true they fail: conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from octavo.cli.kubeagent import NodeAgent
from octavo.cli.kubecontrolplane import ControlPlaneError, KubeControlPlane

sys.path.insert(0, str(Path(__file__).resolve().parent))
from localplane import reset_namespace

T = TypeVar("T")
NS = "default"


def eventually(fn: Callable[[], T], timeout_s: float = 60.0, what: str = "the condition") -> T:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            result = fn()
            if result:
                return result
            last = result
        except (KeyError, IndexError, TypeError, AssertionError, ControlPlaneError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout_s}s (last: {last!r})")
        time.sleep(0.2)


class Cluster:
    def __init__(self, plane: KubeControlPlane, agent: NodeAgent) -> None:
        self.plane = plane
        self.agent = agent

    def kubectl(self, *args: str, input_text: str | None = None) -> str:
        return self.plane.kubectl(*args, input_text=input_text).stdout

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                 "items": list(objects)}))

    def get(self, kind: str, name: str = "") -> Any:
        out = self.plane.kubectl("get", kind, *([name] if name else []), "-o", "json", check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def pod_ready(self, name: str) -> dict[str, Any] | None:
        pod = self.get("pod", name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
        return pod if ready else None


@pytest.fixture(scope="module")
def cluster(kube_plane: Any) -> Iterator[Cluster]:
    """The session's control plane and agent (conftest.py: it skips without `make kube`'s binaries or root; its
    agent has a bridge of its own), the namespace emptied before and after."""
    reset_namespace(kube_plane.k, kube_plane.agent)
    yield Cluster(kube_plane.plane, kube_plane.agent)
    reset_namespace(kube_plane.k, kube_plane.agent)


def test_nodes_register_ready_with_zones_and_lose_their_taints(cluster: Cluster) -> None:
    def ready_nodes() -> list[dict[str, Any]]:
        nodes = cluster.get("nodes")["items"]
        assert len(nodes) == 3
        for node in nodes:
            assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
            assert not node["spec"].get("taints"), node["spec"]["taints"]
        return nodes

    nodes = eventually(ready_nodes, 60, "three Ready nodes without taints")
    by_name = {node["metadata"]["name"]: node for node in nodes}
    assert sorted(by_name) == ["node-0", "node-1", "node-2"]
    assert [by_name[f"node-{i}"]["metadata"]["labels"]["topology.kubernetes.io/zone"] for i in range(3)] == [
        "zone-a", "zone-b", "zone-c"]
    for name, node in by_name.items():
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name
        assert node["metadata"]["labels"]["kubernetes.io/os"] == "linux"
        assert int(node["status"]["allocatable"]["pods"]) > 0
        assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == cluster.agent.server.port
    lease = json.loads(cluster.kubectl("get", "lease", "-n", "kube-node-lease", "node-0", "-o", "json"))
    assert lease["spec"]["holderIdentity"] == "node-0"


SHOW = """
import os, ssl, urllib.request
for key in ("GREETING", "PASSWORD", "POD_NAME", "POD_IP", "NODE", "COMBINED", "FROM_ENV_EXTRA", "CPU_LIMIT"):
    print(f"{key}={os.environ.get(key)}")
print("conf=" + open("/etc/octavo-agent-test/app.conf").read().strip())
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
print("namespace=" + open(sa + "/namespace").read())
print("token=" + str(len(open(sa + "/token").read()) > 100))
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
request = urllib.request.Request(f"https://{host}:{port}/api",
                                 headers={"Authorization": "Bearer " + open(sa + "/token").read()})
with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=sa + "/ca.crt"), timeout=10) as r:
    print(f"api={r.status}")
"""


def test_a_pod_sees_its_environment_and_volumes_and_kubectl_logs_shows_its_output(cluster: Cluster) -> None:
    cluster.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo"},
         "data": {"greeting": "hello", "app.conf": "answer=42\n", "EXTRA": "from-envfrom"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "demo"}, "stringData": {"password": "s3cret"}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "show"}, "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "show", "image": "python:3.11-slim", "command": ["python", "-c", SHOW],
                "envFrom": [{"configMapRef": {"name": "demo"}, "prefix": "FROM_ENV_"}],
                "env": [
                    {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "demo", "key": "greeting"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "demo", "key": "password"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "COMBINED", "value": "$(GREETING)-$(POD_NAME)-$$(KEPT)"},
                    {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                ],
                "resources": {"limits": {"cpu": "2", "memory": "256Mi"}},
                "volumeMounts": [{"name": "conf", "mountPath": "/etc/octavo-agent-test", "readOnly": True}],
            }],
            "volumes": [{"name": "conf", "configMap": {"name": "demo", "items": [
                {"key": "app.conf", "path": "app.conf"}]}}],
        }})
    pod = eventually(lambda: (p := cluster.get("pod", "show")) and p["status"].get("phase") in ("Succeeded", "Failed")
                     and p, 60, "the pod to finish")
    logs = cluster.kubectl("logs", "show")
    assert pod["status"]["phase"] == "Succeeded", logs
    lines = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line)
    assert lines["GREETING"] == "hello" and lines["PASSWORD"] == "s3cret" and lines["POD_NAME"] == "show"
    assert lines["POD_IP"] == pod["status"]["podIP"] and not lines["POD_IP"].startswith("127.")
    assert lines["NODE"] == pod["spec"]["nodeName"]
    assert lines["COMBINED"] == "hello-show-$(KEPT)"
    assert lines["FROM_ENV_EXTRA"] == "from-envfrom" and lines["CPU_LIMIT"] == "2"
    assert lines["conf"] == "answer=42"
    assert lines["namespace"] == NS and lines["token"] == "True"
    assert lines["api"] == "200"
    status = pod["status"]["containerStatuses"][0]
    assert status["state"]["terminated"]["exitCode"] == 0
    # The volume was bound in the pod's own mount namespace: nothing of it on the host's path.
    assert not Path("/etc/octavo-agent-test/app.conf").exists()
    with contextlib.suppress(OSError):  # the empty mount point the launcher made (docs/kubernetes.md)
        os.rmdir("/etc/octavo-agent-test")
    assert "hello" in cluster.kubectl("logs", "show", "--tail=20")


APP = """
import os, signal, sys, http.server
first = "/data/first"
if not os.path.exists(first):
    with open(first, "w") as f:
        f.write(os.environ["POD_UID"])
print("first=" + open(first).read(), flush=True)

def stop(signum, frame):
    with open("/data/terminated", "w") as f:
        f.write(os.environ["POD_UID"])
    print("got SIGTERM", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
http.server.HTTPServer(("0.0.0.0", 8080), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


@pytest.fixture(scope="module")
def web(cluster: Cluster) -> Cluster:
    cluster.apply(
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 8080}]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "web"}, "spec": {
            "replicas": 2, "serviceName": "web", "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "terminationGracePeriodSeconds": 60,
                "containers": [{
                    "name": "app", "image": "python:3.11", "command": ["python", "-c", APP],
                    "env": [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
                    "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 2},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
        }})
    for name in ("web-0", "web-1"):
        eventually(lambda name=name: cluster.pod_ready(name), 90, f"{name} Running and Ready")
    return cluster


def _volume_dir(cluster: Cluster, claim: str) -> Path:
    pvc = cluster.get("pvc", claim)
    assert pvc["status"]["phase"] == "Bound"
    pv = cluster.get("pv", pvc["spec"]["volumeName"])
    return Path(pv["spec"]["local"]["path"])


def test_a_statefulset_runs_on_local_volumes_bound_to_its_node(web: Cluster) -> None:
    for i in range(2):
        pod = web.get("pod", f"web-{i}")
        assert pod["status"]["phase"] == "Running"
        pvc = web.get("pvc", f"data-web-{i}")
        pv = web.get("pv", pvc["spec"]["volumeName"])
        assert pvc["status"]["phase"] == "Bound" and pv["spec"]["storageClassName"] == "standard"
        terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"][0]["values"] == [pod["spec"]["nodeName"]]
        assert (_volume_dir(web, f"data-web-{i}") / "first").read_text() == pod["metadata"]["uid"]


def test_deleting_a_pod_sends_sigterm_and_the_data_survives_on_its_claim(web: Cluster) -> None:
    old = web.get("pod", "web-0")
    started = time.monotonic()
    web.kubectl("delete", "pod", "web-0", "--wait=true", "--timeout=60s")
    assert time.monotonic() - started < 30, "the pod took its whole grace period: SIGTERM was not honoured"
    volume = _volume_dir(web, "data-web-0")
    assert (volume / "terminated").read_text() == old["metadata"]["uid"]
    new = eventually(lambda: (p := web.pod_ready("web-0")) and p["metadata"]["uid"] != old["metadata"]["uid"] and p,
                     90, "web-0 back, Ready, as a new pod")
    assert _volume_dir(web, "data-web-0") == volume
    assert f"first={old['metadata']['uid']}" in web.kubectl("logs", "web-0")
    assert new["status"]["containerStatuses"][0]["restartCount"] == 0
    events = json.loads(web.kubectl("get", "events", "--field-selector", "involvedObject.name=web-0", "-o", "json"))
    assert any(e["reason"] == "Killing" and e["involvedObject"]["uid"] == old["metadata"]["uid"]
               for e in events["items"])


def test_a_killed_container_is_restarted_by_the_agent(web: Cluster) -> None:
    pod = web.get("pod", "web-1")
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 0
    pid = int(status["containerID"].removeprefix("octavo://"))
    os.kill(pid, signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        p = web.pod_ready("web-1")
        return p if p and p["status"]["containerStatuses"][0]["restartCount"] == 1 else None

    after = eventually(restarted, 60, "web-1 restarted once and Ready again")
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
    status = after["status"]["containerStatuses"][0]
    assert status["lastState"]["terminated"]["exitCode"] == 128 + signal.SIGKILL
    assert "got SIGTERM" not in web.kubectl("logs", "web-1", "--previous")
    assert "first=" in web.kubectl("logs", "web-1", "--previous")
    events = web.kubectl("get", "events", "--field-selector", "involvedObject.name=web-1", "-o", "json")
    assert "Started container app (restart 1)" in [e["message"] for e in json.loads(events)["items"]]
