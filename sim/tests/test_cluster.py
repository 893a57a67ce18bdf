"""One writer and bookies in virtual time: the real client, data plane and engine over the simulated network."""

from __future__ import annotations

import asyncio
from pathlib import Path

from octavo.sim.cluster import Cluster
from octavo.sim.world import World


def test_write_close_and_read_back(tmp_path: Path) -> None:
    world = World(7)
    cluster = Cluster(world, str(tmp_path), bookies=3)

    async def main() -> tuple[int, list[bytes]]:
        await cluster.start_all()
        client = cluster.client("client-0")

        async def write() -> int:
            writer = await client.create_ledger(3, 3, 2)
            for i in range(50):
                assert await writer.append(b"entry %d" % i) == i
            await writer.close()
            return writer.ledger_id

        ledger_id = await cluster.on_node("client-0", write())
        reader = cluster.client("client-1")

        async def read() -> list[bytes]:
            handle = await reader.open_ledger(ledger_id)
            return [e.data async for e in handle.read(0, handle.last_entry_id)]

        got = await cluster.on_node("client-1", read())
        await cluster.close()
        return ledger_id, got

    _, got = world.run(main)
    assert got == [b"entry %d" % i for i in range(50)]
    assert world.clock.now_s < 5.0  # virtual seconds


def test_a_full_disk_turns_the_bookie_read_only_until_it_is_over(tmp_path: Path) -> None:
    """The disk monitor on the simulated disk: a full disk makes the bookie read-only (its registration moves to
    the read-only set, writers go elsewhere), and writable again once the disk is no longer full."""
    world = World(8)
    cluster = Cluster(world, str(tmp_path), bookies=4)

    async def main() -> list[tuple[bool, bool]]:
        await cluster.start_all()
        client = cluster.client("client-0")
        bookie = cluster.bookies["bookie-0"]
        seen = []

        async def state() -> tuple[bool, bool]:
            storage = bookie.storage
            assert storage is not None
            return bool(storage.read_only_reason), "bookie-0" in await client.writable_bookies()

        seen.append(await cluster.on_node("client-0", state()))
        bookie.io.full = True
        await asyncio.sleep(2.5)  # the monitor checks every second; the registration follows
        seen.append(await cluster.on_node("client-0", state()))

        async def write() -> list[str]:
            writer = await client.create_ledger(3, 3, 2)
            for i in range(5):
                await writer.append(b"entry %d" % i)
            await writer.close()
            return list(writer.metadata.last_ensemble)

        assert "bookie-0" not in await cluster.on_node("client-0", write())
        bookie.io.full = False
        await asyncio.sleep(2.5)
        seen.append(await cluster.on_node("client-0", state()))
        await cluster.close()
        return seen

    assert world.run(main) == [(False, True), (True, False), (False, True)]
