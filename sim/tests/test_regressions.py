"""Bugs the simulation found, each pinned at the lowest level that shows it (docs/durability.md lists them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from octavo.client.bookie_client import BookieClient
from octavo.meta.errors import BookieUnavailableError
from octavo.sim.network import NODE
from octavo.sim.world import World


def test_add_timeout_fails_the_stream_when_the_deadline_rounds() -> None:
    """Seed 101: a request sent at t with `(t + timeout) - t < timeout` in floats. The watchdog, due at
    t + timeout, found `now - t < timeout` and set itself again for now: a loop on a clock that does not move
    between callbacks (the virtual one; a real one spins until the next tick). It must fail the stream once."""
    sent_at = 1.3436424411240122  # (sent_at + 2.0) - sent_at < 2.0
    assert (sent_at + 2.0) - sent_at < 2.0
    world = World(1)
    world.network.serve("bookie-x", "bookie-x:3181", [silent_bookie()])
    world.network.link("sim", "bookie-x").partitioned = True  # the requests are lost: no answer ever comes

    async def main() -> float:
        await asyncio.sleep(sent_at)
        client = BookieClient("bookie-x", "bookie-x:3181", add_timeout_s=2.0)
        with pytest.raises(BookieUnavailableError, match=r"no answer within 2\.0s"):
            await client.add(1, b"k" * 32, [0], [b"x"], -1)
        failed_at = asyncio.get_running_loop().time()
        await client.close()
        return failed_at

    NODE.set("sim")
    assert world.run(main) == pytest.approx(sent_at + 2.0)


def silent_bookie() -> grpc.GenericRpcHandler:
    """A Bookie service whose add stream takes requests and never answers."""
    async def add_entries(requests: AsyncIterator[bytes], _context: object) -> AsyncIterator[bytes]:
        async for _ in requests:
            pass
        if False:  # an async generator that yields nothing
            yield b""

    return grpc.method_handlers_generic_handler("octavo.v1.Bookie", {
        "AddEntries": grpc.stream_stream_rpc_method_handler(add_entries)})
