"""The peers' configuration files say what docs/benchmarks.md says they run (no servers, no network):
`.venv/bin/pytest bench/peers/test_configs.py`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import configs


def parse(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_kafka_brokers_are_combined_kraft_voters_with_three_replicas() -> None:
    nodes = [configs.KafkaNode(i + 1, 9000 + i, 9100 + i, f"/d/k{i}") for i in range(3)]
    props = parse(configs.kafka_properties(nodes[1], nodes))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9100,2@127.0.0.1:9101,3@127.0.0.1:9102"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9001,CONTROLLER://127.0.0.1:9101"
    assert props["default.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert props["log.dirs"] == "/d/k1"
    # Kafka's default durability is kept: no flush setting at all.
    assert not any(k.startswith("log.flush") for k in props)


def test_kafka_cluster_id_is_16_bytes_base64url_unpadded() -> None:
    assert configs.kafka_cluster_id(bytes(16)) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert len(configs.kafka_cluster_id(bytes(range(16)))) == 22
    with pytest.raises(ValueError, match="16 bytes"):
        configs.kafka_cluster_id(b"short")


@pytest.mark.parametrize("sync", [True, False])
def test_bookie_runs_db_ledger_storage_with_the_journal_sync_asked_for(sync: bool) -> None:
    conf = parse(configs.bookie_config(3181, 2181, "/ledgers-x", "/d/j", "/d/l", journal_sync_data=sync))
    assert conf["ledgerStorageClass"] == "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage"
    assert conf["journalSyncData"] == ("true" if sync else "false")
    assert conf["metadataServiceUri"] == "zk+null://127.0.0.1:2181/ledgers-x"
    assert conf["bookiePort"] == "3181"
    assert conf["allowLoopback"] == "true"
    assert (conf["journalDirectories"], conf["ledgerDirectories"]) == ("/d/j", "/d/l")
    # 8 MiB of 100 B entries in flight must fit the bookie's add queue (its default of 10,000 made runs fail).
    assert int(conf["maxPendingAddRequestsPerThread"]) >= 8 * 1024 * 1024 // 100


def test_metadata_root_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="absolute"):
        configs.metadata_service_uri(2181, "ledgers")


def test_zookeeper_listens_on_loopback_only() -> None:
    conf = parse(configs.zookeeper_config(2181, "/d/zk"))
    assert (conf["clientPort"], conf["clientPortAddress"], conf["dataDir"]) == ("2181", "127.0.0.1", "/d/zk")
    assert conf["admin.enableServer"] == "false"
