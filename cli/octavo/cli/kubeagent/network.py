"""Pod networking for the node agent on the local control plane (issue 40): an address of its own for every pod,
Services routed by nftables, and the names under `*.svc` as hosts entries. Linux only, as root.

Layout (the approach of e2e/netfaults/netlab.py, but the bridge lives in the host's namespace so that the host
is the pods' router):
- one bridge (BRIDGE, default `octavo-k8s0`) in the host namespace holding the gateway address, the first
  address of the pod range (POD_CIDR, 10.244.0.0/16, or a free 10.X.0.0/16 when this machine already uses it);
- a network namespace per pod (`<bridge>-<pod uid>`) with `lo` up and `eth0`, one end of a veth pair whose
  other end is a port of the bridge, holding the pod's address; its default route goes through the gateway;
- forwarding enabled on the bridge only (net.ipv4.conf.<bridge>.forwarding: the host does not become a router
  for its other interfaces);
- one nftables table of our own (`ip octavo_<bridge>`) for Services: see `render_ruleset`.

Reachability: pods reach each other directly over the bridge; they reach host processes listening on the
gateway address (or on 0.0.0.0), such as Octavo's metadata etcd that tests start on `gateway`; they do not reach
host processes bound to 127.0.0.1, except the API server through the `kubernetes` Service when it is given as
`api_server` (10.96.0.1:443 -> 127.0.0.1:PORT, by `route_localnet` on the bridge). Host processes reach pods
directly, and Services (ClusterIP:port) through the same table (its output hook). Nothing reaches the outside
world from a pod (no masquerade to the host's uplink): nothing here needs it.

Names: there is no DNS server. `hosts_file(namespace)` is the content of a pod's /etc/hosts, and `RESOLV_CONF`
its /etc/resolv.conf: name lookups go to /etc/hosts first (nsswitch `hosts: files dns`, Debian's default, and the
image's) and DNS never answers (no nameserver but 127.0.0.1 in the pod's namespace, where nothing listens: a
lookup of an unknown name fails at once). Search domains apply to DNS only, never to /etc/hosts, so the hosts
file spells out every short form Kubernetes' DNS would resolve through the search path.

Crash story: every name derives from the bridge's name, so `start()` first deletes whatever a previous run left
(the table, the namespaces `<bridge>-*` and the processes still in them, the bridge) and `stop()` does the same;
both are idempotent. One PodNetwork per bridge name on a host: `start()` takes a lock on the name (released by
`stop()` or by the process's death) and refuses when another live one holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

BRIDGE = "octavo-k8s0"
POD_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"  # kubecontrolplane.SERVICE_CIDR: the agent passes the control plane's
CLUSTER_DOMAIN = "cluster.local"
KUBERNETES_SERVICE = ("default", "kubernetes")
IFNAME_LENGTH_MAX = 15  # IFNAMSIZ - 1, the kernel's limit on interface names
COMMAND_TIMEOUT_S = 30.0
LOCK_DIR = "/run"  # tmpfs, as /run/netns: a lock file per bridge name, held while a PodNetwork is started
KILL_WAIT_S = 5.0  # for processes left in a pod namespace being deleted to exit
PROTOCOLS = ("TCP", "UDP", "SCTP")
RESOLV_CONF = ("# Octavo's local control plane (octavo.cli.kubeagent.network): no DNS server; names come from\n"
               "# /etc/hosts, which lists every Service and StatefulSet pod name in full. Nothing listens on the\n"
               "# nameserver below, so an unknown name fails at once.\n"
               "nameserver 127.0.0.1\n"
               "options ndots:1 timeout:1 attempts:1\n")
_UID = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


class PodNetworkError(RuntimeError):
    pass


# -- the pure part: Services and EndpointSlices as the API returns them -> routes, rules, hosts entries ---------

@dataclass(frozen=True)
class Backend:
    ip: str
    port: int


@dataclass(frozen=True)
class ServiceRoute:
    """One ClusterIP:port (protocol) and the ready backends its connections are spread over (none: refused)."""
    namespace: str
    name: str
    cluster_ip: str
    port: int
    protocol: str
    backends: tuple[Backend, ...]


def _ready(endpoint: Mapping[str, Any]) -> bool:
    """The EndpointSlice rule: a missing `ready` condition means ready (publishNotReadyAddresses sets it true)."""
    return (endpoint.get("conditions") or {}).get("ready") is not False


def _slices_of(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """EndpointSlices by (namespace, service name): only IPv4 ones (our pods have IPv4 addresses only)."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for s in slices:
        meta = s.get("metadata") or {}
        service = (meta.get("labels") or {}).get("kubernetes.io/service-name")
        if service and s.get("addressType", "IPv4") == "IPv4":
            out.setdefault((meta.get("namespace", "default"), service), []).append(s)
    return out


