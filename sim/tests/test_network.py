"""The simulated network as callers see it: answers through the served handlers, what gRPC answers when a
handler raises, deadlines on calls and streams, partitions, nodes down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from octavo.sim.network import _END, NODE
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


def test_a_stream_delivers_in_order_each_message_after_its_latency_and_nothing_once_broken() -> None:
    """Messages written in a burst are on their way together (one delivery timer per direction, not per message):
    each arrives no sooner than the link's least latency after it was written and no later than its greatest (or
    than the message before it), in the order written; a stream that breaks delivers nothing more."""
    async def main(world: World) -> None:
        world.network.link("sim", "server").latency_s_min = 0.001
        world.network.link("sim", "server").latency_s_max = 0.010
        channel = world.network.channel("server:1", None)
        call = channel.stream_stream("/t.Echo/Chat")()
        words = [b"w%d" % i for i in range(40)]
        for word in words:  # all sent at the same virtual time
            await call.write(word)
        t0 = world.clock.now_s
        got, times = [], []
        for _ in words:
            got.append(await call.read())
            times.append(world.clock.now_s - t0)
        assert got == [w.upper() for w in words]
        assert times == sorted(times)
        # each went there and back: at least two least latencies, at most the slowest trip each way
        assert times[0] >= 0.002 - 1e-12 and times[-1] <= 0.020 + 1e-12
        assert len(set(times)) > 1  # not all at once: the latencies were drawn per message
        for word in words:
            await call.write(word)
        call.cancel()  # broken with 40 messages on their way
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() == grpc.StatusCode.CANCELLED
        await asyncio.sleep(0.05)  # past every arrival time: nothing was delivered after the break
        assert list(call.to_client.arrived) == [_END] and not call.to_client.in_flight
        with pytest.raises(grpc.aio.AioRpcError):
            await call.read()  # and every later read fails the same way

    run(main)


def test_a_stream_read_by_two_readers_at_once_is_refused() -> None:
    """One reader per direction (as a gRPC call allows): a second read while one waits is a usage error."""
    async def main(world: World) -> None:
        call = world.network.channel("server:1", None).stream_stream("/t.Echo/Chat")()
        first = asyncio.ensure_future(call.read())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="two readers"):
            await call.read()
        await call.write(b"x")
        assert await first == b"X"

    run(main)


def test_a_direct_call_sets_its_deadline_timer_only_when_the_deadline_can_matter() -> None:
    """A Direct handler's answer that arrives in time leaves no timer behind; a call whose request or answer is
    lost, or whose answer would arrive after its deadline, still fails with DEADLINE_EXCEEDED at the deadline."""
    async def main(world: World) -> None:
        world.network.serve("etcd", "etcd:1", [], direct={"/t.Echo/Echo": lambda request: request.upper()})
        link = world.network.link("sim", "etcd")
        link.latency_s_min = link.latency_s_max = 0.01
        echo = world.network.channel("etcd:1", None).unary_unary("/t.Echo/Echo")
        loop, set_at = world.loop, []
        call_at = loop.call_at
        loop.call_at = lambda when, *args, **kw: set_at.append(when) or call_at(when, *args, **kw)  # type: ignore[method-assign]
        t0 = world.clock.now_s
        assert await echo(b"hi", timeout=1.0) == b"HI"
        assert set_at == pytest.approx([t0 + 0.01, t0 + 0.02])  # the request's trip and the answer's: no deadline
        del loop.call_at
        t0 = world.clock.now_s
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await echo(b"late", timeout=0.015)  # the answer would arrive at 0.02 s
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert world.clock.now_s - t0 == pytest.approx(0.015)
        link.drop_ratio = 1.0
        t0 = world.clock.now_s
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await echo(b"lost", timeout=0.5)
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert world.clock.now_s - t0 == pytest.approx(0.5)

    run(main)
