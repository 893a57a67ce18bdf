"""Failures on a real local cluster: bookies killed mid-write, two writers, recovery in every awkward state,
a bookie that lost its unsynced tail in a "power loss", etcd stopped."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from octavo.cli.localcluster import LocalCluster
from octavo.client import (
    Client,
    ClientOptions,
    LedgerFencedError,
    MetadataUnavailableError,
    RecoveryError,
    WriteHandle,
)
from octavo.meta.etcd import CALL_TIMEOUT_S
from octavo.meta.ledger_metadata import CLOSED, master_key, write_set
from octavo.node.files import LOGS_DIR
from octavo.node.startup import BOOT_ID_ENV
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

PW = b"pw"
FAST = ClientOptions(add_timeout_s=5.0, read_timeout_s=3.0, speculative_read_delay_s=0.1, bookie_list_ttl_s=0.2,
                     metadata_timeout_s=2.0)
BOOKIE_ARGS = ["--log-size-bytes-max", str(16 << 20), "--batch-bytes-max", str(8 << 20)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("cluster")), bookies=5, bookie_args=BOOKIE_ARGS) as c:
        yield c


@pytest.fixture(autouse=True)
def all_bookies_up(cluster: LocalCluster) -> Iterator[None]:
    """Each test starts (and leaves the next one) with every bookie serving, same ids, same data."""
    yield
    for bookie_id, bookie in cluster.bookies.items():
        bookie.env = {}
        bookie.args = cluster._args(bookie_id)
        if not bookie.alive():
            bookie.start()


def data(ledger: int, entry: int) -> bytes:
    return f"ledger {ledger} entry {entry} ".encode() * 10


async def quiet(writer: WriteHandle, timeout_s: float = 10) -> None:
    """Wait until every bookie has answered the writer (not only the ack quorum)."""
    deadline = time.monotonic() + timeout_s
    while writer.outstanding_requests:
        assert time.monotonic() < deadline, "the writer's requests were never all answered"
        await asyncio.sleep(0.01)


async def read_back(client: Client, ledger: int) -> list[bytes]:
    reader = await client.open_ledger(ledger, password=PW)
    return [e.data async for e in reader.read(0, reader.last_entry_id)] if reader.last_entry_id >= 0 else []


async def test_bookie_sigkilled_mid_write_loses_nothing(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        victim = writer.metadata.last_ensemble[1]
        appends = []
        for i in range(6000):
            appends.append(asyncio.ensure_future(writer.append(data(writer.ledger_id, i))))
            if i % 200 == 0:
                await asyncio.sleep(0.001)
            if i == 2000:
                cluster.bookies[victim].kill()
        ids = await asyncio.gather(*appends)
        assert ids == list(range(6000))
        assert writer.ensemble_changes >= 1 and victim not in writer.metadata.last_ensemble
        assert len(writer.metadata.ensembles) >= 2
        await writer.close()
        assert await read_back(client, writer.ledger_id) == [data(writer.ledger_id, i) for i in range(6000)]


async def test_a_hung_bookie_is_replaced_after_the_add_timeout(cluster: LocalCluster) -> None:
    """A bookie that stops answering (SIGSTOP: its connection stays open) holds up a Qa = Qw ledger until its
    oldest unanswered request is add_timeout_s old; then its stream fails, the ensemble changes, and every
    append is acknowledged on the replacement."""
    options = ClientOptions(add_timeout_s=1.5, read_timeout_s=3.0, speculative_read_delay_s=0.1,
                            bookie_list_ttl_s=0.2, metadata_timeout_s=2.0)
    async with Client(cluster.etcd_endpoint, options=options) as client:
        writer = await client.create_ledger(3, 3, 3, password=PW)
        assert await writer.append_many([data(writer.ledger_id, i) for i in range(100)]) == list(range(100))
        victim = writer.metadata.last_ensemble[0]
        proc = cluster.bookies[victim].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            ids = await asyncio.wait_for(
                writer.append_many([data(writer.ledger_id, i) for i in range(100, 400)]), timeout=30)
            waited = time.monotonic() - started
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert ids == list(range(100, 400))
        assert waited >= 1.0, "acknowledged by all three while one was stopped?"
        assert writer.ensemble_changes >= 1 and victim not in writer.metadata.last_ensemble
        await writer.close()
        assert await read_back(client, writer.ledger_id) == [data(writer.ledger_id, i) for i in range(400)]


@pytest.mark.parametrize("delay_ms", [0, 5, 20])
async def test_close_right_after_a_bookie_dies_closes_the_ledger(cluster: LocalCluster, delay_ms: int) -> None:
    """The last entries are acknowledged by the ack quorum, then a bookie of the ensemble dies: its unanswered
    requests start an ensemble change that races the close. The close must land on top of the change (it
    once lost its CAS to it and reported a recovery open)."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        victim = writer.metadata.last_ensemble[2]
        pending = [asyncio.ensure_future(writer.append(data(writer.ledger_id, i))) for i in range(300)]
        await asyncio.sleep(delay_ms / 1000)
        cluster.bookies[victim].kill()
        assert await asyncio.gather(*pending) == list(range(300))
        await writer.close()
        meta = await client.ledger_metadata(writer.ledger_id)
        assert meta.state == "CLOSED" and meta.last_entry_id == 299
        assert await read_back(client, writer.ledger_id) == [data(writer.ledger_id, i) for i in range(300)]


