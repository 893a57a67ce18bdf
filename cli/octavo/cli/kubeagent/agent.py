"""The node agent: a kubelet for the local control plane (octavo.cli.kubecontrolplane). It registers NODES nodes
(node-0, node-1, ... each with its own node credentials, in zones zone-a/b/c), renews their leases, runs the pods
the scheduler binds to them as local processes (pods.py), provisions local PersistentVolumes for the `standard`
StorageClass (provisioner.py) and serves `kubectl logs` (logserver.py). docs/kubernetes.md says what it supports.

    plane = KubeControlPlane(root / "plane").start()
    agent = NodeAgent(agent_config(plane, root / "agent")).start()
    ...
    agent.stop(); plane.stop()

or as a process: `agent_config(...).write(path)`, then `python -m octavo.cli.kubeagent --config PATH`.

One thread lists each node's pods every POLL_S and hands each pod to its PodWorker (a thread per pod); the same
thread renews the leases and node statuses, provisions volumes and keeps the pod network's Services in step."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from octavo.cli.kubeagent import api as k
from octavo.cli.kubeagent import nodes as n
from octavo.cli.kubeagent.addresses import BridgeNetwork, LoopbackNetwork
from octavo.cli.kubeagent.logserver import LogServer
from octavo.cli.kubeagent.pods import NodeContext, PodWorker
from octavo.cli.kubeagent.provisioner import Provisioner

log = logging.getLogger("octavo.kubeagent")

NODES_DEFAULT = 3
POLL_S = 0.5
SYNC_S = 1.0
STOP_GRACE_S = 10.0
NETWORKS = ("bridge", "loopback")


class AgentError(RuntimeError):
    """The agent cannot run here; the message says why and what to do."""


@dataclass(frozen=True)
class NodeIdentity:
    name: str
    cert_file: str
    key_file: str


@dataclass(frozen=True)
class AgentConfig:
    """What the agent needs of the control plane: where the API is, its CA, each node's client certificate, the
    admin's (for the volume provisioner and the Services the pod network routes) and the kubelet endpoint's
    serving certificate. `network`: "bridge" (network.py, a network namespace per pod) or "loopback"."""

    root: str
    server: str
    ca_file: str
    admin_cert_file: str
    admin_key_file: str
    serving_cert_file: str
    serving_key_file: str
    nodes: tuple[NodeIdentity, ...]
    network: str = "bridge"
    kubelet_port: int = 0
    bridge: str = ""  # the bridge network's bridge name; empty: network.BRIDGE (one agent per name at a time)

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> AgentConfig:
        raw = json.loads(Path(path).read_text())
        raw["nodes"] = tuple(NodeIdentity(**node) for node in raw["nodes"])
        return cls(**raw)


def agent_config(plane: Any, root: str | Path, nodes: int = NODES_DEFAULT, network: str = "bridge",
                 kubelet_port: int = 0, bridge: str = "") -> AgentConfig:
    """Credentials from a started KubeControlPlane for `nodes` nodes named node-0, node-1, ..."""
    names = [f"node-{i}" for i in range(nodes)]
    identities = []
    for name in names:
        creds = plane.node_credentials(name)
        identities.append(NodeIdentity(name, creds.cert_file, creds.key_file))
    cert, key = plane.serving_certificate("kubelet", ["localhost", "127.0.0.1", *names])
    return AgentConfig(root=str(Path(root).resolve()), server=plane.server, ca_file=plane.ca_file,
                       admin_cert_file=str(plane.pki / "admin.crt"), admin_key_file=str(plane.pki / "admin.key"),
                       serving_cert_file=cert, serving_key_file=key, nodes=tuple(identities), network=network,
                       kubelet_port=kubelet_port, bridge=bridge)


def check_host(network: str) -> None:
    """Root, and the tools the chosen network needs: the pods' mount namespaces need CAP_SYS_ADMIN."""
    if network not in NETWORKS:
        raise AgentError(f"network {network!r}: one of {', '.join(NETWORKS)}")
    if os.geteuid() != 0:
        raise AgentError("the node agent runs as root: each container gets a mount namespace of its own with its "
                         "volumes bound at their absolute paths (and, with the bridge network, a network "
                         "namespace); run it with sudo, or in a container or VM as root (CI runs as root)")
    needed = ["nsenter"] + (["ip", "nft"] if network == "bridge" else [])
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if missing:
        raise AgentError(f"the node agent needs {', '.join(missing)} on PATH (util-linux, iproute2, nftables)")


