"""Bit rot found and repaired (issue 43), on real bookie processes and a real etcd: flipped bytes in one
bookie's flushed records while it runs, a truncated rolled log on another across a restart, a scrub of a
ledger nobody reads, and damage marks that lie."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from octavo.cli.clustertesting import octavo
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, ClientOptions
from octavo.client import damage as read_repair
from octavo.meta.damage import Damage
from octavo.meta.errors import BookieUnavailableError
from octavo.node.files import LOGS_DIR
from octavo.node.record import LOG_HEADER_BYTES, RECORD_HEADER
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc

PW = b"pw"
ENTRIES = 300
SIZE = 1024
FAST = ClientOptions(add_timeout_s=5.0, read_timeout_s=5.0, speculative_read_delay_s=0.5, bookie_list_ttl_s=0.2,
                     metadata_timeout_s=5.0)
# Generous for a loaded 2-core machine: the bookies check their damage marks every second.
REPAIR_WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    args = ["--log-size-bytes-max", str(128 * 1024), "--batch-bytes-max", str(64 * 1024),
            "--entry-size-bytes-max", str(32 * 1024), "--damage-check-interval-s", "1", "--scrub-interval-s", "0",
            "--metrics-port", "-1"]
    with LocalCluster(str(tmp_path_factory.mktemp("bitrot")), bookies=4, bookie_args=args) as c:
        yield c


def payload(ledger: int, entry: int) -> bytes:
    head = f"ledger {ledger} entry {entry} ".encode()
    return (head * (SIZE // len(head) + 1))[:SIZE]


def records(path: Path) -> Iterator[tuple[int, int, int, int]]:
    """(offset, length, ledger id, entry id) of every whole record in an entry log file."""
    data = path.read_bytes()
    pos = LOG_HEADER_BYTES
    while pos + RECORD_HEADER.size <= len(data):
        _, body_len, lid, eid = RECORD_HEADER.unpack_from(data, pos)
        length = body_len + 8
        if pos + length > len(data):
            return
        yield pos, length, lid, eid
        pos += length


def rolled_logs(cluster: LocalCluster, bookie_id: str) -> list[Path]:
    """The bookie's entry logs but the newest (the active one)."""
    logs = sorted((Path(cluster.bookies[bookie_id].data_dir) / LOGS_DIR).glob("*.log"))
    return logs[:-1]


def flip_entries(cluster: LocalCluster, bookie_id: str, ledger: int, count: int) -> list[int]:
    """Flip one payload byte of `count` of the ledger's records in the bookie's rolled logs (a bad sector);
    returns the entry ids damaged."""
    damaged: list[int] = []
    for path in rolled_logs(cluster, bookie_id):
        with open(path, "r+b") as f:
            for offset, length, lid, eid in list(records(path)):
                if lid != ledger or eid < 0 or eid % 7 != 3 or len(damaged) >= count:
                    continue
                f.seek(offset + length - 100)
                byte = f.read(1)
                f.seek(offset + length - 100)
                f.write(bytes([byte[0] ^ 0x10]))
                damaged.append(eid)
    assert len(damaged) == count, f"only {len(damaged)} records of ledger {ledger} in rolled logs on {bookie_id}"
    return damaged


def truncate_a_rolled_log(cluster: LocalCluster, bookie_id: str, ledger: int) -> list[int]:
    """Cut the last 10 records of a rolled log holding the ledger's entries off; returns the entries lost."""
    for path in rolled_logs(cluster, bookie_id):
        mine = [(offset, eid) for offset, _, lid, eid in records(path) if lid == ledger and eid >= 0]
        if len(mine) > 20:
            cut = mine[-10][0]
            os.truncate(path, cut + 5)
            return [eid for _, eid in mine[-10:]]
    raise AssertionError(f"no rolled log of {bookie_id} holds 20 entries of ledger {ledger}")


async def write_ledger(client: Client, ensemble_size: int = 3) -> tuple[int, tuple[str, ...]]:
    # Qa = Qw: every copy is there when the close returns (with Qa 2 the third may still be on its way).
    writer = await client.create_ledger(ensemble_size, 3, 3, password=PW)
    for first in range(0, ENTRIES, 50):
        await writer.append_many([payload(writer.ledger_id, e) for e in range(first, first + 50)])
    await writer.close()
    ensemble = writer.metadata.last_ensemble
    for bookie_id in ensemble:  # every copy there, before anything is damaged
        answers = await direct(client, bookie_id, writer.ledger_id, list(range(ENTRIES)))
        missing = [e for e in range(ENTRIES) if answers[e][0] != pb.OK]
        assert not missing, f"{bookie_id} lacks {len(missing)} entries of ledger {writer.ledger_id}: {missing[:5]}"
    return writer.ledger_id, ensemble


async def read_all(client: Client, ledger: int) -> None:
    reader = await client.open_ledger(ledger, password=PW)
    got = [e.data async for e in reader.read(0, ENTRIES - 1)]
    assert got == [payload(ledger, e) for e in range(ENTRIES)]


