"""The Spark data source on local Spark and a real cluster (etcd + bookie processes). One Spark session for the
module (it costs ~10-30 s and ~1 GB here); everything Spark is under the `spark` marker."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra (pyspark, pyarrow) is not installed")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from octavo.cli.localcluster import LocalCluster  # noqa: E402
from octavo.client import SyncClient  # noqa: E402
from octavo.client.dataset import META_DATASET  # noqa: E402
from octavo.spark.arrowio import OptionError, Options  # noqa: E402
from octavo.spark.keycompact import OffsetMap, compact_dataset  # noqa: E402

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def cluster(spark: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Started after Spark: PySpark launches its JVM with a fork (it passes a preexec_fn), and a fork while gRPC
    threads are busy in this process can leave the child broken ("Java gateway process exited"), which CI
    once hit. `make test` also runs this module in a pytest process of its own, before any gRPC use."""
    # No dataset maintenance: its merges would change the ledger counts these tests check (test_dataset_merge.py
    # tests it, and key compaction racing a merge).
    with LocalCluster(str(tmp_path_factory.mktemp("spark")), bookies=4,
                      bookie_args=["--dataset-maintenance-interval-s", "0"]) as c:
        yield c


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("octavo-tests")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
               .config("spark.task.maxFailures", "2")
               .config("spark.sql.streaming.checkpointLocation", str(tmp_path_factory.mktemp("ckpt")))
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def frame(spark, n: int, parts: int = 4, offset: int = 0):  # type: ignore[no-untyped-def]
    return spark.range(offset, offset + n, numPartitions=parts).selectExpr(
        "id", "id % 97 as k", "cast(id * 7 as string) as s", "cast(id as double) / 3 as d")


def checksum(df) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    rows = df.selectExpr("count(*) as n", "sum(crc32(concat_ws('|', id, k, s, d))) as c").collect()[0]
    return int(rows["n"]), int(rows["c"] or 0)


