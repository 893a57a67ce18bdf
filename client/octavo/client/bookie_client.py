"""The client's connection to one bookie: one gRPC channel and one AddEntries stream shared by every ledger
this client writes to that bookie.

Adds from all ledgers queue up and a sender task packs whatever is queued into one AddRequest (within the
request limits), with a bounded number of requests in flight; a receiver task hands each response's codes
back to the callers. Many entries per message is what gets a Python gRPC stream past a few thousand
messages a second. Any stream failure fails every add in flight on it with BookieUnavailableError; the
next add opens a new stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, NamedTuple

import grpc
from opentelemetry import trace

from octavo.meta import transport
from octavo.meta.errors import BookieUnavailableError
from octavo.meta.etcd import CHANNEL_OPTIONS
from octavo.meta.tls import TlsFiles
from octavo.telemetry.tracing import TRACEPARENT, current_traceparent
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc
from octavo.v1.wire import encode_add_request

log = logging.getLogger(__name__)

# One AddRequest carries at most this much, or less when the bookie's registration names smaller batch limits
# (batch_entries_max, batch_bytes_max; its defaults are 10,000 entries and 16 MiB): a bookie refuses a larger
# request whole. One entry may be as large as the bookie's entry_size_bytes_max.
REQUEST_ENTRIES_MAX = 4_096
REQUEST_BYTES_MAX = 1024 * 1024
# A new request goes out while fewer than REQUESTS_IN_FLIGHT_SMALL are unanswered, or, when what is queued
# fills a request, while fewer than REQUESTS_IN_FLIGHT_MAX are. Small adds therefore wait behind two requests
# and go out together (a busy writer batches more per request: the fewer messages, the cheaper), while large
# ones keep the stream full.
REQUESTS_IN_FLIGHT_SMALL = 2
REQUESTS_IN_FLIGHT_MAX = 8
CALL_TIMEOUT_S = 10.0
# Request-level answers that are about what the request carried (a limit, a malformed field), not about the
# bookie's health: the entries are refused, and the bookie is no reason to change the ensemble.
REQUEST_REFUSALS = frozenset((pb.TOO_LARGE, pb.INVALID, pb.UNAUTHORIZED, pb.PERMISSION_DENIED))
MESSAGE_BYTES_MAX = 128 * 1024 * 1024
# Write-closes one add request carries at most (each is ~50 bytes on the wire).
REQUEST_CLOSES_MAX = 4_096
# How long a write-close waits for an add request to ride on before it goes in a request of its own. A writer's
# close does not wait for it (the close in etcd is what counts), so this costs nothing but the bookie learning
# of the close later; with many ledgers closing, nearly every write-close rides on another ledger's adds.
CLOSE_LINGER_S = 0.02


class AddGroup(NamedTuple):
    """One ledger's entries for one request; a writer shares one group between the bookies of a write set."""

    ledger_id: int
    master_key: bytes
    last_add_confirmed: int
    recovery: bool
    entry_ids: Sequence[int]
    payloads: Sequence[bytes]
    size: int  # payload bytes
    trace_parent: str = ""  # W3C traceparent of a sampled append this group carries entries of


def add_group(ledger_id: int, master_key: bytes, entry_ids: Sequence[int], payloads: Sequence[bytes],
              last_add_confirmed: int, recovery: bool = False) -> AddGroup:
    return AddGroup(ledger_id, master_key, last_add_confirmed, recovery, entry_ids, payloads,
                    sum(map(len, payloads)))


def _trace_metadata() -> tuple[tuple[str, str], ...] | None:
    """The caller's sampled trace context as gRPC metadata (W3C traceparent), None when there is none."""
    if not trace.get_current_span().is_recording():
        return None
    traceparent = current_traceparent()
    return ((TRACEPARENT, traceparent),) if traceparent else None


class WriteClose(NamedTuple):
    """An advisory write-close waiting to ride the add stream. `done` gets None once the bookie did it, or why
    not (a refusal or a failed stream, already logged); it never raises."""

    ledger_id: int
    master_key: bytes
    last_entry_id: int
    done: asyncio.Future[str | None]


