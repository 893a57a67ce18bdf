"""Tenants on real bookies with mutual TLS (tenant_prefixes): a client certificate limited to datasets by prefix
writes and reads its own datasets' ledgers, and is refused with PERMISSION_DENIED on every data-plane call for
a ledger of another dataset (adds, reads, a recovery open's fence), a ledger without a dataset, or one that
does not exist; unlisted identities are not limited; bad settings are refused with a message."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.certs import CertificateAuthority
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions, PermissionDeniedError, ReadError
from octavo.meta.ledger_metadata import META_DATASET
from octavo.node.tenants import TenantSettingError, parse_tenants

PW = b"pw"
TENANTS = "tenant-sales=sales.,eu-sales.;tenant-ads=ads."


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ClientOptions]:
    root = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority()
    issued = {name: ca.write(root, name, server=name == "bookie") for name in
              ("bookie", "tenant-sales", "tenant-ads", "pipeline-admin")}
    out = {name: ClientOptions(tls_ca_file=i.ca_file, tls_cert_file=i.cert_file, tls_key_file=i.key_file,
                               add_timeout_s=3.0, read_timeout_s=3.0) for name, i in issued.items()}
    out["_bookie_args"] = ["--tls-cert-file", issued["bookie"].cert_file, "--tls-key-file",  # type: ignore[assignment]
                           issued["bookie"].key_file, "--tls-ca-file", issued["bookie"].ca_file,
                           "--tenant-prefixes", TENANTS]
    return out


@pytest.fixture(scope="module")
def cluster(pki: dict[str, object], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("tenants")), bookies=3,
                      bookie_args=list(pki["_bookie_args"])) as c:  # type: ignore[call-overload]
        yield c


async def write(cluster: LocalCluster, options: ClientOptions, dataset: str | None, n: int = 20,
                close: bool = True) -> int:
    async with Client(cluster.etcd_endpoint, options=options) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW,
                                            metadata={META_DATASET: dataset} if dataset is not None else None)
        await writer.append_many([b"%d" % i for i in range(n)])
        if close:
            await writer.close()
        return writer.ledger_id


async def test_a_tenant_uses_its_datasets_and_nothing_else(cluster: LocalCluster,
                                                           pki: dict[str, ClientOptions]) -> None:
    sales, ads, admin = pki["tenant-sales"], pki["tenant-ads"], pki["pipeline-admin"]
    own = await write(cluster, sales, "sales.orders")
    also_own = await write(cluster, sales, "eu-sales.orders")
    theirs = await write(cluster, ads, "ads.clicks")
    theirs_open = await write(cluster, ads, "ads.views", close=False)  # its writer is gone: left open
    untagged = await write(cluster, admin, None)  # an unlisted identity is not limited
    untagged_open = await write(cluster, admin, None, close=False)

    async with Client(cluster.etcd_endpoint, options=sales) as client:
        for ledger in (own, also_own):
            reader = await client.open_ledger(ledger, password=PW)
            assert [e.data async for e in reader.read(0, 19)] == [b"%d" % i for i in range(20)]
        # Reads of another tenant's ledger, or of one without a dataset: refused by every bookie, by name.
        for ledger, what in ((theirs, "dataset 'ads.clicks'"), (untagged, "no dataset")):
            reader = await client.open_ledger(ledger, password=PW, recovery=False)
            with pytest.raises(ReadError) as refused:
                [e async for e in reader.read(0, 0)]
            assert "tenant-sales may only use ledgers of datasets under sales., eu-sales." in str(refused.value)
            assert what in str(refused.value)
        # A recovery open of an open ledger fences: every fence is refused, nothing is fenced.
        with pytest.raises(PermissionDeniedError, match=f"ledger {theirs_open} has dataset 'ads.views'"):
            await client.open_ledger(theirs_open, password=PW)
        # Its own writer cannot tag a ledger for another tenant's datasets and write to it.
        writer = await client.create_ledger(3, 3, 2, password=PW, metadata={META_DATASET: "ads.spoofed"})
        with pytest.raises(PermissionDeniedError, match="tenant-sales may only use"):
            await writer.append_many([b"x"])

    # The other tenant's ledgers' entries were not fenced or changed by any of it; the admin reads everything.
    async with Client(cluster.etcd_endpoint, options=admin) as client:
        for ledger in (own, theirs, untagged):
            reader = await client.open_ledger(ledger, password=PW)
            assert reader.last_entry_id == 19
        # (The refused recovery open did mark the ledger IN_RECOVERY in etcd, which the client reaches directly:
        # etcd's own roles guard metadata, docs/security.md. Its entries and fencing on the bookies are intact.)
    async with Client(cluster.etcd_endpoint, options=ads) as client:
        reader = await client.open_ledger(theirs, password=PW)
        assert [e.data async for e in reader.read(0, 19)] == [b"%d" % i for i in range(20)]
        recovered = await client.open_ledger(theirs_open, password=PW)  # its own tenant recovers it
        assert [e.data async for e in recovered.read(0, 19)] == [b"%d" % i for i in range(20)]
    async with Client(cluster.etcd_endpoint, options=sales) as client:
        open_own = await write(cluster, sales, "sales.returns", close=False)
        with pytest.raises(PermissionDeniedError, match="tenant-sales may only use"):
            await client.open_ledger(untagged_open, password=PW)
        assert (await client.open_ledger(open_own, password=PW)).last_entry_id == 19


@pytest.mark.parametrize(("setting", "message"), [
    ("tenant-a", "is not IDENTITY=PREFIX"),
    ("a b=sales.", "is not IDENTITY=PREFIX"),
    ("a=", "a has no dataset prefix"),
    ("a=x.;a=y.", "a is listed twice"),
])
def test_bad_tenant_settings_are_refused(setting: str, message: str) -> None:
    with pytest.raises(TenantSettingError, match=message):
        parse_tenants(setting)


def test_a_bookie_refuses_tenants_without_client_certificates_or_etcd(tmp_path: Path,
                                                                      pki: dict[str, ClientOptions]) -> None:
    def node(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", str(tmp_path / "d"),
                               "--port", "0", "--tenant-prefixes", TENANTS, *args], capture_output=True, text=True,
                              timeout=60)

    plain = node("--etcd", "127.0.0.1:2379")
    assert plain.returncode == 2 and "tenant_prefixes needs client certificates" in plain.stderr
    tls = list(pki["_bookie_args"])[:6]  # type: ignore[call-overload]
    standalone = node(*tls)
    assert standalone.returncode == 2 and "tenant_prefixes needs etcd" in standalone.stderr
    bad = subprocess.run([sys.executable, "-m", "octavo.cli.main", "node", "--data-dir", str(tmp_path / "d"),
                          "--tenant-prefixes", "nobody"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is not IDENTITY=PREFIX" in bad.stderr
