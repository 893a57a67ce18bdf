"""Re-replication of a bookie gone for good (issue 10, first part): `octavo cluster recover` and the engine
under it, on real clusters whose bookies are SIGKILLed and whose data directories are deleted."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from octavo.cli.clustertesting import FAILOVER, PASSWORD, destroy, entry_data, octavo, quiet, read_all, write_closed
from octavo.cli.localcluster import LocalCluster
from octavo.client import Client, LedgerFencedError
from octavo.client.replication import (
    LOST,
    OPEN_SEGMENT_LEFT,
    REPLICATED,
    UNANSWERED,
    Replicator,
    recover_bookie,
)
from octavo.meta.errors import NotEnoughBookiesError
from octavo.meta.underreplication import UnderReplication

FAST = replace(FAILOVER, ensemble_change_wait_s=2.0)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A fresh 4-bookie cluster per test: these tests destroy bookies for good. The bookies' own autorecovery is
    off: these tests drive the engine and `cluster recover` alone (test_autorecovery.py has them together)."""
    with LocalCluster(str(tmp_path / "c"), bookies=4, bookie_args=["--autorecovery-enabled", "false"]) as c:
        yield c


async def wait_unregistered(client: Client, bookie_id: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while bookie_id in await client.bookies(refresh=True):
        assert time.monotonic() < deadline, f"{bookie_id}'s registration did not expire"
        await asyncio.sleep(0.1)


def naming(metas: list, bookie_id: str) -> list[int]:  # type: ignore[type-arg]
    return [m.ledger_id for m in metas if any(bookie_id in b for _, b in m.ensembles)]


async def test_a_lost_bookie_is_re_replicated_and_a_second_loss_loses_nothing(cluster: LocalCluster) -> None:
    """E = Qw = Qa = 2 on 4 bookies: each entry has two copies. One bookie is lost for good; after `cluster
    recover` no ensemble names it, and a second original bookie can be lost too: every acknowledged entry
    still reads back byte-identical (without re-replication the entries of ledgers on both would be gone)."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        written = await write_closed(client, 8, 300)
        metas = [await client.ledger_metadata(lid) for lid in written]
        victim = max(sorted(cluster.bookies), key=lambda b: len(naming(metas, b)))  # placement is random
        assert naming(metas, victim), "no ledger on the victim: the test would prove nothing"
        destroy(cluster, victim)
        await wait_unregistered(client, victim)

        run = octavo(cluster, "cluster", "recover", victim, "--json")
        assert run.returncode == 0, run.stderr
        out = json.loads(run.stdout)
        assert sorted(out["replicated"]) == sorted(naming(metas, victim)) and out["lost"] == []
        assert out["entries_copied"] == 300 * len(naming(metas, victim))
        metas = [await client.ledger_metadata(lid) for lid in written]
        assert naming(metas, victim) == []
        marks = UnderReplication(client.etcd, client.metadata_store.layout)
        assert [m async for m in marks.marks()] == []

        # A second original bookie goes; every ledger still has a copy of every entry.
        second = next(b for b in ("bookie-0", "bookie-2", "bookie-3")
                      if any(b in bs for m in metas for _, bs in m.ensembles))
        destroy(cluster, second)
        for lid, entries in written.items():
            assert await read_all(client, lid) == entries


async def test_entries_on_no_surviving_replica_are_reported_lost_and_the_mark_stays(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(2, 2, 2, password=PASSWORD)
        await writer.append_many([entry_data(writer.ledger_id, i) for i in range(50)])
        await writer.close()
        a, b = writer.metadata.last_ensemble
        destroy(cluster, a)
        destroy(cluster, b)
        await wait_unregistered(client, a)
        await wait_unregistered(client, b)
        run = octavo(cluster, "cluster", "recover", a, "--json")
        assert run.returncode == 1
        out = json.loads(run.stdout)
        assert out["lost"] == [{"ledger_id": writer.ledger_id, "bookie": a, "first": 0, "last": 49}]
        assert f"LOST: ledger {writer.ledger_id}: entries 0-49 (the copies on {a}) exist on no surviving replica" \
            in run.stderr
        meta = await client.ledger_metadata(writer.ledger_id)
        assert a in meta.last_ensemble, "a segment with lost entries was papered over"
        mark = await UnderReplication(client.etcd, client.metadata_store.layout).get(writer.ledger_id)
        assert mark is not None and a in mark.missing
        listed = json.loads(octavo(cluster, "cluster", "underreplicated", "--json").stdout)["underreplicated"]
        assert [(m["ledger_id"], m["missing"]) for m in listed] == [(writer.ledger_id, [a])]


async def test_open_ledgers_are_left_to_their_writer_unless_recover_open(cluster: LocalCluster) -> None:
    """An open ledger whose last segment names the lost bookie: without --recover-open it is left to its
    writer; with it, it is fenced, closed and re-replicated, and the old writer can no longer append."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        await writer.append_many([entry_data(writer.ledger_id, i) for i in range(100)])
        await quiet(writer)
        victim = writer.metadata.last_ensemble[0]
        destroy(cluster, victim)
        await wait_unregistered(client, victim)
        replicator = Replicator(client)
        left = await recover_bookie(client, victim, replicator)
        assert left.left_open == [writer.ledger_id] and not left.done
        mark = await UnderReplication(client.etcd, client.metadata_store.layout).get(writer.ledger_id)
        assert mark is not None, "the mark must stay while the writer's segment names the lost bookie"

        report = await replicator.replicate(writer.ledger_id, {victim}, recover_open=True)
        assert report.outcome == REPLICATED and report.entries_copied == 100
        meta = await client.ledger_metadata(writer.ledger_id)
        assert meta.closed and meta.last_entry_id == 99 and victim not in meta.last_ensemble
        with pytest.raises(LedgerFencedError):
            for i in range(100, 200):
                await asyncio.wait_for(writer.append(entry_data(writer.ledger_id, i)), timeout=20)
        assert await read_all(client, writer.ledger_id) == [entry_data(writer.ledger_id, i) for i in range(100)]
        assert report.outcome != OPEN_SEGMENT_LEFT and report.outcome != LOST


async def test_recovery_races_a_live_writer_without_overwriting_it(cluster: LocalCluster) -> None:
    """A writer replaced the lost bookie in a new segment and keeps writing while its older segment is
    re-replicated: the two CAS on one ledger; neither change is lost and every entry reads back."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(2, 2, 2, password=PASSWORD)
        await writer.append_many([entry_data(writer.ledger_id, i) for i in range(500)])
        victim = writer.metadata.last_ensemble[0]
        destroy(cluster, victim)
        await writer.append_many([entry_data(writer.ledger_id, i) for i in range(500, 600)])  # the writer replaces it
        assert victim not in writer.metadata.last_ensemble
        await wait_unregistered(client, victim)
        appends = asyncio.ensure_future(writer.append_many([entry_data(writer.ledger_id, i) for i in range(600, 3000)]))
        result = await recover_bookie(client, victim, Replicator(client))
        await appends
        assert result.replicated == [writer.ledger_id] and result.done
        await writer.close()
        meta = await client.ledger_metadata(writer.ledger_id)
        assert naming([meta], victim) == [] and meta.last_entry_id == 2999
        assert await read_all(client, writer.ledger_id) == [entry_data(writer.ledger_id, i) for i in range(3000)]


async def test_bad_input_is_refused_with_a_reason(cluster: LocalCluster) -> None:
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(3, 3, 2, password=PASSWORD)
        await writer.append_many([entry_data(writer.ledger_id, i) for i in range(10)])
        await writer.close()
        alive = octavo(cluster, "cluster", "recover", "bookie-0")
        assert alive.returncode == 1 and "is registered (alive" in alive.stderr
        unknown = octavo(cluster, "cluster", "recover", "no-such-bookie")
        assert unknown.returncode == 1 and "unknown bookie 'no-such-bookie'" in unknown.stderr
        alive_bookie = writer.metadata.last_ensemble[0]
        dry = octavo(cluster, "cluster", "recover", alive_bookie, "--dry-run")  # alive: refused first
        assert dry.returncode == 1
        # Two bookies lost: an E3 ledger cannot get a full ensemble from the two left.
        a, b = writer.metadata.last_ensemble[:2]
        destroy(cluster, a)
        destroy(cluster, b)
        await wait_unregistered(client, a)
        await wait_unregistered(client, b)
        dry = octavo(cluster, "cluster", "recover", a, "--dry-run", "--json")
        assert dry.returncode == 0 and json.loads(dry.stdout)["segments_to_move"] == 1
        with pytest.raises(NotEnoughBookiesError, match=r"needs an ensemble of 3 bookies \(E3/Qw3/Qa2\)"):
            await recover_bookie(client, a, Replicator(client))
        refused = octavo(cluster, "cluster", "recover", a)
        assert refused.returncode == 1 and "needs an ensemble of 3 bookies" in refused.stderr


async def test_an_interrupted_copy_resumes_on_the_same_bookie(cluster: LocalCluster) -> None:
    """A re-replication stopped mid-copy (its lease revoked, as when its process dies) leaves a partial copy
    on one bookie and the mark; the next run picks that same bookie, finishes, and no other bookie ever got a
    copy: at most one partial copy, never two."""
    async with Client(cluster.etcd_endpoint, options=FAST) as client:
        writer = await client.create_ledger(2, 2, 2, password=PASSWORD)
        entries = [entry_data(writer.ledger_id, i) * 10 for i in range(2000)]  # about 2 MB
        await writer.append_many(entries)
        await writer.close()
        victim, survivor = writer.metadata.last_ensemble
        candidates = [b for b in cluster.bookies if b not in (victim, survivor)]
        destroy(cluster, victim)
        await wait_unregistered(client, victim)

        async def holders() -> list[str]:
            held = []
            for b in candidates:
                answer = await client.bookie_client(b).read_lac(writer.ledger_id)
                if answer.code == 0:
                    held.append(b)
            return held

        slow = Replicator(client, rate_bytes_per_s=300_000, batch_bytes_max=64 << 10)
        run = asyncio.ensure_future(recover_bookie(client, victim, slow))
        deadline = time.monotonic() + 20
        while not await holders():
            assert time.monotonic() < deadline, "no copy started"
            await asyncio.sleep(0.1)
        run.cancel()  # stopped mid-copy; its lease (and so its lock) is revoked on the way out
        with pytest.raises(asyncio.CancelledError):
            await run
        partial = await holders()
        assert len(partial) == 1
        meta = await client.ledger_metadata(writer.ledger_id)
        assert victim in meta.last_ensemble
        assert await UnderReplication(client.etcd, client.metadata_store.layout).get(writer.ledger_id) is not None

        result = await recover_bookie(client, victim, Replicator(client))
        assert result.replicated == [writer.ledger_id] and result.done
        meta = await client.ledger_metadata(writer.ledger_id)
        assert meta.last_ensemble == tuple(partial[0] if b == victim else b for b in writer.metadata.last_ensemble)
        assert await holders() == partial, "a second copy was started elsewhere"
        assert await read_all(client, writer.ledger_id) == entries


async def test_a_replica_that_cannot_answer_is_not_taken_for_lost(cluster: LocalCluster) -> None:
    """The simulation's note (seed 2009): a survivor that was only briefly unreachable made re-replication log
    "LOST: ... exist on no surviving replica" (an ERROR an operator is paged for) though its copies were whole.
    A registered replica that cannot answer is not proof of loss: the ledger is left for a retry (UNANSWERED; the
    command says so and exits 1), and once the replica answers again its copies are made and nothing is lost."""
    import os
    import signal

    async with Client(cluster.etcd_endpoint, options=replace(FAST, read_timeout_s=1.0)) as client:
        writer = await client.create_ledger(2, 2, 2, password=PASSWORD)
        await writer.append_many([entry_data(writer.ledger_id, i) for i in range(20)])
        await writer.close()
        lost, frozen = writer.metadata.last_ensemble
        destroy(cluster, lost)
        await wait_unregistered(client, lost)
        proc = cluster.bookies[frozen].proc
        assert proc is not None and frozen in await client.bookies(refresh=True)
        os.kill(proc.pid, signal.SIGSTOP)  # registered (its lease outlives the test's read), answering nothing
        try:
            report = await Replicator(client).replicate(writer.ledger_id, {lost})
            # What `cluster recover` runs, in the same state: a ledger to retry, not a loss, not done
            recovery = await recover_bookie(client, lost, Replicator(client), by="test")
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert report.outcome == UNANSWERED and report.lost == []
        assert [(u.bookie, u.first, u.last) for u in report.unanswered] == [(lost, 0, 19)]
        assert recovery.retry == [writer.ledger_id] and recovery.lost == [] and not recovery.done
        assert lost in (await client.ledger_metadata(writer.ledger_id)).last_ensemble  # not changed meanwhile
        report = await Replicator(client).replicate(writer.ledger_id, {lost})
        assert report.outcome == REPLICATED and report.lost == [] and report.entries_copied == 20
        meta = await client.ledger_metadata(writer.ledger_id)
        assert lost not in meta.last_ensemble
        destroy(cluster, frozen)  # the copy made is whole: the other original copy can go too
        assert await read_all(client, writer.ledger_id) == [entry_data(writer.ledger_id, i) for i in range(20)]