class Refusal(NamedTuple):
    """A bookie's answer to a group with an entry that was not stored: a code per entry and the bookie's
    explanation of the first code that is not OK (it names the limit or the state that refused it)."""

    codes: list[int]
    message: str


# Called once per queued group, with the group and: None when every entry was stored (the common case, kept
# cheap), a Refusal when one was not, or the exception that failed the add (the bookie could not be reached).
AddCallback = Callable[[AddGroup, Refusal | BaseException | None], None]


class _Joined:
    """Joins the results of a group split over several requests into one callback, in order."""

    def __init__(self, group: AddGroup, sizes: list[int], callback: AddCallback) -> None:
        self.group = group
        self.sizes = sizes
        self.parts: list[Refusal | None] = [None] * len(sizes)
        self.left = len(sizes)
        self.callback = callback
        self.failed = False

    def piece(self, k: int) -> AddCallback:
        def done(_: AddGroup, result: Refusal | BaseException | None) -> None:
            if self.failed:
                return
            if isinstance(result, BaseException):
                self.failed = True
                self.callback(self.group, result)
                return
            self.parts[k] = result
            self.left -= 1
            if self.left == 0:
                if all(part is None for part in self.parts):
                    self.callback(self.group, None)
                else:
                    codes = [code for part, n in zip(self.parts, self.sizes, strict=True)
                             for code in (part.codes if part is not None else [pb.OK] * n)]
                    message = next(part.message for part in self.parts if part is not None)
                    self.callback(self.group, Refusal(codes, message))
        return done