def read(spark, cluster: LocalCluster, name: str, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.read.format("octavo").option("etcd", cluster.etcd_endpoint)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(name)


def write(df, cluster: LocalCluster, name: str, mode: str = "append", **options: str) -> None:  # type: ignore[no-untyped-def]
    writer = df.write.format("octavo").option("etcd", cluster.etcd_endpoint).mode(mode)
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save(name)


def test_write_then_read_back_every_row(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    df = frame(spark, 200_000)
    write(df, cluster, "events", rows_per_entry="5000")
    back = read(spark, cluster, "events")
    assert back.schema == df.schema
    assert checksum(back) == checksum(df)
    assert back.rdd.getNumPartitions() == 1  # four small ledgers share a partition (max_partition_bytes)
    tiny = read(spark, cluster, "events", max_partition_bytes="1024")  # every entry is over it: one each
    assert tiny.rdd.getNumPartitions() == 40 and checksum(tiny) == checksum(df)
    split = read(spark, cluster, "events", entries_per_partition="3")
    assert split.rdd.getNumPartitions() > 4 and checksum(split) == checksum(df)
    projected = read(spark, cluster, "events", columns="id,s")
    assert projected.columns == ["id", "s"] and projected.count() == 200_000
    with SyncClient(cluster.etcd_endpoint) as client:
        manifest = client._loop.run(client._client.datasets.get("events"))
    assert manifest.rows == 200_000 and len(manifest.ledgers) == 4


def test_empty_partitions_write_no_ledger(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    write(frame(spark, 3, parts=8), cluster, "sparse")  # at most 3 of the 8 partitions hold a row
    write(frame(spark, 0, parts=4), cluster, "sparse")  # a write of no row commits, with no ledger
    with SyncClient(cluster.etcd_endpoint) as client:
        manifest = client._loop.run(client._client.datasets.get("sparse"))
        written = [m.ledger_id for m in client._loop.run(client._client.all_ledger_metadata())
                   if m.custom_metadata.get(META_DATASET) == "sparse"]
    assert manifest.version == 2 and manifest.rows == 3 and 1 <= len(manifest.ledgers) <= 3
    assert sorted(written) == sorted(x.ledger_id for x in manifest.ledgers) and all(
        x.rows > 0 for x in manifest.ledgers)
    assert read(spark, cluster, "sparse").count() == 3


def test_every_spark_type_reads_back_whatever_the_session_time_zone(spark, cluster: LocalCluster,  # type: ignore[no-untyped-def]
                                                                    tmp_path: Path) -> None:
    import datetime
    from decimal import Decimal

    schema = ("ts TIMESTAMP, ntz TIMESTAMP_NTZ, day DATE, dec DECIMAL(38,10), small DECIMAL(5,2), "
              "nested STRUCT<a: INT, b: ARRAY<STRING>>, m MAP<STRING, DOUBLE>, bin BINARY, f DOUBLE, "
              "text STRING, flag BOOLEAN, tiny TINYINT, span INTERVAL DAY TO SECOND")
    stamp = datetime.datetime(2026, 3, 29, 1, 30, 15, 123456)
    rows = [
        (stamp, stamp, datetime.date(1970, 1, 1), Decimal("1234567890123456789012345678.0123456789"),
         Decimal("-1.25"), (7, ["x", None, "yé"]), {"k": 1.5, "n": None}, b"\x00\xff", float("inf"),
         "naïve — ünïcödé", True, -128, datetime.timedelta(days=2, microseconds=5)),
        (None,) * 13,
    ]
    original = spark.conf.get("spark.sql.session.timeZone")
    try:
        for zone in ("UTC", "America/Los_Angeles"):
            spark.conf.set("spark.sql.session.timeZone", zone)
            df = spark.createDataFrame(rows, schema).selectExpr(
                "*", "case when flag then parse_json('{\"a\": [1, 2.5, null], \"é\": \"x\"}') end as doc")
            name = "types-" + zone.replace("/", "-").lower()
            write(df, cluster, name)
            back = read(spark, cluster, name)
            assert back.schema == df.schema
            expected = sorted(map(repr, df.collect()))
            assert sorted(map(repr, back.collect())) == expected, zone
            # ... and through a streaming read.
            streamed: list[str] = []
            query = (spark.readStream.format("octavo").option("etcd", cluster.etcd_endpoint).load(name)
                     .writeStream.foreachBatch(lambda batch, _, out=streamed: out.extend(map(repr, batch.collect())))
                     .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())
            query.awaitTermination(180)
            assert sorted(streamed) == expected, zone
    finally:
        spark.conf.set("spark.sql.session.timeZone", original)
    # A type PySpark cannot put in Arrow is refused while the write is planned, naming the column.
    months = spark.sql("select interval '1-2' year to month as age, 1 as id")
    with pytest.raises(Exception, match="column age has type INTERVAL YEAR TO MONTH"):
        write(months, cluster, "types-months")


def test_options_are_checked_by_name(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    write(frame(spark, 10, parts=1), cluster, "options")
    with pytest.raises(Exception, match="unknown option entrie_per_partition; did you mean entries_per_partition"):
        read(spark, cluster, "options", entrie_per_partition="7").count()
    with pytest.raises(Exception, match="unknown option if_exist; did you mean if_exists"):
        write(frame(spark, 10, parts=1), cluster, "options", if_exist="error")
    assert read(spark, cluster, "options", ENTRIES_PER_PARTITION="1").count() == 10  # names are case-insensitive
    with pytest.raises(Exception, match=r"got no options.*CREATE TEMPORARY VIEW"):
        frame(spark, 1, parts=1).write.format("octavo").mode("append").saveAsTable("octavo_table")


def test_append_twice_and_overwrite(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    first, second = frame(spark, 1000), frame(spark, 500, parts=2, offset=1000)
    write(first, cluster, "twice")
    write(second, cluster, "twice")
    assert checksum(read(spark, cluster, "twice")) == checksum(first.union(second))
    write(frame(spark, 10, parts=1), cluster, "twice", mode="overwrite")
    assert read(spark, cluster, "twice").count() == 10
    # Time travel: the versions before the overwrite, while the retention period keeps them.
    assert checksum(read(spark, cluster, "twice", versionAsOf="2")) == checksum(first.union(second))
    assert checksum(read(spark, cluster, "twice", versionAsOf="1")) == checksum(first)
    with pytest.raises(Exception, match="versions 1 to 3, not 9"):
        read(spark, cluster, "twice", versionAsOf="9").count()
    with pytest.raises(Exception, match="already exists"):
        write(first, cluster, "twice", if_exists="error")
    write(first, cluster, "twice", if_exists="ignore")  # an existing dataset: nothing happens
    assert read(spark, cluster, "twice").count() == 10
    with pytest.raises(Exception, match="another schema"):
        write(spark.range(5).selectExpr("id as other"), cluster, "twice")


def test_merge_schema_adds_nullable_columns_that_older_rows_read_as_null(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    write(spark.range(3).selectExpr("id", "cast(id as string) as s"), cluster, "evolving")
    wider = spark.range(3, 5).selectExpr("cast(id * 10 as int) as extra", "cast(id as string) as s", "id")
    with pytest.raises(Exception, match="another schema"):
        write(wider, cluster, "evolving")  # without mergeSchema: refused, as before
    write(wider, cluster, "evolving", mergeSchema="true")
    back = read(spark, cluster, "evolving")
    assert back.columns == ["id", "s", "extra"]
    assert sorted(tuple(r) for r in back.collect()) == [(0, "0", None), (1, "1", None), (2, "2", None),
                                                         (3, "3", 30), (4, "4", 40)]
    with pytest.raises(Exception, match="mergeSchema adds columns; it changes the type of none"):
        write(spark.range(1).selectExpr("cast(id as string) as id", "'x' as s"), cluster, "evolving",
              mergeSchema="true")


def test_bad_options_get_clear_errors(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OptionError, match="etcd is required"):
        Options.parse({"dataset": "x"})
    with pytest.raises(OptionError, match="ensemble_size must be an integer"):
        Options.parse({"etcd": "h:1", "dataset": "x", "ensemble_size": "three"})
    with pytest.raises(OptionError, match="ack_quorum must be in"):
        Options.parse({"etcd": "h:1", "dataset": "x", "write_quorum": "2", "ack_quorum": "3"})
    with pytest.raises(OptionError, match="dataset name"):
        Options.parse({"etcd": "h:1", "dataset": "../etc"})
    with pytest.raises(Exception, match="does not exist"):
        read(spark, cluster, "never-written").count()


def test_a_write_to_an_unreachable_etcd_fails_while_planning(spark) -> None:  # type: ignore[no-untyped-def]
    from octavo.cli.localcluster import free_port

    df = frame(spark, 100, parts=2).write.format("octavo").option("etcd", f"127.0.0.1:{free_port()}")
    with pytest.raises(Exception) as failed:
        df.mode("append").save("nowhere")
    message = str(failed.value)
    assert "etcd unavailable" in message and "connection refused" in message
    assert "stage failure" not in message  # no task ran: the driver refused while planning


def test_a_task_failure_leaves_nothing_visible_and_its_ledgers_are_collected(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.functions import udf

    @udf("long")
    def explode_on_last(x):  # type: ignore[no-untyped-def]
        if x == 2999:
            raise RuntimeError("injected task failure")
        return x

    df = frame(spark, 3000, parts=3).withColumn("id", explode_on_last("id"))
    with pytest.raises(Exception, match="injected task failure"):
        write(df, cluster, "failing", orphan_grace_s="0")
    with pytest.raises(Exception, match="does not exist"):
        read(spark, cluster, "failing").count()  # not even partly visible
    with SyncClient(cluster.etcd_endpoint) as client:
        leftover = [m.ledger_id for m in client._loop.run(client._client.all_ledger_metadata())
                    if m.custom_metadata.get(META_DATASET) == "failing"]
        write(frame(spark, 10, parts=1), cluster, "failing", orphan_grace_s="0")
        # orphan collection (the auditor's dataset maintenance, or `octavo dataset gc`) deletes whatever a
        # failed attempt left behind, and nothing the dataset references
        collected = client._loop.run(client._client.datasets.collect_orphans("failing", 0))
        after = [m.ledger_id for m in client._loop.run(client._client.all_ledger_metadata())
                 if m.custom_metadata.get(META_DATASET) == "failing"]
    assert set(leftover) <= set(collected) and not set(leftover) & set(after)
    assert read(spark, cluster, "failing").count() == 10


def test_a_streaming_query_restarted_from_its_checkpoint_writes_no_duplicates(
        spark, cluster: LocalCluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = tmp_path / "in"
    source.mkdir()
    checkpoint = str(tmp_path / "ckpt")
    schema = "id LONG, v STRING"

    def run_once() -> None:
        stream = spark.readStream.schema(schema).json(str(source))
        query = (stream.writeStream.format("octavo").option("etcd", cluster.etcd_endpoint)
                 .option("checkpointLocation", checkpoint).option("stream_id", "ingest")
                 .trigger(availableNow=True).start("streamed"))
        query.awaitTermination(120)

    for i in range(3):
        (source / f"f{i}.json").write_text("\n".join(f'{{"id": {i * 100 + j}, "v": "x{j}"}}' for j in range(100)))
    run_once()
    (source / "f3.json").write_text("\n".join(f'{{"id": {300 + j}, "v": "y"}}' for j in range(50)))
    # Simulate a crash after the sink committed but before Spark recorded the batch: drop its commit log
    # entry, so the restarted query runs the same batch id again.
    run_once()
    commits = sorted(Path(checkpoint, "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    run_once()
    back = read(spark, cluster, "streamed")
    assert back.count() == 350 and back.select("id").distinct().count() == 350


def test_a_streaming_read_tails_new_commits(spark, cluster: LocalCluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write(frame(spark, 100, parts=1), cluster, "tailed")
    out = []

    def collect(batch_df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        out.extend(r["id"] for r in batch_df.select("id").collect())

    stream = spark.readStream.format("octavo").option("etcd", cluster.etcd_endpoint).load("tailed")
    query = (stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert sorted(out) == list(range(100))
    write(frame(spark, 50, parts=1, offset=100), cluster, "tailed")
    query = (stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert sorted(out) == list(range(150))  # the restarted query reads only what is new


def test_a_streaming_read_starts_where_asked_and_keeps_to_its_limit(spark, cluster: LocalCluster,  # type: ignore[no-untyped-def]
                                                                      tmp_path: Path) -> None:
    for k in range(5):  # versions 1..5, 10 rows each
        write(frame(spark, 10, parts=1, offset=10 * k), cluster, "limited")

    def run(name: str, **options: str) -> list[list[int]]:
        batches: list[list[int]] = []

        def collect(batch_df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
            batches.append(sorted(r["id"] for r in batch_df.select("id").collect()))

        stream = spark.readStream.format("octavo").option("etcd", cluster.etcd_endpoint)
        for key, value in options.items():
            stream = stream.option(key, value)
        query = (stream.load("limited").writeStream.foreachBatch(collect)
                 .option("checkpointLocation", str(tmp_path / name)).trigger(availableNow=True).start())
        query.awaitTermination(180)
        return [b for b in batches if b]

    limited = run("rows", maxRowsPerTrigger="15")
    assert [len(b) for b in limited] == [10] * 5  # whole commits, at most 15 rows: one commit a batch
    assert sorted(i for b in limited for i in b) == list(range(50))
    assert sum(map(len, run("bytes", maxBytesPerTrigger="1"))) == 50  # at least one commit a batch
    assert sorted(i for b in run("v3", startingVersion="3") for i in b) == list(range(20, 50))
    assert run("latest", startingVersion="latest") == []
    with pytest.raises(Exception, match="startingVersion must be earliest, latest or a version"):
        run("bad", startingVersion="yesterday")


def test_key_compaction_keeps_exactly_the_latest_row_per_key(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.functions import expr

    base = spark.range(0, 2000, numPartitions=2).select(expr("id % 300 as key"), expr("id as version"),
                                                        expr("false as deleted"))
    write(base, cluster, "keyed", key_column="key")
    tombs = spark.range(0, 10, numPartitions=1).select(expr("id as key"), expr("5000 + id as version"),
                                                       expr("true as deleted"))
    write(tombs, cluster, "keyed")
    opts = Options.parse({"etcd": cluster.etcd_endpoint, "dataset": "keyed"})
    result = asyncio.run(compact_dataset(opts, slots=64, tombstone_retention_s=0))
    assert result.rows_before == 2010 and 0 < result.tombstones_dropped <= 10
    rows = {(r["key"], r["version"]) for r in read(spark, cluster, "keyed").collect()}
    latest = {k: max(v for v in range(2000) if v % 300 == k) for k in range(10, 300)}
    # 64 slots for 300 keys: collisions may keep older duplicates this run, but never lose a latest row; a
    # deleted key whose rows survive (a collision) keeps its tombstone too, so it still reads as deleted
    assert set(latest.items()) <= rows
    assert all((k, 5000 + k) in rows for k, _ in rows if k < 10)
    # a map with room to spare and a fixed seed (no collision among these 300 keys): exactly one row per key
    again = asyncio.run(compact_dataset(opts, slots=1 << 20, tombstone_retention_s=0, seed=b"octavo-test-seed"))
    assert again.rows_after == 290
    final = {r["key"]: r["version"] for r in read(spark, cluster, "keyed").collect()}
    assert final == latest


def test_key_compaction_as_a_spark_job(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.functions import expr

    from octavo.spark.keycompact import compact_with_spark

    rounds = [spark.range(0, 3000, numPartitions=3).select(
        expr("id % 500 as key"), expr(f"{r} * 10000 + id as version"), expr("false as deleted")) for r in range(2)]
    write(rounds[0], cluster, "keyed-spark", key_column="key")
    write(rounds[1], cluster, "keyed-spark")
    write(spark.range(0, 20, numPartitions=1).select(expr("id as key"), expr("cast(99999 as long) as version"),
                                                     expr("true as deleted")), cluster, "keyed-spark")
    opts = Options.parse({"etcd": cluster.etcd_endpoint, "dataset": "keyed-spark"})
    result = compact_with_spark(spark, opts, slots=1 << 16, tombstone_retention_s=0, seed=b"octavo-test-seed")
    assert result.ledgers_before == 7 and result.rows_before == 6020 and result.tombstones_dropped == 20
    got = {(r["key"], r["version"]) for r in read(spark, cluster, "keyed-spark").collect()}
    expected = {(k, 10000 + max(v for v in range(3000) if v % 500 == k)) for k in range(20, 500)}
    assert got == expected


def test_a_bookie_killed_during_a_write_loses_no_committed_row(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    df = frame(spark, 300_000, parts=4)
    import threading

    victim = cluster.bookies["bookie-1"]
    killer = threading.Timer(1.5, victim.kill)
    killer.start()
    try:
        write(df, cluster, "survivor", rows_per_entry="2000")
    finally:
        killer.cancel()
        killer.join()
        if not victim.alive():
            victim.start()
    assert checksum(read(spark, cluster, "survivor")) == checksum(df)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.integers(0, 40), min_size=1, max_size=200), slots=st.integers(1, 16),
       seed=st.binary(min_size=16, max_size=16))
def test_offset_map_collisions_never_lose_the_latest_value(keys: list[int], slots: int, seed: bytes) -> None:
    m = OffsetMap(slots, seed)
    for pos, k in enumerate(keys):
        m.put(k, pos)
    latest = {k: pos for pos, k in enumerate(keys)}
    kept = [pos for pos, k in enumerate(keys) if not m.superseded(k, pos)]
    assert set(latest.values()) <= set(kept)  # every key's latest row survives
    big = OffsetMap(1 << 16, seed)  # with room for every key, exactly the latest rows are kept
    for pos, k in enumerate(keys):
        big.put(k, pos)
    assert [pos for pos, k in enumerate(keys) if not big.superseded(k, pos)] == sorted(latest.values())


def test_offset_map_memory_is_fixed() -> None:
    m = OffsetMap(1000, b"0" * 16)
    before = (len(m.hi), len(m.lo), len(m.pos))
    for i in range(100_000):
        m.put(i, i)
    assert (len(m.hi), len(m.lo), len(m.pos)) == before == (1000, 1000, 1000)
    with pytest.raises(ValueError, match="slots"):
        OffsetMap(0, b"")


def test_the_dataset_cli(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    import json
    import subprocess

    write(frame(spark, 100, parts=2), cluster, "cli-ds")

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "octavo.cli.main", "dataset", *argv, "--etcd",
                               cluster.etcd_endpoint], capture_output=True, text=True, timeout=120)

    out = cli("ls", "--json")
    assert out.returncode == 0
    listed = {d["name"]: d for d in json.loads(out.stdout)["datasets"]}
    assert listed["cli-ds"]["rows"] == 100 and listed["cli-ds"]["ledgers"] == 2
    out = cli("ls")
    assert out.stdout.splitlines()[0].split()[:4] == ["DATASET", "VERSION", "LEDGERS", "ROWS"]
    out = cli("show", "cli-ds", "--json")
    assert out.returncode == 0 and sum(x["rows"] for x in json.loads(out.stdout)["ledgers"]) == 100
    out = cli("show", "cli-ds")
    assert "100 rows in 2 ledgers" in out.stdout and "\n  id: long" in out.stdout  # the schema, a column a line
    out = cli("compact", "cli-ds")  # no key column: its small ledgers are merged
    assert out.returncode == 0 and "2 ledgers -> 1" in out.stdout
    out = cli("gc", "cli-ds", "--grace-s", "0")
    assert out.returncode == 2 and "must be a positive number" in out.stderr  # 0 would take running writes
    out = cli("gc", "cli-ds", "--grace-s", "0.001")
    assert out.returncode == 0 and "deleted 0 orphan ledgers" in out.stdout
    out = cli("gc", "no-such-ds")
    assert out.returncode == 1 and "does not exist and no ledger was written for it" in out.stderr
    out = cli("drop", "cli-ds")  # not at a terminal: --yes is needed
    assert out.returncode == 2 and "refusing without --yes" in out.stderr
    out = cli("drop", "cli-ds", "--yes")
    assert out.returncode == 0 and "dropped cli-ds (1 ledgers)" in out.stdout
    out = cli("drop", "cli-ds", "--yes")
    assert out.returncode == 1 and "does not exist" in out.stderr
    assert "cli-ds" not in {d["name"] for d in json.loads(cli("ls", "--json").stdout)["datasets"]}


def test_an_interrupted_key_compaction_leaves_orphans_that_are_collected_and_can_run_again(
        spark, cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql.functions import expr

    from octavo.client.dataset import DatasetStore

    write(spark.range(0, 1000, numPartitions=2).select(expr("id % 100 as key"), expr("id as version")),
          cluster, "interrupted", key_column="key")
    opts = Options.parse({"etcd": cluster.etcd_endpoint, "dataset": "interrupted"})
    real_commit = DatasetStore.commit

    async def crash(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("died before the swap")

    monkeypatch.setattr(DatasetStore, "commit", crash)
    with pytest.raises(RuntimeError, match="before the swap"):
        asyncio.run(compact_dataset(opts, seed=b"octavo-test-seed"))
    monkeypatch.setattr(DatasetStore, "commit", real_commit)
    assert read(spark, cluster, "interrupted").count() == 1000  # readers never saw a half-done compaction

    async def orphans() -> list[int]:
        from octavo.client import Client

        async with Client(cluster.etcd_endpoint) as client:
            return await client.datasets.collect_orphans("interrupted", 0)

    assert len(asyncio.run(orphans())) == 1  # the compaction's output ledger
    result = asyncio.run(compact_dataset(opts, seed=b"octavo-test-seed"))
    assert result.rows_after == 100
    assert sorted(r["version"] for r in read(spark, cluster, "interrupted").collect()) == list(range(900, 1000))
    assert asyncio.run(orphans()) == []  # the replaced ledgers are retired (kept for the retention), not orphans


def test_tasks_push_their_metrics_over_otlp(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    """With the otlp_endpoint option every Python worker pushes the data source's counters (and the client's
    add latency under them) to a collector: here a real OTLP gRPC receiver in this process."""
    from octavo.telemetry.testing import OtlpReceiver

    with OtlpReceiver() as receiver:
        df = frame(spark, 10_000, parts=4)
        write(df, cluster, "measured", otlp_endpoint=receiver.endpoint, rows_per_entry="500")
        assert read(spark, cluster, "measured", otlp_endpoint=receiver.endpoint).count() == 10_000
    # Cumulative points: the last value per process (resource attribute process.pid), summed.
    assert receiver.total("octavo.spark.rows_written") == 10_000
    assert receiver.total("octavo.spark.ledgers_written") == 4
    assert receiver.total("octavo.spark.bytes_written") > 0
    assert receiver.total("octavo.spark.rows_read") == 10_000
    assert receiver.total("octavo.spark.commits", kind="batch") == 1
    assert receiver.histogram_count("octavo.client.add.latency") >= 4


def test_a_write_and_read_over_mutual_tls(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The TLS options reach every task's client: a cluster whose bookies require client certificates."""
    from octavo.cli.certs import CertificateAuthority

    ca = CertificateAuthority()
    bookie = ca.write(tmp_path / "pki", "bookie")
    client = ca.write(tmp_path / "pki", "client", server=False)
    args = ["--tls-cert-file", bookie.cert_file, "--tls-key-file", bookie.key_file, "--tls-ca-file", bookie.ca_file]
    with LocalCluster(str(tmp_path / "c"), bookies=3, bookie_args=args) as tls_cluster:
        tls = {"tls_ca_file": client.ca_file, "tls_cert_file": client.cert_file, "tls_key_file": client.key_file}
        df = frame(spark, 5_000, parts=2)
        write(df, tls_cluster, "secured", **tls)
        assert checksum(read(spark, tls_cluster, "secured", **tls)) == checksum(df)


def test_data_skipping_reads_only_the_ledgers_a_filter_can_match(spark, cluster: LocalCluster) -> None:  # type: ignore[no-untyped-def]
    # 40 ledgers (one per partition), each an hour of event time; half of them have no `tag`.
    df = spark.range(0, 4000, numPartitions=40).selectExpr(
        "id", "timestamp_seconds(1767225600 + id * 36) as ts", "cast(timestamp_seconds(1767225600 + id * 36) "
        "as date) as day", "cast(id as decimal(20, 2)) as amount", "format_string('k%05d', id) as key",
        "case when id % 200 < 100 then 'x' end as tag")
    write(df, cluster, "skipping")

    def planned(frame) -> int:  # type: ignore[no-untyped-def]
        return int(frame.rdd.getNumPartitions())

    one_per_ledger = {"entries_per_partition": "1000000000"}  # every ledger read is an input partition
    original = spark.conf.get("spark.sql.python.filterPushdown.enabled", "false")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        full = read(spark, cluster, "skipping", **one_per_ledger)
        skipping = read(spark, cluster, "skipping", data_skipping="true", **one_per_ledger)
        assert planned(full) == 40 and planned(skipping) == 40  # no filter: nothing skipped
        hour = 3600 // 36  # ids per hour of event time
        cases = {  # condition: (the ids it selects, the ledgers it reads)
            "ts >= timestamp'2026-01-01 05:00:00Z' and ts < timestamp'2026-01-01 06:00:00Z'":
                (range(5 * hour, 6 * hour), 1),
            "id in (5, 3999)": ([5, 3999], 2),
            "amount = 1234.00": ([1234], 1),
            "key > 'k03899'": (range(3900, 4000), 1),
            "day > date'2026-01-02'": ([], 0),
            "tag is null and id < 150": (range(100, 150), 1),
            "id > 100 and key < 'k00150'": (range(101, 150), 1),
        }
        for condition, (ids, ledgers) in cases.items():
            got = skipping.filter(condition)
            assert sorted(r["id"] for r in got.select("id").collect()) == list(ids), (condition, planned(got))
            assert planned(got) == ledgers or (ledgers == 0 and planned(got) == 1), condition
        # Filters statistics cannot decide are still applied by Spark: exact results, nothing skipped.
        odd = skipping.filter("id % 7 = 3 and key like '%9'")
        assert planned(odd) == 40
        assert odd.count() == full.filter("id % 7 = 3 and key like '%9'").count()
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
        with pytest.raises(Exception, match="filterPushdown"):
            read(spark, cluster, "skipping", data_skipping="true").filter("id = 1").collect()
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", original)
