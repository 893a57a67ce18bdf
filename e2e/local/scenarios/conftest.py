"""The operator on an emulated Kubernetes API with real bookies: a real etcd, kmock's API emulator with our
bookkeeping (octavo.localk8s.apiserver), the pod runner starting real `octavo node` processes on loopback
addresses (octavo.localk8s.podrunner), and the operator in kopf's KopfRunner."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kopf
import pytest
import urllib3
from kopf.testing import KopfRunner

from octavo.cli.localcluster import EtcdProcess, free_port
from octavo.localk8s.apiserver import ApiServer
from octavo.localk8s.podrunner import PodRunner
from octavo.operator import handlers

T = TypeVar("T")
POLL_INTERVAL_S = 0.5
NAMESPACE = "default"


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


class K:
    """A small synchronous client of the emulated API for the tests' own reads and writes."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = urllib3.PoolManager()

    @staticmethod
    def path(api_version: str, plural: str, name: str = "", sub: str = "", namespace: str | None = NAMESPACE) -> str:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        return f"{base}{f'/namespaces/{namespace}' if namespace else ''}/{plural}" + (f"/{name}" if name else "") + (
            f"/{sub}" if sub else "")

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        r = self.http.request(method, self.url + path, body=json.dumps(body) if body is not None else None,
                              headers={"Content-Type": content_type})
        if r.status == 404:
            return None
        if r.status >= 300:
            raise AssertionError(f"{method} {path}: {r.status} {r.data[:300]!r}")
        return json.loads(r.data) if r.data else None

    def get(self, api_version: str, plural: str, name: str) -> Any:
        return self._call("GET", self.path(api_version, plural, name))

    def list(self, api_version: str, plural: str) -> list[Any]:
        return list((self._call("GET", self.path(api_version, plural)) or {}).get("items") or [])

    def create(self, api_version: str, plural: str, obj: dict[str, Any]) -> None:
        self._call("POST", self.path(api_version, plural), obj)

    def patch(self, api_version: str, plural: str, name: str, patch: dict[str, Any], sub: str = "") -> None:
        self._call("PATCH", self.path(api_version, plural, name, sub), patch, "application/merge-patch+json")

    def delete(self, api_version: str, plural: str, name: str) -> None:
        self._call("DELETE", self.path(api_version, plural, name))

    def cluster(self, name: str) -> Any:
        return self.get("octavo.io/v1alpha1", "bookieclusters", name)

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        status = (self.cluster(name) or {}).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})

    def events(self, reason: str = "") -> list[dict[str, Any]]:
        return [e for e in self.list("v1", "events") if not reason or e.get("reason") == reason]


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[str]:
    proc = EtcdProcess(str(tmp_path / "etcd"))
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
            pods = {name: (c.running(), c.ready, c.restarts) for (_, name), c in self.runner.containers.items()}
            raise AssertionError(f"{e}; clusters: {json.dumps(statuses)[:6000]}; pod runner: containers "
                                 f"(running, ready, restarts) {pods}, errors {self.runner.errors[-5:]}") from None

    def __init__(self, api: ApiServer, runner: PodRunner, etcd: str) -> None:
        self.api = api
        self.runner = runner
        self.etcd = etcd
        self.k = K(api.url)

    @contextlib.contextmanager
    def operator(self, metrics_tls: bool = False) -> Iterator[KopfRunner]:
        """The operator, as `octavo operator run` runs it (its handlers in a registry of their own)."""
        handlers.CONFIG.kubeconfig = self.api.kubeconfig
        handlers.CONFIG.kube = None
        handlers.CONFIG.locks.clear()
        handlers.CONFIG.scale_downs.clear()
        # Fresh metrics per operator run, served on a free port (operator_metrics() scrapes it).
        handlers.CONFIG.telemetry = None
        handlers.CONFIG._metrics = None
        handlers.CONFIG.metrics_port = 0
        handlers.CONFIG.metrics_host = "127.0.0.1"
        handlers.CONFIG.metrics_tls = metrics_tls
        registry = kopf.OperatorRegistry()
        handlers.register(registry, POLL_INTERVAL_S)
        with KopfRunner(["run", "--standalone", "-A", f"--liveness=http://127.0.0.1:{free_port()}/healthz"],
                        registry=registry, timeout=120) as runner:
            yield runner
        assert runner.exception is None, runner.output[-3000:]
        self.output = runner.output

    def operator_metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """(sample name, sorted labels) -> value, scraped from the running operator's /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        telemetry = handlers.CONFIG.telemetry
        assert telemetry is not None and telemetry.endpoint is not None, "the operator serves no metrics"
        r = self.k.http.request("GET", f"http://127.0.0.1:{telemetry.endpoint.port}/metrics")
        assert r.status == 200, r.status
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(r.data.decode()) for sample in family.samples}

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


@pytest.fixture
def local_kube(tmp_path: Path, etcd: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalKube]:
    with ApiServer() as api:
        monkeypatch.setenv("KUBECONFIG", api.kubeconfig)
        runner = PodRunner(api.url, str(tmp_path / "kube")).start()
        try:
            yield LocalKube(api, runner, etcd)
        finally:
            runner.stop()
            runner.check()
            handlers.CONFIG.clock_offset_s = 0.0


@pytest.fixture
def tls_kube(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LocalKube, Any]]:
    """The same with an etcd that requires client certificates, and the CA that issued its certificate (for the
    Secrets and clients a test makes)."""
    from octavo.cli.certs import CertificateAuthority
    from octavo.meta.tls import TlsFiles

    ca = CertificateAuthority("octavo-e2e-ca")
    server = ca.write(tmp_path / "pki", "etcd", common_name="etcd", sans=["127.0.0.1", "localhost"])
    etcd = EtcdProcess(str(tmp_path / "etcd"), tls=TlsFiles(server.cert_file, server.key_file, server.ca_file))
    endpoint = etcd.start()
    try:
        with ApiServer() as api:
            monkeypatch.setenv("KUBECONFIG", api.kubeconfig)
            runner = PodRunner(api.url, str(tmp_path / "kube")).start()
            try:
                yield LocalKube(api, runner, endpoint), ca
            finally:
                runner.stop()
                runner.check()
    finally:
        etcd.stop(kill=True)
