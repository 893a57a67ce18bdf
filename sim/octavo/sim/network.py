"""The in-memory network: a Transport (octavo.meta.transport) whose channels deliver gRPC calls to handlers
served in the same process, through the same serializers and method handlers as the gRPC server, with
faults drawn from the run's random generator.

Each node (a bookie process, a client, etcd) has a name; code runs "on" a node when the contextvar NODE names
it (a task inherits it from the task that created it), so a channel knows which link it uses. Per link:
- every message is delayed by a random latency within [latency_s_min, latency_s_max]; separate calls are
  therefore reordered, while the messages of one stream keep their order (HTTP/2 over one connection);
- a message is dropped with probability drop_ratio: a unary call then never gets its answer (the request or
  the answer is lost: the caller cannot tell which) and times out; a stream breaks (UNAVAILABLE on both sides);
- a partitioned link loses every message (calls time out, streams go silent).
A node that is down refuses calls (UNAVAILABLE) and its streams break; a call with wait_for_ready waits for
it, up to its deadline, as gRPC does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from octavo.meta.tls import TlsFiles
from octavo.sim.crashpoints import CrashPoint
from octavo.sim.loop import VirtualLoop

NODE: contextvars.ContextVar[str] = contextvars.ContextVar("octavo_sim_node", default="sim")
# How often a call that waits for its target to be ready looks again.
READY_POLL_S = 0.05
# A unary method answered at once, on the loop's turn its request arrives: the serialized request in, the
# serialized answer out, or Aborted (any other exception is answered UNKNOWN, as gRPC does). For handlers that
# never wait (the etcd model's): no task, no extra loop turn.
Direct = Callable[[bytes], bytes]
_END = object()


@dataclass
class Link:
    latency_s_min: float = 0.0002
    latency_s_max: float = 0.002
    drop_ratio: float = 0.0
    partitioned: bool = False


@dataclass
class Host:
    """A node that serves calls: its method handlers by full method name, up or down."""

    name: str
    handlers: dict[str, Any] = field(default_factory=dict)
    # Unary methods answered at once as the request arrives, without a task (`Direct`): the etcd model's.
    direct: dict[str, Direct] = field(default_factory=dict)
    up: bool = True
    # Insertion-ordered (a dict, not a set: a set of objects iterates in address order, which differs from run to
    # run), so the streams a host's fall breaks break in the same order each time the seed runs.
    streams: dict[SimStreamCall, None] = field(default_factory=dict)


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class Aborted(Exception):
    """A handler's refusal: the caller gets this status code and details (ServicerContext.abort)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class SimServicerContext:
    """What the servicers ask of grpc's ServicerContext."""

    def __init__(self, peer: str, metadata: Sequence[tuple[str, str]] | None) -> None:
        self._peer = peer
        self._metadata = tuple(metadata or ())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return f"sim:{self._peer}"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = None) -> None:
        raise Aborted(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        pass

    def set_details(self, details: str) -> None:
        pass


class Network:
    """The transport of a simulated cluster. `history` gets one line per fault decision."""

    def __init__(self, rng: random.Random, history: Callable[[str], None]) -> None:
        self.rng = rng
        self.history = history
        self.hosts: dict[str, Host] = {}
        self.addresses: dict[str, str] = {}  # address -> node name
        self.links: dict[tuple[str, str], Link] = {}
        self._directed: dict[tuple[str, str], Link] = {}  # (src, dst) in either order -> its link in self.links
        self.default_link = Link()
        self.messages = 0
        self.crash_point: CrashPoint | None = None  # a client's named crash point (crashpoints.py), when armed

    # -- the cluster's shape -------------------------------------------------------------------------
    def serve(self, node: str, address: str, generic_handlers: Sequence[Any],
              direct: Mapping[str, Direct] | None = None) -> Host:
        """Serve the method handlers of grpc generic handlers (as a gRPC server would) at `address`, and the unary
        methods of `direct` (by full method name) answered as their request arrives. A node served again (a
        bookie's new process) replaces its old host: calls and streams still held by the old one (a process that
        is gone) break, and it never answers again."""
        old = self.hosts.get(node)
        if old is not None:
            self.down(node, "restarted")
        host = Host(node)
        for generic in generic_handlers:
            # grpc's generic handler keeps its method handlers by full name; ours are all built that way.
            for method, handler in generic._method_handlers.items():
                host.handlers[method] = handler
        host.direct.update(direct or {})
        self.hosts[node] = host
        self.addresses[address] = node
        return host

    def link(self, src: str, dst: str) -> Link:
        link = self._directed.get((src, dst))
        if link is None:
            key = (min(src, dst), max(src, dst))
            link = self.links.get(key)
            if link is None:
                link = self.links[key] = Link(self.default_link.latency_s_min, self.default_link.latency_s_max,
                                              self.default_link.drop_ratio)
            self._directed[(src, dst)] = link
        return link

    def down(self, node: str, why: str) -> None:
        host = self.hosts.get(node)
        if host is None:
            return
        host.up = False
        for call in list(host.streams):
            call.broken(rpc_error(grpc.StatusCode.UNAVAILABLE, f"{node} {why}"))

    def up(self, node: str) -> None:
        if node in self.hosts:
            self.hosts[node].up = True

    # -- Transport -----------------------------------------------------------------------------------
    def channel(self, address: str, tls: TlsFiles | None, options: Sequence[tuple[str, Any]] = ()) -> Any:
        return SimChannel(self, NODE.get(), address)

    async def probe(self, address: str, timeout_s: float) -> str | None:
        node = self.addresses.get(address)
        if node is None:
            return f"cannot resolve {address!r}"
        return None if self.hosts[node].up else "connection refused"

    # -- one message ---------------------------------------------------------------------------------
    def fate(self, src: str, dst: str) -> float | None:
        """The delay of one message from src to dst, None when it is lost."""
        self.messages += 1
        link = self._directed.get((src, dst)) or self.link(src, dst)
        if link.partitioned:
            return None
        if link.drop_ratio and self.rng.random() < link.drop_ratio:
            self.history(f"drop {src}->{dst}")
            return None
        low = link.latency_s_min  # random.uniform(low, high) written out: the same draw, one call less
        return low + (link.latency_s_max - low) * self.rng.random()

    def target(self, address: str) -> Host | None:
        node = self.addresses.get(address)
        return self.hosts.get(node) if node is not None else None


def _virtual_loop() -> VirtualLoop:
    """The running loop, which must be the virtual one: calls and streams read its clock directly."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualLoop):
        raise RuntimeError(f"the simulated network runs on octavo.sim.loop.VirtualLoop, not {type(loop).__name__}")
    return loop


def _serialize(serializer: Callable[[Any], bytes] | None, message: Any) -> bytes:
    return message if serializer is None else serializer(message)


def _deserialize(deserializer: Callable[[bytes], Any] | None, data: bytes) -> Any:
    return data if deserializer is None else deserializer(data)


class SimChannel:
    """A grpc.aio.Channel to one address over the simulated network."""

    def __init__(self, network: Network, src: str, address: str) -> None:
        self.network = network
        self.src = src
        self.address = address
        self.closed = False

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        host = self.network.target(self.address)
        if self.closed:
            return grpc.ChannelConnectivity.SHUTDOWN
        return grpc.ChannelConnectivity.READY if host is not None and host.up else \
            grpc.ChannelConnectivity.TRANSIENT_FAILURE

    async def close(self, grace: float | None = None) -> None:
        self.closed = True

    async def __aenter__(self) -> SimChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def unary_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                    **_: Any) -> Callable[..., Any]:
        def call(request: Any, timeout: float | None = None, wait_for_ready: bool | None = None,
                 metadata: Any = None, **__: Any) -> asyncio.Future[Any]:
            return _UnaryCall(self, method, _serialize(request_serializer, request), response_deserializer,
                              timeout, bool(wait_for_ready), metadata).future
        return call

    def unary_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     **_: Any) -> Callable[..., Any]:
        def call(*_args: Any, **__: Any) -> Any:
            raise rpc_error(grpc.StatusCode.UNIMPLEMENTED, f"{method}: the simulated network has no unary streams")
        return call

    def stream_unary(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                     **_: Any) -> Callable[..., Any]:
        return self.unary_stream(method)

    def stream_stream(self, method: str, request_serializer: Any = None, response_deserializer: Any = None,
                      **_: Any) -> Callable[..., Any]:
        def call(request_iterator: Any = None, timeout: float | None = None, wait_for_ready: bool | None = None,
                 metadata: Any = None, **__: Any) -> SimStreamCall:
            return SimStreamCall(self, method, request_serializer, response_deserializer, request_iterator,
                                 metadata, timeout)
        return call


class _UnaryCall:
    """One unary call, as callbacks on the loop rather than a task of its own (a simulated run makes thousands
    a second): the request's trip over the link, the handler as a task of the server's node, the answer's trip
    back. The caller awaits `future`, which the call's deadline fails with DEADLINE_EXCEEDED.

    What reaches the caller: the answer; the server's refusal or error at once (gRPC's status, with no trip
    back); UNAVAILABLE at once when the server is down (a call with wait_for_ready looks again every
    READY_POLL_S) or crashes before answering; nothing when the request or the answer is lost (the deadline
    ends it). A request still on its way when the caller gave up (cancelled, or its deadline passed) is not
    delivered. A crash point (crashpoints.py) that matches fires as the request leaves or as the answer
    arrives: the caller's node dies there. The deadline's timer is set only when it can matter (`_arm`): an
    answer from a `Direct` handler that arrives in time (most calls: the etcd model's) sets none."""

    __slots__ = ("_deadline", "_deadline_at", "channel", "deserializer", "future", "host", "loop", "metadata",
                 "method", "network", "point", "request", "wait_for_ready")

    def __init__(self, channel: SimChannel, method: str, request: bytes, deserializer: Any, timeout: float | None,
                 wait_for_ready: bool, metadata: Any) -> None:
        self.channel, self.network = channel, channel.network
        self.loop = loop = _virtual_loop()
        self.method, self.request, self.deserializer, self.metadata = method, request, deserializer, metadata
        self.wait_for_ready = wait_for_ready
        self.future: asyncio.Future[Any] = loop.create_future()
        point = self.network.crash_point
        self.point = point if point is not None and point.matches(channel.src, method, request) else None
        self._deadline_at = None if timeout is None else loop.clock.now_s + timeout
        self._deadline: asyncio.TimerHandle | None = None
        self.host: Host | None = None
        self._send()

    def _arm(self, at: float | None = None) -> None:
        """Set the deadline's timer (once, if the call has a deadline): for a lost message, a wait for the server,
        a handler running as a task, or (`at`) a message that would arrive after the deadline. Set before that
        message's timer: at the same time, the deadline runs first, as when every call set it at its start."""
        deadline_at = self._deadline_at
        if deadline_at is not None and self._deadline is None and (at is None or at >= deadline_at):
            self._deadline = self.loop.call_at(deadline_at, self._expired)

    def _expired(self) -> None:
        self._fail(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
        if self._deadline is not None:
            self._deadline.cancel()

    def _send(self) -> None:
        if self.future.done():
            return
        channel = self.channel
        host = self.network.target(channel.address)
        if channel.closed:
            return self._fail(rpc_error(grpc.StatusCode.CANCELLED, "channel closed"))
        if host is None or not host.up:
            if not self.wait_for_ready:
                return self._fail(rpc_error(grpc.StatusCode.UNAVAILABLE, f"{channel.address}: connection refused"))
            self._arm()
            self.loop.call_later(READY_POLL_S, self._send)
            return
        if self.point is not None and self.point.before:
            self._fire()  # the process dies as it sends this
            return
        self.host = host
        delay = self.network.fate(channel.src, host.name)
        if delay is None:  # lost: the caller's deadline ends it
            return self._arm()
        at = self.loop.clock.now_s + delay
        self._arm(at)
        self.loop.call_at(at, self._arrive)

    def _fire(self) -> None:
        """The crash point fires: the caller's node dies (its tasks are cancelled; the call with them)."""
        assert self.point is not None
        with contextlib.suppress(asyncio.CancelledError):  # the crash ends what hit the point: here, the call
            self.point.fire(self.channel.src)
        if not self.future.done():
            self.future.cancel()
        if self._deadline is not None:
            self._deadline.cancel()

    def _arrive(self) -> None:
        host = self.host
        assert host is not None
        if self.future.done():
            return
        if not host.up:
            return self._fail(rpc_error(grpc.StatusCode.UNAVAILABLE, f"{host.name}: connection reset"))
        direct = host.direct.get(self.method)
        if direct is not None:
            try:
                response = direct(self.request)
            except Exception as e:
                return self._refused(e)
            return self._respond(host, response)
        handler = host.handlers.get(self.method)
        if handler is None:
            return self._fail(rpc_error(grpc.StatusCode.UNIMPLEMENTED, f"{self.method} is not served by {host.name}"))
        self._arm()
        context = SimServicerContext(self.channel.src, self.metadata)
        served = _on_node(host.name, _serve_unary(handler, self.request, context))
        served.add_done_callback(self._served)

    def _served(self, served: asyncio.Task[bytes]) -> None:
        host = self.host
        assert host is not None
        if served.cancelled():  # the server crashed while it handled the call
            return self._fail(rpc_error(grpc.StatusCode.UNAVAILABLE, f"{host.name}: connection reset"))
        error = served.exception()
        if self.future.done():
            return
        if error is not None:
            return self._refused(error)
        self._respond(host, served.result())

    def _refused(self, error: BaseException) -> None:
        if isinstance(error, Aborted):
            return self._fail(rpc_error(error.code, error.details))
        # What gRPC answers when a handler raises.
        return self._fail(rpc_error(grpc.StatusCode.UNKNOWN, f"Exception calling application: {error}"))

    def _respond(self, host: Host, response: bytes) -> None:
        delay = self.network.fate(host.name, self.channel.src)
        if delay is None:  # lost: the caller's deadline ends it
            return self._arm()
        at = self.loop.clock.now_s + delay
        self._arm(at)
        self.loop.call_at(at, self._answer, response)

    def _answer(self, response: bytes) -> None:
        if self.future.done():
            return
        if self.point is not None:
            self._fire()  # the server did it; the process dies before it hears so
            return
        self.future.set_result(_deserialize(self.deserializer, response))
        if self._deadline is not None:
            self._deadline.cancel()


async def _serve_unary(handler: Any, request: bytes, context: SimServicerContext) -> bytes:
    parsed = _deserialize(handler.request_deserializer, request)
    response = await handler.unary_unary(parsed, context)
    return _serialize(handler.response_serializer, response)


def _on_node(node: str, coro: Any) -> asyncio.Task[Any]:
    """Run `coro` as a task of `node` (its tasks end with it when the node crashes)."""
    context = contextvars.copy_context()
    context.run(NODE.set, node)
    return asyncio.get_running_loop().create_task(coro, context=context)


class _Direction:
    """One direction of a stream, in place of an asyncio.Queue and a timer per message: the messages on their way,
    each with its arrival time (in the order written: a message never overtakes the one before it, as on one
    HTTP/2 connection), delivered by one timer at the first one's arrival, which delivers every message due then
    and sets the next; and the messages arrived, for this direction's one reader, woken by one future."""

    __slots__ = ("arrived", "call", "in_flight", "last_at", "loop", "waiter")

    def __init__(self, call: SimStreamCall, loop: VirtualLoop) -> None:
        self.call = call
        self.loop = loop
        self.in_flight: deque[tuple[float, Any]] = deque()  # (arrival time, message), arrival times not decreasing
        self.last_at = 0.0  # when the last message sent arrives
        self.arrived: deque[Any] = deque()
        self.waiter: asyncio.Future[None] | None = None

    def send(self, item: Any, delay_s: float) -> None:
        at = self.loop.clock.now_s + delay_s
        if at < self.last_at:
            at = self.last_at
        self.last_at = at
        self.in_flight.append((at, item))
        if len(self.in_flight) == 1:
            self.loop.call_at(at, self._deliver)

    def _deliver(self) -> None:
        """Every message due by now, as the loop runs every timer due in one iteration (within its resolution)."""
        in_flight = self.in_flight
        if self.call.done:  # broken: what was on its way is lost
            in_flight.clear()
            return
        loop = self.loop
        due = loop.clock.now_s + loop._clock_resolution  # type: ignore[attr-defined]
        while in_flight and in_flight[0][0] < due:
            self.put(in_flight.popleft()[1])
        if in_flight:
            loop.call_at(in_flight[0][0], self._deliver)

    def put(self, item: Any) -> None:
        self.arrived.append(item)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        """A future done when a message arrives (await it while `arrived` is empty)."""
        if self.waiter is not None and not self.waiter.done():
            raise RuntimeError("two readers wait on one direction of a simulated stream")
        waiter = self.waiter = self.loop.create_future()
        return waiter


class SimStreamCall:
    """A bidirectional stream: the client writes and reads here; the server's handler runs as a task of the
    server's node, reading what the client wrote and its answers coming back, each message over the link."""

    def __init__(self, channel: SimChannel, method: str, request_serializer: Any, response_deserializer: Any,
                 request_iterator: Any, metadata: Any, timeout: float | None = None) -> None:
        self.channel = channel
        self.network = channel.network
        self.method = method
        self.request_serializer = request_serializer
        self.response_deserializer = response_deserializer
        loop = _virtual_loop()
        self.to_server = _Direction(self, loop)
        self.to_client = _Direction(self, loop)
        self.error: grpc.aio.AioRpcError | None = None
        self.done = False
        self.host = channel.network.target(channel.address)
        self._server: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        if timeout is not None:  # the call's deadline covers the whole stream, as in gRPC
            self._deadline = asyncio.get_running_loop().call_later(timeout, self.broken, rpc_error(
                grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
        if self.host is None or not self.host.up:
            self.broken(rpc_error(grpc.StatusCode.UNAVAILABLE, f"{channel.address}: connection refused"))
            return
        self.host.streams[self] = None
        handler = self.host.handlers.get(method)
        if handler is None:
            self.broken(rpc_error(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served"))
            return
        self._server = _on_node(self.host.name, self._serve(handler, SimServicerContext(channel.src, metadata)))
        if request_iterator is not None:
            self._writer = asyncio.get_running_loop().create_task(self._write_all(request_iterator))

    # -- faults --------------------------------------------------------------------------------------
    def broken(self, error: grpc.aio.AioRpcError) -> None:
        if self.done:
            return
        self.done = True
        self.error = error
        if self._deadline is not None:
            self._deadline.cancel()
        self.to_client.put(_END)
        self.to_server.put(_END)
        for task in (self._server, self._writer):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if self.host is not None:
            self.host.streams.pop(self, None)

    def finished(self) -> None:
        """The server ended the stream and the client read its end: the call is over, without an error."""
        if not self.done:
            self.done = True
            if self._deadline is not None:
                self._deadline.cancel()
            if self.host is not None:
                self.host.streams.pop(self, None)

    def _send(self, direction: _Direction, item: Any, src: str, dst: str) -> None:
        delay = self.network.fate(src, dst)
        if delay is None:
            link = self.network.link(src, dst)
            if not link.partitioned:  # dropped on a live link: the connection breaks
                self.broken(rpc_error(grpc.StatusCode.UNAVAILABLE, f"connection {src}->{dst} reset"))
            return  # partitioned: the message is lost and the stream goes silent
        direction.send(item, delay)

    # -- the client's side ---------------------------------------------------------------------------
    async def write(self, message: Any) -> None:
        if self.done:
            raise self.error or rpc_error(grpc.StatusCode.CANCELLED, "stream finished")
        assert self.host is not None
        self._send(self.to_server, _serialize(self.request_serializer, message), self.channel.src, self.host.name)

    async def done_writing(self) -> None:
        if not self.done and self.host is not None:
            self._send(self.to_server, _END, self.channel.src, self.host.name)

    async def _write_all(self, request_iterator: AsyncIterator[Any]) -> None:
        async for message in request_iterator:
            await self.write(message)

    async def read(self) -> Any:
        direction = self.to_client
        while not direction.arrived:
            await direction.wait()
        item = direction.arrived[0]
        if item is _END:  # stays, for any later read
            if self.error is not None:
                raise self.error
            self.finished()
            return grpc.aio.EOF
        direction.arrived.popleft()
        return _deserialize(self.response_deserializer, item)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            item = await self.read()
            if item is grpc.aio.EOF:
                return
            yield item

    def cancel(self) -> bool:
        if self.done:
            return False
        self.broken(rpc_error(grpc.StatusCode.CANCELLED, "cancelled by the client"))
        return True

    # -- the server's side ---------------------------------------------------------------------------
    async def _requests(self, deserializer: Any) -> AsyncIterator[Any]:
        direction = self.to_server
        while True:
            while not direction.arrived:
                await direction.wait()
            item = direction.arrived[0]
            if item is _END:  # stays, for any later read
                return
            direction.arrived.popleft()
            yield _deserialize(deserializer, item)

    async def _serve(self, handler: Any, context: SimServicerContext) -> None:
        assert self.host is not None
        src, dst = self.host.name, self.channel.src
        try:
            async for response in handler.stream_stream(self._requests(handler.request_deserializer), context):
                if self.done:
                    return
                self._send(self.to_client, _serialize(handler.response_serializer, response), src, dst)
            self._send(self.to_client, _END, src, dst)
        except Aborted as e:
            self.broken(rpc_error(e.code, e.details))
        except Exception as e:  # what gRPC answers when a handler raises
            self.broken(rpc_error(grpc.StatusCode.UNKNOWN, f"Exception iterating responses: {e}"))
