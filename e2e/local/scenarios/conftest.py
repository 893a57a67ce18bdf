"""The operator on a real Kubernetes control plane with real bookies: kube-apiserver, kube-controller-manager
and kube-scheduler built by `make kube` (octavo.cli.kubecontrolplane), the node agent running the bookie pods as
local processes in network namespaces of their own (octavo.cli.kubeagent), Octavo's metadata etcd on the pod
network's gateway address (pods cannot reach the host's 127.0.0.1), and the operator in kopf's KopfRunner with
the cluster admin's kubeconfig. One control plane and agent serve the whole session (localplane.py); each test
gets a fresh etcd, and the namespace `default` is emptied after it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kopf
import pytest
from kopf.testing import KopfRunner

from octavo.cli.localcluster import EtcdProcess, free_port
from octavo.operator import handlers
from octavo.operator.config import OperatorConfig, OperatorState
from octavo.operator.rolling import ROLL_READY_TIMEOUT_S

sys.path.insert(0, str(Path(__file__).resolve().parent))
import localplane
from localplane import HostsSync, K, PrivateHosts, reset_namespace

T = TypeVar("T")
POLL_INTERVAL_S = 0.5
NAMESPACE = "default"
ROOT = Path(__file__).resolve().parents[3]
CRDS = ROOT / "charts" / "octavo" / "crds"


def eventually(fn: Callable[[], T], timeout_s: float = 60.0, what: str = "the condition") -> T:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            result = fn()
            if result:
                return result
            last = result
        except (KeyError, IndexError, TypeError, AssertionError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout_s}s (last: {last!r})")
        time.sleep(0.1)


class Plane:
    """The session's control plane, node agent and hosts sync."""

    def __init__(self, plane: Any, agent: Any) -> None:
        self.plane = plane
        self.agent = agent
        self.k = K(plane)

    @property
    def gateway(self) -> str:
        """The pod network's gateway address: where host processes listen for pods to reach them."""
        return str(self.agent.network.node_ip(""))


def ensure_crds(plane: Any) -> None:
    """Our CRDs, from the chart (a chart test deletes them to see `helm install` create them)."""
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    if any(plane.get(f"{crds}/{name}.octavo.io") is None for name in ("bookieclusters", "compactionpolicies")):
        plane.kubectl("apply", "--server-side", "-f", str(CRDS))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/bookieclusters.octavo.io",
                  "crd/compactionpolicies.octavo.io")


@pytest.fixture(scope="session")
def kube_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    from octavo.cli.kubeagent import NodeAgent, agent_config
    from octavo.cli.kubecontrolplane import ControlPlaneError, KubeControlPlane, find_binaries

    try:
        find_binaries()
    except ControlPlaneError as e:  # under CI=true this skip fails the run: `make test` builds them (make kube)
        pytest.skip(str(e))
    hosts = localplane.HOSTS  # set up by the root conftest.py's pytest_configure (localplane.py says why)
    if not isinstance(hosts, PrivateHosts):
        pytest.skip(f"the node agent and the tests' private /etc/hosts need root: {hosts}")
    root = tmp_path_factory.mktemp("kube")
    plane = KubeControlPlane(root / "plane").start()
    try:
        ensure_crds(plane)
        # A bridge of its own: `octavo dev up --kubernetes` or another run may use the default one.
        agent = NodeAgent(agent_config(plane, root / "agent", bridge=f"okt-{os.getpid() % 100000}")).start()
        try:
            sync = HostsSync(hosts, agent).start()
            try:
                yield Plane(plane, agent)
            finally:
                sync.stop()
        finally:
            agent.stop()
    finally:
        plane.stop()


@pytest.fixture
def etcd(tmp_path: Path, kube_plane: Plane) -> Iterator[str]:
    """Octavo's metadata etcd, on the gateway address (the pods reach it there, the tests too)."""
    proc = EtcdProcess(str(tmp_path / "etcd"), host=kube_plane.gateway)
    endpoint = proc.start()
    try:
        yield endpoint
    finally:
        proc.stop(kill=True)


