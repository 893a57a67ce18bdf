"""The fallback pod network, for when the real one (network.py: a network namespace per pod on a bridge) is not
in use: every pod shares this host's network and gets an address of its own in 127.0.0.0/8 for its status
(127.A.B.N, the prefix random per agent so that agents on one machine do not collide). Its containers listen on
the host's ports, so two pods of one port collide; Services have no ClusterIP routing, and the `kubernetes`
Service is the API server's own address. The API server refuses loopback addresses in EndpointSlices: Services
get no endpoints from these pods."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

from octavo.cli.kubeagent.pods import PodAddress
from octavo.cli.kubeagent.volumes import Mount


class LoopbackNetwork:
    def __init__(self, api_host: str, api_port: int) -> None:
        self.api = (api_host, api_port)
        self.prefix = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
        self._ips: dict[str, str] = {}
        self._next = 1
        self._lock = threading.Lock()

    def node_ip(self, node: str) -> str:
        return "127.0.0.1"

    def attach(self, pod: dict[str, Any]) -> PodAddress:
        uid = pod["metadata"]["uid"]
        with self._lock:
            if uid not in self._ips:
                if self._next > 254:
                    raise OSError(f"the loopback pod network has no address left in {self.prefix}.0/24")
                self._ips[uid] = f"{self.prefix}.{self._next}"
                self._next += 1
            return PodAddress(self._ips[uid])

    def detach(self, pod: dict[str, Any]) -> None:
        with self._lock:
            self._ips.pop(pod["metadata"]["uid"], None)

    def kubernetes_service(self) -> tuple[str, int]:
        return self.api

    def sync(self, services: list[dict[str, Any]], slices: list[dict[str, Any]]) -> None:
        pass  # no Service routing here


class BridgeNetwork:
    """The real pod network (network.py): a network namespace per pod on a bridge, Services routed by nftables,
    `*.svc` names in each pod's /etc/hosts (kept up to date by `sync`), and the `kubernetes` Service at its
    ClusterIP. Every node of the agent shares the bridge; its gateway address is the nodes' InternalIP."""

    def __init__(self, root: Path, api_host: str, api_port: int, bridge: str = "") -> None:
        from octavo.cli.kubeagent import network

        self._network = network
        self.net = network.PodNetwork(root / "network", bridge=bridge or network.BRIDGE,
                                      api_server=(api_host, api_port))
        self.root = root
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> pod, for the hosts files
        self._lock = threading.Lock()

    def start(self) -> BridgeNetwork:
        self.net.start()
        return self

    def stop(self) -> None:
        self.net.stop()

    def node_ip(self, node: str) -> str:
        return self.net.gateway

    def _files(self, uid: str) -> tuple[Path, Path]:
        where = self.root / "pods" / uid
        return where / "etc-hosts", where / "etc-resolv.conf"

    def attach(self, pod: dict[str, Any]) -> PodAddress:
        uid = pod["metadata"]["uid"]
        netns, ip = self.net.add_pod(uid)
        hosts, resolv = self._files(uid)
        hosts.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._pods[uid] = pod
        self._write_hosts(pod, ip)
        self._network.write_in_place(resolv, self.net.resolv_conf())
        return PodAddress(ip, f"/run/netns/{netns}", (Mount(str(hosts), "/etc/hosts", False),
                                                      Mount(str(resolv), "/etc/resolv.conf", False)))

    def _write_hosts(self, pod: dict[str, Any], ip: str) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        content = self.net.hosts_file(meta["namespace"], ip, spec.get("hostname") or meta["name"],
                                      spec.get("subdomain") or None)
        self._network.write_in_place(self._files(meta["uid"])[0], content)

    def detach(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            self._pods.pop(uid, None)
        self.net.remove_pod(uid)

    def kubernetes_service(self) -> tuple[str, int]:
        from octavo.cli.kubecontrolplane import KUBERNETES_SERVICE_IP

        return KUBERNETES_SERVICE_IP, 443

    def sync(self, services: list[dict[str, Any]], slices: list[dict[str, Any]]) -> None:
        """Route the Services as the API lists them now, and rewrite every pod's /etc/hosts to match."""
        self.net.sync_services(services, slices)
        with self._lock:
            pods = list(self._pods.values())
        for pod in pods:
            ip = self.net.pod_ip(pod["metadata"]["uid"])
            if ip is not None:
                self._write_hosts(pod, ip)
