"""The write handle: pipelined, batched appends to a write quorum, acknowledged in order.

Every append gets the next entry id and goes to the Qw bookies of its write set (entry e: positions starting
at e mod E of the last ensemble). Appends made in the same event-loop turn go out together, one batch per
bookie. An entry is acknowledged once Qa bookies of its write set have it *and* every entry before it is
acknowledged; the last-add-confirmed (LAC) is the highest such entry and rides on every add.

A bookie that fails, refuses (READ_ONLY, INTERNAL, ...) or leaves a request unanswered for add_timeout_s (its
stream then fails) is replaced:
a new ensemble segment starting at the first unacknowledged entry (LAC + 1) is written to etcd with a CAS, and
every unacknowledged entry whose write set now includes the replacement is sent to it. A FENCED answer means
a recovery open took the ledger over: every pending and later append fails with LedgerFencedError.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from octavo.client.errors import (
    BookieUnavailableError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataUnavailableError,
    NotEnoughBookiesError,
    OctavoError,
    WrongPasswordError,
)
from octavo.client.ledger_metadata import CLOSED, OPEN, LedgerMetadata, write_set
from octavo.v1 import bookie_pb2 as pb

if TYPE_CHECKING:
    from octavo.client.client import Client

log = logging.getLogger(__name__)

ENSEMBLE_CHANGE_ATTEMPTS_MAX = 10
ENSEMBLE_CHANGE_METADATA_WAIT_S = 30.0
# How long a writer must be idle before it sends its LAC on its own.
LAC_UPDATE_DELAY_S = 0.05


def _ignore(_: object) -> None:
    """Answers to LAC-only adds change nothing: a lost one only leaves readers one batch behind."""


@dataclass(eq=False)
class _Pending:
    entry_id: int
    data: bytes
    # Only entries someone waits for have a future: acknowledgement is in order, so append_many waits for
    # its last entry alone, and every failure fails all pending entries, that one included.
    future: asyncio.Future[int] | None = field(repr=False)
    acked: set[str] = field(default_factory=set)


class WriteHandle:
    def __init__(self, client: Client, metadata: LedgerMetadata, revision: int, master_key: bytes) -> None:
        self._client = client
        self.metadata = metadata
        self._revision = revision
        self._master_key = master_key
        self._options = client.options
        self._next_entry = 0
        self._lac = -1
        self._length = 0
        self._pending: dict[int, _Pending] = {}
        self._unsent: list[_Pending] = []
        self._flush_scheduled = False
        self._inflight_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._error: OctavoError | None = None
        self._closing = False
        self._closed = False
        self._failed_bookies: set[str] = set()
        self._change_lock = asyncio.Lock()
        self._changing: set[str] = set()
        self.ensemble_changes = 0
        self.outstanding_requests = 0  # bookie add calls sent and not yet answered
        self._lac_sent = -1
        self._lac_timer_armed = False

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    # -- appends ---------------------------------------------------------------------------------------
    async def append(self, data: bytes) -> int:
        """Append one entry; returns its entry id once it is acknowledged. Many appends may be in flight
        (gather them); they are acknowledged in entry-id order. For many entries, append_many is cheaper."""
        await self._wait_for_room(len(data))
        future = self._enqueue(data)
        assert future is not None
        return await future

    async def append_many(self, entries: Sequence[bytes]) -> list[int]:
        """Append entries in order, all pipelined; returns their ids once all are acknowledged. Much cheaper
        per entry than gathering append() calls: one future for the whole batch."""
        if not entries:
            return []
        first = self._next_entry
        last: asyncio.Future[int] | None = None
        for i, data in enumerate(entries):
            if self._inflight_bytes and self._inflight_bytes + len(data) > self._options.inflight_bytes_max:
                await self._wait_for_room(len(data))
            last = self._enqueue(data, want_future=i == len(entries) - 1) or last
        assert last is not None
        end = await last
        return list(range(first, end + 1))

    async def _wait_for_room(self, size: int) -> None:
        while self._inflight_bytes and self._inflight_bytes + size > self._options.inflight_bytes_max:
            if self._error is not None:
                raise self._error
            self._room.clear()
            await self._room.wait()

    def _enqueue(self, data: bytes, want_future: bool = True) -> asyncio.Future[int] | None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed to appends")
        if not isinstance(data, bytes):
            if not isinstance(data, (bytearray, memoryview)):
                raise TypeError(f"append takes bytes, got {type(data).__name__}")
            data = bytes(data)
        limit = self._options.entry_size_bytes_max
        if len(data) > limit:
            raise EntryTooLargeError(f"entry of {len(data)} bytes is over entry_size_bytes_max={limit}")
        loop = asyncio.get_running_loop()
        pending = _Pending(self._next_entry, data, loop.create_future() if want_future else None)
        self._next_entry += 1
        self._pending[pending.entry_id] = pending
        self._unsent.append(pending)
        self._inflight_bytes += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return pending.future

    def _flush(self) -> None:
        self._flush_scheduled = False
        batch, self._unsent = self._unsent, []
        batch = [p for p in batch if p.entry_id in self._pending]
        if not batch or self._error is not None:
            return
        meta = self.metadata
        ensemble = meta.last_ensemble
        if meta.write_quorum == meta.ensemble_size:
            for bookie in ensemble:
                self._send(bookie, batch)
            return
        groups: dict[str, list[_Pending]] = {}
        for p in batch:
            for position in write_set(p.entry_id, meta.ensemble_size, meta.write_quorum):
                groups.setdefault(ensemble[position], []).append(p)
        for bookie, entries in groups.items():
            self._send(bookie, entries)

    def _send(self, bookie_id: str, entries: list[_Pending]) -> None:
        try:
            bookie = self._client.bookie_client(bookie_id)
        except BookieUnavailableError as e:
            asyncio.get_running_loop().call_soon(self._bookie_failed, bookie_id, str(e))
            return
        self.outstanding_requests += 1
        self._lac_sent = max(self._lac_sent, self._lac)
        bookie.add_with_callback(self.ledger_id, self._master_key, [p.entry_id for p in entries],
                                 [p.data for p in entries], self._lac, False,
                                 lambda result: self._on_result(bookie_id, entries, result))

    def _on_result(self, bookie_id: str, entries: list[_Pending], result: list[int] | BaseException) -> None:
        self.outstanding_requests -= 1
        if isinstance(result, BaseException):
            self._bookie_failed(bookie_id, str(result))
            return
        refused = ""
        codes = result
        meta = self.metadata
        if (codes.count(pb.OK) == len(entries) and meta.write_quorum == meta.ensemble_size
                and bookie_id in meta.last_ensemble and entries[0].entry_id >= meta.ensembles[-1][0]):
            # The common case: every entry stored, and this bookie is in every write set of the last segment.
            for p in entries:
                p.acked.add(bookie_id)
            self._advance()
            return
        for p, code in zip(entries, codes, strict=False):
            if code == pb.OK:
                if p.entry_id in self._pending and bookie_id in meta.write_set_bookies(p.entry_id):
                    p.acked.add(bookie_id)
            elif code == pb.FENCED:
                if self._closed or p.entry_id <= self._lac:
                    continue  # a late copy of an acknowledged entry, refused after the close: nothing is lost
                self._fail(LedgerFencedError(f"ledger {self.ledger_id} was fenced by a recovery open: no more "
                                             "appends can be acknowledged"))
                return
            elif code == pb.UNAUTHORIZED:
                self._fail(WrongPasswordError(f"bookie {bookie_id} refused the master key of ledger "
                                              f"{self.ledger_id}"))
                return
            else:
                refused = pb.ResultCode.Name(code)  # type: ignore[arg-type]
        if refused:
            self._bookie_failed(bookie_id, f"refused adds: {refused}")
        self._advance()

    def _advance(self) -> None:
        qa = self.metadata.ack_quorum
        pending = self._pending
        while True:
            p = pending.get(self._lac + 1)
            if p is None or len(p.acked) < qa:
                break
            del pending[p.entry_id]
            self._lac = p.entry_id
            self._length += len(p.data)
            self._inflight_bytes -= len(p.data)
            if p.future is not None and not p.future.done():
                p.future.set_result(p.entry_id)
        self._room.set()
        if not pending and self._lac > self._lac_sent and not self._lac_timer_armed and not self._closing:
            self._lac_timer_armed = True
            asyncio.get_running_loop().call_later(LAC_UPDATE_DELAY_S, self._send_lac_if_idle)

    def _send_lac_if_idle(self) -> None:
        """Explicit LAC (BookKeeper's explicitLac): adds carry the LAC of when they were sent, so after the
        last batch the bookies know one batch less than the writer. Once idle, tell them with a LAC-only add
        (no entries), so readers of the open ledger see everything acknowledged."""
        self._lac_timer_armed = False
        if self._pending or self._error is not None or self._closed or self._client.closed:
            return
        self._lac_sent = self._lac
        for bookie_id in self.metadata.last_ensemble:
            try:
                bookie = self._client.bookie_client(bookie_id)
            except BookieUnavailableError:
                continue
            bookie.add_with_callback(self.ledger_id, self._master_key, [], [], self._lac, False, _ignore)

    def abandon(self, error: OctavoError) -> None:
        """The client is going away: fail what is pending, change nothing in etcd."""
        self._fail(error)

    def _fail(self, error: OctavoError) -> None:
        if self._error is None:
            self._error = error
            log.info("ledger %d: %s", self.ledger_id, error)
        for p in self._pending.values():
            if p.future is not None and not p.future.done():
                p.future.set_exception(error)
        self._pending.clear()
        self._unsent.clear()
        self._room.set()

    # -- ensemble change -------------------------------------------------------------------------------
    def _bookie_failed(self, bookie_id: str, reason: str) -> None:
        if self._error is not None or bookie_id in self._changing or self._client.closed:
            return
        if bookie_id not in self.metadata.last_ensemble:
            return  # already replaced
        log.info("ledger %d: bookie %s failed (%s); changing the ensemble", self.ledger_id, bookie_id, reason)
        self._changing.add(bookie_id)
        task = asyncio.get_running_loop().create_task(self._change_ensemble(bookie_id))
        task.add_done_callback(lambda _: self._changing.discard(bookie_id))

    async def _change_ensemble(self, failed: str) -> None:
        async with self._change_lock:
            if self._error is not None or self._closed or failed not in self.metadata.last_ensemble:
                return
            self._failed_bookies.add(failed)
            try:
                replacement = await self._write_new_segment(failed)
            except OctavoError as e:
                self._fail(e)
                return
            self.ensemble_changes += 1
            resend = []
            for p in self._pending.values():
                p.acked.discard(failed)
                if replacement in self.metadata.write_set_bookies(p.entry_id) and p not in self._unsent:
                    resend.append(p)
            if resend:
                self._send(replacement, resend)
            self._advance()

    async def _write_new_segment(self, failed: str) -> str:
        """Replace `failed` in a new segment; an etcd outage is waited out for up to
        ENSEMBLE_CHANGE_METADATA_WAIT_S (appends stay pending meanwhile) before the handle fails."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ENSEMBLE_CHANGE_METADATA_WAIT_S
        while True:
            try:
                return await self._try_new_segment(failed)
            except MetadataUnavailableError as e:
                if loop.time() > deadline:
                    raise
                log.info("ledger %d: ensemble change waits for etcd: %s", self.ledger_id, e)
                await asyncio.sleep(0.5)

    async def _try_new_segment(self, failed: str) -> str:
        store = self._client.metadata_store
        for _ in range(ENSEMBLE_CHANGE_ATTEMPTS_MAX):
            ensemble = list(self.metadata.last_ensemble)
            writable = await self._client.writable_bookies()
            candidates = [b for b in writable if b not in ensemble and b not in self._failed_bookies]
            if not candidates:
                raise NotEnoughBookiesError(
                    f"ledger {self.ledger_id}: no writable bookie to replace {failed} (ensemble {ensemble}, "
                    f"writable {sorted(writable)})")
            replacement = random.choice(candidates)
            ensemble[ensemble.index(failed)] = replacement
            first = self._lac + 1
            changed = self.metadata.with_segment(first, tuple(ensemble))
            revision = await store.update_ledger(changed, self._revision)
            if revision is not None:
                self.metadata, self._revision = changed, revision
                log.info("ledger %d: bookie %s replaced by %s from entry %d", self.ledger_id, failed, replacement,
                         first)
                return replacement
            current, current_revision = await store.read_ledger(self.ledger_id)
            if current.state != OPEN:
                raise LedgerFencedError(f"ledger {self.ledger_id} is {current.state} in etcd: a recovery open "
                                        "took it over")
            self.metadata, self._revision = current, current_revision
        raise MetadataUnavailableError(f"ledger {self.ledger_id}: the ensemble change kept losing its CAS")

    # -- close -----------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Wait for every append in flight, close the ledger in etcd (CAS to CLOSED with its last entry),
        then send the advisory write-close to the bookies. Raises LedgerFencedError if a recovery open took
        the ledger over first."""
        if self._error is not None:
            raise self._error  # a failed handle never closes the ledger: recovery does, from etcd's record
        if self._closed:
            return
        self._closing = True
        while self._pending and self._error is None:  # every entry appended is acknowledged, or the handle failed
            self._room.clear()
            await self._room.wait()
        if self._error is not None:
            raise self._error
        store = self._client.metadata_store
        # An ensemble change may run concurrently (a bookie failed after the last entry was acknowledged at the
        # ack quorum) and move the metadata's revision under the close: then the CAS loses to our own change,
        # and the close waits for the change and closes on top of it. With etcd down, the CAS fails at once
        # (MetadataUnavailableError) and the close can be retried.
        for _ in range(ENSEMBLE_CHANGE_ATTEMPTS_MAX):
            closed = self.metadata.with_state(CLOSED, last_entry_id=self._lac, length=self._length)
            revision = await store.update_ledger(closed, self._revision)
            if revision is not None:
                self.metadata, self._revision = closed, revision
                break
            current, _ = await store.read_ledger(self.ledger_id)
            if current.state == CLOSED and current.last_entry_id == self._lac:
                break
            if current.state != OPEN:
                self._closed = True
                raise LedgerFencedError(f"ledger {self.ledger_id} is {current.state} in etcd (last entry "
                                        f"{current.last_entry_id}): a recovery open took it over")
            async with self._change_lock:  # our own ensemble change: let it land, then close on top of it
                if self._error is not None:
                    raise self._error
        else:
            raise MetadataUnavailableError(f"ledger {self.ledger_id}: the close kept losing its CAS")
        self._closed = True
        await asyncio.gather(*(self._write_close(b) for b in self.metadata.last_ensemble), return_exceptions=True)

    async def _write_close(self, bookie_id: str) -> None:
        try:
            await self._client.bookie_client(bookie_id).write_close(self.ledger_id, self._master_key, self._lac)
        except OctavoError as e:
            log.info("ledger %d: write-close to bookie %s failed: %s", self.ledger_id, bookie_id, e)

    async def __aenter__(self) -> WriteHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
