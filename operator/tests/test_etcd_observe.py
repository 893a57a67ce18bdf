"""The operator reads etcd's health from a real etcd: its database against the BookieCluster's quota, and a
NOSPACE alarm that makes EtcdHealthy False, Degraded True and the status say etcd refuses writes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from octavo.cli.localcluster import EtcdProcess
from octavo.meta.errors import EtcdSpaceExceededError
from octavo.meta.etcd import EtcdClient
from octavo.operator.handlers import observe_etcd
from octavo.operator.resources import parse_cluster
from octavo.operator.status import DEGRADED, ETCD_HEALTHY, cluster_status

QUOTA_BYTES = 4 << 20
NOW = datetime(2026, 5, 4, 2, 10, tzinfo=UTC)


@pytest.fixture
def small_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(str(tmp_path / "etcd"), extra_args=["--quota-backend-bytes", str(QUOTA_BYTES)])
    proc.start()
    yield proc
    proc.stop()


def status_of(etcd: Any, etcd_error: str) -> dict[str, Any]:
    return cluster_status(NOW, generation=1, replicas=0, ready_replicas=0, selector="app=x", bookies=[], pods={},
                          decision=None, spec_error="", old=None, etcd=etcd, etcd_error=etcd_error)


async def test_the_operator_sees_a_full_etcd(small_etcd: EtcdProcess) -> None:
    spec = parse_cluster("logs", {"image": "octavo:0.1", "storage": {"size": "1Gi"},
                                  "etcd": {"endpoints": small_etcd.endpoint, "quotaBytes": QUOTA_BYTES}})
    # The endpoints are in the spec: the Kubernetes API is not asked for them.
    reading = await observe_etcd(None, "ns", spec, 5.0)  # type: ignore[arg-type]
    etcd, error = reading.health, reading.error
    assert error == "" and etcd is not None and not etcd.refuses_writes and reading.underreplicated == 0
    assert etcd.quota_bytes == QUOTA_BYTES and etcd.quota_source == "setting" and etcd.db_size_bytes > 0
    healthy = status_of(etcd, error)
    assert {c["type"]: c["status"] for c in healthy["conditions"]}[ETCD_HEALTHY] == "True"

    async with EtcdClient(small_etcd.endpoint) as client:
        # Fill it (512 KiB values, giving the backend time to commit: its file's size is what the quota counts).
        refused = False
        for i in range(16 * QUOTA_BYTES // (512 << 10)):
            try:
                await client.put(b"/filler/%d" % i, b"x" * (512 << 10))
            except EtcdSpaceExceededError:
                refused = True
                break
            await asyncio.sleep(0.05)
        assert refused, "etcd never refused a write for space"

    reading = await observe_etcd(None, "ns", spec, 5.0)  # type: ignore[arg-type]
    etcd, error = reading.health, reading.error
    assert etcd is not None and etcd.alarms == ("NOSPACE",) and etcd.refuses_writes
    status = status_of(etcd, error)
    c = {c["type"]: c for c in status["conditions"]}
    assert c[ETCD_HEALTHY]["status"] == "False" and c[ETCD_HEALTHY]["reason"] == "EtcdNoSpace"
    assert "REFUSES WRITES" in c[ETCD_HEALTHY]["message"]
    assert c[DEGRADED]["status"] == "True" and c[DEGRADED]["reason"] == "EtcdRefusesWrites"
    assert status["etcd"]["refusesWrites"] is True and status["etcd"]["quotaBytes"] == QUOTA_BYTES


async def test_an_etcd_that_does_not_answer_is_reported_not_fatal(small_etcd: EtcdProcess) -> None:
    endpoint = small_etcd.endpoint
    small_etcd.stop()
    spec = parse_cluster("logs", {"image": "octavo:0.1", "storage": {"size": "1Gi"}, "etcd": {"endpoints": endpoint}})
    reading = await observe_etcd(None, "ns", spec, 1.0)  # type: ignore[arg-type]
    etcd, error = reading.health, reading.error
    assert etcd is None and reading.underreplicated is None and error.startswith("cannot read etcd's status")
    c = {c["type"]: c for c in status_of(etcd, error)["conditions"]}
    assert c[ETCD_HEALTHY]["status"] == "False" and c[ETCD_HEALTHY]["reason"] == "EtcdUnreachable"


async def test_the_operator_counts_the_clusters_underreplicated_marks(small_etcd: EtcdProcess) -> None:
    """A roll waits for none (rolling.py); only this cluster's marks count."""
    from octavo.meta.layout import Layout

    spec = parse_cluster("logs", {"image": "octavo:0.1", "storage": {"size": "1Gi"},
                                  "etcd": {"endpoints": small_etcd.endpoint}})
    async with EtcdClient(small_etcd.endpoint) as client:
        await client.put(Layout("logs").underreplicated_ledger(5), b"{}")
        await client.put(Layout("logs").underreplicated_ledger(6), b"{}")
        await client.put(Layout("other").underreplicated_ledger(7), b"{}")
    reading = await observe_etcd(None, "ns", spec, 5.0)  # type: ignore[arg-type]
    assert reading.underreplicated == 2 and reading.error == ""
