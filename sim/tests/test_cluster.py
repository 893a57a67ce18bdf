"""One writer and bookies in virtual time: the real client, data plane and engine over the simulated network."""

from __future__ import annotations

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
