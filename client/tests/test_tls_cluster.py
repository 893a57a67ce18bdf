"""The core cluster scenarios with mTLS between every client and bookie (real certificates, real processes):
write, SIGKILL a bookie (the writer changes its ensemble over TLS), recovery open and read back byte-identical;
re-replication of the lost bookie's copies by the other bookies' workers, which call their peers with the
bookies' own certificates; the CLI reaching the bookies with OCTAVO_TLS_*; a client without a certificate
told that TLS may be why it cannot reach a bookie."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from octavo.cli.certs import CertificateAuthority
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions
from octavo.meta.errors import OctavoError

PW = b"pw"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority()
    bookie = ca.write(root, "bookie")
    client = ca.write(root, "client", server=False)
    return {"ca": bookie.ca_file, "bookie_cert": bookie.cert_file, "bookie_key": bookie.key_file,
            "client_cert": client.cert_file, "client_key": client.key_file}


@pytest.fixture(scope="module")
def cluster(pki: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    args = ["--tls-cert-file", pki["bookie_cert"], "--tls-key-file", pki["bookie_key"], "--tls-ca-file", pki["ca"],
            "--lost-bookie-delay-s", "1", "--audit-interval-s", "5"]
    with LocalCluster(str(tmp_path_factory.mktemp("tls-cluster")), bookies=4, bookie_args=args) as c:
        yield c


def options(pki: dict[str, str], **kw: object) -> ClientOptions:
    return ClientOptions(tls_ca_file=pki["ca"], tls_cert_file=pki["client_cert"], tls_key_file=pki["client_key"],
                         add_timeout_s=2.0, read_timeout_s=3.0, metadata_timeout_s=2.0, bookie_list_ttl_s=0.2,
                         **kw)  # type: ignore[arg-type]


def data(i: int) -> bytes:
    return (f"{i}:".encode() * 50)[:300]


async def test_write_kill_recover_and_heal_over_mtls(cluster: LocalCluster, pki: dict[str, str]) -> None:
    async with Client(cluster.etcd_endpoint, options=options(pki)) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append_many([data(i) for i in range(500)])
        victim = writer.metadata.last_ensemble[0]
        cluster.bookies[victim].kill()
        await writer.append_many([data(i) for i in range(500, 1000)])
        assert victim not in writer.metadata.last_ensemble  # replaced by an ensemble change over TLS
        ledger_id = writer.ledger_id
    async with Client(cluster.etcd_endpoint, options=options(pki)) as reader_client:
        reader = await reader_client.open_ledger(ledger_id, password=PW)  # fences over TLS, recovers, closes
        assert reader.last_entry_id == 999
        assert [e.data async for e in reader.read(0, 999)] == [data(i) for i in range(1000)]
        # The lost bookie's copy of the first segment is re-replicated by the others' workers (TLS clients
        # with the bookies' own certificates).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            meta = await reader_client.ledger_metadata(ledger_id)
            if all(victim not in bookies for _, bookies in meta.ensembles):
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError(f"{victim} still named by ledger {ledger_id}: {meta.ensembles}")
    cluster.bookies[victim].start()


async def test_a_client_without_a_certificate_is_told_tls_may_be_why(cluster: LocalCluster,
                                                                    pki: dict[str, str]) -> None:
    no_cert = ClientOptions(tls_ca_file=pki["ca"], add_timeout_s=2.0, metadata_timeout_s=2.0,
                            ensemble_change_wait_s=0.0)
    async with Client(cluster.etcd_endpoint, options=no_cert) as client:
        with pytest.raises(OctavoError) as e:
            writer = await client.create_ledger(3, 3, 2, password=PW)
            await asyncio.wait_for(writer.append_many([b"x"]), 30)
    assert "TLS is on" in str(e.value), str(e.value)


def test_the_cli_reaches_tls_bookies_with_octavo_tls_env(cluster: LocalCluster, pki: dict[str, str]) -> None:
    def status(env: dict[str, str]) -> dict[str, object]:
        run = subprocess.run([sys.executable, "-m", "octavo.cli.main", "cluster", "status", "--json", "--etcd",
                              cluster.etcd_endpoint], capture_output=True, text=True, timeout=60,
                             env={**os.environ, **env})
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)  # type: ignore[no-any-return]

    env = {"OCTAVO_TLS_CA_FILE": pki["ca"], "OCTAVO_TLS_CERT_FILE": pki["client_cert"],
           "OCTAVO_TLS_KEY_FILE": pki["client_key"]}
    with_tls = status(env)
    reached = [b for b in with_tls["bookies"] if "ledgers" in b]  # type: ignore[union-attr]
    assert len(reached) == sum(1 for b in cluster.bookies.values() if b.alive())
    without = status({})
    assert all("error" in b for b in without["bookies"] if b["state"] != "gone")  # type: ignore[union-attr,index]
    half = subprocess.run([sys.executable, "-m", "octavo.cli.main", "cluster", "status", "--etcd",
                           cluster.etcd_endpoint], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OCTAVO_TLS_CERT_FILE": pki["client_cert"]})
    assert half.returncode == 2 and "go together" in half.stderr