async def test_striped_ledger_survives_a_killed_bookie(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(4, 2, 2, password=PW)
        first = await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(500)))
        cluster.bookies[writer.metadata.last_ensemble[0]].kill()
        rest = await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(500, 1000)))
        assert list(first) + list(rest) == list(range(1000))
        await writer.close()
        # entries of the first segment that lived on the dead bookie are read from their other replica
        assert await read_back(client, writer.ledger_id) == [data(writer.ledger_id, i) for i in range(1000)]


@pytest.mark.parametrize("round_no", range(12))
async def test_first_writer_cannot_commit_after_second_closes(cluster: LocalCluster, round_no: int) -> None:
    """BookKeeper's testFirstWriterCannotCommitWriteAfter2ndWriterCloses, at a random moment each round."""
    rng = random.Random(round_no)
    async with Client(cluster.etcd_endpoint, options=FAST) as first, \
            Client(cluster.etcd_endpoint, options=FAST) as second:
        writer = await first.create_ledger(*rng.choice([(3, 3, 2), (3, 2, 2), (5, 3, 2)]), password=PW)
        acked: list[int] = []
        stop = asyncio.Event()

        async def keep_writing() -> None:
            i = 0
            while not stop.is_set():
                batch = [asyncio.ensure_future(writer.append(data(writer.ledger_id, i + k))) for k in range(20)]
                i += 20
                for done in await asyncio.gather(*batch, return_exceptions=True):
                    if isinstance(done, LedgerFencedError):
                        return
                    assert not isinstance(done, BaseException), done
                    acked.append(done)

        task = asyncio.create_task(keep_writing())
        await asyncio.sleep(rng.uniform(0.01, 0.3))
        acked_before = len(acked)
        reader = await second.open_ledger(writer.ledger_id, password=PW)
        closed_at = reader.last_entry_id
        await asyncio.sleep(0.1)
        stop.set()
        await task
        assert closed_at >= acked_before - 1, "recovery closed short of an entry acknowledged before it began"
        assert all(entry_id <= closed_at for entry_id in acked), (
            f"the first writer got entry {max(acked)} acknowledged after the ledger was closed at {closed_at}")
        with pytest.raises(LedgerFencedError):
            await writer.append(b"never")
        assert await read_back(second, writer.ledger_id) == [data(writer.ledger_id, i) for i in range(closed_at + 1)]


async def test_recovery_finds_tail_entries_present_on_one_bookie_only(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(10)))
        lone = writer.metadata.last_ensemble[2]
        # A writer that crashed after sending entries 10 and 11 to one bookie only.
        with BookieConnection(cluster.bookies[lone].address) as conn:
            resp = conn.add(writer.ledger_id, master_key(PW), [10, 11],
                            [data(writer.ledger_id, 10), data(writer.ledger_id, 11)], last_add_confirmed=9)
            assert list(resp.results[0].codes) == [pb.OK, pb.OK]
        async with Client(cluster.etcd_endpoint, options=FAST) as other:
            reader = await other.open_ledger(writer.ledger_id, password=PW)
            assert reader.last_entry_id == 11
            assert await read_back(other, writer.ledger_id) == [data(writer.ledger_id, i) for i in range(12)]
        for bookie in writer.metadata.last_ensemble:  # re-replicated to the whole write quorum
            with BookieConnection(cluster.bookies[bookie].address) as conn:
                assert conn.read_all(writer.ledger_id, 10, 11)[11] == (pb.OK, data(writer.ledger_id, 11))


