"""The peers' configuration files and command lines, as pure functions of ports and directories (no IO), so
that what the benchmark runs can be read and tested in one place.

Kafka: brokers in KRaft mode, each a combined broker+controller (`process.roles=broker,controller`), three
voters, topics with replication factor 3 and `min.insync.replicas=2`; Kafka's default of never flushing
(`log.flush.interval.messages` unset) is kept. BookKeeper: one standalone ZooKeeper and bookies started with
`org.apache.bookkeeper.server.Main`, `DbLedgerStorage` (the storage Pulsar runs), `journalSyncData` true (the
default: the journal is fdatasync'ed before an add is acknowledged) or false.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

KAFKA_VERSION = "4.4.0"
BOOKKEEPER_VERSION = "4.17.2"

# Heaps for 2 cores and 24 GiB with ten-odd JVMs on the machine at once.
KAFKA_JVM_ARGS = ["-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                  "-XX:InitiatingHeapOccupancyPercent=35", "-Djava.awt.headless=true"]
# A bookie's DbLedgerStorage caches live in direct memory (write cache 256 MiB, read-ahead 64 MiB, RocksDB's
# block cache 64 MiB), outside the heap.
BOOKIE_JVM_ARGS = ["-Xms1g", "-Xmx1g", "-XX:MaxDirectMemorySize=1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=10",
                   "-Djava.awt.headless=true"]
ZOOKEEPER_JVM_ARGS = ["-Xms256m", "-Xmx256m", "-Dzookeeper.admin.enableServer=false"]
DRIVER_JVM_ARGS = ["-Xms512m", "-Xmx1g", "-XX:+UseG1GC"]

KAFKA_MAIN = "kafka.Kafka"
KAFKA_STORAGE_TOOL = "kafka.tools.StorageTool"
BOOKIE_MAIN = "org.apache.bookkeeper.server.Main"
BOOKIE_SHELL = "org.apache.bookkeeper.bookie.BookieShell"
ZOOKEEPER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


@dataclass(frozen=True)
class KafkaNode:
    node_id: int
    port: int
    controller_port: int
    log_dir: str


def kafka_cluster_id(seed: bytes) -> str:
    """A KRaft cluster id: 16 bytes in URL-safe base64 without padding (what `kafka-storage random-uuid` prints)."""
    if len(seed) != 16:
        raise ValueError(f"a Kafka cluster id is 16 bytes, got {len(seed)}")
    return base64.urlsafe_b64encode(seed).rstrip(b"=").decode()


def kafka_properties(node: KafkaNode, voters: list[KafkaNode]) -> str:
    quorum = ",".join(f"{v.node_id}@127.0.0.1:{v.controller_port}" for v in voters)
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": quorum,
        "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": node.log_dir,
        "num.partitions": "1",
        "default.replication.factor": "3",
        "min.insync.replicas": "2",
        "offsets.topic.replication.factor": "3",
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "group.initial.rebalance.delay.ms": "0",
        # A deleted topic's files go at once (default 60 s), as Octavo's runs delete and collect their ledgers.
        "log.segment.delete.delay.ms": "1000",
        "auto.create.topics.enable": "false",
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def zookeeper_config(port: int, data_dir: str) -> str:
    return (f"tickTime=2000\ndataDir={data_dir}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
            "maxClientCnxns=0\nadmin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n")


def metadata_service_uri(zk_port: int, ledgers_root: str) -> str:
    """The bookies' and clients' metadata service: ZooKeeper at `zk_port`, ledgers under `ledgers_root`."""
    if not ledgers_root.startswith("/"):
        raise ValueError(f"ledgers_root must be an absolute ZooKeeper path, got {ledgers_root!r}")
    return f"zk+null://127.0.0.1:{zk_port}{ledgers_root}"


def bookie_config(port: int, zk_port: int, ledgers_root: str, journal_dir: str, ledger_dir: str,
                  journal_sync_data: bool) -> str:
    settings = {
        "bookiePort": str(port),
        "advertisedAddress": "127.0.0.1",
        "allowLoopback": "true",
        "useHostNameAsBookieID": "false",
        "metadataServiceUri": metadata_service_uri(zk_port, ledgers_root),
        "journalDirectories": journal_dir,
        "ledgerDirectories": ledger_dir,
        "ledgerStorageClass": "org.apache.bookkeeper.bookie.storage.ldb.DbLedgerStorage",
        "journalSyncData": "true" if journal_sync_data else "false",
        "dbStorage_writeCacheMaxSizeMb": "256",
        "dbStorage_readAheadCacheMaxSizeMb": "64",
        "dbStorage_rocksDB_blockCacheSize": str(64 << 20),
        # Old journals are kept only as long as needed (defaults: 2 GiB files, 5 kept) to spare the disk.
        "journalMaxSizeMB": "512",
        "journalMaxBackups": "1",
        # Deleted ledgers' entry logs are collected every 30 s (default 15 min), so runs do not pile up.
        "gcWaitTime": "30000",
        # The in-flight budget is 8 MiB of payload, 83,886 entries of 100 B: above the default queue of 10,000
        # adds per add thread a bookie answers "too many requests", the client replaces the bookie in the
        # ensemble, and with three bookies there is none to take its place (the run of 2026-11-26 failed so).
        "maxPendingAddRequestsPerThread": "100000",
        "httpServerEnabled": "false",
        "autoRecoveryDaemonEnabled": "false",
        "diskUsageThreshold": "0.99",
        "diskUsageWarnThreshold": "0.98",
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def java_command(classpath: str, jvm_args: list[str], main: str, *args: str) -> list[str]:
    return ["java", *jvm_args, "-cp", classpath, main, *args]