class NodeAgent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.root = Path(config.root)
        self.admin = k.Api(config.server, config.ca_file, k.Identity(config.admin_cert_file, config.admin_key_file))
        self.apis = {node.name: k.Api(config.server, config.ca_file, k.Identity(node.cert_file, node.key_file))
                     for node in config.nodes}
        self.network: BridgeNetwork | LoopbackNetwork | None = None
        self.server: LogServer | None = None
        self.provisioner = Provisioner(self.admin, self.root, set(self.apis))
        self.workers: dict[str, PodWorker] = {}  # pod uid -> its worker
        self.contexts: dict[str, NodeContext] = {}
        self.node_uids: dict[str, str] = {}
        self.errors: list[str] = []  # the last errors the loop ran into (it carries on)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="node-agent", daemon=True)

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> NodeAgent:
        check_host(self.config.network)
        self.root.mkdir(parents=True, exist_ok=True)
        host, port = _host_port(self.config.server)
        try:
            if self.config.network == "bridge":
                self.network = BridgeNetwork(self.root, host, port, self.config.bridge).start()
            else:
                self.network = LoopbackNetwork(host, port)
            address = self.network.node_ip("")
            self.server = LogServer(address, self.config.kubelet_port, self.config.serving_cert_file,
                                    self.config.serving_key_file, self.config.ca_file, self._find_log).start()
            allocatable = n.capacity()
            for index, (name, api) in enumerate(self.apis.items()):
                node = n.register(api, name, index, address, self.server.port)
                self.node_uids[name] = node["metadata"]["uid"]
                n.renew_lease(api, name, self.node_uids[name])
                self.contexts[name] = NodeContext(name, api, self.root, self.network, allocatable)
            self.provisioner.ensure_class()
        except BaseException:
            self.stop()
            raise
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop, kill every pod's processes (the pod objects stay, as when a kubelet's machine dies),
        then the kubelet endpoint and the pod network."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(STOP_GRACE_S)
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            w.gone()
        for w in workers:
            w.join(STOP_GRACE_S)
        if self.server is not None:
            self.server.stop()
        if isinstance(self.network, BridgeNetwork):
            self.network.stop()

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop ------------------------------------------------------------------------------------------------
    def _main(self) -> None:
        next_lease = next_status = next_sync = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            for name in self.apis:
                self._guard(f"pods of {name}", self._sync_pods, name)
            if now >= next_lease:
                next_lease = now + n.LEASE_RENEW_S
                for name, api in self.apis.items():
                    self._guard(f"lease of {name}", n.renew_lease, api, name, self.node_uids[name])
            if now >= next_status:
                next_status = now + n.STATUS_RENEW_S
                address = self.network.node_ip("") if self.network else ""
                port = self.server.port if self.server else 0
                for name, api in self.apis.items():
                    self._guard(f"status of {name}", n.renew_status, api, name, address, port)
            if now >= next_sync:
                next_sync = now + SYNC_S
                self._guard("volumes", self.provisioner.step)
                self._guard("services", self._sync_services)
            self._stop.wait(POLL_S)

    def _guard(self, what: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except (k.ApiError, OSError, ValueError, KeyError) as e:
            self.errors.append(f"{time.strftime('%H:%M:%S')} {what}: {e}")
            del self.errors[:-100]
            log.warning("%s: %s", what, e)

    def _sync_services(self) -> None:
        if isinstance(self.network, BridgeNetwork):
            services = self.admin.items(k.core(None, "services"))
            slices = self.admin.items(k.group("discovery.k8s.io/v1", None, "endpointslices"))
            self.network.sync(services, slices)

    def _sync_pods(self, node: str) -> None:
        api = self.apis[node]
        pods = api.items(k.core(None, "pods"), {"fieldSelector": f"spec.nodeName={node}"})
        seen = {p["metadata"]["uid"]: p for p in pods}
        with self._lock:
            for uid, pod in seen.items():
                worker = self.workers.get(uid)
                if worker is not None:
                    worker.update(pod)
                    continue
                phase = (pod.get("status") or {}).get("phase")
                if pod["metadata"].get("deletionTimestamp"):  # not ours to stop (an earlier agent's): remove it
                    api.delete(k.core(pod["metadata"]["namespace"], "pods", pod["metadata"]["name"]),
                               {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}})
                elif phase not in ("Succeeded", "Failed"):
                    worker = PodWorker(self.contexts[node], pod)
                    self.workers[uid] = worker
                    worker.start()
            for uid, worker in list(self.workers.items()):
                if worker.node.name != node:
                    continue
                if uid not in seen:
                    worker.gone()
                if not worker.alive() and uid not in seen:
                    del self.workers[uid]

    # -- for the kubelet endpoint and tests ----------------------------------------------------------------------
    def worker(self, namespace: str, pod: str) -> PodWorker | None:
        """The newest worker of that pod (a StatefulSet's pod comes back under its name)."""
        with self._lock:
            found = [w for w in self.workers.values() if w.namespace == namespace and w.name == pod]
        alive = [w for w in found if w.alive()]
        return (alive or found)[-1] if found else None

    def _find_log(self, namespace: str, pod: str, container: str, previous: bool) -> Any:
        worker = self.worker(namespace, pod)
        c = worker.container(container) if worker is not None else None
        if c is None:
            return None
        return (c.previous_log_path if previous else c.log_path), c.running


def _host_port(server: str) -> tuple[str, int]:
    rest = server.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)