async def test_two_recoveries_racing_converge(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(300)))
        clients = [Client(cluster.etcd_endpoint, options=FAST) for _ in range(3)]
        try:
            readers = await asyncio.gather(*(c.open_ledger(writer.ledger_id, password=PW) for c in clients))
        finally:
            await asyncio.gather(*(c.close() for c in clients))
        assert {r.last_entry_id for r in readers} == {299}
        meta = await client.ledger_metadata(writer.ledger_id)
        assert meta.state == CLOSED and meta.last_entry_id == 299


async def test_recovery_while_a_bookie_of_the_last_ensemble_is_down(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(200)))
        cluster.bookies[writer.metadata.last_ensemble[0]].kill()
        async with Client(cluster.etcd_endpoint, options=FAST) as other:
            reader = await other.open_ledger(writer.ledger_id, password=PW)
            assert reader.last_entry_id == 199
            assert await read_back(other, writer.ledger_id) == [data(writer.ledger_id, i) for i in range(200)]


async def test_fenced_bookie_restarted_with_sigkill_still_refuses_the_old_writer(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(20)))
        async with Client(cluster.etcd_endpoint, options=FAST) as other:
            await other.open_ledger(writer.ledger_id, password=PW)
        for bookie_id in writer.metadata.last_ensemble:
            bookie = cluster.bookies[bookie_id]
            bookie.kill()
            bookie.start()
            with BookieConnection(bookie.address) as conn:
                resp = conn.add(writer.ledger_id, master_key(PW), [20], [b"late write"], last_add_confirmed=19)
                assert list(resp.results[0].codes) == [pb.FENCED]
        with pytest.raises(LedgerFencedError):
            await writer.append(b"late write")


def cut_tail(data_dir: str, keep_bytes: int) -> int:
    """Simulate losing the unsynced tail: truncate the newest entry log to `keep_bytes` fewer... returns cut."""
    logs = sorted(p for p in Path(data_dir, LOGS_DIR).iterdir() if p.name.endswith(".log"))
    newest = max((p for p in logs if p.stat().st_size > 32), key=lambda p: p.name)
    size = newest.stat().st_size
    with open(newest, "r+b") as f:
        f.truncate(max(32, size - keep_bytes))
    return size - max(32, size - keep_bytes)


async def test_bookie_that_lost_its_tail_in_a_power_loss(cluster: LocalCluster) -> None:
    """A bookie loses its unsynced tail across a 'reboot': no acknowledged entry is lost cluster-wide, and
    recovery finds the true last entry instead of closing short on that bookie's word."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(100)))
        lost_id, down_id, good_id = writer.metadata.last_ensemble
        # Qa=2 acknowledged each entry; let the third answers arrive too, so the old writer is quiet (an answer
        # lost to the coming SIGKILL would make it change its ensemble, a different scenario).
        await quiet(writer)
        lost = cluster.bookies[lost_id]
        lost.kill()
        assert cut_tail(lost.data_dir, 20 * len(data(writer.ledger_id, 0)) + 500) > 0
        lost.env = {BOOT_ID_ENV: "after-power-loss"}
        lost.args = [*lost.args, "--tail-repair", "false"]  # keep its doubt: the repair is tested below
        lost.start()
        with BookieConnection(lost.address) as conn:
            assert conn.status().tail_maybe_lost
            missing = conn.read_all(writer.ledger_id, 99, 99)[99]
            assert missing[0] in (pb.UNKNOWN, pb.OK)
        # With one bookie of the write quorum down as well, the one bookie that is sure is not enough: recovery
        # must refuse to decide rather than take the lost tail's word for it.
        cluster.bookies[down_id].kill()
        async with Client(cluster.etcd_endpoint, options=FAST) as other:
            assert len((await other.ledger_metadata(writer.ledger_id)).ensembles) == 1
            with pytest.raises(RecoveryError):
                await other.open_ledger(writer.ledger_id, password=PW)
            assert (await other.ledger_metadata(writer.ledger_id)).state != CLOSED
            cluster.bookies[down_id].start()
            reader = await other.open_ledger(writer.ledger_id, password=PW)
            assert reader.last_entry_id == 99
            assert await read_back(other, writer.ledger_id) == [data(writer.ledger_id, i) for i in range(100)]
        assert good_id in writer.metadata.last_ensemble


async def test_bookie_copies_back_the_tail_it_lost(cluster: LocalCluster) -> None:
    """BP-46: a bookie that lost everything unsynced in a 'power loss' takes its entries back from its peers,
    including a whole ledger it no longer knows, and then stops answering UNKNOWN."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        plain = await client.create_ledger(3, 3, 2, password=PW)
        victim = plain.metadata.last_ensemble[0]
        await plain.append_many([data(plain.ledger_id, i) for i in range(300)])
        striped = None
        for _ in range(20):  # a striped ledger that also lives on the victim
            candidate = await client.create_ledger(4, 2, 2, password=PW)
            if victim in candidate.metadata.last_ensemble:
                striped = candidate
                break
            await candidate.close()
        assert striped is not None
        await striped.append_many([data(striped.ledger_id, i) for i in range(200)])
        await plain.close()  # one closed ledger, one still open
        for writer in (plain, striped):
            await quiet(writer)
        bookie = cluster.bookies[victim]
        bookie.kill()
        logs = sorted(p for p in Path(bookie.data_dir, LOGS_DIR).iterdir() if p.name.endswith(".log"))
        for log_path in logs:  # nothing was flushed yet: losing the unsynced tail loses everything
            with open(log_path, "r+b") as f:
                f.truncate(32)
        bookie.env = {BOOT_ID_ENV: "after-a-second-power-loss"}
        bookie.start()
        with BookieConnection(bookie.address) as conn:
            deadline = time.monotonic() + 30
            while conn.status().tail_maybe_lost:
                assert time.monotonic() < deadline, "the tail repair did not finish"
                time.sleep(0.1)
            got = conn.read_all(plain.ledger_id, 0, 299)
            assert all(got[e] == (pb.OK, data(plain.ledger_id, e)) for e in range(300))
            position = striped.metadata.last_ensemble.index(victim)
            mine = [e for e in range(200) if position in write_set(e, 4, 2)]
            assert mine
            for e in mine:
                assert conn.read_all(striped.ledger_id, e, e)[e] == (pb.OK, data(striped.ledger_id, e))
        await striped.close()