def _cluster_ip(service: Mapping[str, Any]) -> str | None:
    """The Service's IPv4 ClusterIP, or None for headless, ExternalName and IPv6-only Services."""
    spec = service.get("spec") or {}
    if spec.get("type") == "ExternalName":
        return None
    ip = spec.get("clusterIP")
    if not ip or ip == "None":
        return None
    return ip if ipaddress.ip_address(ip).version == 4 else None


def service_routes(services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
                   api_server: tuple[str, int] | None = None) -> list[ServiceRoute]:
    """A route per port of every ClusterIP Service, to the ready endpoints of its EndpointSlices (a Service port
    matches the slice port of the same name; the slice's port is the resolved targetPort). `api_server`, when
    given, replaces the endpoints of the `kubernetes` Service (default/kubernetes)."""
    by_service = _slices_of(slices)
    routes = []
    for svc in services:
        meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
        ip = _cluster_ip(svc)
        if ip is None:
            continue
        key = (meta.get("namespace", "default"), meta["name"])
        for port in spec.get("ports") or ():
            protocol = port.get("protocol", "TCP")
            if protocol not in PROTOCOLS:
                continue
            if key == KUBERNETES_SERVICE and api_server is not None:
                backends: tuple[Backend, ...] = (Backend(api_server[0], int(api_server[1])),)
            else:
                backends = _backends(by_service.get(key, ()), port.get("name") or "", protocol)
            routes.append(ServiceRoute(key[0], key[1], ip, int(port["port"]), protocol, backends))
    return routes


def _backends(slices: Iterable[Mapping[str, Any]], port_name: str, protocol: str) -> tuple[Backend, ...]:
    found: list[Backend] = []
    for s in slices:
        numbers = [p["port"] for p in s.get("ports") or ()
                   if (p.get("name") or "") == port_name and p.get("protocol", "TCP") == protocol
                   and p.get("port") is not None]
        for number in numbers:
            for endpoint in s.get("endpoints") or ():
                if _ready(endpoint):
                    found.extend(Backend(a, int(number)) for a in endpoint.get("addresses") or ())
    return tuple(sorted(set(found), key=lambda b: (ipaddress.ip_address(b.ip), b.port)))


