"""Refusals that are about an entry or a ledger, not about a bookie's health, on a real cluster: they fail
the append with a typed error that says why, and never change the ensemble."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from octavo.cli.localcluster import LocalCluster
from octavo.client import (
    Client,
    ClientOptions,
    EntryTooLargeError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
)
from octavo.node.testing import BookieConnection
from octavo.v1 import bookie_pb2 as pb

PW = b"pw"
MIB = 1024 * 1024
# Bookies take entries up to 1 MiB; the client's own limit stays at its 4 MiB default.
BOOKIE_ARGS = ["--entry-size-bytes-max", str(MIB), "--gc-interval-ms", "60000"]
FAST = ClientOptions(add_timeout_s=5.0, bookie_list_ttl_s=0.2, metadata_timeout_s=2.0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(str(tmp_path_factory.mktemp("refusals")), bookies=4, bookie_args=BOOKIE_ARGS) as c:
        yield c


async def test_an_entry_over_the_bookies_limit_is_refused_and_the_ledger_goes_on(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        ensemble = writer.metadata.last_ensemble
        assert await writer.append(b"before") == 0
        with pytest.raises(EntryTooLargeError, match=r"entry of 2097152 bytes is over bookie bookie-\d's "
                                                     r"entry_size_bytes_max=1048576"):
            await writer.append(b"x" * (2 * MIB))
        assert await writer.append(b"after") == 1  # the refused entry took no id
        assert writer.ensemble_changes == 0 and writer.metadata.last_ensemble == ensemble
        await writer.close()
        reader = await client.open_ledger(writer.ledger_id, password=PW)
        assert [e.data async for e in reader.read(0, reader.last_entry_id)] == [b"before", b"after"]


async def test_a_bookies_refusal_of_an_entry_fails_the_handle_without_an_ensemble_change(
        cluster: LocalCluster) -> None:
    """When the client does not know a bookie's limit (a registration without it), the bookie's TOO_LARGE
    answer is still a refusal of the entry: a typed error with the bookie's message, no bookie replaced."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        ensemble = writer.metadata.last_ensemble
        await writer.append(b"first")
        writer._entry_limit = FAST.entry_size_bytes_max  # as if the registrations did not say the bookies' limit
        with pytest.raises(EntryTooLargeError, match=r"refused entry 1 .*over entry_size_bytes_max=1048576"):
            await writer.append(b"x" * (2 * MIB))
        assert writer.ensemble_changes == 0
        meta = await client.ledger_metadata(writer.ledger_id)
        assert meta.last_ensemble == ensemble and meta.ensembles == writer.metadata.ensembles
        with pytest.raises(EntryTooLargeError):  # the handle stays failed: entry 1 can never be acknowledged
            await writer.append(b"small")
        reader = await client.open_ledger(writer.ledger_id, password=PW)  # recovery closes it at entry 0
        assert reader.last_entry_id == 0


