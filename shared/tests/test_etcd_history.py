"""etcd's history and space on a real etcd: watches across a compaction, compaction itself, and a full etcd
("database space exceeded") as Octavo's clients and `octavo cluster status` see it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.localcluster import ETCD_QUOTA_BACKEND_BYTES, EtcdProcess, LocalCluster, etcd_binary
from octavo.client import Client, ClientOptions
from octavo.meta.errors import EtcdCompactedError, EtcdSpaceExceededError
from octavo.meta.etcd import EtcdClient
from octavo.meta.keyrange import WatchPosition

QUOTA_BYTES = 4 << 20  # etcd takes any quota; 4 MiB fills in a second
FAST = ClientOptions(add_timeout_s=5.0, read_timeout_s=3.0, metadata_timeout_s=3.0)


async def next_deletes(watch: object) -> list[bytes]:
    return await asyncio.wait_for(watch.__anext__(), 10)  # type: ignore[attr-defined]


async def test_a_watch_resumed_from_its_position_gets_the_deletes_made_while_it_was_away(
        etcd: EtcdProcess, cluster_name: str) -> None:
    prefix = f"/{cluster_name}/".encode()
    async with EtcdClient(etcd.endpoint) as client:
        for i in range(4):
            await client.put(prefix + b"%d" % i, b"v")
        position = WatchPosition()
        watch = client.watch_deletes(prefix, position)
        first = asyncio.ensure_future(next_deletes(watch))
        await asyncio.sleep(0.5)  # the watch is open (its start revision was read before it)
        await client.delete(prefix + b"0")
        assert await first == [prefix + b"0"]
        await watch.aclose()
        await client.delete(prefix + b"1")  # nobody watches
        await client.delete(prefix + b"2")
        resumed = client.watch_deletes(prefix, position)
        seen = await next_deletes(resumed)
        if len(seen) < 2:
            seen += await next_deletes(resumed)
        await resumed.aclose()
        assert seen == [prefix + b"1", prefix + b"2"]


async def test_a_watch_whose_start_was_compacted_raises_and_starts_again_from_now(
        etcd: EtcdProcess, cluster_name: str) -> None:
    prefix = f"/{cluster_name}/".encode()
    async with EtcdClient(etcd.endpoint) as client:
        await client.put(prefix + b"a", b"v")
        await client.put(prefix + b"b", b"v")
        position = WatchPosition(await client.revision())
        await client.delete(prefix + b"a")  # while nobody watches, and then compacted away
        await client.put(prefix + b"c", b"v")  # etcd keeps the revision compacted to: compact past the delete
        compacted = await client.revision()
        assert await client.compact(compacted)
        with pytest.raises(EtcdCompactedError, match="compacted its history") as caught:
            async for _ in client.watch_deletes(prefix, position):
                pytest.fail("a watch behind a compaction delivered events")
        assert caught.value.compact_revision == compacted
        position.revision = 0  # what the bookie does: from now on (and a full scan for the gap)
        watch = client.watch_deletes(prefix, position)
        seen = asyncio.ensure_future(next_deletes(watch))
        await asyncio.sleep(0.5)
        await client.delete(prefix + b"b")
        assert await seen == [prefix + b"b"]
        await watch.aclose()


async def test_compacting_to_a_revision_compacted_already_is_done(etcd: EtcdProcess, cluster_name: str) -> None:
    async with EtcdClient(etcd.endpoint) as client:
        await client.put(f"/{cluster_name}/k".encode(), b"v")
        revision = await client.revision()
        assert await client.compact(revision) is True
        assert await client.compact(revision) is False
        assert await client.compact(revision - 1) is False
        with pytest.raises(ValueError):
            await client.compact(0)


@pytest.fixture
def full_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = EtcdProcess(str(tmp_path / "etcd"), extra_args=["--quota-backend-bytes", str(QUOTA_BYTES)])
    proc.start()
    yield proc
    proc.stop()


async def fill(client: EtcdClient) -> int:
    """Write 512 KiB values until etcd refuses one for space; how many it took. etcd checks its quota against the
    database file's size, which grows when its backend commits (every 100 ms by default): the writes give it time
    to, and go on well past the quota before the test gives up."""
    written = 0
    with pytest.raises(EtcdSpaceExceededError):
        for i in range(16 * QUOTA_BYTES // (512 << 10)):
            await client.put(b"/filler/%d" % i, b"x" * (512 << 10))
            written += 1
            await asyncio.sleep(0.05)
    return written


def etcdctl(endpoint: str, *args: str) -> str:
    binary = os.path.join(os.path.dirname(etcd_binary()), "etcdctl")
    done = subprocess.run([binary, "--endpoints", endpoint, *args], capture_output=True, text=True, timeout=60,
                          check=True)
    return done.stdout


async def test_a_full_etcd_fails_creation_with_a_typed_error_that_says_what_to_do(
        full_etcd: EtcdProcess, tmp_path: Path) -> None:
    with LocalCluster(str(tmp_path / "c"), bookies=1, etcd_endpoint=full_etcd.endpoint) as cluster:
        async with Client(cluster.etcd_endpoint, options=FAST) as client, EtcdClient(full_etcd.endpoint) as etcd:
            writer = await client.create_ledger(1, 1, 1, password=b"pw")
            await writer.append(b"before")
            filled = await fill(etcd)
            with pytest.raises(EtcdSpaceExceededError) as caught:
                await client.create_ledger(1, 1, 1, password=b"pw")
            message = str(caught.value)
            assert "database space exceeded" in message and "NOSPACE" in message
            assert "etcdctl defrag" in message and "etcdctl alarm disarm" in message
            await writer.append(b"during")  # adds do not touch etcd: an open ledger still takes entries
            with pytest.raises(EtcdSpaceExceededError):
                await writer.close()  # a close is a write too
            assert "NOSPACE" in (await etcd.status()).alarms

            # cluster status says it first and loudly, with where the recovery steps are; like every unhealthy
            # state it reports, with exit code 0 (the command itself worked).
            status = cluster_status(cluster.etcd_endpoint, "--etcd-quota-bytes", str(QUOTA_BYTES))
            assert status.returncode == 0, status.stderr
            first = status.stdout.splitlines()[0]
            assert first.startswith("!!! etcd REFUSES WRITES: its NOSPACE alarm is raised"), status.stdout
            assert "no ledger can be created" in first and "docs/operations.md#recovering-a-full-etcd-nospace" in first
            assert "etcdctl alarm disarm" in first
            assert "of a 4.0 MiB quota" in status.stdout and "alarms: NOSPACE" in status.stdout
            as_json = cluster_status(cluster.etcd_endpoint, "--json", "--etcd-quota-bytes", str(QUOTA_BYTES))
            health = json.loads(as_json.stdout)["etcd"]
            assert health["alarms"] == ["NOSPACE"] and health["refuses_writes"] is True
            assert health["quota_bytes"] == QUOTA_BYTES and health["quota_source"] == "setting"
            assert health["db_size_ratio"] >= 0.9 and health["db_size_bytes"] >= 0.9 * QUOTA_BYTES
            assert health["problems"][0].startswith("etcd REFUSES WRITES")
            assert health["recovery"] == "docs/operations.md#recovering-a-full-etcd-nospace"

            # What docs/operations.md tells the operator: free space, compact, defragment, disarm.
            for i in range(filled):  # every one: under load etcd takes more before its size check trips
                await etcd.delete(b"/filler/%d" % i)
            revision = await etcd.revision()
            etcdctl(full_etcd.endpoint, "compact", str(revision))
            etcdctl(full_etcd.endpoint, "defrag")
            etcdctl(full_etcd.endpoint, "alarm", "disarm")
            assert (await etcd.status()).alarms == ()
            again = await client.create_ledger(1, 1, 1, password=b"pw")
            await again.append(b"after")
            await again.close()


def cluster_status(endpoint: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "octavo.cli.main", "cluster", "status", "--etcd", endpoint,
                           "--allow-empty", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


async def test_cluster_status_shows_etcds_database_against_its_quota(etcd: EtcdProcess, cluster_name: str) -> None:
    """etcd 3.5 does not report its quota: the status measures against the setting, etcd's default 2 GiB unless
    --etcd-quota-bytes (or $OCTAVO_ETCD_QUOTA_BYTES) says otherwise, and warns near it."""
    as_json = cluster_status(etcd.endpoint, "--json", "--cluster", cluster_name)
    assert as_json.returncode == 0, as_json.stderr
    health = json.loads(as_json.stdout)["etcd"]
    assert health["quota_bytes"] == ETCD_QUOTA_BACKEND_BYTES and health["quota_source"] == "setting"
    assert 0 < health["db_size_in_use_bytes"] <= health["db_size_bytes"]
    assert health["db_size_ratio"] == round(health["db_size_bytes"] / ETCD_QUOTA_BACKEND_BYTES, 4)
    assert health["alarms"] == [] and health["refuses_writes"] is False and health["problems"] == []
    text = cluster_status(etcd.endpoint, "--cluster", cluster_name).stdout
    assert "of a 2048.0 MiB quota (0%; quota from setting)" in text and "alarms: none" in text
    assert "!!!" not in text and "WARNING" not in text

    # A quota the database already fills: a warning before etcd refuses anything.
    size = health["db_size_bytes"]
    near = cluster_status(etcd.endpoint, "--cluster", cluster_name, env={"OCTAVO_ETCD_QUOTA_BYTES": str(size)})
    assert near.returncode == 0, near.stderr
    assert f"of a {size / 2**20:.1f} MiB quota (100%" in near.stdout
    assert "etcd: etcd's database is at 100% of its quota (warning at 80%)" in near.stdout and "!!!" not in near.stdout
    flag = json.loads(cluster_status(etcd.endpoint, "--json", "--cluster", cluster_name, "--etcd-quota-bytes",
                                     str(size * 4)).stdout)["etcd"]
    assert flag["quota_bytes"] == size * 4 and flag["problems"] == []
    bad = cluster_status(etcd.endpoint, "--cluster", cluster_name, env={"OCTAVO_ETCD_QUOTA_BYTES": "lots"})
    assert bad.returncode == 2 and "OCTAVO_ETCD_QUOTA_BYTES" in bad.stderr


async def compacted_revision(endpoint: str) -> int:
    """The revision etcd compacted to (0: never compacted), from what it answers a read at revision 1."""
    import grpc
    from aetcd import rpc

    async with grpc.aio.insecure_channel(endpoint) as channel:
        try:
            await rpc.KVStub(channel).Range(rpc.RangeRequest(key=b"/", revision=1), timeout=5)
        except grpc.aio.AioRpcError as e:
            if "compacted" in (e.details() or ""):
                status = await rpc.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=5)
                return int(status.header.revision)  # bounded below by the compaction; > 0 is what is checked
            raise
    return 0


async def wait_for(predicate: object, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.2)


async def test_a_bookie_drops_deleted_ledgers_across_compactions_and_a_compacted_watch(tmp_path: Path) -> None:
    """A bookie whose auditor compacts etcd every second drops the ledgers deleted meanwhile through its watch;
    and when its watch was away while etcd restarted and its history was compacted past the watch's position,
    it starts again from now and finds the deletes of the gap by a scan (GC is an hour away: only that path can
    drop them)."""
    args = ["--etcd-compaction-interval-s", "1", "--gc-interval-ms", "3600000", "--metrics-port", "0"]
    with LocalCluster(str(tmp_path), bookies=1, bookie_args=args) as cluster:
        bookie = cluster.bookies["bookie-0"]
        etcd_process = cluster.etcd
        assert etcd_process is not None

        async def ledger_count() -> int:
            from octavo.node.testing import BookieConnection

            with BookieConnection(bookie.address) as conn:
                return int(conn.status().ledger_count)

        async with Client(cluster.etcd_endpoint, options=FAST) as client:
            ids = []
            for _ in range(30):
                writer = await client.create_ledger(1, 1, 1, password=b"pw")
                await writer.append(b"x")
                await writer.close()
                ids.append(writer.ledger_id)
            assert await ledger_count() == 30
            # The auditor compacts while ledgers are deleted: the live watch sees every delete.
            for lid in ids[:10]:
                await client.delete_ledger(lid)
                await asyncio.sleep(0.3)
            await wait_for(lambda: compacted_revision(cluster.etcd_endpoint))
            await wait_for(lambda: _equals(ledger_count, 20))
            with urllib.request.urlopen(f"http://{bookie.metrics_address}/metrics", timeout=10) as r:
                metrics = r.read().decode()
            compactions = [float(line.split()[-1]) for line in metrics.splitlines()
                           if line.startswith("octavo_bookie_etcd_compactions_total")]
            assert compactions and compactions[0] >= 1, metrics[-2000:]

            # The watch away (the bookie paused) while etcd restarts, ledgers are deleted and that history is
            # compacted.
            assert bookie.proc is not None
            bookie.proc.send_signal(signal.SIGSTOP)
            try:
                etcd_process.stop(kill=True)
                etcd_process.start()
                for lid in ids[10:20]:
                    await client.delete_ledger(lid)
                async with EtcdClient(cluster.etcd_endpoint) as etcd:
                    await etcd.put(b"/elsewhere", b"v")  # compact past the last delete
                    assert await etcd.compact(await etcd.revision())
            finally:
                bookie.proc.send_signal(signal.SIGCONT)
            await wait_for(lambda: _equals(ledger_count, 10))
            assert "compacted its history past this watch's start" in Path(bookie.log_path).read_text()
            for lid in ids[20:]:  # the ledgers not deleted are still there and readable
                reader = await client.open_ledger(lid, password=b"pw")
                assert [e.data async for e in reader.read(0, 0)] == [b"x"]


async def _equals(value: object, expected: int) -> bool:
    return await value() == expected  # type: ignore[operator]


def test_local_etcd_runs_with_an_explicit_quota(etcd: EtcdProcess) -> None:
    """`octavo dev up` and the tests' etcd: ETCD_QUOTA_BACKEND_BYTES, as etcd itself reports it."""
    with urllib.request.urlopen(f"http://{etcd.endpoint}/metrics", timeout=10) as r:
        quota = [float(line.split()[-1]) for line in r.read().decode().splitlines()
                 if line.startswith("etcd_server_quota_backend_bytes ")]
    assert quota == [float(ETCD_QUOTA_BACKEND_BYTES)]
    assert etcd.proc is not None  # given, not etcd's default that happens to be the same
    args = Path(f"/proc/{etcd.proc.pid}/cmdline").read_bytes().split(b"\0")
    assert args[args.index(b"--quota-backend-bytes") + 1] == str(ETCD_QUOTA_BACKEND_BYTES).encode()
    assert not any(a.startswith(b"--auto-compaction") for a in args)  # the auditor compacts


async def test_a_watch_whose_channel_is_closed_ends_with_metadata_unavailable(etcd: EtcdProcess) -> None:
    """Found in review: grpc.aio cancels a call itself when its channel is closed (the client closing it, or a
    failover to another endpoint closing the old one), and the watch handed its caller a CancelledError, which
    ended the bookie's self-healing watch task for good instead of making it watch again."""
    from octavo.meta.errors import MetadataUnavailableError
    from octavo.meta.keyrange import WatchRange

    client = EtcdClient(etcd.endpoint)
    watch = client.watch_changes([WatchRange.prefix(b"/closed-channel/")])
    assert await asyncio.wait_for(watch.__anext__(), 10) == []  # established
    pending = asyncio.ensure_future(watch.__anext__())
    await asyncio.sleep(0.1)
    await client.close()
    with pytest.raises(MetadataUnavailableError, match=r"channel was closed|etcd watch"):
        await asyncio.wait_for(pending, 10)
