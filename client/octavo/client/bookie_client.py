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
from dataclasses import dataclass, field
from typing import Any

import grpc

from octavo.client.errors import BookieUnavailableError
from octavo.client.etcd import CHANNEL_OPTIONS
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# One AddRequest carries at most this much; a bookie's batch limits must be at least as large (its defaults
# are 10,000 entries and 16 MiB). One entry may be as large as the bookie's entry_size_bytes_max.
REQUEST_ENTRIES_MAX = 4_096
REQUEST_BYTES_MAX = 4 * 1024 * 1024
REQUESTS_IN_FLIGHT_MAX = 16
CALL_TIMEOUT_S = 10.0
MESSAGE_BYTES_MAX = 128 * 1024 * 1024


# Called once per add with the per-entry codes, or with the exception that failed it.
AddCallback = Callable[[list[int] | BaseException], None]


@dataclass(slots=True)
class _Add:
    ledger_id: int
    master_key: bytes
    last_add_confirmed: int
    recovery: bool
    entry_ids: list[int]
    payloads: list[bytes]
    callback: AddCallback = field(repr=False)
    size: int = 0
    done: bool = False

    def finish(self, result: list[int] | BaseException) -> None:
        if not self.done:
            self.done = True
            self.callback(result)


class _Joined:
    """Joins the results of an add split over several requests into one callback, in order."""

    def __init__(self, pieces: int, callback: AddCallback) -> None:
        self.parts: list[list[int] | None] = [None] * pieces
        self.callback = callback
        self.failed = False

    def piece(self, k: int) -> AddCallback:
        def done(result: list[int] | BaseException) -> None:
            if self.failed:
                return
            if isinstance(result, BaseException):
                self.failed = True
                self.callback(result)
                return
            self.parts[k] = result
            if all(part is not None for part in self.parts):
                self.callback([code for part in self.parts for code in part or []])
        return done


