"""The simulated network as callers see it: answers through the served handlers, what gRPC answers when a
handler raises, deadlines on calls and streams, partitions, nodes down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from octavo.sim.network import NODE
from octavo.sim.world import World


def echo_service() -> grpc.GenericRpcHandler:
    async def echo(request: bytes, _context: object) -> bytes:
        if request == b"boom":
            raise OSError(28, "no space")
        return request.upper()

    async def chat(requests: AsyncIterator[bytes], _context: object) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request.upper()

    return grpc.method_handlers_generic_handler("t.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Chat": grpc.stream_stream_rpc_method_handler(chat)})


def run(main):  # type: ignore[no-untyped-def]
    world = World(3)
    world.network.serve("server", "server:1", [echo_service()])
    NODE.set("sim")
    return world, world.run(lambda: main(world))


def test_calls_streams_errors_deadlines_and_partitions() -> None:
    async def main(world: World) -> None:
        channel = world.network.channel("server:1", None)
        echo = channel.unary_unary("/t.Echo/Echo")
        assert await echo(b"hi", timeout=1.0) == b"HI"
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await echo(b"boom", timeout=1.0)
        assert raised.value.code() == grpc.StatusCode.UNKNOWN
        call = channel.stream_stream("/t.Echo/Chat")()
        for word in (b"a", b"b", b"c"):
            await call.write(word)
        assert [await call.read() for _ in range(3)] == [b"A", b"B", b"C"]  # in order on one stream
        world.network.link("sim", "server").partitioned = True
        t0 = world.clock.now_s
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await echo(b"hi", timeout=1.5)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert world.clock.now_s - t0 == pytest.approx(1.5)
        quiet = channel.stream_stream("/t.Echo/Chat")(timeout=2.0)
        await quiet.write(b"lost")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await quiet.read()
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        world.network.link("sim", "server").partitioned = False
        world.network.down("server", "crashed")
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await echo(b"hi", timeout=1.0)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(grpc.aio.AioRpcError):
            await call.read()  # the open stream broke with the node
        world.loop.call_later(0.5, world.network.up, "server")
        assert await echo(b"back", timeout=1.0, wait_for_ready=True) == b"BACK"
        await asyncio.sleep(0)

    run(main)
