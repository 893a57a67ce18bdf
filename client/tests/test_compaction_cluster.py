"""Compaction on a real bookie process in a real cluster, killed with SIGKILL at each phase boundary.

One bookie (ensembles of one), ledgers written through the client and deleted in etcd; GC drops them, so the
bookie's logs are mostly dead; then a compaction started over the admin API dies at a named fault point.
After each restart every live entry must read back byte-identical, no compaction file may be left over, and
the logs may not grow over repeated crashes; a last clean pass finishes the job.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from octavo.cli.clustertesting import SHORT_TIMEOUTS
from octavo.cli.localcluster import EtcdProcess
from octavo.client import SyncClient
from octavo.node import faults
from octavo.node.faults import FAULT_POINTS_ENV
from octavo.node.files import COMPACTED_SUFFIX, COMPACTING_SUFFIX, LOGS_DIR
from octavo.node.testing import BookieConnection, BookieProcess
from octavo.v1 import bookie_pb2 as pb

PW = b"pw"
FAST = SHORT_TIMEOUTS
ENTRY = 1000


def payload(ledger: int, entry: int) -> bytes:
    head = b"%d/%d:" % (ledger, entry)
    return head + bytes((ledger * 31 + entry + i) % 251 for i in range(ENTRY - len(head)))


def bookie_args(etcd: EtcdProcess, cluster: str) -> list[str]:
    return ["--etcd", etcd.endpoint, "--cluster", cluster, "--bookie-id", "solo", "--registration-ttl-s", "3",
            "--log-size-bytes-max", str(256 * 1024), "--batch-bytes-max", str(128 * 1024),
            "--entry-size-bytes-max", str(64 * 1024),
            "--gc-interval-ms", "3600000", "--compaction-rate-bytes-per-s", "0",
            "--compaction-minor-interval-ms", "3600000", "--compaction-major-interval-ms", "3600000"]


def log_files(data_dir: str) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in Path(data_dir, LOGS_DIR).iterdir()}


def write_interleaved(client: SyncClient, ledgers: int, rounds: int) -> list[tuple[int, int]]:
    """Ledgers written in turns of 20 entries, so every log holds some of each; returns (id, entries)."""
    handles = [client.create_ledger(1, 1, 1, password=PW) for _ in range(ledgers)]
    for r in range(rounds):
        for h in handles:
            h.append_many([payload(h.ledger_id, e) for e in range(r * 20, (r + 1) * 20)])
    for h in handles:
        h.close()
    return [(h.ledger_id, rounds * 20) for h in handles]


def check_entries(address: str, ledger: int, count: int) -> None:
    with BookieConnection(address) as conn:
        got = conn.read_all(ledger, 0, count - 1)
    assert sorted(got) == list(range(count))
    for entry, (code, data) in got.items():
        assert code == pb.OK and data == payload(ledger, entry), (ledger, entry)


def compact(address: str) -> pb.CompactionRun | None:
    """Run a major pass; None if the bookie died during it."""
    with BookieConnection(address) as conn:
        try:
            for update in conn.admin.RunCompaction(pb.RunCompactionRequest(major=True), timeout=120):
                if update.done:
                    return update.report
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            return None
    raise AssertionError("the stream ended without a report")


@pytest.mark.parametrize("point", faults.COMPACTION_POINTS)
def test_sigkill_at_each_compaction_phase(etcd: EtcdProcess, cluster_name: str, tmp_path: Path, point: str) -> None:
    data_dir = str(tmp_path / "bookie")
    args = bookie_args(etcd, cluster_name)
    bookie = BookieProcess(data_dir, args)
    bookie.start()
    try:
        with SyncClient(etcd.endpoint, cluster=cluster_name, options=FAST) as client:
            written = write_interleaved(client, 4, 30)
            (kept, count), *doomed = written
            for ledger, _ in doomed:
                client.delete_ledger(ledger)
        with BookieConnection(bookie.address) as conn:
            conn.admin.RunGc(pb.RunGcRequest(), timeout=60)  # drops what the watch has not dropped yet
            assert conn.status().ledger_count == 1
        bookie.stop()
        clean_size = None
        for attempt in range(3):  # the same crash again and again: nothing may pile up
            bookie = BookieProcess(data_dir, args, env={FAULT_POINTS_ENV: point})
            bookie.start()
            report = compact(bookie.address)
            if report is not None:  # the job was finished by an earlier restart: the point is never reached
                assert attempt > 0 and report.logs_compacted == 0 and not report.error
                bookie.stop()
                break
            assert bookie.kill() == -signal.SIGKILL
            bookie = BookieProcess(data_dir, args)
            bookie.start()  # startup rolls the compaction back or finishes it
            names = log_files(data_dir)
            assert not [n for n in names if n.endswith((COMPACTING_SUFFIX, COMPACTED_SUFFIX))], names
            check_entries(bookie.address, kept, count)
            size = sum(names.values())
            clean_size = size if clean_size is None else clean_size
            assert size <= clean_size + 256 * 1024 + 4096, (attempt, size, clean_size)
            bookie.stop()
        bookie = BookieProcess(data_dir, args)
        bookie.start()
        report = compact(bookie.address)  # the next pass finishes the job
        assert report is not None and not report.error
        with BookieConnection(bookie.address) as conn:
            status = conn.status()
        assert status.log_live_bytes >= 0.9 * status.log_total_bytes, status
        assert status.log_total_bytes < 0.5 * count * ENTRY * len(written)
        check_entries(bookie.address, kept, count)
    finally:
        bookie.stop()


def test_compaction_controls_over_the_cli(etcd: EtcdProcess, cluster_name: str, tmp_path: Path) -> None:
    data_dir = str(tmp_path / "bookie")
    args = bookie_args(etcd, cluster_name)
    bookie = BookieProcess(data_dir, args)
    address = bookie.start()

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "octavo.cli.main", "bookie", *argv, "--bookie", address],
                              capture_output=True, text=True, timeout=120)

    try:
        with SyncClient(etcd.endpoint, cluster=cluster_name, options=FAST) as client:
            (kept, count), *doomed = write_interleaved(client, 3, 30)
            for ledger, _ in doomed:
                client.delete_ledger(ledger)
        assert cli("gc").returncode == 0
        out = cli("compaction", "suspend", "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["suspended"] is True
        out = cli("compact", "--major")
        assert out.returncode == 1 and "suspended" in out.stderr
        bookie.stop()
        address = bookie.start()  # the suspend survives a restart
        out = cli("status", "--json")
        assert json.loads(out.stdout)["compaction"]["suspended"] is True
        assert cli("compaction", "resume").returncode == 0
        out = cli("compaction", "window", "--for", "2h", "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["window_until_unix_ms"] > 0
        out = cli("compaction", "window", "--for", "soon")
        assert out.returncode == 2 and "positive duration" in out.stderr
        out = cli("compact", "--major", "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert report["kind"] == "major" and report["logs_compacted"] > 0 and report["bytes_reclaimed"] > 0
        out = cli("status")
        assert out.returncode == 0 and "last pass major" in out.stdout and "live" in out.stdout
        check_entries(address, kept, count)
        out = cli("readonly", "--json")
        assert out.returncode == 0 and json.loads(out.stdout)["mode"] == "MODE_READ_ONLY"
        with BookieConnection(address) as conn:
            refused = conn.add(kept, b"any", [count], [b"x"])
        assert refused.results[0].codes[0] == pb.READ_ONLY and "forced" in refused.results[0].message
        bookie.stop()
        address = bookie.start()  # the forced mode survives a restart
        out = cli("status")
        mode = next(line for line in out.stdout.splitlines() if line.startswith("mode"))
        assert mode.split(None, 1)[1].startswith("read-only: forced by `octavo bookie readonly`"), mode  # said once
        out = cli("writable")
        assert out.returncode == 0 and out.stdout.startswith("writable")
    finally:
        bookie.stop()


def test_a_deleted_ledger_is_dropped_at_once_through_the_watch(etcd: EtcdProcess, cluster_name: str,
                                                               tmp_path: Path) -> None:
    bookie = BookieProcess(str(tmp_path / "bookie"), bookie_args(etcd, cluster_name))  # GC runs hourly here
    address = bookie.start()
    try:
        with SyncClient(etcd.endpoint, cluster=cluster_name, options=FAST) as client:
            (kept, count), (doomed, _) = write_interleaved(client, 2, 5)
            with BookieConnection(address) as conn:
                assert conn.status().ledger_count == 2
                client.delete_ledger(doomed)
                deadline = time.monotonic() + 10
                while conn.status().ledger_count != 1:
                    assert time.monotonic() < deadline, "the deletion was not seen through the watch"
                    time.sleep(0.05)
                assert conn.status().gc_last_run_unix_ms == 0  # no GC pass did it
                missing = conn.read(doomed, 0, 0)
                assert missing.error == pb.NO_SUCH_LEDGER
        check_entries(address, kept, count)
    finally:
        bookie.stop()


def test_a_window_that_opens_starts_a_pass_at_once_and_a_closed_one_holds_it(etcd: EtcdProcess, cluster_name: str,
                                                                               tmp_path: Path) -> None:
    """What the operator relies on: a window set in the past closes scheduled compaction (nothing runs, however
    much is dead); a window that opens starts a pass within seconds, though the next scheduled pass is an hour
    away (minor and major intervals of one hour here)."""
    bookie = BookieProcess(str(tmp_path / "bookie"), bookie_args(etcd, cluster_name))
    address = bookie.start()
    try:
        with SyncClient(etcd.endpoint, cluster=cluster_name, options=FAST) as client:
            (kept, count), *doomed = write_interleaved(client, 6, 20)  # 1/6 live: below the minor threshold
            for ledger, _ in doomed:
                client.delete_ledger(ledger)
        with BookieConnection(address) as conn:
            conn.admin.RunGc(pb.RunGcRequest(), timeout=60)
            closed = conn.admin.SetCompactionWindow(
                pb.SetCompactionWindowRequest(until_unix_ms=int(time.time() * 1000) - 1000), timeout=10)
            assert closed.blocked_reason == "the compaction window closed"
            time.sleep(3)
            assert conn.status().compaction.last_run.finished_unix_ms == 0, "a pass ran in a closed window"
            opened_ms = int(time.time() * 1000)
            conn.admin.SetCompactionWindow(pb.SetCompactionWindowRequest(until_unix_ms=opened_ms + 600_000),
                                           timeout=10)
            deadline = time.monotonic() + 20
            while conn.status().compaction.last_run.finished_unix_ms < opened_ms:
                assert time.monotonic() < deadline, "no pass within 20 s of the window opening"
                time.sleep(0.2)
            run = conn.status().compaction.last_run
            assert run.kind == "minor" and run.logs_compacted > 0
        check_entries(address, kept, count)
    finally:
        bookie.stop()