async def test_tail_repair_waits_for_every_peer_of_an_open_ledger(cluster: LocalCluster) -> None:
    """An open ledger E3 Qw2 Qa2 on (alive, victim, other): entry 0 on alive and victim, entry 1 on victim and
    other, both acknowledged (the LAC the bookies know is still -1). The victim loses its unsynced tail in a power
    loss, and `other` is down when it starts again. Its tail repair must not take alive's answer (last entry 0)
    for the ledger's end: entry 1 would never be restored, the victim would stop answering UNKNOWN, and a
    recovery open would take its "no such entry" as the denial that closes the ledger before acknowledged entry
    1 (found by the simulation, seed 2600299). It waits for `other`, then restores both entries."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 2, 2, password=PW)  # its handle stays idle: adds go directly
        ledger = writer.ledger_id
        alive_id, victim_id, other_id = writer.metadata.last_ensemble
        key = master_key(PW)
        for entry, bookies in ((0, (alive_id, victim_id)), (1, (victim_id, other_id))):
            assert [b for b in writer.metadata.last_ensemble
                    if writer.metadata.last_ensemble.index(b) in write_set(entry, 3, 2)] == sorted(
                bookies, key=writer.metadata.last_ensemble.index)
            for bookie_id in bookies:
                with BookieConnection(cluster.bookies[bookie_id].address) as conn:
                    assert list(conn.add(ledger, key, [entry], [data(ledger, entry)]).results[0].codes) == [pb.OK]
        victim, other = cluster.bookies[victim_id], cluster.bookies[other_id]
        victim.kill()
        for log_path in (p for p in Path(victim.data_dir, LOGS_DIR).iterdir() if p.name.endswith(".log")):
            with open(log_path, "r+b") as f:  # nothing was flushed yet: the power loss takes every entry
                f.truncate(32)
        victim.env = {BOOT_ID_ENV: "after-a-power-loss-with-a-peer-down"}
        other.kill()
        victim.start()
        with BookieConnection(victim.address) as conn:
            time.sleep(4)  # the repair's first attempts, with `other` down
            assert conn.status().tail_maybe_lost, "the tail repair ended without hearing from every peer"
            assert conn.read_all(ledger, 1, 1)[1][0] == pb.UNKNOWN
            other.start()
            deadline = time.monotonic() + 60
            while conn.status().tail_maybe_lost:
                assert time.monotonic() < deadline, "the tail repair did not finish once every peer was back"
                time.sleep(0.2)
            got = conn.read_all(ledger, 0, 1)
            assert got == {0: (pb.OK, data(ledger, 0)), 1: (pb.OK, data(ledger, 1))}
        async with Client(cluster.etcd_endpoint, options=FAST) as other_client:
            reader = await other_client.open_ledger(ledger, password=PW)
            assert reader.last_entry_id == 1


def test_the_lac_stands_still_while_an_ensemble_change_is_in_flight(tmp_path: Path) -> None:
    """A bookie dies while etcd is down, so the ensemble change cannot land: the two live bookies still store
    every new entry, but none is acknowledged until the new segment is in etcd, and then every entry of the
    new segment is on the replacement too (an entry acknowledged during the change would otherwise belong to
    the new segment with no copy on the replacement)."""
    async def scenario(cluster: LocalCluster) -> None:
        async with Client(cluster.etcd_endpoint, options=FAST) as client:
            writer = await client.create_ledger(3, 3, 2, password=PW)
            ledger = writer.ledger_id
            assert await writer.append_many([data(ledger, i) for i in range(50)]) == list(range(50))
            victim = writer.metadata.last_ensemble[0]
            assert cluster.etcd is not None
            cluster.etcd.stop()
            cluster.bookies[victim].kill()
            pending = [asyncio.ensure_future(writer.append(data(ledger, i))) for i in range(50, 150)]
            deadline = time.monotonic() + 20
            while not writer.changing_ensemble:
                assert time.monotonic() < deadline, "the dead bookie was never noticed"
                await asyncio.sleep(0.01)
            lac = writer.last_add_confirmed
            more = [asyncio.ensure_future(writer.append(data(ledger, i))) for i in range(150, 200)]
            await asyncio.sleep(1.5)
            assert writer.changing_ensemble and writer.last_add_confirmed == lac
            assert not any(f.done() for f in more)
            cluster.etcd.start()
            ids = await asyncio.wait_for(asyncio.gather(*pending, *more), timeout=60)
            assert list(ids) == list(range(50, 200))
            first, ensemble = writer.metadata.ensembles[-1]
            assert first == lac + 1 and victim not in ensemble
            (replacement,) = set(ensemble) - set(writer.metadata.ensembles[0][1])
            await quiet(writer)  # Qa answers acknowledged the entries; wait for the replacement's too
            with BookieConnection(cluster.bookies[replacement].address) as conn:
                assert conn.read_all(ledger, first, 199) == {e: (pb.OK, data(ledger, e)) for e in range(first, 200)}
            await writer.close()
            assert await read_back(client, ledger) == [data(ledger, i) for i in range(200)]

    with LocalCluster(str(tmp_path / "c"), bookies=4, bookie_args=BOOKIE_ARGS) as cluster:
        asyncio.run(scenario(cluster))


def test_a_first_add_waits_out_an_etcd_outage_on_the_same_bookies(tmp_path: Path) -> None:
    """A writer's first adds reach bookies new to its ledger while etcd is frozen for longer than the bookies'
    etcd read resends (CALL_TIMEOUT_S): they cannot check the ledger, refuse UNAVAILABLE, and the writer sends
    the adds to the same bookies again (resends.py) instead of replacing healthy bookies. Once etcd is back the
    adds are acknowledged by the ensemble the ledger was created with, and every entry reads back."""
    options = dataclasses.replace(FAST, add_timeout_s=30.0)

    async def scenario(cluster: LocalCluster) -> None:
        async with Client(cluster.etcd_endpoint, options=options) as client:
            writer = await client.create_ledger(3, 3, 2, password=PW)
            ledger, ensemble = writer.ledger_id, writer.metadata.last_ensemble
            assert cluster.etcd is not None and cluster.etcd.proc is not None
            pid = cluster.etcd.proc.pid
            os.kill(pid, signal.SIGSTOP)
            try:
                stopped_by = time.monotonic() + 10
                while _process_state(pid) != "T":
                    assert time.monotonic() < stopped_by, "etcd did not stop on SIGSTOP"
                    await asyncio.sleep(0.01)
                first = asyncio.ensure_future(writer.append_many([data(ledger, i) for i in range(20)]))
                await asyncio.sleep(CALL_TIMEOUT_S + 3)  # past the bookies' lookups' own resends
                assert not first.done() and writer.ensemble_changes == 0
            finally:
                os.kill(pid, signal.SIGCONT)
            assert await asyncio.wait_for(first, 30) == list(range(20))
            assert await writer.append_many([data(ledger, i) for i in range(20, 40)]) == list(range(20, 40))
            assert writer.ensemble_changes == 0 and writer.metadata.ensembles == ((0, ensemble),)
            assert writer._resends.sent > 0, "no bookie refused the adds for the moment: etcd was not missed"
            await quiet(writer)
            for bookie_id in ensemble:  # Qw = E: every bookie of the ensemble has every entry
                with BookieConnection(cluster.bookies[bookie_id].address) as conn:
                    assert conn.read_all(ledger, 0, 39) == {e: (pb.OK, data(ledger, e)) for e in range(40)}
            await writer.close()
            assert (await client.ledger_metadata(ledger)).ensembles == ((0, ensemble),)
            assert await read_back(client, ledger) == [data(ledger, i) for i in range(40)]

    # A registration outlives the freeze: a lapsed one would refuse adds of new ledgers (READ_ONLY) by design.
    with LocalCluster(str(tmp_path / "c"), bookies=4,
                      bookie_args=[*BOOKIE_ARGS, "--registration-ttl-s", "60"]) as cluster:
        asyncio.run(scenario(cluster))


def _process_state(pid: int) -> str:
    """The process's state letter in /proc (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_etcd_stopped(tmp_path: Path) -> None:
    async def scenario(cluster: LocalCluster) -> None:
        async with Client(cluster.etcd_endpoint, options=FAST) as client:
            writer = await client.create_ledger(3, 3, 2, password=PW)
            await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(100)))
            assert cluster.etcd is not None
            cluster.etcd.stop()
            # Appends to an open ledger with a healthy ensemble go on without etcd.
            ids = await asyncio.gather(*(writer.append(data(writer.ledger_id, i)) for i in range(100, 200)))
            assert list(ids) == list(range(100, 200))
            with pytest.raises(MetadataUnavailableError, match="etcd unavailable"):
                await client.create_ledger(3, 3, 2, password=PW)
            with pytest.raises(MetadataUnavailableError):
                await client.list_ledgers()
            with pytest.raises(MetadataUnavailableError):
                await writer.close()  # closing needs the metadata store
            cluster.etcd.start()
            await writer.close()
            assert (await client.ledger_metadata(writer.ledger_id)).last_entry_id == 199

    with LocalCluster(str(tmp_path / "c"), bookies=3, bookie_args=BOOKIE_ARGS) as cluster:
        assert cluster.etcd is not None
        port = cluster.etcd.client_port
        asyncio.run(scenario(cluster))
        assert cluster.etcd.client_port == port and os.path.isdir(cluster.etcd.data_dir)