def render_ruleset(table: str, routes: Sequence[ServiceRoute], pod_cidr: str, service_cidr: str,
                   bridge: str) -> str:
    """The whole table, for `nft -f` (replacing any previous version in one transaction).

    - `services`: a rule per ClusterIP:port jumping to the route's chain, which DNATs to one backend chosen
      round-robin (`numgen inc`: connections, not packets, go through nat chains) or rejects when no backend is
      ready (a connection is refused at once, as kube-proxy does);
    - hooked at prerouting (pods' connections) and output (host processes');
    - postrouting: a pod's connection DNATed back out to the bridge is masqueraded to the gateway, so the reply
      comes back through the host to be un-DNATed, even when the backend is on the same bridge or is the pod
      itself (without br_netfilter it would go straight back over the bridge, un-translated);
    - forward and output filters reject what is still addressed to the Service range after DNAT (a ClusterIP
      that no Service holds) instead of sending it out of the host's default route, and pods' packets for
      anywhere but the bridge (the outside world: without masquerade no answer would come back, so a lookup
      on the host's DNS server would wait for its timeout instead of failing)."""
    lines = [f"table ip {table} {{"]
    dispatch = []
    for i, r in enumerate(routes):
        chain, proto = f"svc{i}", r.protocol.lower()
        dispatch.append(f"    ip daddr {r.cluster_ip} {proto} dport {r.port} jump {chain}"
                        f" comment \"{r.namespace}/{r.name}:{r.port}/{r.protocol}\"")
        lines.append(f"  chain {chain} {{")
        if not r.backends:
            lines.append("    reject" + (" with tcp reset" if r.protocol == "TCP" else ""))
        elif len(r.backends) == 1:
            lines.append(f"    meta l4proto {proto} dnat to {r.backends[0].ip}:{r.backends[0].port}")
        else:
            choices = ", ".join(f"{n} : jump {chain}e{n}" for n in range(len(r.backends)))
            lines.append(f"    numgen inc mod {len(r.backends)} vmap {{ {choices} }}")
        lines.append("  }")
        if len(r.backends) > 1:
            for n, b in enumerate(r.backends):
                lines.append(f"  chain {chain}e{n} {{\n    meta l4proto {proto} dnat to {b.ip}:{b.port}\n  }}")
    lines.append("  chain services {")
    lines.extend(dispatch)
    lines.append("  }")
    lines.append("  chain prerouting {\n    type nat hook prerouting priority -100; policy accept;\n"
                 "    jump services\n  }")
    lines.append("  chain output {\n    type nat hook output priority -100; policy accept;\n"
                 "    jump services\n  }")
    lines.append("  chain postrouting {\n    type nat hook postrouting priority 100; policy accept;\n"
                 f"    ct status dnat ip saddr {pod_cidr} oifname \"{bridge}\" masquerade\n  }}")
    lines.append("  chain forward {\n    type filter hook forward priority 0; policy accept;\n"
                 f"    ip daddr {service_cidr} reject\n"
                 f"    iifname \"{bridge}\" oifname != \"{bridge}\" meta l4proto tcp reject with tcp reset\n"
                 f"    iifname \"{bridge}\" oifname != \"{bridge}\" reject\n  }}")
    lines.append("  chain filter_output {\n    type filter hook output priority 0; policy accept;\n"
                 f"    ip daddr {service_cidr} reject\n  }}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def hosts_entries(namespace: str, services: Iterable[Mapping[str, Any]],
                  slices: Iterable[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """(address, names) for a pod in `namespace`: every ClusterIP Service as `<svc>.<ns>.svc.cluster.local`,
    `<svc>.<ns>.svc`, `<svc>.<ns>` (and `<svc>` in the pod's own namespace); every headless Service's ready
    endpoints under the Service's names, and each one with a hostname (a StatefulSet pod) as
    `<hostname>.<svc>.<ns>.svc.cluster.local` and the same shorter forms. Sorted, so that equal inputs give
    equal files."""
    by_service = _slices_of(slices)
    entries: list[tuple[str, list[str]]] = []
    for svc in sorted(services, key=lambda s: (s["metadata"].get("namespace", "default"), s["metadata"]["name"])):
        meta = svc["metadata"]
        ns, name = meta.get("namespace", "default"), meta["name"]
        names = _names(f"{name}.{ns}", ns == namespace, name)
        ip = _cluster_ip(svc)
        if ip is not None:
            entries.append((ip, names))
            continue
        if (svc.get("spec") or {}).get("clusterIP") != "None":
            continue  # ExternalName, or a Service not given an address yet
        for s in sorted(by_service.get((ns, name), ()), key=lambda s: s["metadata"].get("name", "")):
            for endpoint in s.get("endpoints") or ():
                if not _ready(endpoint) or not endpoint.get("addresses"):
                    continue
                address = endpoint["addresses"][0]
                hostname = endpoint.get("hostname")
                if hostname:
                    entries.append((address, _names(f"{hostname}.{name}.{ns}", ns == namespace,
                                                    f"{hostname}.{name}")))
                entries.append((address, names))
    return entries


def _names(qualified: str, same_namespace: bool, short: str) -> list[str]:
    """`a.ns` -> a.ns.svc.cluster.local, a.ns.svc, a.ns (and `short` when the pod is in the same namespace)."""
    names = [f"{qualified}.svc.{CLUSTER_DOMAIN}", f"{qualified}.svc", qualified]
    return [*names, short] if same_namespace else names


def render_hosts(entries: Sequence[tuple[str, Sequence[str]]], pod_ip: str | None = None,
                 hostname: str | None = None, subdomain: str | None = None, namespace: str = "default") -> str:
    """/etc/hosts as the kubelet writes it (localhost, the pod's own name) followed by `entries`."""
    lines = ["# Kubernetes-managed hosts file (octavo.cli.kubeagent.network): rewritten in place.",
             "127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    if pod_ip and hostname:
        own = [f"{hostname}.{subdomain}.{namespace}.svc.{CLUSTER_DOMAIN}", hostname] if subdomain else [hostname]
        lines.append(f"{pod_ip}\t{' '.join(own)}")
    lines.extend(f"{ip}\t{' '.join(names)}" for ip, names in entries)
    return "\n".join(lines) + "\n"


def write_in_place(path: str | Path, content: str) -> bool:
    """Rewrite `path`'s content in place (same inode: a bind mount of it sees the change), only when it differs.
    True when it was written. A reader may see a short file for a moment: hosts files are read whole per
    lookup, and the next lookup sees the full content."""
    data = content.encode()
    with open(path, "r+b" if os.path.exists(path) else "w+b") as f:
        if f.read() == data:
            return False
        f.seek(0)
        f.write(data)
        f.truncate()
    return True


# -- the IO ------------------------------------------------------------------------------------------------------

def _run(*argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, input=input)
    if check and done.returncode != 0:
        raise PodNetworkError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def _used_networks() -> list[ipaddress.IPv4Network]:
    used = _run("ip", "-4", "-o", "addr").stdout + _run("ip", "-4", "route").stdout
    nets = []
    for word in used.split():
        try:
            net = ipaddress.ip_network(word, strict=False)
        except ValueError:
            continue
        if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
            nets.append(net)
    return nets


def free_pod_cidr(preferred: str = POD_CIDR, avoid: Sequence[str] = (SERVICE_CIDR,)) -> ipaddress.IPv4Network:
    """`preferred` when no address or route of this machine overlaps it, else the first free 10.X.0.0/16 (X in
    [200, 250], as netlab picks its subnets, none overlapping `avoid`)."""
    used = _used_networks() + [ipaddress.IPv4Network(a) for a in avoid]
    candidates = [preferred] + [f"10.{x}.0.0/16" for x in range(200, 251)]
    for candidate in candidates:
        net = ipaddress.IPv4Network(candidate)
        if not any(net.overlaps(n) for n in used):
            return net
    raise PodNetworkError(f"no free pod range: {preferred} and 10.200-250.0.0/16 all overlap this machine's")


def _sysctl(path: str, value: str) -> None:
    with open(f"/proc/sys/net/ipv4/{path}", "w") as f:
        f.write(value)


@dataclass(frozen=True)
class Pod:
    uid: str
    netns: str
    ip: str
    host_link: str  # the veth end on the bridge


class PodNetwork:
    """The pods' network on this host. Thread-safe: the agent may call it from its workers.

        net = PodNetwork(root, api_server=("127.0.0.1", apiserver_port)).start()
        netns, ip = net.add_pod(uid)
        Popen([*net.command_prefix(netns), "unshare", "--mount", ...])   # see command_prefix
        net.sync_services(services, endpoint_slices)                     # on every watch event
        write_in_place(hosts_path, net.hosts_file(namespace, ip, hostname, subdomain))
        net.remove_pod(uid); net.stop()
    """

    def __init__(self, root: str | Path, cidr: str | None = None, bridge: str = BRIDGE,
                 service_cidr: str = SERVICE_CIDR, api_server: tuple[str, int] | None = None) -> None:
        if not bridge or len(bridge) > IFNAME_LENGTH_MAX - 2 or not re.fullmatch(r"[a-z0-9-]+", bridge):
            raise ValueError(f"bridge name {bridge!r}: [a-z0-9-], at most {IFNAME_LENGTH_MAX - 2} characters")
        self.root = Path(root)
        self.bridge = bridge
        self.table = "octavo_" + bridge.replace("-", "_")
        self.service_cidr = service_cidr
        self.api_server = api_server
        self._requested_cidr = cidr
        self.cidr: ipaddress.IPv4Network | None = None
        self.gateway = ""
        self._pods: dict[str, Pod] = {}
        self._next = 2  # the host index in `cidr` the next pod tries first (.1 is the gateway)
        self._services: list[Mapping[str, Any]] = []
        self._slices: list[Mapping[str, Any]] = []
        self._lock = threading.Lock()
        self._bridge_lock: IO[str] | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> PodNetwork:
        """Clean what a previous run left, then create the bridge with the gateway address, enable forwarding on
        it, and load the table (no Services yet)."""
        with self._lock:
            self._hold_bridge()
            self._clean()
            self.root.mkdir(parents=True, exist_ok=True)
            requested = self._requested_cidr
            if requested is not None:
                net = ipaddress.IPv4Network(requested)
                clash = [str(n) for n in _used_networks() if net.overlaps(n)]
                if clash or net.overlaps(ipaddress.IPv4Network(self.service_cidr)):
                    raise PodNetworkError(f"pod range {net} overlaps {clash or self.service_cidr}")
            else:
                net = free_pod_cidr(avoid=(self.service_cidr,))
            if net.num_addresses < 8:
                raise PodNetworkError(f"pod range {net}: too small (at least a /29)")
            self.cidr, self.gateway = net, str(net[1])
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.gateway}/{net.prefixlen}", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            _sysctl(f"conf/{self.bridge}/forwarding", "1")
            if self.api_server is not None and ipaddress.ip_address(self.api_server[0]).is_loopback:
                _sysctl(f"conf/{self.bridge}/route_localnet", "1")  # DNAT from pods to 127.0.0.1 is allowed
            self._apply()
        return self

    def stop(self) -> None:
        """Remove everything: the table, every pod namespace (killing what still runs in it), the bridge.
        Idempotent."""
        with self._lock:
            self._clean()
            self._pods.clear()
            self.cidr, self.gateway = None, ""
            if self._bridge_lock is not None:
                self._bridge_lock.close()  # releases the lock
                self._bridge_lock = None

    def __enter__(self) -> PodNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _hold_bridge(self) -> None:
        """Lock the bridge's name for this object (a lock the kernel drops when the process dies), so that a
        second PodNetwork on the same bridge fails here instead of cleaning away the first one's pods."""
        if self._bridge_lock is not None:
            return
        f = open(f"{LOCK_DIR}/octavo-podnetwork-{self.bridge}.lock", "a+")  # noqa: SIM115 (held until stop)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise PodNetworkError(f"bridge {self.bridge} is in use by another PodNetwork (another agent or "
                                  f"`dev up --kubernetes`): give this one another bridge name") from None
        self._bridge_lock = f

    def _clean(self) -> None:
        _run("nft", "delete", "table", "ip", self.table, check=False)
        for netns in _run("ip", "netns", "list").stdout.split("\n"):
            name = netns.split(" ")[0]
            if name.startswith(self.bridge + "-"):
                _delete_netns(name)
        _run("ip", "link", "del", self.bridge, check=False)
        (self.root / "network.json").unlink(missing_ok=True)

    # -- pods ------------------------------------------------------------------------------------------------
    def netns_name(self, uid: str) -> str:
        return f"{self.bridge}-{uid}"

    def add_pod(self, uid: str) -> tuple[str, str]:
        """A namespace for the pod with `lo` up, `eth0` holding a free address of the range, and a default route
        through the gateway: (namespace name, address). The same uid again returns what it has."""
        if not _UID.match(uid) or len(uid) > 63:
            raise ValueError(f"pod uid {uid!r}: lowercase letters, digits and '-', at most 63")
        with self._lock:
            cidr = self._started()
            if uid in self._pods:
                return self._pods[uid].netns, self._pods[uid].ip
            ip = self._allocate()
            netns = self.netns_name(uid)
            host_link = host_link_name(netns)
            _run("ip", "netns", "add", netns)
            try:
                # One call makes both ends, eth0 already inside: no half-made pair outside a namespace.
                _run("ip", "link", "add", host_link, "type", "veth", "peer", "name", "eth0", "netns", netns)
                _run("ip", "link", "set", host_link, "master", self.bridge)
                # A pod reaching itself through a Service: with br_netfilter the DNAT happens as the frame enters
                # the bridge, which then sends it back out of the port it came in by (kubelet's hairpin-veth).
                _run("ip", "link", "set", host_link, "type", "bridge_slave", "hairpin", "on")
                _run("ip", "link", "set", host_link, "up")
                _run("ip", "-n", netns, "link", "set", "lo", "up")
                _run("ip", "-n", netns, "addr", "add", f"{ip}/{cidr.prefixlen}", "dev", "eth0")
                _run("ip", "-n", netns, "link", "set", "eth0", "up")
                _run("ip", "-n", netns, "route", "add", "default", "via", self.gateway)
            except Exception:
                _delete_netns(netns)
                raise
            self._pods[uid] = Pod(uid, netns, ip, host_link)
            self._apply()  # a pod address that comes back gets its endpoint rules again
        return netns, ip

    def remove_pod(self, uid: str) -> None:
        """Delete the pod's namespace (its interfaces with it; processes still in it are killed: call this once
        the pod's containers exited) and stop sending Service connections to its address, before the API's
        EndpointSlices say so. Unknown uids are ignored."""
        with self._lock:
            pod = self._pods.pop(uid, None)
            _delete_netns(self.netns_name(uid))
            if pod is not None and self.cidr is not None:
                self._apply()

    def pod_ip(self, uid: str) -> str | None:
        with self._lock:
            pod = self._pods.get(uid)
            return pod.ip if pod else None

    def _started(self) -> ipaddress.IPv4Network:
        if self.cidr is None:
            raise PodNetworkError("the pod network is not started (PodNetwork.start)")
        return self.cidr

    def _allocate(self) -> str:
        """The next free address after the last one given (not the lowest: a freed address is reused last, so
        connections tracked for its previous pod have time to expire)."""
        cidr = self._started()
        hosts = cidr.num_addresses - 2  # without the network and broadcast addresses
        taken = {p.ip for p in self._pods.values()}
        for step in range(hosts - 1):
            index = 2 + (self._next - 2 + step) % (hosts - 1)
            ip = str(cidr[index])
            if ip not in taken:
                self._next = index + 1
                return ip
        raise PodNetworkError(f"pod range {cidr} is full: {len(taken)} pods")

    @staticmethod
    def command_prefix(netns: str) -> list[str]:
        """argv to put in front of a pod's command so that it runs in the pod's network namespace.

        `nsenter --net` joins the network namespace only (no mount changes, unlike `ip netns exec`, which
        remounts /sys and bind-mounts /etc/netns/NAME/*) and execs the rest, so the process started is the
        command itself. Put it outermost: `[*command_prefix(netns), "unshare", "--mount", ..., *command]`; the
        mount namespace unshare makes inside it (with /etc/hosts and /etc/resolv.conf bind-mounted) then shares
        the pod's network, and every child of the command does too. The other order
        (`unshare --mount ... nsenter --net=...`) works as well, since nsenter leaves mounts alone."""
        return ["nsenter", f"--net=/run/netns/{netns}", "--"]

    # -- services and names ----------------------------------------------------------------------------------
    def sync_services(self, services: Iterable[Mapping[str, Any]], endpoint_slices: Iterable[Mapping[str, Any]]
                      ) -> None:
        """Make the table route every ClusterIP Service (all namespaces, as listed by the API) to its ready
        endpoints, and remember both lists for `hosts_file`. Replaces the whole table in one transaction."""
        with self._lock:
            self._services, self._slices = list(services), list(endpoint_slices)
            if self.cidr is not None:
                self._apply()

    def routes(self) -> list[ServiceRoute]:
        """What the table routes now: the API's view, less the endpoints in the pod range that are no pod of
        ours (a pod removed before its EndpointSlice changed)."""
        cidr, live = self._started(), {p.ip for p in self._pods.values()}
        out = []
        for r in service_routes(self._services, self._slices, self.api_server):
            kept = tuple(b for b in r.backends if b.ip in live or ipaddress.ip_address(b.ip) not in cidr)
            out.append(ServiceRoute(r.namespace, r.name, r.cluster_ip, r.port, r.protocol, kept))
        return out

    def hosts_file(self, namespace: str, pod_ip: str | None = None, hostname: str | None = None,
                   subdomain: str | None = None) -> str:
        """The content of /etc/hosts for a pod in `namespace` (see hosts_entries; with the pod's own
        `hostname[.subdomain...]` when given), from the last `sync_services`."""
        with self._lock:
            entries = hosts_entries(namespace, self._services, self._slices)
        return render_hosts(entries, pod_ip, hostname, subdomain, namespace)

    @staticmethod
    def resolv_conf() -> str:
        """The content of /etc/resolv.conf for a pod: no DNS server; see the module's docstring."""
        return RESOLV_CONF

    def _apply(self) -> None:
        ruleset = render_ruleset(self.table, self.routes(), str(self._started()), self.service_cidr, self.bridge)
        # Declaring the table first makes the delete succeed on a first load: one transaction either way.
        _run("nft", "-f", "-", input=f"table ip {self.table}\ndelete table ip {self.table}\n{ruleset}")
        (self.root / "nftables.conf").write_text(ruleset)
        state = {"bridge": self.bridge, "cidr": str(self.cidr), "gateway": self.gateway, "table": self.table,
                 "pods": {p.uid: {"netns": p.netns, "ip": p.ip} for p in self._pods.values()}}
        (self.root / "network.json").write_text(json.dumps(state, indent=1) + "\n")


def host_link_name(netns: str) -> str:
    """The bridge's end of a pod's veth pair, derived from the namespace's name so that a run after a crash
    finds it without a record of it."""
    return "v" + hashlib.sha1(netns.encode()).hexdigest()[:IFNAME_LENGTH_MAX - 1]


def _delete_netns(name: str) -> None:
    """Kill what runs in the namespace and wait for it to leave (up to KILL_WAIT_S), delete the veth pair (a
    namespace's interfaces go away asynchronously after its deletion: this makes it synchronous), then the
    namespace. Missing parts are skipped."""
    pids = [int(p) for p in _run("ip", "netns", "pids", name, check=False).stdout.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _in_a_netns(p)]
        time.sleep(0.01)
    if pids:
        raise PodNetworkError(f"processes {pids} still run in {name} {KILL_WAIT_S} s after SIGKILL")
    _run("ip", "link", "del", host_link_name(name), check=False)
    _run("ip", "netns", "del", name, check=False)


def _in_a_netns(pid: int) -> bool:
    """False once the process exited (a zombie has left its namespaces)."""
    try:
        os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return False
    return True
