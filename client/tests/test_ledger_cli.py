"""`octavo ledger ls|show|read|delete` against a real cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from octavo.client import SyncClient
from octavo.client.localcluster import LocalCluster

OCTAVO = [sys.executable, "-m", "octavo.cli.main", "ledger"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("cli")), bookies=3) as c:
        yield c


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OCTAVO, *args], capture_output=True, text=True, timeout=120)


def test_ls_show_read_delete(cluster: LocalCluster) -> None:
    etcd = cluster.etcd_endpoint
    with SyncClient(etcd) as client, \
            client.create_ledger(3, 3, 2, password=b"pw", metadata={"owner": "tests"}) as writer:
        writer.append_many([b"alpha", b"beta", b"gamma"])
        ledger = writer.ledger_id
    assert str(ledger) in run("ls", "--etcd", etcd).stdout.split()
    assert ledger in json.loads(run("ls", "--etcd", etcd, "--json").stdout)
    shown = run("show", str(ledger), "--etcd", etcd)
    assert shown.returncode == 0 and "CLOSED, last entry 2" in shown.stdout and "owner = tests" in shown.stdout
    meta = json.loads(run("show", str(ledger), "--etcd", etcd, "--json").stdout)
    assert meta["state"] == "CLOSED" and "master_key_hex" not in meta
    read = run("read", str(ledger), "--etcd", etcd, "--password", "pw")
    assert read.returncode == 0 and read.stdout.splitlines() == ["0\tb'alpha'", "1\tb'beta'", "2\tb'gamma'"]
    wrong = run("read", str(ledger), "--etcd", etcd, "--password", "nope")
    assert wrong.returncode == 1 and "wrong password" in wrong.stderr
    deleted = run("delete", str(ledger), "--etcd", etcd)
    assert deleted.returncode == 0 and "deleted" in deleted.stdout
    missing = run("show", str(ledger), "--etcd", etcd)
    assert missing.returncode == 1 and f"ledger {ledger} does not exist" in missing.stderr


def test_unreachable_etcd_is_a_clear_failure() -> None:
    from octavo.client.localcluster import free_port

    result = run("ls", "--etcd", f"127.0.0.1:{free_port()}")
    assert result.returncode == 1 and "etcd unavailable" in result.stderr
