"""TLS on a real bookie process, with real certificates (a throwaway CA from octavo.cli.certs): a client with a
certificate of the CA adds and reads; one without a certificate, with one from another CA, with an expired
one, in plaintext, or not trusting the bookie's CA is refused; renewed certificate files are served to new
connections without a restart while an open stream goes on; server-only TLS (tls_client_auth none); bad
settings refused with a message."""

from __future__ import annotations

import datetime
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from octavo.cli.certs import CertificateAuthority, Issued
from octavo.meta.tls import TlsFiles
from octavo.node.testing import BookieConnection, BookieProcess
from octavo.v1 import bookie_pb2 as pb

KEY = b"tls-key"


class Pki:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = CertificateAuthority("octavo-test-ca")
        self.server = self.ca.write(root, "bookie")
        self.client = self.ca.write(root / "client", "client", server=False)
        past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
        self.expired = self.ca.write(root / "expired", "expired", server=False, not_before=past,
                                     not_after=past + datetime.timedelta(days=1))
        other = CertificateAuthority("another-ca")
        self.stranger = other.write(root / "stranger", "stranger", server=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def tls_args(issued: Issued, client_auth: str = "require") -> list[str]:
    return ["--tls-cert-file", issued.cert_file, "--tls-key-file", issued.key_file, "--tls-ca-file",
            issued.ca_file, "--tls-client-auth", client_auth]


@pytest.fixture(scope="module")
def bookie(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieProcess]:
    proc = BookieProcess(str(tmp_path_factory.mktemp("tls") / "bookie"), args=tls_args(pki.server))
    proc.start()
    yield proc
    proc.stop()


def files(issued: Issued, ca_file: str = "") -> TlsFiles:
    return TlsFiles(issued.cert_file, issued.key_file, ca_file or issued.ca_file)


def refused(address: str, tls: TlsFiles | None) -> grpc.RpcError:
    with BookieConnection(address, tls=tls) as conn, pytest.raises(grpc.RpcError) as e:
        conn.bookie.ReadLastAddConfirmed(pb.ReadLacRequest(ledger_id=1), timeout=5)
    return e.value


def test_a_client_with_a_certificate_of_the_ca_adds_and_reads(bookie: BookieProcess, pki: Pki) -> None:
    with BookieConnection(bookie.address, tls=files(pki.client)) as conn:
        assert not conn.add(1, KEY, [0, 1], [b"a", b"b"]).results[0].message
        read = conn.read(1, 0, 1)
        assert [e.payload for e in read.entries] == [b"a", b"b"]
        assert conn.status().bookie_id  # the admin plane too


@pytest.mark.parametrize("who", ["no certificate", "another CA", "expired", "plaintext", "distrusts the bookie"])
def test_clients_the_bookie_must_not_serve_are_refused(bookie: BookieProcess, pki: Pki, who: str) -> None:
    tls = {"no certificate": TlsFiles(ca_file=pki.server.ca_file),
           "another CA": files(pki.stranger, pki.server.ca_file),
           "expired": files(pki.expired),
           "plaintext": None,
           "distrusts the bookie": TlsFiles(pki.client.cert_file, pki.client.key_file, pki.stranger.ca_file)}[who]
    error = refused(bookie.address, tls)
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error  # gRPC reports a refused handshake so


def peer_common_name(address: str, pki: Pki) -> str:
    """The CN of the certificate the bookie presents to a new connection (a TLS handshake with ALPN h2)."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=pki.server.ca_file)
    context.load_cert_chain(pki.client.cert_file, pki.client.key_file)
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        subject = dict(part[0] for part in tls.getpeercert()["subject"])  # type: ignore[index]
    return str(subject["commonName"])


def test_renewed_certificate_files_are_served_without_a_restart(pki: Pki, tmp_path: Path) -> None:
    issued = pki.ca.write(tmp_path / "renewing", "bookie", common_name="bookie-first")
    proc = BookieProcess(str(tmp_path / "bookie"), args=tls_args(issued))
    proc.start()
    try:
        assert peer_common_name(proc.address, pki) == "bookie-first"
        with BookieConnection(proc.address, tls=files(pki.client)) as conn:
            assert not conn.add(9, KEY, [0], [b"before"]).results[0].message
            # cert-manager replaces the files in place (atomically); the bookie keeps running.
            pki.ca.write(tmp_path / "renewing", "bookie", common_name="bookie-renewed")
            assert peer_common_name(proc.address, pki) == "bookie-renewed"
            # The connection opened before the renewal goes on.
            assert not conn.add(9, KEY, [1], [b"after"]).results[0].message
            assert [e.payload for e in conn.read(9, 0, 1).entries] == [b"before", b"after"]
        assert proc.alive()
    finally:
        proc.stop()


def test_server_only_tls_serves_clients_without_a_certificate(pki: Pki, tmp_path: Path) -> None:
    proc = BookieProcess(str(tmp_path / "bookie"), args=[
        "--tls-cert-file", pki.server.cert_file, "--tls-key-file", pki.server.key_file, "--tls-client-auth", "none"])
    proc.start()
    try:
        with BookieConnection(proc.address, tls=TlsFiles(ca_file=pki.server.ca_file)) as conn:
            assert not conn.add(3, KEY, [0], [b"x"]).results[0].message
        assert refused(proc.address, None).code() == grpc.StatusCode.UNAVAILABLE  # still no plaintext
    finally:
        proc.stop()


def test_bad_tls_settings_are_refused_with_a_message(pki: Pki, tmp_path: Path) -> None:
    def node(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", str(tmp_path / "d"),
                               "--port", "0", *args], capture_output=True, text=True, timeout=60)

    alone = node("--tls-cert-file", pki.server.cert_file)
    assert alone.returncode == 2 and "tls_cert_file and tls_key_file go together" in alone.stderr
    no_ca = node("--tls-cert-file", pki.server.cert_file, "--tls-key-file", pki.server.key_file)
    assert no_ca.returncode == 2 and "tls_client_auth=require needs tls_ca_file" in no_ca.stderr
    missing = node(*tls_args(Issued(str(tmp_path / "nope.crt"), pki.server.key_file, pki.server.ca_file)))
    assert missing.returncode == 1 and "tls_cert_file: cannot read" in missing.stderr, missing.stderr
    garbage = tmp_path / "garbage.crt"
    garbage.write_bytes(b"not a certificate\n")
    bad = node(*tls_args(Issued(str(garbage), pki.server.key_file, pki.server.ca_file)))
    assert bad.returncode == 1 and "holds no PEM block" in bad.stderr, bad.stderr
    metrics = node("--metrics-port", "0", "--metrics-tls", "true")
    assert metrics.returncode == 2 and "metrics_tls needs tls_cert_file" in metrics.stderr
    mode = node(*tls_args(pki.server, client_auth="sometimes"))
    assert mode.returncode == 2 and "tls_client_auth must be require or none" in mode.stderr
    assert not os.path.exists(tmp_path / "d" / "logs"), "nothing is created before the settings are checked"


def test_the_admin_plane_serves_only_admin_identities_and_the_admin_token(pki: Pki, tmp_path: Path) -> None:
    admin = pki.ca.write(tmp_path / "admin", "admin", common_name="ops-admin", server=False)
    token_file = tmp_path / "admin-token"
    token_file.write_text("s3cret-admin-token\n")
    proc = BookieProcess(str(tmp_path / "bookie"), args=[
        *tls_args(pki.server), "--admin-identities", "ops-admin,other-admin", "--admin-token-file", str(token_file)])
    proc.start()
    try:
        # A client certificate that is not an admin: the data plane serves it, the admin plane refuses it.
        with BookieConnection(proc.address, tls=files(pki.client)) as conn:
            assert not conn.add(5, KEY, [0], [b"x"]).results[0].message
            with pytest.raises(grpc.RpcError) as e:
                conn.status()
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "(CN client;" in (e.value.details() or "") and "admin_identities" in (e.value.details() or "")
            with pytest.raises(grpc.RpcError) as e:
                conn.admin.SetReadOnly(pb.SetReadOnlyRequest(read_only=True), timeout=10)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # An admin certificate: served.
        with BookieConnection(proc.address, tls=files(admin)) as conn:
            assert conn.status().mode == pb.MODE_WRITABLE
            assert conn.admin.SetReadOnly(pb.SetReadOnlyRequest(read_only=False), timeout=10).mode == pb.MODE_WRITABLE
        # The CLI with the admin token (and a non-admin certificate); a wrong token is refused and not echoed.
        env = {**os.environ, "OCTAVO_TLS_CA_FILE": pki.server.ca_file, "OCTAVO_TLS_CERT_FILE": pki.client.cert_file,
               "OCTAVO_TLS_KEY_FILE": pki.client.key_file}
        octavo = [sys.executable, "-m", "octavo.cli.main", "bookie", "status", "--bookie", proc.address]
        ok = subprocess.run(octavo, capture_output=True, text=True, timeout=60,
                            env={**env, "OCTAVO_ADMIN_TOKEN_FILE": str(token_file)})
        assert ok.returncode == 0 and "mode        writable" in ok.stdout, ok.stderr
        wrong_file = tmp_path / "wrong-token"
        wrong_file.write_text("guess\n")
        wrong = subprocess.run(octavo, capture_output=True, text=True, timeout=60,
                               env={**env, "OCTAVO_ADMIN_TOKEN_FILE": str(wrong_file)})
        assert wrong.returncode == 1 and "PERMISSION_DENIED" in wrong.stderr and "guess" not in wrong.stderr
        assert "s3cret" not in proc.log_tail(200)
    finally:
        proc.stop()


def test_without_tls_the_admin_token_alone_guards_the_admin_plane(tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text("plain-admin-token\n")
    proc = BookieProcess(str(tmp_path / "bookie"), args=["--admin-token-file", str(token_file)])
    proc.start()
    try:
        with BookieConnection(proc.address) as conn:
            with pytest.raises(grpc.RpcError) as e:
                conn.status()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "needs a client certificate named in admin_identities or an admin token" in (e.value.details() or "")
            assert not conn.add(1, KEY, [0], [b"x"]).results[0].message  # the data plane is not the admin plane
        from octavo.meta.tls import sync_channel
        from octavo.v1 import bookie_pb2_grpc as pb_grpc

        with sync_channel(proc.address, None, metadata=[("authorization", "Bearer plain-admin-token")]) as channel:
            assert pb_grpc.BookieAdminStub(channel).GetStatus(pb.GetStatusRequest(), timeout=10).bookie_id
    finally:
        proc.stop()


def https_get(address: str, path: str, ca_file: str) -> tuple[int, str, str]:
    """(status, body, the server certificate's CN) of one HTTPS GET, checking the certificate."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=ca_file)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        cert = tls.getpeercert()
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    subject = dict(item[0] for item in cert["subject"])  # type: ignore[index, misc]
    return int(head.split()[1]), body.decode(), str(subject.get("commonName", ""))


def test_metrics_and_healthz_over_tls_pick_up_a_renewed_certificate(pki: Pki, tmp_path: Path) -> None:
    """metrics_tls: /metrics and /healthz (what Kubernetes probes when the gRPC port needs TLS) served over TLS
    with the bookie's certificate, nothing in plaintext; renewed files are served from the next connection."""
    issued = pki.ca.write(tmp_path / "renewing", "bookie", common_name="metrics-first")
    proc = BookieProcess(str(tmp_path / "bookie"), args=[*tls_args(issued), "--metrics-port", "0",
                                                          "--metrics-tls", "true"])
    proc.start()
    try:
        status, body, cn = https_get(proc.metrics_address, "/healthz", issued.ca_file)
        assert (status, body, cn) == (200, "serving\n", "metrics-first")
        status, body, _ = https_get(proc.metrics_address, "/metrics", issued.ca_file)
        assert status == 200 and "octavo_bookie_mode" in body
        host, port = proc.metrics_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as plain:
            plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                answer = plain.recv(65536)
            except ConnectionError:
                answer = b""
            assert b"octavo_bookie" not in answer  # a TLS server answers no plaintext
        pki.ca.write(tmp_path / "renewing", "bookie", common_name="metrics-renewed")
        https_get(proc.metrics_address, "/healthz", issued.ca_file)  # the connection after which it reloads
        assert https_get(proc.metrics_address, "/healthz", issued.ca_file)[2] == "metrics-renewed"
    finally:
        proc.stop()