class BookieClient:
    def __init__(self, bookie_id: str, address: str, add_timeout_s: float = CALL_TIMEOUT_S,
                 tls: TlsFiles | None = None, request_entries_max: int = REQUEST_ENTRIES_MAX,
                 request_bytes_max: int = REQUEST_BYTES_MAX) -> None:
        """`request_entries_max`, `request_bytes_max`: the bookie's batch limits (at most REQUEST_*_MAX)."""
        if not (0 < request_entries_max <= REQUEST_ENTRIES_MAX and 0 < request_bytes_max <= REQUEST_BYTES_MAX):
            raise ValueError(f"bookie {bookie_id}: request limits ({request_entries_max} entries, "
                             f"{request_bytes_max} bytes) must be in (0, {REQUEST_ENTRIES_MAX}] and "
                             f"(0, {REQUEST_BYTES_MAX}]")
        self.request_entries_max = request_entries_max
        self.request_bytes_max = request_bytes_max
        self.bookie_id = bookie_id
        self.address = address
        self.add_timeout_s = add_timeout_s
        self.tls = tls if tls is not None and tls.enabled else None
        self._channel = transport.current().channel(address, self.tls, options=[
            ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
            *CHANNEL_OPTIONS,
        ])
        self._stub = pb_grpc.BookieStub(self._channel)
        # Requests go out pre-encoded (wire.encode_add_request): upb serializes large payload lists slowly.
        self._add_entries = self._channel.stream_stream("/octavo.v1.Bookie/AddEntries", request_serializer=None,
                                                        response_deserializer=pb.AddResponse.FromString)
        self._queue: deque[tuple[AddGroup, AddCallback]] = deque()
        self._closes: deque[WriteClose] = deque()
        self._closes_due = False  # the write-closes queued go even without adds to ride on
        self._close_timer: asyncio.TimerHandle | None = None
        self._wake = asyncio.Event()
        self._window_open = asyncio.Event()
        self._window_open.set()
        self._queued_bytes = 0
        # Requests written and not answered, oldest first: request id -> (when it was sent, its groups, its
        # write-closes).
        self._pending: dict[int, tuple[float, list[tuple[AddGroup, AddCallback]], list[WriteClose]]] = {}
        self._watchdog: asyncio.TimerHandle | None = None
        self._request_id = 0
        self._call: Any = None
        self._sender: asyncio.Task[None] | None = None
        self._receiver: asyncio.Task[None] | None = None
        self._closed = False
        # Called with the bookie's id when an add response says the bookie is draining (stopping): its writers
        # move off it (Client._bookie_draining).
        self.on_draining: Callable[[str], None] | None = None

    # -- the connection ------------------------------------------------------------------------------
    def connectivity(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        """The channel's state (READY, IDLE, CONNECTING, TRANSIENT_FAILURE, SHUTDOWN); with try_to_connect an
        IDLE channel starts connecting."""
        return self._channel.get_state(try_to_connect)

    def reachable(self) -> bool:
        """Connected, or not tried yet (an IDLE channel connects on its first call)."""
        return self.connectivity(True) in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.IDLE)

    @property
    def busy(self) -> bool:
        """Adds are queued or in flight on this connection."""
        return bool(self._queue or self._pending or self._closes)

    async def close(self) -> None:
        self._closed = True
        self._fail_all(BookieUnavailableError(f"bookie {self.bookie_id}: client closed"))
        for task in (self._sender, self._receiver):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self._channel.close()

    # -- adds ------------------------------------------------------------------------------------------
    def add(self, ledger_id: int, master_key: bytes, entry_ids: list[int], payloads: list[bytes],
            last_add_confirmed: int, recovery: bool = False) -> asyncio.Future[list[int]]:
        """Queue entries of one ledger; the future gets one ResultCode per entry, or BookieUnavailableError."""
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        n = len(entry_ids)

        def settle(_: AddGroup, result: Refusal | BaseException | None) -> None:
            if future.done():
                return
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result([pb.OK] * n if result is None else result.codes)

        self.add_group(add_group(ledger_id, master_key, entry_ids, payloads, last_add_confirmed, recovery), settle)
        return future

    def add_group(self, group: AddGroup, callback: AddCallback) -> None:
        """Queue a group; `callback` gets it back with None (all stored), the codes, or the exception,
        exactly once. The cheap path for writers: no future and no timer per add (a request that goes
        unanswered fails the stream)."""
        if self._closed:
            callback(group, BookieUnavailableError(f"bookie {self.bookie_id}: client closed"))
            return
        entries_max, bytes_max = self.request_entries_max, self.request_bytes_max
        if len(group.entry_ids) <= entries_max and group.size <= bytes_max:
            self._queue.append((group, callback))
        else:
            pieces: list[tuple[int, int, int]] = []
            start = size = 0
            for i, payload in enumerate(group.payloads):
                if i > start and (i - start >= entries_max or size + len(payload) > bytes_max):
                    pieces.append((start, i, size))
                    start, size = i, 0
                size += len(payload)
            pieces.append((start, len(group.payloads), size))
            joined = _Joined(group, [b - a for a, b, _ in pieces], callback)
            for k, (a, b, piece_size) in enumerate(pieces):
                self._queue.append((group._replace(entry_ids=group.entry_ids[a:b], payloads=group.payloads[a:b],
                                                   size=piece_size), joined.piece(k)))
        self._queued_bytes += group.size
        if self._queued_bytes >= bytes_max and not self._window_open.is_set():
            self._update_window()
        self._send_soon()

    def _send_soon(self) -> None:
        if not self._wake.is_set():
            self._wake.set()
        if self._sender is None or self._sender.done():
            self._start_stream()

    def _start_stream(self) -> None:
        self._call = self._add_entries(timeout=None)
        self._sender = asyncio.create_task(self._send_loop(self._call), name=f"octavo-send-{self.bookie_id}")
        self._receiver = asyncio.create_task(self._receive_loop(self._call), name=f"octavo-recv-{self.bookie_id}")

    def _take_request(self) -> tuple[int, bytes, list[tuple[AddGroup, AddCallback]], list[WriteClose]]:
        """Whatever is queued, within the request limits, as one request in the flat form."""
        taken: list[tuple[AddGroup, AddCallback]] = []
        entries = size = 0
        queue = self._queue
        while queue:
            group = queue[0][0]
            n = len(group.entry_ids)
            if taken and (entries + n > self.request_entries_max or size + group.size > self.request_bytes_max):
                break
            taken.append(queue.popleft())
            entries += n
            size += group.size
        # Column by column: comprehensions run faster than one loop appending to six lists.
        groups = [g for g, _ in taken]
        ledger_ids = [g.ledger_id for g in groups]
        keys = [g.master_key for g in groups]
        lacs = [g.last_add_confirmed for g in groups]
        recovery = any(g.recovery for g in groups)
        counts = [len(g.entry_ids) for g in groups]
        entry_ids = list(chain.from_iterable(g.entry_ids for g in groups))
        payloads = list(chain.from_iterable(g.payloads for g in groups))
        closes = [self._closes.popleft() for _ in range(min(len(self._closes), REQUEST_CLOSES_MAX))]
        if not self._closes:
            self._closes_due = False
        self._request_id += 1
        self._queued_bytes -= size
        try:
            request = pb.AddRequest(request_id=self._request_id, group_ledger_ids=ledger_ids,
                                    group_master_keys=keys, group_lacs=lacs, group_entry_counts=counts,
                                    entry_ids=entry_ids,
                                    group_recovery=[g.recovery for g in groups] if recovery else ())
            if closes:
                request.close_ledger_ids.extend(c.ledger_id for c in closes)
                request.close_master_keys.extend(c.master_key for c in closes)
                request.close_last_entry_ids.extend(c.last_entry_id for c in closes)
            trace_parent = next((g.trace_parent for g in groups if g.trace_parent), "")
            if trace_parent:
                request.trace_parent = trace_parent
            encoded = encode_add_request(request, payloads, size)
        except Exception as e:  # taken off the queue: they must still get their answer
            error = BookieUnavailableError(f"bookie {self.bookie_id}: cannot encode an add request: "
                                           f"{type(e).__name__}: {e}")
            for group, callback in taken:
                callback(group, error)
            _settle_closes(closes, error, self.bookie_id)
            raise
        return self._request_id, encoded, taken, closes

    async def _send_loop(self, call: Any) -> None:
        try:
            while True:
                if not self._queue and not (self._closes and self._closes_due):
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self._window_open.is_set():
                    await self._window_open.wait()
                    continue
                request_id, request, taken, closes = self._take_request()
                loop = asyncio.get_running_loop()
                self._pending[request_id] = (loop.time(), taken, closes)
                self._update_window()
                if self._watchdog is None:
                    self._watchdog = loop.call_later(self.add_timeout_s, self._check_timeout)
                await call.write(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._stream_failed(call, e)

    def _update_window(self) -> None:
        unanswered = len(self._pending)
        if unanswered < REQUESTS_IN_FLIGHT_SMALL or (
                unanswered < REQUESTS_IN_FLIGHT_MAX and self._queued_bytes >= self.request_bytes_max):
            self._window_open.set()
        else:
            self._window_open.clear()

    def _check_timeout(self) -> None:
        """One timer per stream, not one per request: the oldest request still unanswered after add_timeout_s
        fails the stream, and every add in flight on it; otherwise the timer moves to the oldest's deadline."""
        self._watchdog = None
        call = self._call
        if call is None or not self._pending:
            return
        loop = asyncio.get_running_loop()
        # The same float for the test and the timer: `now - oldest >= timeout` can be false at the very time
        # `oldest + timeout` the timer was set for (rounding), and the timer would then be set again for now,
        # for ever on a clock that does not move in between (found by the simulation, seed 101).
        deadline = next(iter(self._pending.values()))[0] + self.add_timeout_s
        if loop.time() >= deadline:
            self._stream_failed(call, BookieUnavailableError(
                f"bookie {self.bookie_id} at {self.address}: no answer within {self.add_timeout_s}s"))
        else:
            self._watchdog = loop.call_at(deadline, self._check_timeout)

    async def _receive_loop(self, call: Any) -> None:
        try:
            async for response in call:
                _, taken, closes = self._pending.pop(response.request_id, (0.0, [], []))
                self._update_window()
                if response.draining and self.on_draining is not None:
                    self.on_draining(self.bookie_id)
                if closes:
                    _settle_closes(closes, response, self.bookie_id)
                if response.error in REQUEST_REFUSALS:  # about the request itself, not the bookie's health
                    for group, callback in taken:
                        callback(group, Refusal([response.error] * len(group.entry_ids), response.error_message))
                    continue
                if response.error or response.group_count != len(taken):
                    err = BookieUnavailableError(
                        f"bookie {self.bookie_id} refused a request: {response.error_message}" if response.error
                        else f"bookie {self.bookie_id} answered {response.group_count} of {len(taken)} groups "
                             "(does it speak the flat add form?)")
                    for group, callback in taken:
                        callback(group, err)
                    continue
                if not response.refused_groups:
                    for group, callback in taken:
                        callback(group, None)
                    continue
                refused = {r.group: Refusal(list(r.codes), r.message) for r in response.refused_groups}
                for k, (group, callback) in enumerate(taken):
                    callback(group, refused.get(k))
            raise BookieUnavailableError(f"bookie {self.bookie_id} closed the add stream")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._stream_failed(call, e)

    def _stream_failed(self, call: Any, error: Exception) -> None:
        if call is not self._call:
            return
        log.info("add stream to bookie %s at %s failed: %s", self.bookie_id, self.address, error)
        self._call = None
        call.cancel()
        for task in (self._sender, self._receiver):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._sender = self._receiver = None
        err = error if isinstance(error, BookieUnavailableError) else BookieUnavailableError(
            f"bookie {self.bookie_id} at {self.address}: {_describe(error, self.tls)}")
        self._fail_all(err)
        self._window_open.set()

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        queued, self._queue = self._queue, deque()
        closes, self._closes = self._closes, deque()
        self._closes_due = False
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        self._queued_bytes = 0
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for _, taken, sent_closes in pending.values():
            for group, callback in taken:
                callback(group, error)
            _settle_closes(sent_closes, error, self.bookie_id)
        for group, callback in queued:
            callback(group, error)
        _settle_closes(list(closes), error, self.bookie_id)

    # -- reads and ledger calls ------------------------------------------------------------------------
    async def read(self, ledger_id: int, entry_ids: Sequence[int], timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """Read entries; a `range` of step 1 goes as a range (the bookie stops at its first failure), anything
        else as a list of ids (each answered on its own)."""
        if isinstance(entry_ids, range) and entry_ids.step == 1 and len(entry_ids):
            request = pb.ReadRequest(ledger_id=ledger_id, first_entry_id=entry_ids.start,
                                     last_entry_id=entry_ids.stop - 1)
        else:
            request = pb.ReadRequest(ledger_id=ledger_id, entry_ids=list(entry_ids))
        return await self._unary(self._stub.ReadEntries(request, timeout=timeout_s, metadata=_trace_metadata()))

    async def read_tail(self, ledger_id: int, previous_lac: int, wait_ms: int, max_entries: int,
                        timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """A tailing read's long poll (the Bookie service's ReadTail)."""
        return await self._unary(self._stub.ReadTail(pb.ReadTailRequest(
            ledger_id=ledger_id, previous_lac=previous_lac, wait_ms=wait_ms, max_entries=max_entries),
            timeout=timeout_s, metadata=_trace_metadata()))

    async def read_lac(self, ledger_id: int, fence: bool = False, master_key: bytes = b"",
                       timeout_s: float = CALL_TIMEOUT_S) -> Any:
        return await self._unary(self._stub.ReadLastAddConfirmed(
            pb.ReadLacRequest(ledger_id=ledger_id, fence=fence, master_key=master_key), timeout=timeout_s,
            metadata=_trace_metadata()))

    async def list_entries(self, ledger_id: int, first_entry_id: int, last_entry_id: int,
                           timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """Which entries of [first, last] the bookie stores (ListEntriesResponse; a long range comes in parts)."""
        return await self._unary(self._stub.ListEntries(
            pb.ListEntriesRequest(ledger_id=ledger_id, first_entry_id=first_entry_id, last_entry_id=last_entry_id),
            timeout=timeout_s))

    async def _unary(self, call: Any) -> Any:
        """A unary call's answer; its failure as BookieUnavailableError. So is a call cut short because this client
        was closed under it (Client._replace_connection, after the bookie restarted or moved): grpc raises
        CancelledError for a call whose channel closed, which would read as the caller's own task cancelled."""
        try:
            return await call
        except grpc.aio.AioRpcError as e:
            raise BookieUnavailableError(
                f"bookie {self.bookie_id} at {self.address}: {_describe(e, self.tls)}") from e
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._closed or task is None or task.cancelling():
                raise  # the caller's task is being cancelled: that stays a cancellation
            raise BookieUnavailableError(f"bookie {self.bookie_id} at {self.address}: the connection was closed "
                                         "under the call (replaced: the bookie restarted or moved)") from None

    def write_close_soon(self, ledger_id: int, master_key: bytes, last_entry_id: int) -> asyncio.Future[str | None]:
        """Queue the advisory write-close on the add stream: it rides on the next add request, or goes in one of
        its own after CLOSE_LINGER_S, so closing many ledgers costs no call per ledger. The future (which the
        caller may ignore) gets None once the bookie did it, or why not; it never raises."""
        done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        if self._closed:
            done.set_result("client closed")
            return done
        self._closes.append(WriteClose(ledger_id, master_key, last_entry_id, done))
        if self._close_timer is None and not self._closes_due:
            self._close_timer = asyncio.get_running_loop().call_later(CLOSE_LINGER_S, self._closes_now)
        return done

    def _closes_now(self) -> None:
        if self._close_timer is not None:
            self._close_timer.cancel()
            self._close_timer = None
        if self._closes:
            self._closes_due = True
            self._send_soon()

    async def flush_closes(self, timeout_s: float) -> None:
        """Send the write-closes queued now and wait up to `timeout_s` for their answers (a client closing)."""
        waiting = [c.done for c in self._closes] + [c.done for _, _, closes in self._pending.values()
                                                    for c in closes]
        self._closes_now()
        if waiting:
            await asyncio.wait(waiting, timeout=timeout_s)


def _settle_closes(closes: list[WriteClose], outcome: Any, bookie_id: str) -> None:
    """Answer write-closes from the response of the request that carried them, or fail them with an error; a
    refusal or a failure is logged (at info: a write-close is advisory)."""
    if isinstance(outcome, BaseException):
        failed = {k: f"failed: {outcome}" for k in range(len(closes))}
    elif outcome.error:
        failed = {k: f"refused: {pb.ResultCode.Name(outcome.error)}: {outcome.error_message}"
                  for k in range(len(closes))}
    else:
        failed = {r.group: f"refused: {pb.ResultCode.Name(r.codes[0] if r.codes else pb.INTERNAL)}: {r.message}"
                  for r in outcome.refused_closes}
    for k, close in enumerate(closes):
        why = failed.get(k)
        if why is not None:
            log.info("write-close of ledger %d on bookie %s %s", close.ledger_id, bookie_id, why)
        if not close.done.done():
            close.done.set_result(why)


def _describe(error: BaseException, tls: TlsFiles | None = None) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        hint = ""
        if tls is not None and error.code() == grpc.StatusCode.UNAVAILABLE:
            # gRPC reports a refused handshake as UNAVAILABLE, like a bookie that is down.
            hint = (" (TLS is on: a bookie that refuses this client's certificate, or presents one tls_ca_file "
                    "does not trust, also shows as UNAVAILABLE)")
        return f"{error.code().name}: {error.details()}{hint}"
    return f"{type(error).__name__}: {error}"
