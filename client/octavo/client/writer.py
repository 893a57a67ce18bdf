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
add_timeout_s (its stream then fails) is replaced (ensemble_change.py); one that refuses for the moment
(UNAVAILABLE: etcd) gets its adds again after a pause, for a bounded time (resends.py). A FENCED answer means a
recovery open took the ledger over: every pending and later append fails with LedgerFencedError. Every way in (append,
append_many, append_nowait, SyncWriteHandle's queue) is admitted by one rule (admission.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from octavo.client.admission import admit, ensemble_entry_limit, has_room, refusal
from octavo.client.arguments import check_entry_list, check_str_map
from octavo.client.bookie_client import AddCallback, AddGroup, Refusal, add_group
from octavo.client.closing import close_in_etcd
from octavo.client.context import ClientContext
from octavo.client.ensemble_change import EnsembleChanges
from octavo.client.quorums import AckMarks
from octavo.client.refusals import Action, judge
from octavo.client.resends import Resends
from octavo.client.scheduler import LAC_UPDATE_DELAY_S
from octavo.meta.errors import (
    BookieUnavailableError,
    BufferFullError,
    LedgerFencedError,
    OctavoError,
)
from octavo.meta.ledger_metadata import CUSTOM_METADATA_BYTES_MAX, LedgerMetadata, write_set
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)


def _ignore(_: AddGroup, __: object) -> None:
    """Answers to LAC-only adds change nothing: a lost one only leaves readers one batch behind."""