async def test_an_ensemble_change_whose_etcd_answer_was_lost_still_resends_to_the_replacement(
        cluster: LocalCluster) -> None:
    """etcd applies the new segment but its answer is lost (the connection breaks after the commit): the change
    retries, finds the revision moved, and reads back its own segment. The replacement must then be sent the
    entries in flight; before the fix the change stopped there, as if not needed, and the appends waited for ever
    with nothing in flight to time out (found by the simulation, seed 2300157)."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(2, 2, 2, password=PW)
        assert await writer.append_many([data(writer.ledger_id, i) for i in range(50)]) == list(range(50))
        store = client.metadata_store
        real_update = store.update_ledger
        lost: list[int] = []

        async def applied_but_answer_lost(meta: object, expected_revision: int) -> int | None:
            revision = await real_update(meta, expected_revision)  # type: ignore[arg-type]
            if not lost and revision is not None:
                lost.append(revision)
                raise MetadataUnavailableError("etcd unavailable (test): connection reset after the commit")
            return revision

        store.update_ledger = applied_but_answer_lost  # type: ignore[method-assign]
        victim = writer.metadata.last_ensemble[1]
        cluster.bookies[victim].kill()
        ids = await asyncio.wait_for(writer.append_many([data(writer.ledger_id, i) for i in range(50, 150)]),
                                     timeout=30)
        assert ids == list(range(50, 150)) and lost, "the segment's answer was never lost: the test proves nothing"
        assert victim not in writer.metadata.last_ensemble and len(writer.metadata.ensembles) == 2
        await asyncio.wait_for(writer.close(), timeout=30)
        assert await read_back(client, writer.ledger_id) == [data(writer.ledger_id, i) for i in range(150)]
