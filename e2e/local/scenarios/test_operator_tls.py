"""A BookieCluster with spec.tls and spec.etcd.tls on the local control plane with real bookies: the Secrets (as
cert-manager writes them) are mounted into the pods, the bookies serve mutual TLS and reach an etcd that
requires client certificates, the operator reaches them with its own certificate (or says what it lacks), and a
client with a certificate of the CA writes and reads."""

from __future__ import annotations

import base64
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest

from octavo.cli.certs import CertificateAuthority
from octavo.meta.tls import TlsFiles

LocalKube = Any  # the tls_kube fixture (conftest.py)
NAMESPACE = "default"


PAYLOAD = [b"tls-%d-" % i + bytes(range(256)) * 4 for i in range(50)]


def tls_secret(name: str, ca: CertificateAuthority, common_name: str, sans: list[str]) -> dict[str, Any]:
    """A kubernetes.io/tls Secret with ca.crt, the layout cert-manager writes."""
    cert, key = ca.issue(common_name, sans=sans)
    data = {"tls.crt": cert, "tls.key": key, "ca.crt": ca.pem}
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def test_a_tls_cluster_serves_mutual_tls_and_reaches_etcd_over_tls(tls_kube: tuple[LocalKube, CertificateAuthority],
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from octavo.client import ClientOptions, SyncClient

    kube, ca = tls_kube
    k = kube.k
    k.create("v1", "secrets", tls_secret("logs-tls", ca, "logs", ["*.logs-bookies.default.svc", "logs.default.svc"]))
    k.create("v1", "secrets", tls_secret("etcd-client", ca, "bookies", []))
    operator = ca.write(tmp_path / "operator", "operator", common_name="octavo-operator", sans=[])
    client = ca.write(tmp_path / "client", "client", common_name="spark-writer", sans=[])
    for var in ("OCTAVO_TLS_CA_FILE", "OCTAVO_TLS_CERT_FILE", "OCTAVO_TLS_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)

    body = {"apiVersion": "octavo.io/v1alpha1", "kind": "BookieCluster",
            "metadata": {"name": "logs", "namespace": NAMESPACE},
            "spec": {"replicas": 3, "image": "octavo:dev", "storage": {"size": "1Gi"},
                     "etcd": {"endpoints": kube.etcd, "tls": {"secretName": "etcd-client"}},
                     "tls": {"secretName": "logs-tls", "adminIdentities": ["octavo-operator"], "metrics": True},
                     "bookie": {"disk_check_interval_ms": 200}}}
    k.create("octavo.io/v1alpha1", "bookieclusters", body)
    options = ClientOptions(tls_ca_file=client.ca_file, tls_cert_file=client.cert_file, tls_key_file=client.key_file,
                            etcd_tls_ca_file=client.ca_file, etcd_tls_cert_file=client.cert_file,
                            etcd_tls_key_file=client.key_file)

    def registered() -> list[str]:
        with SyncClient(kube.etcd, cluster="logs", options=options) as c:
            return sorted(c.bookies())

    # The operator without a certificate of its own: the bookies run, the status says what it lacks.
    with kube.operator():
        kube.eventually(lambda: registered() == ["logs-0", "logs-1", "logs-2"], 90,
                        "three TLS bookies registered through etcd over TLS")
        degraded = kube.eventually(lambda: k.condition("logs", "Degraded").get("reason") ==
                                   "OperatorCannotReachBookies" and k.condition("logs", "Degraded"), 30, "Degraded")
        assert "OCTAVO_TLS_CERT_FILE" in degraded["message"]
        assert k.condition("logs", "Ready")["status"] == "False"

    monkeypatch.setenv("OCTAVO_TLS_CA_FILE", operator.ca_file)
    monkeypatch.setenv("OCTAVO_TLS_CERT_FILE", operator.cert_file)
    monkeypatch.setenv("OCTAVO_TLS_KEY_FILE", operator.key_file)
    with kube.operator(metrics_tls=True):
        ready = kube.eventually(lambda: k.condition("logs", "Ready").get("status") == "True" and k.cluster("logs"),
                                60, "Ready with the operator's certificate")
        assert all(b["reachable"] and b["mode"] == "writable" for b in ready["status"]["bookies"])
        # --metrics-tls: the operator's /metrics over TLS with its own certificate.
        telemetry = kube.state.telemetry
        assert telemetry.endpoint is not None
        context = ssl.create_default_context(cafile=operator.ca_file)
        context.check_hostname = False  # the operator's test certificate names no host
        with urllib.request.urlopen(f"https://127.0.0.1:{telemetry.endpoint.port}/metrics", context=context,
                                    timeout=10) as r:
            assert "octavo_operator" in r.read().decode()

        with SyncClient(kube.etcd, cluster="logs", options=options) as c:
            handle = c.create_ledger(3, 3, 2, password=b"pw")
            handle.append_many(PAYLOAD)
            handle.close()
            got = [e.data for e in c.open_ledger(handle.ledger_id, password=b"pw").read(0, len(PAYLOAD) - 1)]
        assert got == PAYLOAD

        # Without a client certificate, or in plaintext, a bookie serves nothing.
        address = kube.address(NAMESPACE, "logs-0")
        from octavo.node.testing import BookieConnection

        for tls in (TlsFiles(ca_file=client.ca_file), None):
            with BookieConnection(address, tls=tls) as conn, pytest.raises(grpc.RpcError) as refused:
                conn.status()
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        # The client's certificate is not an admin: the admin plane refuses it by name.
        with BookieConnection(address, tls=TlsFiles(client.cert_file, client.key_file, client.ca_file)) as conn, \
                pytest.raises(grpc.RpcError) as denied:
            conn.status()
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED and "spark-writer" in denied.value.details()
