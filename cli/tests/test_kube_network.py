"""Pod networking for the node agent (octavo.cli.kubeagent.network, issue 40): pods in network namespaces of their
own on a bridge, Services by nftables DNAT, names as hosts entries. The pure parts run anywhere; the rest needs
root, `ip`, `nft` and `nsenter` (CI runs as root: there a missing one fails instead of skipping, conftest.py)."""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from octavo.cli.kubeagent.network import (
    RESOLV_CONF,
    Backend,
    PodNetwork,
    PodNetworkError,
    host_link_name,
    hosts_entries,
    render_hosts,
    render_ruleset,
    service_routes,
    write_in_place,
)

# A TCP server that answers every connection with its tag, and a client that connects `count` times and prints
# what each connection was answered (or the error).
SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64)
    print("ready", flush=True)
    while True:
        c, _ = s.accept(); c.sendall(sys.argv[3].encode()); c.close()
""")
CLIENT = textwrap.dedent("""
    import socket, sys
    for _ in range(int(sys.argv[3])):
        try:
            with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as c:
                print(c.recv(100).decode() or "empty", flush=True)
        except OSError as e:
            print(type(e).__name__, flush=True)
""")
_names = itertools.count()


def _unavailable() -> str:
    if os.geteuid() != 0:
        return "network namespaces, bridges and nftables need root (CI runs as root)"
    for tool in ("ip", "nft", "nsenter"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (iproute2, nftables, util-linux: `make system-packages`)"
    return ""


def _service(name: str, cluster_ip: str, ports: list[dict[str, Any]], namespace: str = "default") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"clusterIP": cluster_ip, "ports": ports}}


def _slice(service: str, ports: list[dict[str, Any]], endpoints: list[dict[str, Any]],
           namespace: str = "default") -> dict[str, Any]:
    return {"metadata": {"name": f"{service}-abcde", "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": ports, "endpoints": endpoints}


def _endpoint(ip: str, ready: bool | None = True, hostname: str | None = None) -> dict[str, Any]:
    e: dict[str, Any] = {"addresses": [ip], "conditions": {} if ready is None else {"ready": ready}}
    if hostname:
        e["hostname"] = hostname
    return e


# -- pure: no root needed ---------------------------------------------------------------------------------------

def test_routes_take_ready_endpoints_by_port_name_and_the_api_server_override() -> None:
    services = [
        _service("web", "10.96.0.20", [{"name": "http", "port": 80, "targetPort": "http"},
                                       {"name": "metrics", "port": 9090, "protocol": "TCP"}]),
        _service("peers", "None", [{"name": "peer", "port": 2380}]),  # headless: no route
        _service("kubernetes", "10.96.0.1", [{"name": "https", "port": 443, "targetPort": 6443}]),
    ]
    slices = [_slice("web", [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "metrics", "port": 9100}],
                     [_endpoint("10.244.0.3"), _endpoint("10.244.0.2", ready=None), _endpoint("10.244.0.4", False)])]
    routes = service_routes(services, slices, api_server=("127.0.0.1", 6443))
    by_port = {(r.name, r.port): r for r in routes}
    assert set(by_port) == {("web", 80), ("web", 9090), ("kubernetes", 443)}
    # Ready (or no condition, which means ready), sorted; the not-ready one left out; targetPort from the slice.
    assert by_port["web", 80].backends == (Backend("10.244.0.2", 8080), Backend("10.244.0.3", 8080))
    assert by_port["web", 9090].backends == (Backend("10.244.0.2", 9100), Backend("10.244.0.3", 9100))
    assert by_port["kubernetes", 443].backends == (Backend("127.0.0.1", 6443),)
    assert service_routes(services[2:], [])[0].backends == ()  # no override, no slice: no backend


def test_ruleset_round_robins_rejects_without_endpoints_and_hooks_pods_and_host() -> None:
    services = [_service("web", "10.96.0.20", [{"name": "", "port": 80}]),
                _service("empty", "10.96.0.21", [{"port": 53, "protocol": "UDP"}])]
    slices = [_slice("web", [{"port": 8080}], [_endpoint("10.244.0.2"), _endpoint("10.244.0.3")])]
    text = render_ruleset("octavo_t", service_routes(services, slices), "10.244.0.0/16", "10.96.0.0/16", "br")
    assert "ip daddr 10.96.0.20 tcp dport 80 jump svc0" in text
    assert "numgen inc mod 2 vmap { 0 : jump svc0e0, 1 : jump svc0e1 }" in text
    assert "meta l4proto tcp dnat to 10.244.0.2:8080" in text and "dnat to 10.244.0.3:8080" in text
    assert "ip daddr 10.96.0.21 udp dport 53 jump svc1" in text
    assert "chain svc1 {\n    reject\n  }" in text
    assert "type nat hook prerouting" in text and "type nat hook output" in text


def test_hosts_file_names_services_and_statefulset_pods() -> None:
    services = [_service("web", "10.96.0.20", [{"port": 80}], namespace="apps"),
                _service("db", "10.96.0.30", [{"port": 5432}], namespace="other"),
                _service("peers", "None", [{"port": 2380}], namespace="apps"),
                {"metadata": {"name": "ext", "namespace": "apps"},
                 "spec": {"type": "ExternalName", "externalName": "example.com"}}]
    slices = [_slice("peers", [{"port": 2380}], [_endpoint("10.244.0.7", hostname="etcd-0"),
                                                 _endpoint("10.244.0.8", ready=False, hostname="etcd-1")],
                     namespace="apps")]
    text = render_hosts(hosts_entries("apps", services, slices), "10.244.0.9", "bookie-0", "bookies", "apps")
    lines = text.splitlines()
    assert "127.0.0.1\tlocalhost" in lines
    assert "10.244.0.9\tbookie-0.bookies.apps.svc.cluster.local bookie-0" in lines
    assert "10.96.0.20\tweb.apps.svc.cluster.local web.apps.svc web.apps web" in lines
    assert "10.96.0.30\tdb.other.svc.cluster.local db.other.svc db.other" in lines  # no short name elsewhere
    assert ("10.244.0.7\tetcd-0.peers.apps.svc.cluster.local etcd-0.peers.apps.svc etcd-0.peers.apps "
            "etcd-0.peers") in lines
    assert "10.244.0.7\tpeers.apps.svc.cluster.local peers.apps.svc peers.apps peers" in lines
    assert "10.244.0.8" not in text and "ext" not in text  # not ready; ExternalName has no address
    assert "nameserver 127.0.0.1" in RESOLV_CONF


def test_write_in_place_keeps_the_inode(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    assert write_in_place(path, "a long first content\n")
    inode = path.stat().st_ino
    assert write_in_place(path, "short\n") and path.read_text() == "short\n"
    assert not write_in_place(path, "short\n")
    assert path.stat().st_ino == inode


# -- real: namespaces, a bridge, nftables -----------------------------------------------------------------------

@pytest.fixture
def net(tmp_path: Path) -> Iterator[PodNetwork]:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    network = PodNetwork(tmp_path / "net", bridge=_bridge_name())
    network.start()
    yield network
    network.stop()


def _bridge_name() -> str:
    return f"okt{os.getpid() % 100000}x{next(_names)}"


def _serve(cmd_prefix: list[str], host: str, port: int, tag: str,
           procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([*cmd_prefix, sys.executable, "-c", SERVER, host, str(port), tag],
                            stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _connect(cmd_prefix: list[str], host: str, port: int, count: int = 1) -> list[str]:
    done = subprocess.run([*cmd_prefix, sys.executable, "-c", CLIENT, host, str(port), str(count)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        p.kill()
        p.wait(10)


def _state() -> str:
    return "\n".join(subprocess.run(argv, capture_output=True, text=True).stdout
                     for argv in (["ip", "-o", "link"], ["ip", "netns", "list"], ["nft", "list", "tables"]))


def test_pods_get_distinct_addresses_and_reach_each_other(net: PodNetwork,
                                                          procs: list[subprocess.Popen[str]]) -> None:
    ns_a, ip_a = net.add_pod("pod-a")
    ns_b, ip_b = net.add_pod("pod-b")
    assert ip_a != ip_b and ns_a != ns_b
    for ip in (ip_a, ip_b):
        assert not ip.startswith("127.") and ip != net.gateway
    assert net.add_pod("pod-a") == (ns_a, ip_a)  # idempotent
    _serve(net.command_prefix(ns_b), ip_b, 8080, "b", procs)
    _serve(net.command_prefix(ns_a), ip_a, 8080, "a", procs)
    assert _connect(net.command_prefix(ns_a), ip_b, 8080) == ["b"]
    assert _connect(net.command_prefix(ns_b), ip_a, 8080) == ["a"]
    assert _connect([], ip_a, 8080) == ["a"]  # the host reaches pods directly
    # lo is up in a pod, with nothing of the host's on it.
    _serve(net.command_prefix(ns_a), "127.0.0.1", 9000, "a-lo", procs)
    assert _connect(net.command_prefix(ns_a), "127.0.0.1", 9000) == ["a-lo"]
    assert _connect(net.command_prefix(ns_b), "127.0.0.1", 9000) == ["ConnectionRefusedError"]


def test_pod_reaches_a_host_process_on_the_gateway_address(net: PodNetwork,
                                                          procs: list[subprocess.Popen[str]]) -> None:
    ns, _ = net.add_pod("pod-a")
    _serve([], net.gateway, 2379, "etcd", procs)
    assert _connect(net.command_prefix(ns), net.gateway, 2379) == ["etcd"]


def test_cluster_ip_spreads_connections_over_ready_endpoints(net: PodNetwork,
                                                             procs: list[subprocess.Popen[str]]) -> None:
    ns_a, ip_a = net.add_pod("pod-a")
    ns_b, ip_b = net.add_pod("pod-b")
    ns_c, _ = net.add_pod("pod-c")
    _serve(net.command_prefix(ns_a), ip_a, 8080, "a", procs)
    _serve(net.command_prefix(ns_b), ip_b, 8080, "b", procs)
    services = [_service("web", "10.96.0.20", [{"name": "http", "port": 80, "targetPort": 8080}]),
                _service("idle", "10.96.0.21", [{"port": 80}])]
    net.sync_services(services, [_slice("web", [{"name": "http", "port": 8080}],
                                        [_endpoint(ip_a), _endpoint(ip_b)])])
    from_pod = _connect(net.command_prefix(ns_c), "10.96.0.20", 80, count=10)
    assert sorted(set(from_pod)) == ["a", "b"] and len(from_pod) == 10, from_pod
    from_host = _connect([], "10.96.0.20", 80, count=10)
    assert sorted(set(from_host)) == ["a", "b"], from_host
    # A backend reaching its own Service (masqueraded, so the answer comes back through the host).
    assert set(_connect(net.command_prefix(ns_a), "10.96.0.20", 80, count=4)) == {"a", "b"}
    # No endpoint: refused at once, not a timeout; nor an address of the range no Service holds.
    assert _connect(net.command_prefix(ns_c), "10.96.0.21", 80) == ["ConnectionRefusedError"]
    assert _connect(net.command_prefix(ns_c), "10.96.0.99", 80) == ["ConnectionRefusedError"]


def test_kubernetes_service_reaches_an_api_server_on_loopback(tmp_path: Path,
                                                             procs: list[subprocess.Popen[str]]) -> None:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _serve([], "127.0.0.1", port, "apiserver", procs)
    with PodNetwork(tmp_path / "net", bridge=_bridge_name(), api_server=("127.0.0.1", port)) as net:
        ns, _ = net.add_pod("pod-a")
        # As kube-apiserver makes it with --endpoint-reconciler-type=none: the Service, no EndpointSlice.
        net.sync_services([_service("kubernetes", "10.96.0.1", [{"name": "https", "port": 443}])], [])
        assert _connect(net.command_prefix(ns), "10.96.0.1", 443, count=3) == ["apiserver"] * 3
        assert _connect([], "10.96.0.1", 443) == ["apiserver"]


def test_removing_a_pod_removes_its_namespace_and_its_endpoint(net: PodNetwork,
                                                               procs: list[subprocess.Popen[str]]) -> None:
    ns_a, ip_a = net.add_pod("pod-a")
    ns_b, ip_b = net.add_pod("pod-b")
    _serve(net.command_prefix(ns_a), ip_a, 8080, "a", procs)
    left_running = _serve(net.command_prefix(ns_b), ip_b, 8080, "b", procs)
    net.sync_services([_service("web", "10.96.0.20", [{"port": 80}])],
                      [_slice("web", [{"port": 8080}], [_endpoint(ip_a), _endpoint(ip_b)])])
    net.remove_pod("pod-b")  # before the EndpointSlice changes
    assert left_running.wait(10) == -9  # what still ran in it was killed
    assert ns_b not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.pod_ip("pod-b") is None
    assert _connect([], "10.96.0.20", 80, count=6) == ["a"] * 6
    net.remove_pod("pod-b")  # idempotent
    _, ip_c = net.add_pod("pod-c")
    assert ip_c not in (ip_a, ip_b)  # a freed address is not given again at once


def test_stop_leaves_nothing_and_start_cleans_a_crashed_run(tmp_path: Path,
                                                            procs: list[subprocess.Popen[str]]) -> None:
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    bridge = _bridge_name()
    crashed = PodNetwork(tmp_path / "net", bridge=bridge).start()
    ns, ip = crashed.add_pod("pod-a")
    _serve(crashed.command_prefix(ns), ip, 8080, "a", procs)
    crashed.sync_services([_service("web", "10.96.0.20", [{"port": 80}])],
                          [_slice("web", [{"port": 8080}], [_endpoint(ip)])])
    with pytest.raises(PodNetworkError, match="in use by another PodNetwork"):
        PodNetwork(tmp_path / "other", bridge=bridge).start()  # while the first one holds the bridge
    lock = crashed._bridge_lock
    assert lock is not None
    lock.close()  # what the process's death would do
    before = _state()
    assert bridge in before and ns in before and crashed.table in before
    # A new run after a crash (the old object dropped without stop): start() removes the leftovers first.
    net = PodNetwork(tmp_path / "net", bridge=bridge).start()
    assert ns not in _state()
    ns2, _ = net.add_pod("pod-b")
    net.stop()
    net.stop()  # idempotent
    after = _state()
    for name in (bridge, ns, ns2, net.table, host_link_name(ns), host_link_name(ns2)):
        assert name not in after, (name, after)
    assert not (tmp_path / "net" / "network.json").exists()