async def direct(client: Client, bookie_id: str, ledger: int, entries: list[int]) -> dict[int, tuple[int, bytes]]:
    """Each entry as the bookie itself answers it: (code, payload)."""
    try:
        response = await client.bookie_client(bookie_id).read(ledger, entries, timeout_s=10)
    except BookieUnavailableError:
        assert await client.moved(bookie_id), f"{bookie_id} is down"  # restarted on another port
        response = await client.bookie_client(bookie_id).read(ledger, entries, timeout_s=10)
    assert not response.error, response.error_message
    return {item.entry_id: (item.code, bytes(item.payload)) for item in response.entries}


async def wait_repaired(client: Client, bookie_id: str, ledger: int, entries: list[int]) -> float:
    """Wait until every entry reads back byte-identical from the bookie itself and no mark names it."""
    t0 = time.monotonic()
    damage = Damage(client.etcd, client.metadata_store.layout)
    while True:
        answers = await direct(client, bookie_id, ledger, entries)
        good = all(answers[e] == (pb.OK, payload(ledger, e)) for e in entries)
        if good and await damage.get(ledger, bookie_id) is None:
            return time.monotonic() - t0
        if time.monotonic() - t0 > REPAIR_WAIT_S:
            bad = [e for e in entries if answers[e] != (pb.OK, payload(ledger, e))]
            raise AssertionError(f"{bookie_id}: entries {bad} still damaged after {REPAIR_WAIT_S}s; mark "
                                 f"{await damage.get(ledger, bookie_id)}")
        await asyncio.sleep(0.2)


