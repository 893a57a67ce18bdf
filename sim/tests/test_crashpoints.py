"""Named crash points seen by the simulated network (crashpoints.py): a writer dying mid close, a recovering
client dying mid recovery; what they leave behind must still recover to every acknowledged entry."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from octavo.sim.cluster import Cluster
from octavo.sim.crashpoints import CLOSE_AFTER_CAS, CLOSE_BEFORE_CAS, RECOVERY_AFTER_FENCE, CrashPoint
from octavo.sim.run import crash_node_at
from octavo.sim.world import World


def run_point(tmp_path: Path, spec: str) -> tuple[World, str, int, bool]:
    """writer-0 writes 20 entries and closes (recoverer-0 recovery-opens it when the point is a recovery one);
    then checker-0 recovery-opens it. Returns the world, the state etcd had before the checker, the checker's
    last entry, and whether the armed point fired."""
    world = World(11)
    cluster = Cluster(world, str(tmp_path), bookies=3)
    point = world.network.crash_point = CrashPoint(spec, lambda node, name: crash_node_at(cluster, node, name))

    async def main() -> tuple[str, int]:
        await cluster.start_all()

        ledger_ids: list[int] = []

        async def write() -> None:
            writer = await cluster.client("writer-0").create_ledger(3, 3, 2)
            ledger_ids.append(writer.ledger_id)
            for i in range(20):
                await writer.append(b"entry %d" % i)
            if spec.startswith("close."):
                await writer.close()

        with contextlib.suppress(asyncio.CancelledError):  # a writer that dies at its point
            await cluster.on_node("writer-0", write())
        ledger_id = ledger_ids[0]
        if spec.startswith("recovery."):
            with pytest.raises(asyncio.CancelledError):  # the recovering client dies on the way
                await cluster.on_node("recoverer-0", cluster.client("recoverer-0").open_ledger(ledger_id))
        meta = await cluster.on_node("checker-0", cluster.client("checker-0").ledger_metadata(ledger_id))
        handle = await cluster.on_node("checker-0", cluster.client("checker-0").open_ledger(ledger_id))
        entries = [e.data async for e in handle.read(0, handle.last_entry_id)]
        assert entries == [b"entry %d" % i for i in range(20)]
        await cluster.close()
        return meta.state, handle.last_entry_id

    state, last = world.run(main)
    return world, state, last, point.hits == point.nth


def test_writer_dies_as_it_sends_its_close(tmp_path: Path) -> None:
    world, state, last, fired = run_point(tmp_path, CLOSE_BEFORE_CAS)
    assert fired and any("writer-0 dies at crash point close.before_metadata_cas" in h for h in world.history)
    assert (state, last) == ("OPEN", 19)  # never closed by its writer; the recovery open ends it at 19


def test_writer_dies_after_etcd_closed_its_ledger(tmp_path: Path) -> None:
    world, state, last, fired = run_point(tmp_path, CLOSE_AFTER_CAS)
    assert fired and any("writer-0 dies at crash point close.after_metadata_cas" in h for h in world.history)
    assert (state, last) == ("CLOSED", 19)


def test_recovering_client_dies_after_its_fence(tmp_path: Path) -> None:
    world, state, last, fired = run_point(tmp_path, f"{RECOVERY_AFTER_FENCE}@1")
    assert fired and any("recoverer-0 dies at crash point recovery.after_fence" in h for h in world.history)
    assert (state, last) == ("IN_RECOVERY", 19)  # left mid recovery; the next recovery open finishes it
