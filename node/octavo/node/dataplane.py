"""The data plane: the Bookie service (adds on a stream, reads, LAC reads and fences, write-close).

The storage engine is synchronous. Adds and reads run on the event loop (they only touch the page cache and
take a short lock); anything that syncs to disk (a fence) or may block (waiting for write-cache room) runs in
the default executor so the loop keeps serving other streams.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from octavo.meta.errors import MetadataUnavailableError
from octavo.meta.ledger_metadata import META_DATASET
from octavo.node.drain import Drain
from octavo.node.entrylist import list_entries
from octavo.node.errors import Code, StorageError, WriteCacheFull
from octavo.node.ledgertrust import LedgerTrust
from octavo.node.lookups import LedgerLookups
from octavo.node.registration import Registration
from octavo.node.requeststats import RequestStats
from octavo.node.rpc import disk_failure, stream, unary
from octavo.node.storage import LedgerBatch, Storage
from octavo.node.syncedadds import SyncedAdds, answered_in_turn
from octavo.node.tailwaiters import TailWaiters
from octavo.node.tenants import Tenant, TenantPolicy
from octavo.telemetry.tracing import Sampling, context_from_metadata, context_from_traceparent
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc
from octavo.v1.wire import encode_read_response

log = logging.getLogger(__name__)

# Ledgers remembered as write-closed, for tailing reads (an advisory hint: readers check etcd).
WRITE_CLOSED_LEDGERS_MAX = 100_000


class BookieService(pb_grpc.BookieServicer):
    def __init__(self, storage: Storage, registration: Registration | None = None) -> None:
        self.storage = storage
        self.config = storage.config
        self.registration = registration
        # First contacts with a ledger are checked in etcd (ledgertrust.py), grouped (lookups.py); None without
        # etcd.
        self.trust = None if registration is None else LedgerTrust(
            LedgerLookups(registration.etcd, registration.store.layout), registration.bookie_id)
        self._write_closed: dict[int, None] = {}
        self.tail_waiters = TailWaiters(storage.config.long_poll_waiters_max)
        self.stats = RequestStats()
        self.drain = Drain()  # controlled shutdown: server.py begins it on SIGTERM
        # Tracing (server.py sets both when spans have somewhere to go): a request carrying a sampled trace
        # context gets a span, others at the sampling ratio. With no tracer no span is ever made.
        self.tracer: Tracer | None = None
        self.sampling = Sampling(0.0)
        self.bookie_id = registration.bookie_id if registration is not None else ""
        # Client identities limited to some datasets (tenant_prefixes); None: nobody is.
        self.tenants: TenantPolicy | None = None
        if self.config.tenant_prefixes and registration is not None:
            self.tenants = TenantPolicy(self.config.tenant_prefixes, self._dataset_of)
        # The add stream under fsync_policy=batch: answers wait for their group sync (syncedadds.py).
        self.synced_adds = None if storage.group_sync is None else SyncedAdds(
            self._add, self._add_span, storage.sync_failure, storage.group_sync, self.stats, self.drain)

    async def _dataset_of(self, ledger_id: int) -> str | None:
        assert self.registration is not None
        meta = await self.registration.ledger_metadata(ledger_id)
        return None if meta is None else meta.custom_metadata.get(META_DATASET, "")

    async def _denied(self, context: grpc.aio.ServicerContext, ledger_id: int) -> str:
        """"" unless the caller is a tenant that may not touch this ledger (then the message)."""
        if self.tenants is None:
            return ""
        tenant = self.tenants.tenant(context)
        return "" if tenant is None else await self.tenants.refusal(tenant, ledger_id)

    async def AddEntries(self, request_iterator: AsyncIterator[pb.AddRequest],
                         context: grpc.aio.ServicerContext) -> AsyncIterator[pb.AddResponse]:
        tenant = self.tenants.tenant(context) if self.tenants is not None else None  # one identity per stream
        answers = answered_in_turn(self._traced_add, self.stats, self.drain, request_iterator, context, tenant) \
            if self.synced_adds is None else self.synced_adds.stream(request_iterator, context, tenant)
        async for answer in answers:
            yield answer

    async def _traced_add(self, request: pb.AddRequest, tenant: Tenant | None) -> pb.AddResponse:
        span = self._add_span(request)
        if span is None:
            return await self._add(request, tenant)
        with trace.use_span(span, end_on_exit=True):
            span.set_attribute("octavo.request_id", request.request_id)
            response = await self._add(request, tenant)
            span.set_attribute("octavo.entries", len(request.entry_ids) or sum(len(a.entry_ids)
                                                                               for a in request.ledgers))
            if response.error:
                span.set_status(StatusCode.ERROR, response.error_message)
            return response

    def _add_span(self, request: pb.AddRequest) -> Span | None:
        if self.tracer is None or not (request.trace_parent or self.sampling.enabled):
            return None
        return self._span("octavo.bookie.add", request.trace_parent)

    def _span(self, name: str, traceparent: str = "", metadata: object = None) -> Span | None:
        """A span for one request: child of the caller's sampled context, else a root at the ratio."""
        assert self.tracer is not None
        parent = context_from_traceparent(traceparent) if traceparent else context_from_metadata(metadata)
        if parent is None and not self.sampling.root():
            return None
        return self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER,
                                      attributes={"octavo.bookie_id": self.bookie_id})

    async def _add(self, request: pb.AddRequest, tenant: Tenant | None = None) -> pb.AddResponse:
        if not (request.close_ledger_ids or request.close_master_keys or request.close_last_entry_ids):
            return await self._add_entries(request, tenant)
        # Closes first: each is of a ledger whose adds were all acknowledged before it was queued, and a close may
        # roll the active log, which keeps the request's adds (of other ledgers) out of the closed ledger's log.
        refused = await self._closes(request, tenant)
        if isinstance(refused, str):
            return _refused(request, pb.INVALID, refused)
        response = await self._add_entries(request, tenant)
        response.refused_closes.extend(refused)
        return response

    async def _add_entries(self, request: pb.AddRequest, tenant: Tenant | None) -> pb.AddResponse:
        flat = bool(request.group_ledger_ids or request.entry_ids or request.payloads or request.close_ledger_ids)
        if flat and request.ledgers:
            return _refused(request, pb.INVALID, "a request carries either ledgers or group columns, not both")
        batches = _flat_batches(request) if flat else [
            # Materialize each repeated field once: every access to a protobuf repeated bytes field copies the
            # payload out of the message, so walking it twice would copy the batch twice.
            LedgerBatch(adds.ledger_id, adds.master_key, list(adds.entry_ids), list(adds.payloads),
                        adds.last_add_confirmed, adds.recovery) for adds in request.ledgers]
        if isinstance(batches, pb.AddResponse):
            return batches
        cfg = self.config
        total_entries = sum(len(b.entry_ids) for b in batches)
        total_bytes = sum(sum(map(len, b.payloads)) for b in batches)
        if total_entries > cfg.batch_entries_max:
            self.stats.refused(pb.TOO_LARGE, total_entries)
            return _refused(request, pb.TOO_LARGE, f"request carries {total_entries} entries, over "
                                                   f"batch_entries_max={cfg.batch_entries_max}")
        if total_bytes > cfg.batch_bytes_max:
            self.stats.refused(pb.TOO_LARGE, total_entries)
            return _refused(request, pb.TOO_LARGE, f"request carries {total_bytes} payload bytes, over "
                                                   f"batch_bytes_max={cfg.batch_bytes_max}")
        results: list[tuple[list[Code], str] | None] = [None] * len(batches)
        if tenant is not None:
            assert self.tenants is not None
            for i, batch in enumerate(batches):
                message = await self.tenants.refusal(tenant, batch.ledger_id)
                if message:
                    results[i] = ([pb.PERMISSION_DENIED] * len(batch.entry_ids), message)
        registration = self.registration
        if registration is not None and not registration.registered:
            self._refuse_new_ledgers_unregistered(batches, results)
        unknown = [i for i in self._needing_lookup(batches) if results[i] is None]
        if unknown:  # looked up concurrently: a request may open many ledgers at once
            assert self.trust is not None
            refusals = await asyncio.gather(*(self.trust.first_add(batches[i].ledger_id, batches[i].master_key,
                                                                   batches[i].recovery) for i in unknown))
            for i, refused in zip(unknown, refusals, strict=True):
                if refused is not None:
                    results[i] = ([refused[0]] * len(batches[i].entry_ids), refused[1])
        todo = [i for i, result in enumerate(results) if result is None]
        if todo:
            written = await self._add_batch([batches[i] for i in todo] if len(todo) < len(batches) else batches,
                                            total_entries)
            for i, result in zip(todo, written, strict=True):
                results[i] = result
        stats = self.stats
        stats.add_entries += total_entries
        stats.add_bytes += total_bytes
        for batch, outcome in zip(batches, results, strict=True):
            if outcome is not None and outcome[1]:  # a message: some entry of the batch was refused
                self._count_refused(batch, outcome[0])
        if self.tail_waiters.by_ledger:  # per request, not per entry: readers look at the LAC again
            for batch in batches:
                self.tail_waiters.wake(batch.ledger_id)
        if flat:
            return pb.AddResponse(request_id=request.request_id, group_count=len(batches), refused_groups=[
                pb.GroupResult(group=i, codes=result[0], message=result[1])
                for i, result in enumerate(results) if result is not None and any(result[0])])
        return pb.AddResponse(request_id=request.request_id, results=[
            pb.LedgerAddResult(ledger_id=batch.ledger_id, codes=result[0], message=result[1])
            for batch, result in zip(batches, results, strict=True) if result is not None])

    def _refuse_new_ledgers_unregistered(self, batches: list[LedgerBatch],
                                         results: list[tuple[list[Code], str] | None]) -> None:
        """A bookie whose registration lapsed (its lease not refreshed for a TTL: etcd unreachable from here) may
        be taken for lost by the auditor, and no writer that reads the registrations chooses it: it takes no adds
        for ledgers it holds nothing of (new ledgers, and re-replication copies), only for those it already
        holds, until it is registered again. READ_ONLY: the writer moves to another bookie."""
        assert self.registration is not None
        state = self.storage.ledger_state
        for i, batch in enumerate(batches):
            if results[i] is None and state(batch.ledger_id) is None:
                results[i] = ([pb.READ_ONLY] * len(batch.entry_ids), (
                    f"bookie {self.registration.bookie_id} is not registered in etcd (its lease was not refreshed "
                    f"for {self.registration.ttl_s}s: etcd unreachable from it); it takes adds only for ledgers "
                    "it already holds until it registers again"))

    def _count_refused(self, batch: LedgerBatch, codes: list[Code]) -> None:
        stats = self.stats
        for code, payload in zip(codes, batch.payloads, strict=False):
            if code != pb.OK:
                stats.add_entries -= 1
                stats.add_bytes -= len(payload)
                stats.refused(code, 1)

    async def _add_batch(self, batches: list[LedgerBatch], total_entries: int) -> list[tuple[list[Code], str]]:
        storage = self.storage
        while True:
            try:  # under fsync_policy=batch the stream waits for the sync (syncedadds.py), not the loop
                return storage.add_batch(batches, storage.group_sync is None)
            except WriteCacheFull:
                wait_s = self.config.add_wait_ms_max / 1000
                loop = asyncio.get_running_loop()
                if not await loop.run_in_executor(None, storage.wait_for_room, total_entries, wait_s):
                    return [([pb.INTERNAL] * len(b.entry_ids), (
                        f"write cache full (write_cache_entries_max={self.config.write_cache_entries_max}) for "
                        f"{self.config.add_wait_ms_max} ms: the background flush is not keeping up"))
                        for b in batches]
            except StorageError as e:
                return [([e.code] * len(b.entry_ids), e.message) for b in batches]
            except Exception as e:  # an add must never take the stream down with it
                log.exception("add request failed")
                return [([pb.INTERNAL] * len(b.entry_ids), f"internal error: {type(e).__name__}: {e}")
                        for b in batches]

    def _needing_lookup(self, batches: list[LedgerBatch]) -> list[int]:
        """The batches of ledgers this bookie holds no state for: checked in etcd before anything is bound."""
        if self.registration is None:
            return []
        known = self.storage.ledger_state
        return [i for i, b in enumerate(batches) if known(b.ledger_id) is None]

    async def ReadEntries(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> pb.ReadResponse:
        t0 = time.perf_counter()
        if self.tenants is not None and (denied := await self._denied(context, request.ledger_id)):
            response = pb.ReadResponse(ledger_id=request.ledger_id, error=pb.PERMISSION_DENIED, error_message=denied)
            self._count_read(response, t0)
            return response
        span = self._span("octavo.bookie.read", metadata=context.invocation_metadata()) \
            if self.tracer is not None else None
        if span is None:
            response = self._read(request)
        else:
            with trace.use_span(span, end_on_exit=True):
                span.set_attribute("octavo.ledger_id", request.ledger_id)
                response = self._read(request)
        self._count_read(response, t0)
        return response  # type: ignore[no-any-return]

    def _count_read(self, response: Any, t0: float) -> None:
        """Count a read's answer: an error ReadResponse, or the bytes the wire encoder wrote (its entries were
        counted by _encode)."""
        stats = self.stats
        stats.read_requests += 1
        if not isinstance(response, bytes) and response.error:
            stats.read_error(response.error)
        if stats.read_latency is not None:
            stats.read_latency.record(time.perf_counter() - t0)

    def _read(self, request: pb.ReadRequest) -> Any:
        cfg = self.config
        state = self.storage.ledger_state(request.ledger_id)
        max_entries = min(request.max_entries or cfg.read_entries_max, cfg.read_entries_max)
        max_bytes = min(request.max_bytes or cfg.read_bytes_max, cfg.read_bytes_max)
        ids: list[int] | range
        if request.entry_ids:
            ids = list(request.entry_ids)
            if request.ledger_id < 0 or min(ids) < 0:
                return pb.ReadResponse(ledger_id=request.ledger_id, error=pb.INVALID,
                                       error_message="ledger and entry ids must be non-negative")
            stop_on_failure = False
        else:
            first, last = request.first_entry_id, request.last_entry_id
            if request.ledger_id < 0 or first < 0 or last < first:
                return pb.ReadResponse(ledger_id=request.ledger_id, error=pb.INVALID, error_message=(
                    f"invalid range: ledger {request.ledger_id} entries [{first}, {last}]; ids must be "
                    "non-negative and first <= last"))
            ids = range(first, min(last, first + max_entries - 1) + 1)
            stop_on_failure = True
        if state is None:
            code = pb.UNKNOWN if self.storage.tail_maybe_lost else pb.NO_SUCH_LEDGER
            return pb.ReadResponse(ledger_id=request.ledger_id, error=code,
                                   error_message=f"ledger {request.ledger_id} is not known to this bookie")
        try:
            entries = self.storage.read_many(request.ledger_id, ids, max_entries, max_bytes, stop_on_failure)
        except StorageError as e:
            return pb.ReadResponse(ledger_id=request.ledger_id, error=e.code, error_message=e.message)
        return self._encode(pb.ReadResponse(ledger_id=request.ledger_id, last_add_confirmed=state.last_add_confirmed),
                            entries)

    def _encode(self, head: pb.ReadResponse, entries: list[tuple[int, int, Any, str]]) -> Any:
        """The answer, pre-encoded (upb serializes many large payloads far below memory speed: octavo.v1.wire),
        its entries counted."""
        stats = self.stats
        stats.read_entries += len(entries)
        stats.read_bytes += sum(len(entry[2]) for entry in entries)
        return encode_read_response(head, entries)

    async def ReadTail(self, request: pb.ReadTailRequest, context: grpc.aio.ServicerContext) -> pb.ReadResponse:
        if self.tenants is not None and (denied := await self._denied(context, request.ledger_id)):
            return pb.ReadResponse(ledger_id=request.ledger_id, error=pb.PERMISSION_DENIED, error_message=denied)
        response = await self._read_tail(request)
        self.stats.tail_requests += 1
        return response  # type: ignore[no-any-return]

    async def _read_tail(self, request: pb.ReadTailRequest) -> Any:
        """The long poll of a tailing reader: held until the LAC passes previous_lac, a fence, a write-close or
        the wait's end, then the LAC and the entries after previous_lac up to it that this bookie holds."""
        cfg = self.config
        ledger_id, previous = request.ledger_id, request.previous_lac
        if ledger_id < 0 or previous < -1:
            return pb.ReadResponse(ledger_id=ledger_id, error=pb.INVALID, error_message=(
                f"invalid tail read: ledger {ledger_id} after entry {previous}; the ledger id must be "
                "non-negative and previous_lac >= -1"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(request.wait_ms, cfg.long_poll_wait_ms_max) / 1000
        storage = self.storage
        if self.trust is not None and storage.ledger_state(ledger_id) is None:
            # A reader may wait here for a ledger's first entries, but not for an id etcd never gave out.
            try:
                exists = await self.trust.exists(ledger_id)
            except MetadataUnavailableError as e:
                return pb.ReadResponse(ledger_id=ledger_id, error=pb.UNKNOWN, last_add_confirmed=-1, error_message=(
                    f"cannot check ledger {ledger_id} in etcd: {e}"))
            if not exists and storage.ledger_state(ledger_id) is None:
                return pb.ReadResponse(ledger_id=ledger_id, error=pb.NO_SUCH_LEDGER, last_add_confirmed=-1,
                                       error_message=f"ledger {ledger_id} does not exist in the cluster metadata")
        while True:
            state = storage.ledger_state(ledger_id)
            closed = ledger_id in self._write_closed
            if (state is not None and (state.last_add_confirmed > previous or state.fenced)) or closed:
                break
            remaining = deadline - loop.time()
            if remaining <= 0 or self.drain.draining:  # a stopping bookie holds no poll: its reader moves on
                break
            future = self.tail_waiters.add(ledger_id)
            if future is None:
                return pb.ReadResponse(ledger_id=ledger_id, error=pb.BUSY, error_message=(
                    f"{self.tail_waiters.count} tailing reads are held on this bookie, its "
                    f"long_poll_waiters_max={cfg.long_poll_waiters_max}: retry later"))
            try:  # asyncio.wait, not wait_for: in Python 3.11 wait_for makes a task per wait
                await asyncio.wait((future,), timeout=remaining)
            finally:
                self.tail_waiters.remove(ledger_id, future)
        if state is None:
            code = pb.UNKNOWN if storage.tail_maybe_lost else pb.NO_SUCH_LEDGER
            return pb.ReadResponse(ledger_id=ledger_id, error=code, last_add_confirmed=-1, write_closed=closed,
                                   error_message=f"ledger {ledger_id} is not known to this bookie")
        lac = state.last_add_confirmed
        head = pb.ReadResponse(ledger_id=ledger_id, last_add_confirmed=lac, fenced=state.fenced, write_closed=closed)
        if lac <= previous or request.max_entries == 0:
            return head
        max_entries = min(request.max_entries, cfg.read_entries_max)
        max_bytes = min(request.max_bytes or cfg.read_bytes_max, cfg.read_bytes_max)
        try:
            entries = storage.read_many(ledger_id, range(previous + 1, lac + 1), max_entries, max_bytes,
                                        stop_on_failure=False, skip_missing=True)
        except StorageError as e:
            return pb.ReadResponse(ledger_id=ledger_id, error=e.code, error_message=e.message)
        return self._encode(head, entries)

    async def ReadLastAddConfirmed(self, request: pb.ReadLacRequest,
                                   context: grpc.aio.ServicerContext) -> pb.ReadLacResponse:
        if self.tenants is not None and (denied := await self._denied(context, request.ledger_id)):
            return pb.ReadLacResponse(code=pb.PERMISSION_DENIED, message=denied, last_add_confirmed=-1,
                                      last_entry_id=-1)
        if request.fence and request.master_key and self.trust is not None \
                and self.storage.ledger_state(request.ledger_id) is None:
            # A fence binds the ledger's id and key here: only for a ledger etcd has, with its key.
            found = await self.trust.first_contact(request.ledger_id, request.master_key)
            if isinstance(found, tuple):
                return pb.ReadLacResponse(code=found[0], message=found[1], last_add_confirmed=-1, last_entry_id=-1)
        try:
            if request.fence:
                self.stats.fences += 1
                span = self._span("octavo.bookie.fence", metadata=context.invocation_metadata()) \
                    if self.tracer is not None else None
                loop = asyncio.get_running_loop()
                if span is None:
                    info = await loop.run_in_executor(None, self.storage.fence, request.ledger_id,
                                                      request.master_key)
                else:  # the span covers the fence, synced to disk
                    with trace.use_span(span, end_on_exit=True, record_exception=True):
                        span.set_attribute("octavo.ledger_id", request.ledger_id)
                        info = await loop.run_in_executor(None, self.storage.fence, request.ledger_id,
                                                          request.master_key)
                self.tail_waiters.wake(request.ledger_id)
            else:
                info = self.storage.read_lac(request.ledger_id)
        except StorageError as e:
            return pb.ReadLacResponse(code=e.code, message=e.message, last_add_confirmed=-1, last_entry_id=-1)
        except OSError as e:  # seed 20024: a fence on a full disk
            await context.abort(*disk_failure(e, self.storage.data_dir, f"fence of ledger {request.ledger_id}"))
        return pb.ReadLacResponse(code=pb.OK, last_add_confirmed=info.last_add_confirmed,
                                  last_entry_id=info.last_entry_id, fenced=info.fenced,
                                  tail_maybe_lost=info.tail_maybe_lost)

    def begin_drain(self) -> None:
        """Controlled shutdown (drain.py): add responses say `draining` from now on; held tail polls answer."""
        self.drain.begin()
        for ledger_id in list(self.tail_waiters.by_ledger):
            self.tail_waiters.wake(ledger_id)

    async def ListEntries(self, request: pb.ListEntriesRequest,
                          context: grpc.aio.ServicerContext) -> pb.ListEntriesResponse:
        if self.tenants is not None and (denied := await self._denied(context, request.ledger_id)):
            return pb.ListEntriesResponse(error=pb.PERMISSION_DENIED, error_message=denied, next_entry_id=-1)
        return await asyncio.get_running_loop().run_in_executor(None, list_entries, self.storage, request)

    async def WriteClose(self, request: pb.WriteCloseRequest,
                         context: grpc.aio.ServicerContext) -> pb.WriteCloseResponse:
        if self.tenants is not None and (denied := await self._denied(context, request.ledger_id)):
            return pb.WriteCloseResponse(code=pb.PERMISSION_DENIED, message=denied)
        refused = self._write_close(request.ledger_id, request.master_key)
        if refused is not None:
            return pb.WriteCloseResponse(code=refused[0], message=refused[1])
        return pb.WriteCloseResponse(code=pb.OK)

    def _write_close(self, ledger_id: int, master_key: bytes) -> tuple[Code, str] | None:
        """The advisory write-close (unary, or carried on the add stream): the ledger's log may roll, and
        tailing readers learn the writer is done. Returns the refusal, None when done."""
        try:
            self.storage.write_close(ledger_id, master_key)
        except StorageError as e:
            return e.code, e.message
        except OSError as e:  # the log roll after it, on a full or failing disk
            return pb.INTERNAL, disk_failure(e, self.storage.data_dir, f"write-close of ledger {ledger_id}")[1]
        self.stats.write_closes += 1
        self._write_closed[ledger_id] = None
        if len(self._write_closed) > WRITE_CLOSED_LEDGERS_MAX:
            del self._write_closed[next(iter(self._write_closed))]
        self.tail_waiters.wake(ledger_id)
        return None

    async def _closes(self, request: pb.AddRequest, tenant: Tenant | None) -> list[pb.GroupResult] | str:
        """The write-closes an add request carries, after its adds: the refused ones, or why none was tried."""
        ledger_ids = list(request.close_ledger_ids)
        keys = list(request.close_master_keys)
        if not len(ledger_ids) == len(keys) == len(request.close_last_entry_ids):
            return (f"close columns differ in length: {len(ledger_ids)} ledger ids, {len(keys)} master keys, "
                    f"{len(request.close_last_entry_ids)} last entry ids")
        refused = []
        for k, (ledger_id, key) in enumerate(zip(ledger_ids, keys, strict=True)):
            outcome: tuple[Code, str] | None = None
            if tenant is not None:
                assert self.tenants is not None
                message = await self.tenants.refusal(tenant, ledger_id)
                if message:
                    outcome = (pb.PERMISSION_DENIED, message)
            if outcome is None:
                outcome = self._write_close(ledger_id, key)
            if outcome is not None:
                refused.append(pb.GroupResult(group=k, codes=[outcome[0]], message=outcome[1]))
        return refused


def _flat_batches(request: pb.AddRequest) -> list[LedgerBatch] | pb.AddResponse:
    """The groups of a flat request as batches, or the INVALID answer to malformed columns."""
    ledger_ids = list(request.group_ledger_ids)
    keys = list(request.group_master_keys)
    lacs = list(request.group_lacs)
    recovery = list(request.group_recovery) or [False] * len(ledger_ids)
    counts = list(request.group_entry_counts)
    groups = len(ledger_ids)
    if not len(keys) == len(lacs) == len(recovery) == len(counts) == groups:
        return _refused(request, pb.INVALID, (
            f"group columns differ in length: {groups} ledger ids, {len(keys)} master keys, {len(lacs)} "
            f"LACs, {len(recovery)} recovery flags, {len(counts)} entry counts"))
    entry_ids = list(request.entry_ids)
    payloads = list(request.payloads)
    if not sum(counts) == len(entry_ids) == len(payloads):
        return _refused(request, pb.INVALID, (
            f"group entry counts add up to {sum(counts)}, with {len(entry_ids)} entry ids and "
            f"{len(payloads)} payloads"))
    batches = []
    offset = 0
    for g in range(groups):
        end = offset + counts[g]
        batches.append(LedgerBatch(ledger_ids[g], keys[g], entry_ids[offset:end], payloads[offset:end],
                                   lacs[g], recovery[g]))
        offset = end
    return batches


def _refused(request: pb.AddRequest, code: Code, message: str) -> pb.AddResponse:
    """A request refused as a whole: nothing of it was written."""
    return pb.AddResponse(request_id=request.request_id, error=code, error_message=message)


def bookie_handler(service: BookieService) -> Any:
    return grpc.method_handlers_generic_handler("octavo.v1.Bookie", {
        "AddEntries": stream(service.AddEntries, pb.AddRequest, pb.AddResponse),
        "ReadEntries": unary(service.ReadEntries, pb.ReadRequest, pb.ReadResponse),
        "ReadLastAddConfirmed": unary(service.ReadLastAddConfirmed, pb.ReadLacRequest, pb.ReadLacResponse),
        "ReadTail": unary(service.ReadTail, pb.ReadTailRequest, pb.ReadResponse),
        "WriteClose": unary(service.WriteClose, pb.WriteCloseRequest, pb.WriteCloseResponse),
        "ListEntries": unary(service.ListEntries, pb.ListEntriesRequest, pb.ListEntriesResponse),
    })