class LocalKube:
    def eventually(self, fn: Callable[[], T], timeout_s: float = 60.0, what: str = "the condition") -> T:
        """`eventually`, and on failure what the clusters' status said (the reason is usually there)."""
        try:
            return eventually(fn, timeout_s, what)
        except AssertionError as e:
            statuses = {c["metadata"]["name"]: {"conditions": (c.get("status") or {}).get("conditions"),
                                                "bookies": (c.get("status") or {}).get("bookies"),
                                                "memory": (c.get("status") or {}).get("memory"),
                                                "specError": (c.get("status") or {}).get("specError")}
                        for c in self.k.list("octavo.io/v1alpha1", "bookieclusters")}
            raise AssertionError(f"{e}; clusters: {json.dumps(statuses)[:6000]}; pods (phase, [(ready, restarts, "
                                 f"state)]): {self.k.pod_status()}, agent errors {self.agent.errors[-5:]}") from None

    def __init__(self, plane: Plane, etcd: str) -> None:
        self.plane = plane.plane
        self.agent = plane.agent
        self.gateway = plane.gateway
        self.kubeconfig = plane.plane.kubeconfig
        self.etcd = etcd
        self.k = plane.k

    # -- pods, through the API's pod status and the agent ----------------------------------------------------
    def pod(self, namespace: str, pod: str) -> dict[str, Any]:
        found = self.k._call("GET", self.k.path("v1", "pods", pod, namespace=namespace))
        assert found is not None, f"no pod {namespace}/{pod}"
        return dict(found)

    def kill(self, namespace: str, pod: str) -> None:
        """SIGKILL the pod's (first) container process, as a crash: the agent restarts it (restartPolicy)."""
        status = self.pod(namespace, pod)["status"]["containerStatuses"][0]
        pid = int(status["containerID"].removeprefix("octavo://"))
        os.kill(pid, signal.SIGKILL)

    def address(self, namespace: str, pod: str, port: int = 3181) -> str:
        """The pod's stable name as its StatefulSet gives it (`<pod>.<service>.<ns>.svc`, what a bookie
        advertises and its certificate names; the tests resolve it through their private /etc/hosts)."""
        spec = self.pod(namespace, pod)["spec"]
        return f"{spec.get('hostname') or pod}.{spec['subdomain']}.{namespace}.svc:{port}"

    def restarts(self, namespace: str, pod: str) -> int:
        return int(self.pod(namespace, pod)["status"]["containerStatuses"][0]["restartCount"])

    def story(self, namespace: str, pod: str) -> str:
        """For a failure message: the pod's container statuses, its events and its container's last two runs'
        log tails (from the agent's files)."""
        found = self.pod(namespace, pod)
        events = [f"{e.get('reason')}: {e.get('message')}" for e in self.k.events()
                  if (e.get("involvedObject") or {}).get("name") == pod]
        worker = self.agent.worker(namespace, pod)
        logs = []
        for container in (worker.containers if worker is not None else []):
            for path in (container.previous_log_path, container.log_path):
                with contextlib.suppress(OSError):
                    logs.append(f"{path.name}: ...{path.read_text(errors='replace')[-1500:]}")
        return f"{pod}: {found['status'].get('containerStatuses')}; events {events}; logs {logs}"

    @contextlib.contextmanager
    def operator(self, metrics_tls: bool = False, clock_offset_s: float = 0.0,
                 roll_ready_timeout_s: float = ROLL_READY_TIMEOUT_S) -> Iterator[KopfRunner]:
        """The operator, as `octavo operator run` runs it (its handlers in a registry of their own, with settings
        and state of their own: `self.state` while it runs, whose clock a test may move)."""
        # Metrics served on a free port (operator_metrics() scrapes it).
        config = OperatorConfig(poll_interval_s=POLL_INTERVAL_S, roll_ready_timeout_s=roll_ready_timeout_s,
                                kubeconfig=self.kubeconfig, metrics_port=0, metrics_host="127.0.0.1",
                                metrics_tls=metrics_tls).validate()
        self.state = OperatorState.start(config, clock_offset_s=clock_offset_s)
        registry = kopf.OperatorRegistry()
        handlers.register(registry, config, self.state)
        with KopfRunner(["run", "--standalone", "-A", f"--liveness=http://127.0.0.1:{free_port()}/healthz"],
                        registry=registry, timeout=120) as runner:
            yield runner
        assert runner.exception is None, runner.output[-3000:]
        self.output = runner.output

    def operator_metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """(sample name, sorted labels) -> value, scraped from the running operator's /metrics."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        telemetry = self.state.telemetry
        assert telemetry.endpoint is not None, "the operator serves no metrics"
        with urllib.request.urlopen(f"http://127.0.0.1:{telemetry.endpoint.port}/metrics", timeout=10) as r:
            assert r.status == 200, r.status
            text = r.read().decode()
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    def bookie_cluster(self, name: str, replicas: int, policy: str = "", min_writable: int = 3,
                       bookie: dict[str, Any] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"replicas": replicas, "minWritableBookies": min_writable, "image": "octavo:dev",
                                "storage": {"size": "1Gi"}, "etcd": {"endpoints": self.etcd},
                                "bookie": {"disk_check_interval_ms": 200, "gc_interval_ms": 500, **(bookie or {})}}
        if policy:
            spec["compactionPolicyRef"] = {"name": policy}
        body = {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
                "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}
        self.k.create("octavo.io/v1alpha1", "bookieclusters", body)
        return body

    def policy(self, name: str, spec: dict[str, Any]) -> None:
        self.k.create("octavo.io/v1alpha1", "compactionpolicies", {
            "apiVersion": "octavo.io/v1alpha1", "kind": "CompactionPolicy",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec})

    def registered(self, cluster: str) -> dict[str, Any]:
        from octavo.client import Client

        async def read() -> dict[str, Any]:
            async with Client(self.etcd, cluster) as client:
                return dict(await client.bookies(refresh=True))
        return asyncio.run(read())


@contextlib.contextmanager
def _local(plane: Plane, etcd: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalKube]:
    monkeypatch.setenv("KUBECONFIG", plane.plane.kubeconfig)
    try:
        yield LocalKube(plane, etcd)
    finally:
        reset_namespace(plane.k, plane.agent)
        ensure_crds(plane.plane)


@pytest.fixture
def local_kube(kube_plane: Plane, etcd: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalKube]:
    with _local(kube_plane, etcd, monkeypatch) as kube:
        yield kube


@pytest.fixture
def tls_kube(kube_plane: Plane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalKube, Any]]:
    """The same with an etcd that requires client certificates, and the CA that issued its certificate (for the
    Secrets and clients a test makes)."""
    from octavo.cli.certs import CertificateAuthority
    from octavo.meta.tls import TlsFiles

    ca = CertificateAuthority("octavo-e2e-ca")
    server = ca.write(tmp_path / "pki", "etcd", common_name="etcd",
                      sans=["127.0.0.1", "localhost", kube_plane.gateway])
    etcd = EtcdProcess(str(tmp_path / "etcd"), tls=TlsFiles(server.cert_file, server.key_file, server.ca_file),
                       host=kube_plane.gateway)
    endpoint = etcd.start()
    try:
        with _local(kube_plane, endpoint, monkeypatch) as kube:
            yield kube, ca
    finally:
        etcd.stop(kill=True)
