"""The operator's calls to a real bookie process over its admin API: observing it, forcing and releasing
read-only mode, opening and closing compaction windows; a bookie that does not answer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from octavo.cli.localcluster import free_port
from octavo.node.testing import BookieConnection, BookieProcess
from octavo.operator.bookies import apply, observe
from octavo.operator.policy import CLOSE_WINDOW, FORCE_READ_ONLY, OPEN_WINDOW, RELEASE_READ_ONLY, Action


async def test_observe_and_act_on_a_real_bookie(tmp_path: Path) -> None:
    bookie = BookieProcess(str(tmp_path / "b"), args=["--disk-capacity-bytes", str(1 << 30)])
    address = bookie.start()
    dead = f"127.0.0.1:{free_port()}"
    try:
        addresses = {"b-0": address, "b-1": dead, "b-2": ""}
        seen = {o.bookie_id: o for o in await observe(addresses, timeout_s=2)}
        assert seen["b-0"].reachable and seen["b-0"].writable and not seen["b-0"].forced_read_only
        assert 0 <= seen["b-0"].disk_usage_ratio < 0.01  # a fresh data directory against a 1 GiB capacity
        assert not seen["b-1"].reachable and not seen["b-2"].reachable

        now_ms = int(time.time() * 1000)
        force = Action(FORCE_READ_ONLY, "b-0", reason="disk usage 91.0% reached readOnlyRatio 90%", threshold_ratio=0.9)
        results = await apply([force, Action(OPEN_WINDOW, "b-0", now_ms + 3_600_000)], addresses)
        assert [e for _, e in results] == ["", ""]
        (b,) = await observe({"b-0": address})
        assert not b.writable and b.forced_read_only and b.window_until_unix_ms == now_ms + 3_600_000
        with BookieConnection(address) as conn:
            status = conn.status()
        # The bookie keeps who forced it and at what share: `octavo cluster status` shows the operator's threshold.
        assert status.forced_threshold_ratio == pytest.approx(0.9)
        assert status.forced_reason == "the operator: disk usage 91.0% reached readOnlyRatio 90%"
        assert status.mode_reason.startswith("read-only: forced by the operator: disk usage 91.0%")

        results = await apply([Action(RELEASE_READ_ONLY, "b-0"), Action(CLOSE_WINDOW, "b-0", now_ms)], addresses)
        assert [e for _, e in results] == ["", ""]
        (b,) = await observe({"b-0": address})
        assert b.writable and not b.forced_read_only and b.window_until_unix_ms == now_ms

        failed = await apply([Action(FORCE_READ_ONLY, "b-1"), Action(FORCE_READ_ONLY, "b-2")], addresses, 1.0)
        assert "ForceReadOnly on bookie b-1" in failed[0][1] and "UNAVAILABLE" in failed[0][1]
        assert "no address" in failed[1][1]
    finally:
        bookie.stop()


async def test_the_operator_reaches_tls_bookies_by_their_dns_names(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A bookie whose certificate names only its pod DNS name (as the chart's does), listening on 127.0.0.1: the
    operator dials the address and checks the certificate against the DNS name, with its own client certificate
    from $OCTAVO_TLS_*; the admin plane admits it by name. Without the name, or without a certificate, it is
    refused; without its files the cluster's status says what the operator lacks."""
    from octavo.cli.certs import CertificateAuthority
    from octavo.meta.tls import TlsFiles
    from octavo.operator.bookies import Reach
    from octavo.operator.handlers import cluster_reach
    from octavo.operator.resources import parse_cluster

    ca = CertificateAuthority("operator-test-ca")
    server = ca.write(tmp_path / "pki", "bookie", common_name="logs-0", sans=["logs-0.logs-bookies.prod.svc"])
    operator = ca.write(tmp_path / "pki", "operator", common_name="octavo-operator", sans=[])
    stranger = ca.write(tmp_path / "pki", "stranger", common_name="someone-else", sans=[])
    bookie = BookieProcess(str(tmp_path / "b"), args=[
        "--tls-cert-file", server.cert_file, "--tls-key-file", server.key_file, "--tls-ca-file", server.ca_file,
        "--admin-identities", "octavo-operator"])
    address = bookie.start()
    try:
        spec = parse_cluster("logs", {"image": "i", "storage": {"size": "1Gi"}, "etcd": {"endpoints": "e:2379"},
                                      "tls": {"secretName": "logs-tls", "adminIdentities": ["octavo-operator"]}})
        monkeypatch.delenv("OCTAVO_TLS_CA_FILE", raising=False)
        _, problem = cluster_reach("logs", "prod", spec, ["logs-0"])
        assert "operator has no certificate to reach TLS bookies" in problem and "OCTAVO_TLS_CERT_FILE" in problem
        monkeypatch.setenv("OCTAVO_TLS_CA_FILE", operator.ca_file)
        monkeypatch.setenv("OCTAVO_TLS_CERT_FILE", operator.cert_file)
        monkeypatch.setenv("OCTAVO_TLS_KEY_FILE", operator.key_file)
        reach, problem = cluster_reach("logs", "prod", spec, ["logs-0"])
        assert problem == "" and reach.server_names == {"logs-0": "logs-0.logs-bookies.prod.svc"}

        (b,) = await observe({"logs-0": address}, 5, reach)
        assert b.reachable and b.writable
        results = await apply([Action(FORCE_READ_ONLY, "logs-0")], {"logs-0": address}, 5, reach)
        assert results[0][1] == ""
        (b,) = await observe({"logs-0": address}, 5, reach)
        assert b.forced_read_only

        no_name = Reach(reach.tls)  # 127.0.0.1 is not in the certificate
        assert not (await observe({"logs-0": address}, 2, no_name))[0].reachable
        assert not (await observe({"logs-0": address}, 2))[0].reachable  # plaintext against TLS
        other = Reach(TlsFiles(stranger.cert_file, stranger.key_file, stranger.ca_file), reach.server_names)
        (failed,) = await apply([Action(RELEASE_READ_ONLY, "logs-0")], {"logs-0": address}, 5, other)
        assert "PERMISSION_DENIED" in failed[1] and "admin_identities" in failed[1]
    finally:
        bookie.stop()