def status(cluster: LocalCluster, bookie_id: str) -> dict[str, Any]:
    done = octavo(cluster, "bookie", "status", "--bookie", bookie_id, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


async def test_flipped_bytes_and_a_truncated_log_are_found_listed_and_repaired_in_place(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        ledger, ensemble = await write_ledger(client)
        flipped_on, truncated_on = ensemble[0], ensemble[1]
        await asyncio.sleep(1.0)  # the rolled logs flushed
        # One bookie stops cleanly; a rolled log of it loses its end (a truncated file after a bad repair of the
        # filesystem); it stays down a while, and a client reports the damage it would see.
        cluster.bookies[truncated_on].stop()
        lost = truncate_a_rolled_log(cluster, truncated_on, ledger)
        # The other keeps running while bytes of 20 of its flushed records flip underneath it.
        flipped = flip_entries(cluster, flipped_on, ledger, 20)
        answers = await direct(client, flipped_on, ledger, flipped)
        assert all(code == pb.CORRUPT for code, _ in answers.values())
        # Every entry reads correctly from the other replicas; the reads report the damage they met (a range
        # read stops at a bookie's first damaged entry and goes on elsewhere: one per range is met). The bookie
        # confirms those, checks the ledger's other records in the same logs, and repairs all of them.
        await read_all(client, ledger)
        await read_repair.settled()
        await wait_repaired(client, flipped_on, ledger, flipped)
        assert int(status(cluster, flipped_on)["scrub"].get("damage_entries_repaired", 0)) >= len(flipped)
        scrubbed = octavo(cluster, "bookie", "scrub", "--bookie", flipped_on, "--json")
        assert scrubbed.returncode == 0, scrubbed.stderr
        assert int(json.loads(scrubbed.stdout).get("last_pass_damaged", 0)) == 0
        # The stopped bookie's damage, reported as a reader would, is listed with the bookie and the count,
        # and stays listed while the bookie is down.
        await Damage(client.etcd, client.metadata_store.layout).report(ledger, truncated_on, lost, "CORRUPT",
                                                                        "reader")
        listed = octavo(cluster, "cluster", "underreplicated", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)["damaged"]
        assert [(r["ledger_id"], r["bookie_id"], r["entries"]) for r in rows] == [(ledger, truncated_on, len(lost))]
        shown = octavo(cluster, "cluster", "status")
        assert shown.returncode == 0, shown.stderr
        assert f"damaged copies: {len(lost)} entries of 1 ledgers" in shown.stdout and truncated_on in shown.stdout
        await read_all(client, ledger)
        # Back, and registered: the mark is not dropped for that; the bookie checks and repairs it.
        cluster.bookies[truncated_on].start()
        await wait_repaired(client, truncated_on, ledger, lost)
        assert status(cluster, truncated_on)["scrub"]["damage_entries_repaired"] >= len(lost)
        # Across a restart of the bookie whose bits flipped, its repaired copies stay.
        cluster.bookies[flipped_on].stop()
        cluster.bookies[flipped_on].start()
        answers = await direct(client, flipped_on, ledger, list(range(ENTRIES)))
        assert all(answers[e] == (pb.OK, payload(ledger, e)) for e in range(ENTRIES))
        await read_all(client, ledger)


async def test_a_scrub_finds_damage_in_a_ledger_nobody_reads(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        ledger, ensemble = await write_ledger(client)
        victim = ensemble[2]
        await asyncio.sleep(1.0)
        flipped = flip_entries(cluster, victim, ledger, 5)
        done = octavo(cluster, "bookie", "scrub", "--bookie", victim)
        assert done.returncode == 0, done.stderr
        assert "5 damaged records" in done.stdout
        rows = [line.split() for line in done.stdout.splitlines()[2:]]
        assert sorted((int(r[0]), int(r[1])) for r in rows) == [(ledger, e) for e in flipped]
        await wait_repaired(client, victim, ledger, flipped)
        done = octavo(cluster, "bookie", "scrub", "--bookie", victim, "--json")
        assert done.returncode == 0, done.stderr
        assert int(json.loads(done.stdout).get("last_pass_damaged", 0)) == 0


async def test_a_forged_damage_mark_for_a_good_copy_changes_nothing(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        ledger, ensemble = await write_ledger(client)
        target = ensemble[0]
        await asyncio.sleep(1.0)
        before = status(cluster, target)["scrub"]
        damage = Damage(client.etcd, client.metadata_store.layout)
        await damage.report(ledger, target, range(10, 40), "forged", "a tenant")
        await wait_repaired(client, target, ledger, list(range(10, 40)))
        after = status(cluster, target)["scrub"]
        assert int(after.get("damage_entries_repaired", 0)) == int(before.get("damage_entries_repaired", 0))
        assert int(after.get("damage_entries_refuted", 0)) - int(before.get("damage_entries_refuted", 0)) == 30


async def test_an_add_request_with_a_damaged_entry_stores_the_other_ledgers_entries(cluster: LocalCluster) -> None:
    """A writer's resend carrying an entry this bookie holds damaged, with other ledgers' new entries in the same
    request: only the damaged entry is refused."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        other = await client.create_ledger(3, 3, 2, password=PW)
        ledger = writer.ledger_id
        for first in range(0, ENTRIES, 50):
            await writer.append_many([payload(ledger, e) for e in range(first, first + 50)])
        await other.append_many([payload(other.ledger_id, 0)])
        bookie = next(b for b in writer.metadata.last_ensemble if b in other.metadata.last_ensemble)
        await asyncio.sleep(1.0)
        damaged = flip_entries(cluster, bookie, ledger, 1)[0]
        key = bytes.fromhex((await client.ledger_metadata(ledger)).master_key_hex)
        other_key = bytes.fromhex((await client.ledger_metadata(other.ledger_id)).master_key_hex)
        request = pb.AddRequest(request_id=1, ledgers=[
            pb.LedgerAdds(ledger_id=ledger, master_key=key, entry_ids=[damaged - 1, damaged],
                          payloads=[payload(ledger, damaged - 1), payload(ledger, damaged)]),
            pb.LedgerAdds(ledger_id=other.ledger_id, master_key=other_key, entry_ids=[1],
                          payloads=[payload(other.ledger_id, 1)])])
        async with grpc.aio.insecure_channel(cluster.bookies[bookie].address) as channel:
            call = pb_grpc.BookieStub(channel).AddEntries(iter([request]))  # type: ignore[no-untyped-call]
            response = await call.read()
            call.cancel()
        results = {r.ledger_id: list(r.codes) for r in response.results}
        assert not response.error, response.error_message
        assert results[ledger] == [pb.OK, pb.CORRUPT] and results[other.ledger_id] == [pb.OK]
        assert await direct(client, bookie, other.ledger_id, [1]) == {1: (pb.OK, payload(other.ledger_id, 1))}
        await writer.close()
        await other.close()


def test_the_background_scrub_finds_and_repairs_damage_on_its_own(tmp_path: Path) -> None:
    """No reader, no command: the scrub's own schedule (scrub_interval_s) finds the damage, the bookie repairs it."""
    args = ["--log-size-bytes-max", str(128 * 1024), "--batch-bytes-max", str(64 * 1024),
            "--entry-size-bytes-max", str(32 * 1024), "--damage-check-interval-s", "1", "--scrub-interval-s", "3",
            "--metrics-port", "-1"]

    async def scenario(cluster: LocalCluster) -> None:
        async with Client(cluster.etcd_endpoint, options=FAST) as client:
            ledger, ensemble = await write_ledger(client)
            await asyncio.sleep(1.0)
            flipped = flip_entries(cluster, ensemble[1], ledger, 3)
            await wait_repaired(client, ensemble[1], ledger, flipped)
            # The repair can land while the pass that found the damage is still running: it counts when it ends.
            deadline = time.monotonic() + 60
            while int(status(cluster, ensemble[1])["scrub"]["passes"]) < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert int(status(cluster, ensemble[1])["scrub"]["passes"]) >= 1

    with LocalCluster(str(tmp_path / "scheduled"), bookies=3, bookie_args=args) as cluster:
        asyncio.run(scenario(cluster))


async def test_a_bookie_that_answered_corrupt_repairs_its_copy_without_a_report(cluster: LocalCluster) -> None:
    """A read straight from the bookie (no client library, so no report): the bookie notes what it answered
    CORRUPT and repairs it on its own."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        ledger, ensemble = await write_ledger(client)
        victim = ensemble[2]
        await asyncio.sleep(1.0)
        flipped = flip_entries(cluster, victim, ledger, 2)
        answers = await direct(client, victim, ledger, flipped)
        assert all(code == pb.CORRUPT for code, _ in answers.values())
        await wait_repaired(client, victim, ledger, flipped)
