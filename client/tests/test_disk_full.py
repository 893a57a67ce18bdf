"""A disk that really fills: one bookie of a real cluster runs on a small tmpfs, taken past its high-water mark
under an add load.

The tmpfs is mounted in a private mount namespace (`unshare --mount --map-root-user`), so the test needs no
root and leaves nothing mounted. Where the machine does not allow that, the same scenario runs against the
bookie's documented capacity override (disk_capacity_bytes) instead, and the ENOSPC test is skipped: the
test output says which one ran.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.clustertesting import SHORT_TIMEOUTS, wait_until
from octavo.cli.localcluster import EtcdProcess
from octavo.client import SyncClient
from octavo.node.testing import BookieConnection, BookieProcess
from octavo.v1 import bookie_pb2 as pb

PW = b"pw"
FAST = SHORT_TIMEOUTS
MIB = 1024 * 1024
ENTRY = 16 * 1024
SMALL_DISK_MIB = 96


def _tmpfs_works(tmp: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    target = tmp / "probe"
    target.mkdir(exist_ok=True)
    probe = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c",
                            f"mount -t tmpfs -o size=1m octavo-probe {target}"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory: pytest.TempPathFactory) -> str:
    """'tmpfs' when a private tmpfs can be mounted here, else 'capacity override'."""
    kind = "tmpfs" if _tmpfs_works(tmp_path_factory.mktemp("probe")) else "capacity override"
    print(f"\ndisk-full tests run on: {kind}")
    return kind


def small_bookie(data_dir: Path, etcd: EtcdProcess, cluster: str, kind: str, size_mib: int,
                 extra: list[str]) -> BookieProcess:
    data_dir.mkdir(parents=True)
    args = ["--etcd", etcd.endpoint, "--cluster", cluster, "--bookie-id", "small", "--registration-ttl-s", "3",
            "--log-size-bytes-max", str(8 * MIB), "--batch-bytes-max", str(4 * MIB),
            "--index-map-size-bytes", str(64 * MIB), "--disk-check-interval-ms", "50",
            "--compaction-rate-bytes-per-s", "0", *extra]
    wrapper: list[str] = []
    if kind == "tmpfs":
        wrapper = ["unshare", "--mount", "--map-root-user", "sh", "-c",
                   f'mount -t tmpfs -o size={size_mib}m octavo-small "{data_dir}" && exec "$@"', "sh"]
    else:
        args += ["--disk-capacity-bytes", str(size_mib * MIB)]
    return BookieProcess(str(data_dir), args, wrapper=wrapper)


@pytest.fixture
def peers(etcd: EtcdProcess, cluster_name: str, tmp_path: Path) -> Iterator[list[BookieProcess]]:
    """Two ordinary bookies, and a spare (not started) for the writers to move to."""
    procs = [BookieProcess(str(tmp_path / f"peer{i}"), ["--etcd", etcd.endpoint, "--cluster", cluster_name,
                                                        "--bookie-id", f"peer{i}", "--registration-ttl-s", "3"])
             for i in range(3)]
    for p in procs[:2]:
        p.start()
    yield procs
    for p in procs:
        p.stop()


def entry(ledger: int, i: int) -> bytes:
    head = b"%d/%d;" % (ledger, i)
    return head + bytes([i % 256]) * (ENTRY - len(head))


def status(address: str) -> pb.BookieStatus:
    with BookieConnection(address) as conn:
        return conn.status()


def read_back(client: SyncClient, ledger: int, count: int) -> None:
    reader = client.open_ledger(ledger, password=PW, recovery=False)
    got = [(e.entry_id, e.data) for e in reader.read(0, count - 1)]
    assert [i for i, _ in got] == list(range(count))
    assert all(data == entry(ledger, i) for i, data in got)


def test_a_filling_disk_turns_the_bookie_read_only_and_compaction_brings_it_back(
        etcd: EtcdProcess, cluster_name: str, tmp_path: Path, peers: list[BookieProcess], small_disk: str) -> None:
    small = small_bookie(tmp_path / "small", etcd, cluster_name, small_disk, SMALL_DISK_MIB,
                         ["--disk-warn-ratio", "0.6", "--disk-readonly-ratio", "0.8", "--disk-writable-ratio", "0.5"])
    address = small.start()
    try:
        with SyncClient(etcd.endpoint, cluster=cluster_name, options=FAST) as client:
            big = client.create_ledger(3, 3, 2, password=PW)  # three bookies registered: both use the small one
            keep = client.create_ledger(3, 3, 2, password=PW)
            assert "small" in big.metadata.ensembles[0][1] and "small" in keep.metadata.ensembles[0][1]
            peers[2].start()  # the spare the writers move to
            counts = {big.ledger_id: 0, keep.ledger_id: 0}

            def write_round() -> None:
                for handle, n in ((big, 64), (keep, 8)):  # every log gets some of both ledgers
                    first = counts[handle.ledger_id]
                    handle.append_many([entry(handle.ledger_id, i) for i in range(first, first + n)])
                    counts[handle.ledger_id] = first + n

            deadline = time.monotonic() + 120
            while status(address).mode != pb.MODE_READ_ONLY:
                assert time.monotonic() < deadline, "the small bookie never turned read-only"
                write_round()
            st = status(address)
            assert "disk of" in st.mode_reason, st.mode_reason  # the watermark, not an ENOSPC
            for _ in range(8):  # the writers go on elsewhere
                write_round()
            big.close()
            keep.close()
            for handle in (big, keep):
                assert "small" not in handle.metadata.ensembles[-1][1], handle.metadata.ensembles
            wait_until("the read-only registration", lambda: client.bookies()["small"].readonly)
            for lid, n in counts.items():
                read_back(client, lid, n)  # every acknowledged entry, byte-identical
            log = Path(small.log_path).read_text(errors="replace")
            assert "No space left on device" not in log
            client.delete_ledger(big.ledger_id)
            with BookieConnection(address) as conn:
                conn.admin.RunGc(pb.RunGcRequest(), timeout=60)
                assert conn.status().ledger_count == 1
                assert conn.status().mode == pb.MODE_READ_ONLY  # every log still holds some of `keep`
                report = None
                for update in conn.admin.RunCompaction(pb.RunCompactionRequest(major=True), timeout=120):
                    report = update.report if update.done else None
                assert report is not None and report.logs_compacted > 0 and not report.error
            wait_until("writable again below the low mark", lambda: status(address).mode == pb.MODE_WRITABLE)
            wait_until("the writable registration", lambda: not client.bookies()["small"].readonly)
            read_back(client, keep.ledger_id, counts[keep.ledger_id])
    finally:
        small.stop()


def test_enospc_on_an_add_turns_the_bookie_read_only_at_once(
        etcd: EtcdProcess, cluster_name: str, tmp_path: Path, peers: list[BookieProcess], small_disk: str) -> None:
    if small_disk != "tmpfs":
        pytest.skip("needs a real small filesystem (a private tmpfs mount is not allowed here) to hit ENOSPC")
    # The high-water mark at 100% can never be crossed first: the disk runs out under the adds.
    small = small_bookie(tmp_path / "small", etcd, cluster_name, "tmpfs", 48,
                         ["--disk-warn-ratio", "0.9", "--disk-readonly-ratio", "1.0", "--disk-writable-ratio", "0.5"])
    address = small.start()
    try:
        with SyncClient(etcd.endpoint, cluster=cluster_name, options=FAST) as client:
            handle = client.create_ledger(3, 3, 2, password=PW)
            assert "small" in handle.metadata.ensembles[0][1]
            peers[2].start()
            n = 0
            deadline = time.monotonic() + 120
            while status(address).mode != pb.MODE_READ_ONLY:
                assert time.monotonic() < deadline, "the small bookie never turned read-only"
                handle.append_many([entry(handle.ledger_id, i) for i in range(n, n + 64)])
                n += 64
            assert "ENOSPC" in status(address).mode_reason
            handle.append_many([entry(handle.ledger_id, i) for i in range(n, n + 64)])
            n += 64
            handle.close()
            assert "small" not in handle.metadata.ensembles[-1][1]
            read_back(client, handle.ledger_id, n)
    finally:
        small.stop()
