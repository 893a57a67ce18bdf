"""The write handle: pipelined, batched appends to a write quorum, acknowledged in order.

Every append gets the next entry id and goes to the Qw bookies of its write set (entry e: positions starting
at e mod E of the last ensemble). Appends made in the same event-loop turn go out together: one flush per
turn for all of the client's handles, one batch per (ledger, bookie), and the client's connection to each
bookie packs the batches of every ledger into one request.

Acknowledgement is tracked per bookie, not per entry, by the pure `quorums.AckMarks`: a bookie answers its
requests in order, so each bookie of the last ensemble has a mark, the highest entry id it stored with every
entry of its write sets before it. An entry is acknowledged once Qa bookies of its write set have marks at or
past it *and* every entry before it is acknowledged; the last-add-confirmed (LAC) is the highest such entry
and rides on every add. A bookie whose stream failed or that refused an add gets no further marks (a later
answer on a new stream must not vouch for the failed request's entries).

Refusals are of two kinds. A refusal of the entry itself (TOO_LARGE, INVALID) or of the writer (UNAUTHORIZED:
wrong master key; NO_SUCH_LEDGER: the ledger was deleted; FENCED, below) would be the same on any bookie, so it
fails the handle with a typed error carrying the bookie's message, and never changes the ensemble. Entries
are checked against the ensemble's own entry_size_bytes_max (from the bookies' registrations) before they get
ids, so an entry too large for a bookie is refused by append() and the ledger goes on.
A bookie that fails, refuses for its own state (READ_ONLY, INTERNAL, ...) or leaves a request unanswered for
add_timeout_s (its stream then fails) is replaced: a new ensemble segment starting at the first unacknowledged
entry (LAC + 1) is written to etcd with a CAS, and every unacknowledged entry whose write set now includes the
replacement is sent to it. While a change is in flight the LAC stands still (as in BookKeeper): an entry acknowledged
during the change would belong to the new segment without a copy on the replacement. A FENCED answer means a
recovery open took the ledger over: every pending and later append fails with LedgerFencedError.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from octavo.client import faults
from octavo.client.arguments import check_bytes, check_entry_list, check_str_map
from octavo.client.bookie_client import AddCallback, AddGroup, Refusal, add_group
from octavo.client.context import ClientContext
from octavo.client.placement import CONNECTING, IDLE, READY, UNREGISTERED, replacement_choice
from octavo.client.quorums import AckMarks
from octavo.client.scheduler import LAC_UPDATE_DELAY_S
from octavo.meta.errors import (
    BookieUnavailableError,
    BufferFullError,
    EntryRefusedError,
    EntryTooLargeError,
    EtcdSpaceExceededError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataUnavailableError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    OctavoError,
    PermissionDeniedError,
    WrongPasswordError,
)
from octavo.meta.ledger_metadata import CLOSED, CUSTOM_METADATA_BYTES_MAX, OPEN, LedgerMetadata, write_set
from octavo.meta.retry import CasRetry
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

ENSEMBLE_CHANGE_ATTEMPTS_MAX = 10
ENSEMBLE_CHANGE_METADATA_WAIT_S = 30.0
# How often an ensemble change that waits for a usable bookie reads the registrations again.
ENSEMBLE_CHANGE_POLL_S = 0.2


def _ignore(_: AddGroup, __: object) -> None:
    """Answers to LAC-only adds change nothing: a lost one only leaves readers one batch behind."""


class WriteHandle:
    def __init__(self, client: ClientContext, metadata: LedgerMetadata, revision: int, master_key: bytes) -> None:
        self._client = client
        self.metadata = metadata
        self._revision = revision
        self._master_key = master_key
        self._options = client.options
        self._next_entry = 0
        self._lac = -1
        self._length = 0
        # Payloads of the entries not yet acknowledged: entry e is _data[e - (LAC + 1)].
        self._data: list[bytes] = []
        self._sent_to = 0  # entries below this id have been handed to the bookies
        # (entry id, future), in id order; an asyncio future, or a concurrent one of a SyncWriteHandle's producer
        self._waiters: deque[tuple[int, Any]] = deque()
        self._loop = asyncio.get_running_loop()
        # Acknowledgement marks per bookie of the last ensemble (quorums.AckMarks); its bookies that failed
        # this handle no longer count and are never chosen again.
        self._acks = AckMarks(metadata.last_ensemble)
        self._callbacks: dict[str, AddCallback] = {}  # per bookie: _on_result bound to it and its epoch
        # Per bookie, which of its connections to this handle counts: bumped when it fails and when it joins
        # the ensemble, so an answer to a request sent before either is never taken as an acknowledgement.
        self._epochs: dict[str, int] = {}
        # Bookies that failed this handle, and when (loop time): not chosen again for bookie_quarantine_s,
        # unless no other bookie is usable and they are reachable again.
        self._quarantine: dict[str, float] = {}
        # ... and the started_unix_ms of the registration it had then (0: unknown): a new process is not quarantined.
        self._quarantined_process: dict[str, int] = {}
        self._failure_reasons: dict[str, str] = {}  # the last failure of each bookie, for error messages
        self._flush_scheduled = False
        self._unsent_bytes = 0  # appended, not yet handed to the bookies (what a linger waits to grow)
        self._linger_s = self._options.linger_ms / 1000
        self._linger_timer: asyncio.TimerHandle | None = None
        # Called (in the loop) when acknowledgements free room or the handle fails: the blocking producer of a
        # SyncWriteHandle waits on it from its own threads.
        self._room_hook: Callable[[], None] | None = None
        self._inflight_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._error: OctavoError | None = None
        self._closing = False
        self._close_metadata: dict[str, str] | None = None  # custom metadata the close writes (close())
        self._closed = False
        self._change_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()  # ensemble changes running (kept referenced)
        self._changing: set[str] = set()
        self.ensemble_changes = 0
        self.outstanding_requests = 0  # bookie add calls sent and not yet answered
        self._lac_sent = -1
        self._lac_timer_armed = False
        self._idle_since = 0.0  # when the last pending entry was acknowledged
        self._entry_limit, self._entry_limit_by = self._ensemble_entry_limit()
        # Observability: (last entry id, when sent) per flush, for the latency to the ack quorum (one histogram
        # record per flush, never per entry); the traceparent of a sampled append_many the next flush carries.
        self._metrics = client.metrics
        self._metrics.handles.add(self)
        self._flush_marks: deque[tuple[int, float]] = deque()
        self._trace_parent = ""

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def changing_ensemble(self) -> bool:
        """A bookie failed and its replacement is not in etcd yet: acknowledgements wait for it."""
        return bool(self._changing)

    @property
    def _pending(self) -> bool:
        """Some appended entry is not acknowledged yet."""
        return self._next_entry > self._lac + 1

    # -- appends ---------------------------------------------------------------------------------------
    async def append(self, data: bytes) -> int:
        """Append one entry; returns its entry id once it is acknowledged. Many appends may be in flight
        (gather them); they are acknowledged in entry-id order. For many entries, append_many is cheaper."""
        data = self._checked([data], single=True)[0]
        await self._wait_for_room(len(data))
        future = self._enqueue([data], len(data), want_future=True)
        assert future is not None
        return await future

    async def append_many(self, entries: Sequence[bytes]) -> list[int]:
        """Append entries in order, all pipelined; returns their ids once all are acknowledged. Much cheaper
        per entry than gathering append() calls: one future for the whole batch. Every entry is checked
        before any is appended: a bad one fails the call with nothing appended."""
        if type(entries) is not list:
            check_entry_list("entries", entries)
        if self._client.tracing.sampling.enabled:
            with self._client.tracing.operation("octavo.append", **{"octavo.ledger_id": self.ledger_id,
                                                                    "octavo.entries": len(entries)}) as span:
                if span is not None:
                    self._trace_parent = self._client.tracing.traceparent(span)
                return await self._append_many(entries)
        return await self._append_many(entries)

    async def _append_many(self, entries: Sequence[bytes]) -> list[int]:
        if not entries:
            return []
        datas = self._checked(entries)
        first = self._next_entry
        limit = self._options.inflight_bytes_max
        total = sum(map(len, datas))
        if self._inflight_bytes + total <= limit:  # the common case: all of it fits the window at once
            end = await self._enqueue_future(datas, total)
            return list(range(first, end + 1))
        n = len(datas)
        i = 0
        last: asyncio.Future[int] | None = None
        while i < n:
            room = limit - self._inflight_bytes
            j, size = i, 0
            while j < n and (size + len(datas[j]) <= room or (j == i and not self._inflight_bytes)):
                size += len(datas[j])
                j += 1
            if j == i:
                await self._wait_for_room(len(datas[i]))
                continue
            last = self._enqueue(datas[i:j], size, want_future=j == n)
            i = j
        assert last is not None
        end = await last
        return list(range(first, end + 1))

    def _enqueue_future(self, datas: list[bytes], size: int) -> asyncio.Future[int]:
        future = self._enqueue(datas, size, want_future=True)
        assert future is not None
        return future

    def _checked(self, entries: Sequence[bytes], single: bool = False) -> list[bytes]:
        """The entries as bytes, checked (type, size) before any is appended. `single`: one entry of append
        (named `data` in errors), else `entries[k]` of append_many."""
        if self._error is not None:
            raise self._error
        if self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed to appends")
        datas = list(entries)
        if len(set(map(type, datas))) != 1 or type(datas[0]) is not bytes:  # set(map()) keeps the check in C
            for k, data in enumerate(datas):
                if type(data) is not bytes:
                    datas[k] = check_bytes("data" if single else f"entries[{k}]", data)
        largest = max(map(len, datas))
        if largest > self._entry_limit:
            raise EntryTooLargeError(f"entry of {largest} bytes is over {self._entry_limit_by}'s "
                                     f"entry_size_bytes_max={self._entry_limit}")
        return datas

    def _ensemble_entry_limit(self) -> tuple[int, str]:
        """The largest entry every bookie of the last ensemble takes, and who sets it: the client's option, or
        the bookie with the smallest registered entry_size_bytes_max."""
        limit, by = self._options.entry_size_bytes_max, "the client"
        registrations = self._client.registrations
        for bookie_id in self.metadata.last_ensemble:
            info = registrations.get(bookie_id)
            if info is not None and 0 < info.entry_size_bytes_max < limit:
                limit, by = info.entry_size_bytes_max, f"bookie {bookie_id}"
        return limit, by

    async def _wait_for_room(self, size: int) -> None:
        while self._inflight_bytes and self._inflight_bytes + size > self._options.inflight_bytes_max:
            if self._error is not None:
                raise self._error
            self._room.clear()
            await self._room.wait()
        if self._error is not None:
            raise self._error
        if self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed to appends")

    def _enqueue(self, datas: list[bytes], size: int, want_future: bool) -> asyncio.Future[int] | None:
        """Give the next ids to `datas` (checked); the future, if wanted, resolves with the last id."""
        self._data += datas
        self._next_entry += len(datas)
        self._inflight_bytes += size
        self._unsent_bytes += size
        future = None
        if want_future:
            future = asyncio.get_running_loop().create_future()
            self._waiters.append((self._next_entry - 1, future))
        if not self._flush_scheduled:
            self._want_flush()
        return future

    # -- the producer path -----------------------------------------------------------------------------
    def append_nowait(self, data: bytes) -> asyncio.Future[int]:
        """Append one entry without waiting: returns a future of its entry id, resolved once the entry is
        acknowledged (in entry-id order), or failed with the handle's error (LedgerFencedError, ...). No
        coroutine per record: call it from the event loop's thread as fast as records come; they go out
        together when the calling task yields (or after ClientOptions.linger_ms). Raises BufferFullError when
        the in-flight budget (inflight_bytes_max) has no room: await `send()` instead to wait for room, or
        `flush()`. Raises at once (nothing appended) for an entry that is too large, not bytes, or a handle that
        failed or is closing."""
        if type(data) is not bytes or self._error is not None or self._closing or len(data) > self._entry_limit:
            data = self._checked([data], single=True)[0]
        size = len(data)
        inflight = self._inflight_bytes
        if inflight and inflight + size > self._options.inflight_bytes_max:
            raise BufferFullError(f"ledger {self.ledger_id}: {inflight} bytes in flight, the budget is "
                                  f"inflight_bytes_max={self._options.inflight_bytes_max}")
        future = self._loop.create_future()
        eid = self._next_entry
        self._next_entry = eid + 1
        self._data.append(data)
        self._inflight_bytes = inflight + size
        self._unsent_bytes += size
        self._waiters.append((eid, future))
        if not self._flush_scheduled:
            self._want_flush()
        return future

    async def send(self, data: bytes) -> asyncio.Future[int]:
        """append_nowait(), waiting for room in the in-flight budget first if there is none (back-pressure);
        returns the entry's future without waiting for its acknowledgement."""
        while True:
            try:
                return self.append_nowait(data)
            except BufferFullError:
                await self._wait_for_room(len(data))

    async def flush(self) -> None:
        """Wait until every entry appended so far is acknowledged (lingering ones are sent now). Raises the
        handle's error if it failed."""
        if self._error is not None:
            raise self._error
        if not self._pending:
            return
        if self._linger_timer is not None:
            self._linger_expired()
        future = self._loop.create_future()
        self._waiters.append((self._next_entry - 1, future))
        await future

    def _submit(self, datas: list[bytes], futures: list[Any], size: int) -> None:
        """Entries checked by a SyncWriteHandle's producer threads, with their concurrent futures (run in the
        loop): the futures get the ids, or the handle's error."""
        if self._error is not None or self._closing:
            error = self._error or LedgerClosedError(f"ledger {self.ledger_id} is closed to appends")
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        first = self._next_entry
        self._data += datas
        self._next_entry = first + len(datas)
        self._inflight_bytes += size
        self._unsent_bytes += size
        self._waiters.extend(zip(range(first, first + len(datas)), futures, strict=True))
        if not self._flush_scheduled:
            self._want_flush()

    def _want_flush(self) -> None:
        """Appends are waiting to go out: send them at the end of this loop turn, or, with a linger, when it
        expires or the batch reaches linger_bytes_max."""
        if self._linger_s and self._unsent_bytes < self._options.linger_bytes_max:
            if self._linger_timer is None:
                self._linger_timer = self._client.write_scheduler.flush_later(self, self._linger_s)
            return
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        self._flush_scheduled = True
        self._client.write_scheduler.flush_soon(self)

    def _linger_expired(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if not self._flush_scheduled:
            self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._unsent_bytes = 0
        first, end = self._sent_to, self._next_entry
        if first >= end or self._error is not None:
            return
        self._sent_to = end
        self._flush_marks.append((end - 1, time.perf_counter()))
        base = self._lac + 1
        datas = self._data[first - base:end - base]
        meta = self.metadata
        ensemble = meta.last_ensemble
        trace_parent, self._trace_parent = self._trace_parent, ""
        if meta.write_quorum == meta.ensemble_size:  # one group, shared by every bookie of the ensemble
            group = AddGroup(self.ledger_id, self._master_key, self._lac, False, range(first, end), datas,
                             sum(map(len, datas)), trace_parent)
            for bookie in ensemble:
                self._send(bookie, group)
            return
        groups: dict[str, tuple[list[int], list[bytes]]] = {}
        for k, data in enumerate(datas):
            eid = first + k
            for position in write_set(eid, meta.ensemble_size, meta.write_quorum):
                ids_, datas_ = groups.setdefault(ensemble[position], ([], []))
                ids_.append(eid)
                datas_.append(data)
        for bookie, (ids_, datas_) in groups.items():
            group = add_group(self.ledger_id, self._master_key, ids_, datas_, self._lac)
            self._send(bookie, group._replace(trace_parent=trace_parent) if trace_parent else group)

    def _send(self, bookie_id: str, group: AddGroup) -> None:
        try:
            bookie = self._client.bookie_client(bookie_id)
        except BookieUnavailableError as e:
            self._bookie_failed(bookie_id, str(e))
            return
        self.outstanding_requests += 1
        if self._lac > self._lac_sent:
            self._lac_sent = self._lac
        callback = self._callbacks.get(bookie_id)
        if callback is None:
            callback = self._callbacks[bookie_id] = functools.partial(self._on_result, bookie_id,
                                                                      self._epochs.get(bookie_id, 0))
        bookie.add_group(group, callback)

    def _new_epoch(self, bookie_id: str) -> None:
        """Answers to what was sent to this bookie so far no longer count (a failure, or a new segment)."""
        self._epochs[bookie_id] = self._epochs.get(bookie_id, 0) + 1
        self._callbacks.pop(bookie_id, None)

    def _on_result(self, bookie_id: str, epoch: int, group: AddGroup, result: Refusal | BaseException | None) -> None:
        self.outstanding_requests -= 1
        if epoch != self._epochs.get(bookie_id, 0):
            # A request sent before this bookie failed or rejoined: its marks mean nothing now. A fence is
            # still a fence.
            if isinstance(result, Refusal) and pb.FENCED in result.codes and not self._closed \
                    and any(eid > self._lac for eid, code in zip(group.entry_ids, result.codes, strict=False)
                            if code == pb.FENCED):
                self._fail(LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recovery open: no more "
                                             "appends can be acknowledged"))
            return
        if result is None:  # the common case: every entry stored
            last = group.entry_ids[-1]
            # If last <= LAC, the LAC is already past everything this answer vouches for.
            if self._acks.stored(bookie_id, last) and last > self._lac:
                self._advance()
            return
        if isinstance(result, BaseException):
            self._bookie_failed(bookie_id, str(result))
            return
        if self._closed:
            return  # a late answer after the close (a copy of an acknowledged entry): nothing depends on it
        refused = ""
        for eid, code in zip(group.entry_ids, result.codes, strict=False):
            if code == pb.OK:
                continue
            if code == pb.FENCED:
                if self._closed or eid <= self._lac:
                    continue  # a late copy of an acknowledged entry, refused after the close: nothing is lost
                self._fail(LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recovery open: no more "
                                             "appends can be acknowledged"))
                return
            error = self._refusal_error(bookie_id, eid, code, result.message)
            if error is not None:
                log.warning("ledger %d: %s", self.ledger_id, error)
                self._fail(error)
                return
            refused = f"{pb.ResultCode.Name(code)}: {result.message}"  # type: ignore[arg-type]
        if refused:
            self._bookie_failed(bookie_id, f"refused adds: {refused}")
            return
        if self._acks.stored(bookie_id, group.entry_ids[-1]):
            self._advance()

    def _refusal_error(self, bookie_id: str, entry_id: int, code: int, message: str) -> OctavoError | None:
        """The error for a refusal that any bookie would give (the entry, the key, a deleted ledger); None for
        one about the bookie's own state (READ_ONLY, INTERNAL, ...), which an ensemble change answers."""
        if code == pb.UNAUTHORIZED:
            return WrongPasswordError(f"bookie {bookie_id} refused the master key of ledger {self.ledger_id}")
        if code == pb.PERMISSION_DENIED:
            return PermissionDeniedError(f"bookie {bookie_id} refused ledger {self.ledger_id} to this client: "
                                         f"{message}")
        if code == pb.NO_SUCH_LEDGER:
            return NoSuchLedgerError(f"ledger {self.ledger_id} was deleted: bookie {bookie_id} refuses adds to it "
                                     f"({message})")
        if code == pb.TOO_LARGE:
            return EntryTooLargeError(f"bookie {bookie_id} refused entry {entry_id} of ledger {self.ledger_id}: "
                                      f"{message}; no later entry of this handle can be acknowledged")
        if code == pb.INVALID:
            return EntryRefusedError(f"bookie {bookie_id} refused entry {entry_id} of ledger {self.ledger_id}: "
                                     f"{message}")
        return None

    def _advance(self) -> None:
        if self._changing or self._error is not None:
            return  # the LAC stands still while the ensemble changes
        meta = self.metadata
        top = self._acks.acknowledged_up_to(self._lac, self._sent_to, meta.last_ensemble, meta.write_quorum,
                                            meta.ack_quorum)
        if top > self._lac:
            k = top - self._lac
            done = self._data[:k]
            del self._data[:k]
            size = sum(map(len, done))
            self._length += size
            self._inflight_bytes -= size
            self._lac = top
            marks = self._flush_marks
            if marks and marks[0][0] <= top:
                now = time.perf_counter()
                record = self._metrics.add_latency.record
                while marks and marks[0][0] <= top:
                    record(now - marks.popleft()[1])
            waiters = self._waiters
            while waiters and waiters[0][0] <= top:
                eid, future = waiters.popleft()
                if not future.done():
                    future.set_result(eid)
            self._room.set()
            if self._room_hook is not None:
                self._room_hook()
            if not self._pending:
                self._idle_since = time.monotonic()
                if self._lac > self._lac_sent and not self._lac_timer_armed and not self._closing:
                    self._lac_timer_armed = True
                    self._client.write_scheduler.lac_later(self)

    def _send_lac_if_idle(self) -> None:
        """Explicit LAC (BookKeeper's explicitLac): adds carry the LAC of when they were sent, so after the
        last batch the bookies know one batch less than the writer. Once idle, tell them with a LAC-only add
        (no entries), so readers of the open ledger see everything acknowledged."""
        self._lac_timer_armed = False
        if self._pending or self._error is not None or self._closed or self._client.closed:
            return
        if time.monotonic() - self._idle_since < LAC_UPDATE_DELAY_S:  # idle only for a moment: look again later
            self._lac_timer_armed = True
            self._client.write_scheduler.lac_later(self)
            return
        self._lac_sent = self._lac
        for bookie_id in self.metadata.last_ensemble:
            try:
                bookie = self._client.bookie_client(bookie_id)
            except BookieUnavailableError:
                continue
            bookie.add_group(add_group(self.ledger_id, self._master_key, (), (), self._lac), _ignore)

    def abandon(self, error: OctavoError) -> None:
        """The client is going away: fail what is pending, change nothing in etcd."""
        self._fail(error)

    def _fail(self, error: OctavoError) -> None:
        if self._error is None:
            self._error = error
            log.info("ledger %d: %s", self.ledger_id, error)
        waiters, self._waiters = self._waiters, deque()
        for _, future in waiters:
            if not future.done():
                future.set_exception(error)
        self._room.set()
        if self._room_hook is not None:
            self._room_hook()

    # -- ensemble change -------------------------------------------------------------------------------
    def _bookie_failed(self, bookie_id: str, reason: str) -> None:
        if self._error is not None or self._client.closed:
            return
        if bookie_id not in self.metadata.last_ensemble:
            return  # already replaced
        self._acks.failed(bookie_id)  # its later answers must not vouch for the entries this failure lost
        if bookie_id in self._changing:
            return
        log.info("ledger %d: bookie %s failed (%s); changing the ensemble", self.ledger_id, bookie_id, reason,
                 extra={"event": "bookie_failed", "ledger_id": self.ledger_id, "bookie_id": bookie_id})
        self._new_epoch(bookie_id)
        self._quarantine[bookie_id] = asyncio.get_running_loop().time()
        info = self._client.registrations.get(bookie_id)
        self._quarantined_process[bookie_id] = info.started_unix_ms if info is not None else 0
        self._failure_reasons[bookie_id] = reason
        self._changing.add(bookie_id)
        task = asyncio.get_running_loop().create_task(self._change_ensemble(bookie_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def bookie_draining(self, bookie_id: str) -> None:
        """The bookie is stopping (controlled shutdown, drain.py): move off it while it still stores adds, as
        after a failure (a new segment from LAC + 1, the unacknowledged entries sent to the replacement; what
        is already on its way to the draining bookie still lands there). With no bookie usable in its place now
        (the ensemble is the whole cluster), keep writing to it: once it stops, its failure is handled as any
        other."""
        if self._error is not None or self._closed or self._client.closed \
                or bookie_id not in self.metadata.last_ensemble or bookie_id in self._changing:
            return
        choice = replacement_choice(bookie_id, self.metadata.last_ensemble, self._client.registrations,
                                    self._quarantine, asyncio.get_running_loop().time(),
                                    self._options.bookie_quarantine_s, max(map(len, self._data), default=0),
                                    self._connection_state)
        if not choice.ready:
            log.debug("ledger %d: bookie %s is draining but no other bookie can take its place (%s); writing "
                     "to it until it stops", self.ledger_id, bookie_id,
                     "; ".join(f"{b} {why}" for b, why in sorted(choice.unusable.items())) or "none registered")
            return
        self._bookie_failed(bookie_id, "draining: the bookie is stopping")

    def _change_not_needed(self, failed: str) -> bool:
        """The handle failed or closed, the bookie is already replaced, or a close waits with every entry
        acknowledged (the ledger closes as it is; the missing copies are re-replication's to restore)."""
        return (self._error is not None or self._closed or failed not in self.metadata.last_ensemble
                or (self._closing and not self._pending))

    async def _change_ensemble(self, failed: str) -> None:
        """The background task of one ensemble change. Changes and the close take _change_lock, so they are
        ordered: a change that finds the close done (or not needed any more) stops quietly. It never ends with
        an exception: whatever goes wrong fails the handle with a typed error."""
        try:
            async with self._change_lock:
                if self._change_not_needed(failed):
                    return
                try:
                    if self._client.tracing.sampling.enabled:
                        with self._client.tracing.operation("octavo.ensemble_change", **{
                                "octavo.ledger_id": self.ledger_id, "octavo.failed_bookie": failed}) as span:
                            replacement = await self._write_new_segment(failed)
                            if span is not None and replacement is not None:
                                span.set_attribute("octavo.replacement_bookie", replacement)
                    else:
                        replacement = await self._write_new_segment(failed)
                except OctavoError as e:
                    self._fail(e)
                    return
                if replacement is None:
                    return
                # The new segment is in etcd; the replacement holds nothing past the LAC until the resend below.
                faults.hit(faults.ENSEMBLE_CHANGE_AFTER_SEGMENT_CAS)
                self.ensemble_changes += 1
                self._metrics.ensemble_changes.add(1)
                self._new_epoch(replacement)
                self._acks.replaced(failed, replacement, self._lac)
                # Every entry sent and not acknowledged whose write set now has the replacement goes to it;
                # entries not flushed yet go with their flush.
                base = self._lac + 1
                meta = self.metadata
                ids = [e for e in range(base, self._sent_to) if replacement in meta.write_set_bookies(e)]
                if ids:
                    self._send(replacement, add_group(self.ledger_id, self._master_key, ids,
                                                      [self._data[e - base] for e in ids], self._lac))
        except Exception as e:  # a bug, or an error of a kind not foreseen: the handle fails, typed and logged
            log.exception("ledger %d: the ensemble change replacing %s failed", self.ledger_id, failed)
            self._fail(OctavoError(f"ledger {self.ledger_id}: the ensemble change replacing bookie {failed} failed: "
                                   f"{type(e).__name__}: {e}"))
        finally:
            self._changing.discard(failed)
        self._advance()

    async def _write_new_segment(self, failed: str) -> str | None:
        """Replace `failed` in a new segment; None if the change stopped being needed while it waited. An etcd
        outage is waited out for up to ENSEMBLE_CHANGE_METADATA_WAIT_S (appends stay pending meanwhile) before
        the handle fails."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ENSEMBLE_CHANGE_METADATA_WAIT_S
        while True:
            try:
                return await self._try_new_segment(failed)
            except MetadataUnavailableError as e:
                if loop.time() > deadline or isinstance(e, EtcdSpaceExceededError):  # a full etcd stays full
                    raise
                log.info("ledger %d: ensemble change waits for etcd: %s", self.ledger_id, e)
                await asyncio.sleep(0.5)

    async def _try_new_segment(self, failed: str) -> str | None:
        store = self._client.metadata_store
        retry = CasRetry(f"ledger {self.ledger_id}: the ensemble change replacing {failed}",
                         ENSEMBLE_CHANGE_ATTEMPTS_MAX)
        while True:
            replacement = await self._choose_replacement(failed)
            if replacement is None:
                return None
            ensemble = list(self.metadata.last_ensemble)
            ensemble[ensemble.index(failed)] = replacement
            first = self._lac + 1
            changed = self.metadata.with_segment(first, tuple(ensemble))
            revision = await store.update_ledger(changed, self._revision)
            if revision is not None:
                self.metadata, self._revision = changed, revision
                self._entry_limit, self._entry_limit_by = self._ensemble_entry_limit()
                self._quarantine.pop(replacement, None)
                log.info("ledger %d: bookie %s replaced by %s from entry %d", self.ledger_id, failed, replacement,
                         first, extra={"event": "ensemble_change", "ledger_id": self.ledger_id,
                                       "from_bookie": failed, "to_bookie": replacement})
                return replacement
            current, current_revision = await store.read_ledger(self.ledger_id)
            if current.state != OPEN:
                raise LedgerFencedError(f"ledger {self.ledger_id} is {current.state} in etcd: a recovery open "
                                        "took it over")
            self.metadata, self._revision = current, current_revision
            await retry.lost(f"revision {current_revision} ({len(current.ensembles)} segments)")

    def _lift_restarted_quarantines(self, registered: dict[str, Any]) -> None:
        """A quarantined bookie that registered again from a new process (a restart, a rolled pod) is a candidate
        again: the quarantine was for the process that failed (or drained) under this handle. In a rolling
        restart the bookie restarted a moment ago is often the only one outside the ensemble."""
        for bookie_id in list(self._quarantine):
            info = registered.get(bookie_id)
            if info is not None and info.started_unix_ms > 0 \
                    and info.started_unix_ms != self._quarantined_process.get(bookie_id, 0):
                log.info("ledger %d: bookie %s restarted since it failed this ledger: no longer quarantined",
                         self.ledger_id, bookie_id)
                del self._quarantine[bookie_id]
                self._quarantined_process.pop(bookie_id, None)

    async def _choose_replacement(self, failed: str) -> str | None:
        """A bookie to take `failed`'s place: one usable now (writable, not in the ensemble, not quarantined,
        its connection up or not tried yet), else a quarantined one that is reachable again. With neither,
        wait up to ensemble_change_wait_s for one (a bookie restarting, a connection coming back), re-reading
        the registrations every ENSEMBLE_CHANGE_POLL_S; then NotEnoughBookiesError names every bookie and why
        it could not be used. None if the change stopped being needed meanwhile."""
        loop = asyncio.get_running_loop()
        wait_s = self._options.ensemble_change_wait_s
        started = loop.time()
        while True:
            now = loop.time()
            registered = await self._client.bookies(refresh=True)
            self._lift_restarted_quarantines(registered)
            choice = replacement_choice(failed, self.metadata.last_ensemble, registered,
                                        self._quarantine, now, self._options.bookie_quarantine_s,
                                        max(map(len, self._data), default=0), self._connection_state)
            if choice.ready:
                return random.choice(choice.ready)
            if choice.fallback:
                reachable = [b for b in choice.fallback if self._connection_state(b) == READY]
                if reachable:
                    log.info("ledger %d: no other bookie is usable; taking back %s, which failed this ledger "
                             "earlier and is reachable again", self.ledger_id, reachable[0])
                    return random.choice(reachable)
            if self._change_not_needed(failed):
                return None
            waited = now - started
            if waited >= wait_s:
                raise NotEnoughBookiesError(
                    f"ledger {self.ledger_id}: no bookie can replace {failed}, which failed "
                    f"({self._failure_reasons.get(failed, 'reason not known')})"
                    + (f"; waited {waited:.1f}s (ensemble_change_wait_s={wait_s:g})" if wait_s else "") + ": "
                    + ("; ".join(f"{b} {why}" for b, why in sorted(choice.unusable.items()))
                       or "no bookie is registered"))
            if waited == 0:
                log.info("ledger %d: no bookie can replace %s now; waiting up to %gs: %s", self.ledger_id, failed,
                         wait_s, "; ".join(f"{b} {why}" for b, why in sorted(choice.unusable.items())))
            await asyncio.sleep(min(ENSEMBLE_CHANGE_POLL_S, wait_s - waited))

    def _connection_state(self, bookie_id: str) -> str:
        """The connection's state as placement.py names it; asking starts a connection attempt on an idle
        channel."""
        try:
            bookie = self._client.bookie_client(bookie_id)
        except BookieUnavailableError:
            return UNREGISTERED
        state = bookie.connectivity(True)
        if state == grpc.ChannelConnectivity.READY:
            return READY
        if state == grpc.ChannelConnectivity.IDLE:
            return IDLE
        return CONNECTING

    # -- close -----------------------------------------------------------------------------------------
    async def close(self, metadata: dict[str, str] | None = None) -> None:
        """Wait for every append in flight, close the ledger in etcd (CAS to CLOSED with its last entry),
        then queue the advisory write-close to the bookies (it rides their add streams; not waited for).
        `metadata`: custom metadata added in the same CAS (what is known only once the entries are written, such
        as a dataset ledger's column statistics; CUSTOM_METADATA_BYTES_MAX counts it with the creation's).
        Raises LedgerFencedError if a recovery open took the ledger over first."""
        if metadata:
            custom = {**self.metadata.custom_metadata, **check_str_map("metadata", metadata)}
            if sum(len(k) + len(v) for k, v in custom.items()) > CUSTOM_METADATA_BYTES_MAX:
                raise ValueError(f"custom metadata is over {CUSTOM_METADATA_BYTES_MAX} bytes")
            self._close_metadata = custom
        if self._error is not None:
            raise self._error  # a failed handle never closes the ledger: recovery does, from etcd's record
        if self._closed:
            return
        self._closing = True
        if self._linger_timer is not None:
            self._linger_expired()
        while self._pending and self._error is None:  # every entry appended is acknowledged, or the handle failed
            self._room.clear()
            await self._room.wait()
        if self._error is not None:
            raise self._error
        # The close and ensemble changes are ordered by _change_lock: a change already running lands first and
        # the close goes on top of it; a change that starts later finds the ledger closed and stops quietly (and
        # one still waiting for a bookie stops as soon as nothing is pending). With etcd down, the CAS fails
        # (MetadataUnavailableError) and the close can be retried.
        async with self._change_lock:
            if self._error is not None:
                raise self._error
            await self._close_in_etcd()
            self._closed = True
        for bookie_id in self.metadata.last_ensemble:
            self._write_close(bookie_id)

    async def _close_in_etcd(self) -> None:
        """CAS the metadata to CLOSED with the last entry and length. Called with _change_lock held, so no
        change of ours moves the revision under it: a lost CAS means another party wrote the ledger (a recovery
        open: LedgerFencedError; anything else that left it OPEN: close on top of what it wrote)."""
        store = self._client.metadata_store
        retry = CasRetry(f"ledger {self.ledger_id}: the close", ENSEMBLE_CHANGE_ATTEMPTS_MAX)
        while True:
            closed = self.metadata.with_state(CLOSED, last_entry_id=self._lac, length=self._length)
            if self._close_metadata is not None:
                closed = dataclasses.replace(closed, custom_metadata=self._close_metadata)
            revision = await store.update_ledger(closed, self._revision)
            if revision is not None:
                self.metadata, self._revision = closed, revision
                return
            current, current_revision = await store.read_ledger(self.ledger_id)
            if current.state == CLOSED and current.last_entry_id == self._lac:
                self.metadata, self._revision = current, current_revision
                return
            if current.state != OPEN:
                self._closed = True
                raise LedgerFencedError(f"ledger {self.ledger_id} is {current.state} in etcd (last entry "
                                        f"{current.last_entry_id}): a recovery open took it over")
            self.metadata, self._revision = current, current_revision
            await retry.lost(f"revision {current_revision} ({current.state}, {len(current.ensembles)} segments)")

    def _write_close(self, bookie_id: str) -> None:
        """Queue the advisory write-close on the bookie's add stream; not waited for (bookie_client.py)."""
        try:
            self._client.bookie_client(bookie_id).write_close_soon(self.ledger_id, self._master_key, self._lac)
        except OctavoError as e:
            log.info("ledger %d: write-close to bookie %s failed: %s", self.ledger_id, bookie_id, e)

    async def __aenter__(self) -> WriteHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