async def test_appends_fail_once_the_bookies_know_the_ledger_was_deleted(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as writer_client, \
            Client(cluster.etcd_endpoint, options=FAST) as other:
        writer = await writer_client.create_ledger(3, 3, 2, password=PW)
        for i in range(10):
            await writer.append(b"entry %d" % i)
        await other.delete_ledger(writer.ledger_id)
        # Bookies learn the delete through their etcd watch; from then on they refuse adds to the ledger.
        deadline = time.monotonic() + 10
        acknowledged_after_delete = []
        with pytest.raises(NoSuchLedgerError, match="was deleted"):
            while time.monotonic() < deadline:
                acknowledged_after_delete.append(await writer.append(b"late"))
                await asyncio.sleep(0.05)
        assert time.monotonic() < deadline, "appends were still acknowledged 10 s after the delete"
        with pytest.raises(NoSuchLedgerError):  # every later append fails too
            await writer.append(b"later")
        assert writer.ensemble_changes == 0
    for bookie_id in writer.metadata.last_ensemble:
        with BookieConnection(cluster.bookies[bookie_id].address) as conn:
            r = conn.add(writer.ledger_id, b"key", [100], [b"zombie"]).results[0]
            assert list(r.codes) == [pb.NO_SUCH_LEDGER], f"{bookie_id} took an add to a deleted ledger"
            assert conn.read(writer.ledger_id, 0, 0).error == pb.NO_SUCH_LEDGER


async def test_no_replacement_says_which_bookies_were_tried_and_why(cluster: LocalCluster) -> None:
    """The failed bookie is still registered until its lease expires: it is never its own replacement, and
    the error, after ensemble_change_wait_s, names every bookie with the reason it could not be used."""
    async with Client(cluster.etcd_endpoint, options=replace(FAST, ensemble_change_wait_s=1.0)) as client:
        writer = await client.create_ledger(3, 3, 2, password=PW)
        await writer.append(b"first")
        spare = next(b for b in cluster.bookies if b not in writer.metadata.last_ensemble)
        victim = writer.metadata.last_ensemble[0]
        with BookieConnection(cluster.bookies[spare].address) as conn:
            conn.admin.SetReadOnly(pb.SetReadOnlyRequest(read_only=True), timeout=10)
        try:
            await asyncio.sleep(0.3)  # the client's registration cache (0.2 s) sees the spare read-only
            cluster.bookies[victim].kill()
            with pytest.raises(NotEnoughBookiesError) as failed:
                for _ in range(100):
                    await writer.append(b"more")
            message = str(failed.value)
            assert f"no bookie can replace {victim}, which failed (" in message
            assert re.search(r"waited 1\.\ds \(ensemble_change_wait_s=1\)", message), message
            assert f"{victim} is the one that failed (its registration has not expired yet)" in message
            assert f"{spare} is read-only" in message
            others = [b for b in writer.metadata.last_ensemble if b != victim]
            assert all(f"{b} is already in the ensemble" in message for b in others)
        finally:
            cluster.bookies[victim].start()
            with BookieConnection(cluster.bookies[spare].address) as conn:
                conn.admin.SetReadOnly(pb.SetReadOnlyRequest(read_only=False), timeout=10)


async def test_requests_to_a_bookie_stay_within_its_registered_batch_limits(tmp_path_factory: pytest.TempPathFactory
                                                                             ) -> None:
    """A bookie with batch_bytes_max below the client's own request size (1 MiB; small logs need a small batch
    limit): many ledgers' adds queued at once go out in requests the bookie takes. The client once packed them
    into requests up to 1 MiB, which the bookie refused whole (TOO_LARGE), failing every handle in the request
    (it happened under load on the local Kubernetes control plane, where requests grow)."""
    args = ["--batch-bytes-max", str(128 * 1024), "--batch-entries-max", "100", "--log-size-bytes-max",
            str(256 * 1024), "--entry-size-bytes-max", str(64 * 1024)]
    with LocalCluster(str(tmp_path_factory.mktemp("small-batches")), bookies=3, bookie_args=args) as c:
        async with Client(c.etcd_endpoint, options=FAST) as client:
            assert {b.batch_bytes_max for b in (await client.bookies(refresh=True)).values()} == {128 * 1024}
            writers = [await client.create_ledger(3, 3, 2, password=PW) for _ in range(12)]
            entries = [[b"%d/%d:" % (w.ledger_id, i) + bytes(2000) for i in range(30)] for w in writers]
            for _ in range(3):  # 12 ledgers x 60 KB queued at once: 720 KB per bookie
                await asyncio.gather(*(w.append_many(batch) for w, batch in zip(writers, entries, strict=True)))
            for w in writers:
                await w.close()
            for w, batch in zip(writers, entries, strict=True):
                reader = await client.open_ledger(w.ledger_id, password=PW)
                assert [e.data async for e in reader.read(0, reader.last_entry_id)] == batch * 3