class WriteHandle:
    def __init__(self, client: ClientContext, metadata: LedgerMetadata, revision: int, master_key: bytes) -> None:
        self._client = client
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
        self._changes = EnsembleChanges(client, self)
        self._changing = self._changes.changing  # the same set: read on every acknowledgement
        self._resends = Resends(self._options.add_timeout_s, self._loop, self._resend, self._bookie_failed)
        self.outstanding_requests = 0  # bookie add calls sent and not yet answered
        self._lac_sent = -1
        self._lac_timer_armed = False
        self._idle_since = 0.0  # when the last pending entry was acknowledged
        self.adopt_metadata(metadata, revision)  # metadata, _revision, and the entry limit of the last ensemble
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
    def ensemble_changes(self) -> int:
        """How many ensemble changes this handle made."""
        return self._changes.count

    @property
    def revision(self) -> int:
        """The etcd revision of `metadata`."""
        return self._revision

    @property
    def _pending(self) -> bool:
        """Some appended entry is not acknowledged yet."""
        return self._next_entry > self._lac + 1

    # -- appends ---------------------------------------------------------------------------------------
    async def append(self, data: bytes) -> int:
        """Append one entry; returns its entry id once it is acknowledged. Many appends may be in flight
        (gather them); they are acknowledged in entry-id order. For many entries, append_many is cheaper."""
        datas = [data]
        size = await self._wait_for_room(datas, single=True)
        return await self._enqueue_future(datas, size)

    def admit(self, entries: list[Any], single: bool = False, queued_bytes: int = 0) -> tuple[int, bool]:
        """The admission of entries on every way in (admission.admit, with this handle's state; append_nowait
        calls that directly, once per record): raises the refusal, else returns (their size, whether the budget
        has room for them beside `queued_bytes` more), with `entries` made bytes. SyncWriteHandle's threads too."""
        return admit(entries, single, self._error, self._closing, self.ledger_id, self._entry_limit,
                     self._entry_limit_by, self._inflight_bytes + queued_bytes, self._options.inflight_bytes_max)

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
        datas = list(entries)
        first = self._next_entry
        total, room = self.admit(datas)
        if room:  # the common case: all of it fits the window at once
            end = await self._enqueue_future(datas, total)
            return list(range(first, end + 1))
        limit = self._options.inflight_bytes_max
        n = len(datas)
        i = 0
        last: asyncio.Future[int] | None = None
        while i < n:
            j, size = i, 0
            while j < n and has_room(self._inflight_bytes, size + len(datas[j]), limit, j - i + 1):
                size += len(datas[j])
                j += 1
            if j == i:
                await self._wait_for_room(datas[i:i + 1])
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

    async def _wait_for_room(self, datas: list[Any], single: bool = False) -> int:
        """Wait until the in-flight budget has room for `datas`; their size. Admitted again after every wait:
        the handle may have failed or begun closing meanwhile."""
        while True:
            size, room = self.admit(datas, single)
            if room:
                return size
            self._room.clear()
            await self._room.wait()

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
        datas = [data]
        size, room = admit(datas, True, self._error, self._closing, self.ledger_id, self._entry_limit,
                           self._entry_limit_by, self._inflight_bytes, self._options.inflight_bytes_max)
        if not room:
            raise BufferFullError(f"ledger {self.ledger_id}: {self._inflight_bytes} bytes in flight, the budget is "
                                  f"inflight_bytes_max={self._options.inflight_bytes_max}")
        future = self._loop.create_future()
        eid = self._next_entry
        self._next_entry = eid + 1
        self._data.append(datas[0])
        self._inflight_bytes += size
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
                await self._wait_for_room([data], single=True)

    async def flush(self) -> None:
        """Wait until every entry appended so far is acknowledged (lingering ones are sent now). Raises the
        handle's error if it failed."""
        if self._error is not None:
            raise self._error
        if not self._pending:
            return
        if self._linger_timer is not None:
            self.linger_expired()
        future = self._loop.create_future()
        self._waiters.append((self._next_entry - 1, future))
        await future

    def _submit(self, datas: list[bytes], futures: list[Any], size: int) -> None:
        """Entries checked by a SyncWriteHandle's producer threads, with their concurrent futures (run in the
        loop): the futures get the ids, or the handle's error."""
        error = refusal(self._error, self._closing, self.ledger_id)  # the budget was taken when they were queued
        if error is not None:
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

    def linger_expired(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        if not self._flush_scheduled:
            self.flush_now()

    def flush_now(self) -> None:
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
        if bookie_id in self._resends.paused:
            return  # its resend carries every unacknowledged entry of its write sets (_resend)
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
                self.fail(LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recovery open: no more "
                                            "appends can be acknowledged"))
            return
        if result is None:  # the common case: every entry stored
            last = group.entry_ids[-1]
            # If last <= LAC, the LAC is already past everything this answer vouches for.
            if self._acks.stored(bookie_id, last) and last > self._lac:
                self._advance()
            if self._resends.streaks:
                self._resends.end(bookie_id)
            return
        if isinstance(result, BaseException):
            self._bookie_failed(bookie_id, str(result))
            return
        if self._closed:
            return  # a late answer after the close (a copy of an acknowledged entry): nothing depends on it
        judged = judge(self.ledger_id, bookie_id, group.entry_ids, result.codes, result.message, self._lac)
        if judged.error is not None:  # Action.FAIL
            if not isinstance(judged.error, LedgerFencedError):
                log.warning("ledger %d: %s", self.ledger_id, judged.error)
            self.fail(judged.error)
        elif judged.action is Action.RESEND:
            self._new_epoch(bookie_id)  # what it was sent no longer counts; its mark stays (it stored up to it)
            self._resends.refused(bookie_id, judged.reason)
        elif judged.action is Action.REPLACE:
            self._bookie_failed(bookie_id, judged.reason)
        elif self._acks.stored(bookie_id, group.entry_ids[-1]):
            self._advance()

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

    def send_lac_if_idle(self) -> None:
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
        self.fail(error)

    def fail(self, error: OctavoError) -> None:
        """Fail every pending and later append with `error` (the first error stays)."""
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

    # -- ensemble change (ensemble_change.py) ------------------------------------------------------------
    def _bookie_failed(self, bookie_id: str, reason: str) -> None:
        if self._error is not None or self._client.closed:
            return
        if bookie_id not in self.metadata.last_ensemble:
            return  # already replaced
        self._acks.failed(bookie_id)  # its later answers must not vouch for the entries this failure lost
        if bookie_id in self._changing:
            return
        self._new_epoch(bookie_id)
        self._changes.start(bookie_id, reason)

    def bookie_draining(self, bookie_id: str) -> None:
        """The bookie is stopping (controlled shutdown, drain.py): move off it while it still stores adds, as
        after a failure (a new segment from LAC + 1, the unacknowledged entries sent to the replacement; what
        is already on its way to the draining bookie still lands there). With no bookie usable in its place now
        (the ensemble is the whole cluster), keep writing to it: once it stops, its failure is handled as any
        other."""
        if self._error is not None or self._closed or self._client.closed \
                or bookie_id not in self.metadata.last_ensemble or bookie_id in self._changing:
            return
        if self._changes.can_move_off(bookie_id):
            self._bookie_failed(bookie_id, "draining: the bookie is stopping")

    def change_not_needed(self, failed: str) -> bool:
        """The handle failed or closed, the bookie is already replaced, or a close waits with every entry
        acknowledged (the ledger closes as it is; the missing copies are re-replication's to restore)."""
        return (self._error is not None or self._closed or failed not in self.metadata.last_ensemble
                or (self._closing and not self._pending))

    def largest_pending_entry(self) -> int:
        return max(map(len, self._data), default=0)

    def _adopt(self, metadata: LedgerMetadata, revision: int) -> None:
        self.metadata, self._revision = metadata, revision

    def adopt_metadata(self, metadata: LedgerMetadata, revision: int) -> None:
        self.metadata, self._revision = metadata, revision
        self._entry_limit, self._entry_limit_by = ensemble_entry_limit(
            self._options.entry_size_bytes_max, metadata.last_ensemble, self._client.registrations)

    def replaced(self, failed: str, replacement: str) -> None:
        """The new segment is in etcd: answers of the replacement count from now, and every entry sent and not
        acknowledged whose write set now has it goes to it (entries not flushed yet go with their flush)."""
        self._new_epoch(replacement)
        self._acks.replaced(failed, replacement, self._lac)
        self._send_unacknowledged(replacement)

    def _send_unacknowledged(self, bookie_id: str) -> None:
        base = self._lac + 1
        meta = self.metadata
        ids = [e for e in range(base, self._sent_to) if bookie_id in meta.write_set_bookies(e)]
        if ids:
            self._send(bookie_id, add_group(self.ledger_id, self._master_key, ids,
                                            [self._data[e - base] for e in ids], self._lac))

    def _resend(self, bookie_id: str) -> None:
        """The pause after a refusal for the moment is over (resends.py)."""
        if self._client.closed or bookie_id in self._changing or self.change_not_needed(bookie_id):
            self._resends.end(bookie_id)
        else:
            self._send_unacknowledged(bookie_id)

    def changed(self) -> None:
        self._advance()

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
            self.linger_expired()
        while self._pending and self._error is None:  # every entry appended is acknowledged, or the handle failed
            self._room.clear()
            await self._room.wait()
        if self._error is not None:
            raise self._error
        # The close and ensemble changes are ordered by the changes' lock: a change already running lands first and
        # the close goes on top of it; a change that starts later finds the ledger closed and stops quietly (and
        # one still waiting for a bookie stops as soon as nothing is pending). With etcd down, the CAS fails
        # (MetadataUnavailableError) and the close can be retried.
        async with self._changes.lock:
            if self._error is not None:
                raise self._error
            try:
                await close_in_etcd(self._client.metadata_store, self.metadata, self._revision, self._lac,
                                    self._length, self._close_metadata, self._adopt)
            except LedgerFencedError:
                self._closed = True
                raise
            self._closed = True
        for bookie_id in self.metadata.last_ensemble:
            self._write_close(bookie_id)

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
