"""A node as a kubelet registers it: the Node object (labels, capacity, addresses, the kubelet's port, a Ready
condition) and its heartbeats: the Lease in kube-node-lease renewed every LEASE_RENEW_S, and the node's status
every STATUS_RENEW_S (the node lifecycle controller reads the lease first; either keeps its taints away)."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

from octavo.cli.kubeagent import api as k

LEASE_DURATION_S = 40
LEASE_RENEW_S = 5.0
STATUS_RENEW_S = 30.0
PODS_MAX = 110
ZONES = ("zone-a", "zone-b", "zone-c")
KUBELET_VERSION = "v1.35.4"


def now_micro() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def capacity() -> dict[str, str]:
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"cpu": str(os.cpu_count() or 1), "memory": f"{pages // 1024}Ki", "pods": str(PODS_MAX),
            "ephemeral-storage": f"{_disk_bytes() // 1024}Ki"}


def _disk_bytes() -> int:
    st = os.statvfs("/")
    return st.f_blocks * st.f_frsize


def zone(index: int) -> str:
    return ZONES[index % len(ZONES)]


def node_object(name: str, index: int, address: str, kubelet_port: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": _arch(), "topology.kubernetes.io/zone": zone(index)}},
            "spec": {}, "status": node_status(name, address, kubelet_port)}


def node_status(name: str, address: str, kubelet_port: int) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cap = capacity()
    ok = {"status": "False", "lastHeartbeatTime": now, "lastTransitionTime": now}
    return {
        "capacity": cap, "allocatable": cap,
        "conditions": [
            {"type": "MemoryPressure", "reason": "KubeletHasSufficientMemory", **ok},
            {"type": "DiskPressure", "reason": "KubeletHasNoDiskPressure", **ok},
            {"type": "PIDPressure", "reason": "KubeletHasSufficientPID", **ok},
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "octavo node agent is posting "
             "ready status", "lastHeartbeatTime": now, "lastTransitionTime": now},
        ],
        "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": platform.release(),
                     "osImage": "octavo node agent", "containerRuntimeVersion": "octavo://local-processes",
                     "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                     "architecture": _arch()},
    }


def _arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def register(api: k.Api, name: str, index: int, address: str, kubelet_port: int) -> dict[str, Any]:
    """Create the node (or take over the one of that name an earlier agent left) with a Ready status."""
    body = node_object(name, index, address, kubelet_port)
    if api.create(k.core(None, "nodes"), body) is None:
        api.patch(k.core(None, "nodes", name), {"metadata": {"labels": body["metadata"]["labels"]}},
                  k.STRATEGIC_PATCH)
    return renew_status(api, name, address, kubelet_port)


def renew_status(api: k.Api, name: str, address: str, kubelet_port: int) -> dict[str, Any]:
    return dict(api.patch(k.core(None, "nodes", name, "status"), {"status": node_status(name, address, kubelet_port)},
                          k.STRATEGIC_PATCH))


def renew_lease(api: k.Api, name: str, node_uid: str) -> None:
    path = k.group("coordination.k8s.io/v1", "kube-node-lease", "leases", name)
    spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": now_micro()}
    try:
        api.patch(path, {"spec": spec})
    except k.ApiError as e:
        if e.status != 404:
            raise
        api.create(k.group("coordination.k8s.io/v1", "kube-node-lease", "leases"), {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]},
            "spec": spec})