class BookieClient:
    def __init__(self, bookie_id: str, address: str, add_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.bookie_id = bookie_id
        self.address = address
        self.add_timeout_s = add_timeout_s
        self._channel = grpc.aio.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
            ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
            *CHANNEL_OPTIONS,
        ])
        self._stub = pb_grpc.BookieStub(self._channel)
        self._queue: deque[_Add] = deque()
        self._wake = asyncio.Event()
        self._window = asyncio.Semaphore(REQUESTS_IN_FLIGHT_MAX)
        self._pending: dict[int, list[_Add]] = {}
        self._request_id = 0
        self._call: Any = None
        self._sender: asyncio.Task[None] | None = None
        self._receiver: asyncio.Task[None] | None = None
        self._closed = False

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

        def settle(result: list[int] | BaseException) -> None:
            if future.done():
                return
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

        self.add_with_callback(ledger_id, master_key, entry_ids, payloads, last_add_confirmed, recovery, settle)
        return future

    def add_with_callback(self, ledger_id: int, master_key: bytes, entry_ids: list[int], payloads: list[bytes],
                          last_add_confirmed: int, recovery: bool, callback: AddCallback) -> None:
        """Queue entries of one ledger; `callback` gets the codes (or the exception) exactly once. The cheap
        path for writers: no future and no timer per add (a request that goes unanswered fails the stream)."""
        if self._closed:
            callback(BookieUnavailableError(f"bookie {self.bookie_id}: client closed"))
            return
        pieces: list[tuple[int, int, int]] = []
        start = size = 0
        for i, payload in enumerate(payloads):
            if i > start and (i - start >= REQUEST_ENTRIES_MAX or size + len(payload) > REQUEST_BYTES_MAX):
                pieces.append((start, i, size))
                start, size = i, 0
            size += len(payload)
        pieces.append((start, len(payloads), size))
        if len(pieces) == 1:
            self._queue.append(_Add(ledger_id, master_key, last_add_confirmed, recovery, entry_ids, payloads,
                                    callback, size))
        else:
            joined = _Joined(len(pieces), callback)
            for k, (a, b, piece_size) in enumerate(pieces):
                self._queue.append(_Add(ledger_id, master_key, last_add_confirmed, recovery, entry_ids[a:b],
                                        payloads[a:b], joined.piece(k), piece_size))
        self._wake.set()
        if self._sender is None or self._sender.done():
            self._start_stream()

    def _start_stream(self) -> None:
        self._call = self._stub.AddEntries(timeout=None)
        self._sender = asyncio.create_task(self._send_loop(self._call), name=f"octavo-send-{self.bookie_id}")
        self._receiver = asyncio.create_task(self._receive_loop(self._call), name=f"octavo-recv-{self.bookie_id}")

    def _take_request(self) -> tuple[pb.AddRequest, list[_Add]]:
        taken: list[_Add] = []
        entries = size = 0
        while self._queue:
            add = self._queue[0]
            if taken and (entries + len(add.entry_ids) > REQUEST_ENTRIES_MAX or size + add.size > REQUEST_BYTES_MAX):
                break
            taken.append(self._queue.popleft())
            entries += len(add.entry_ids)
            size += add.size
        self._request_id += 1
        request = pb.AddRequest(request_id=self._request_id, ledgers=[
            pb.LedgerAdds(ledger_id=a.ledger_id, master_key=a.master_key, last_add_confirmed=a.last_add_confirmed,
                          recovery=a.recovery, entry_ids=a.entry_ids, payloads=a.payloads) for a in taken])
        return request, taken

    async def _send_loop(self, call: Any) -> None:
        try:
            while True:
                if not self._queue:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._window.acquire()
                if not self._queue:
                    self._window.release()
                    continue
                request, taken = self._take_request()
                self._pending[request.request_id] = taken
                asyncio.get_running_loop().call_later(self.add_timeout_s, self._check_timeout, call,
                                                      request.request_id)
                await call.write(request)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._stream_failed(call, e)

    def _check_timeout(self, call: Any, request_id: int) -> None:
        """A request still unanswered after add_timeout_s fails the stream, and every add in flight on it."""
        if call is self._call and request_id in self._pending:
            self._stream_failed(call, BookieUnavailableError(
                f"bookie {self.bookie_id} at {self.address}: no answer within {self.add_timeout_s}s"))

    async def _receive_loop(self, call: Any) -> None:
        try:
            async for response in call:
                taken = self._pending.pop(response.request_id, [])
                self._window.release()
                if response.error:
                    err = BookieUnavailableError(f"bookie {self.bookie_id} refused a request: {response.error_message}")
                    for add in taken:
                        add.finish(err)
                    continue
                for add, result in zip(taken, response.results, strict=False):
                    add.finish(list(result.codes) or [pb.OK] * len(add.entry_ids))
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
            f"bookie {self.bookie_id} at {self.address}: {_describe(error)}")
        self._fail_all(err)
        self._window = asyncio.Semaphore(REQUESTS_IN_FLIGHT_MAX)

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        queued, self._queue = self._queue, deque()
        for taken in pending.values():
            for add in taken:
                add.finish(error)
        for add in queued:
            add.finish(error)

    # -- reads and ledger calls ------------------------------------------------------------------------
    async def read(self, ledger_id: int, entry_ids: Sequence[int], timeout_s: float = CALL_TIMEOUT_S) -> Any:
        try:
            return await self._stub.ReadEntries(pb.ReadRequest(ledger_id=ledger_id, entry_ids=list(entry_ids)),
                                                timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            raise BookieUnavailableError(f"bookie {self.bookie_id} at {self.address}: {_describe(e)}") from e

    async def read_lac(self, ledger_id: int, fence: bool = False, master_key: bytes = b"",
                       timeout_s: float = CALL_TIMEOUT_S) -> Any:
        try:
            return await self._stub.ReadLastAddConfirmed(
                pb.ReadLacRequest(ledger_id=ledger_id, fence=fence, master_key=master_key), timeout=timeout_s)
        except grpc.aio.AioRpcError as e:
            raise BookieUnavailableError(f"bookie {self.bookie_id} at {self.address}: {_describe(e)}") from e

    async def write_close(self, ledger_id: int, master_key: bytes, last_entry_id: int) -> None:
        try:
            resp = await self._stub.WriteClose(pb.WriteCloseRequest(ledger_id=ledger_id, master_key=master_key,
                                                                    last_entry_id=last_entry_id),
                                               timeout=CALL_TIMEOUT_S)
            if resp.code:
                log.info("write-close of ledger %d on bookie %s: %s", ledger_id, self.bookie_id, resp.message)
        except grpc.aio.AioRpcError as e:
            log.info("write-close of ledger %d on bookie %s failed: %s", ledger_id, self.bookie_id, _describe(e))


def _describe(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return f"{type(error).__name__}: {error}"
