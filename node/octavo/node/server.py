"""The bookie's gRPC server (grpc.aio): the Bookie data plane, BookieAdmin, health checking, reflection.

The storage engine is synchronous. Adds and reads run on the event loop (they only touch the page cache and
take a short lock); anything that syncs to disk (a fence) or may block (waiting for write-cache room) runs in
the default executor so the loop keeps serving other streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from octavo.client.errors import MetadataUnavailableError
from octavo.client.wire import encode_read_response
from octavo.node.compaction import MAJOR, MINOR, CompactionProgress, CompactionReport, Compactor
from octavo.node.config import NodeConfig
from octavo.node.disk import DiskMonitor
from octavo.node.errors import Code, StorageError
from octavo.node.registration import Registration
from octavo.node.repair import TailRepair
from octavo.node.storage import GcReport, LedgerBatch, Storage, WriteCacheFull
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

VERSION = "0.1.0"
# Room on top of the batch limit for protobuf framing and the master keys.
MESSAGE_OVERHEAD_BYTES = 1024 * 1024
SHUTDOWN_GRACE_S = 5.0


class BookieService(pb_grpc.BookieServicer):
    def __init__(self, storage: Storage, registration: Registration | None = None) -> None:
        self.storage = storage
        self.config = storage.config
        self.registration = registration
        # Ledgers etcd says are not open (IN_RECOVERY or CLOSED): adds without the recovery flag are refused.
        self._not_open: set[int] = set()

    async def AddEntries(self, request_iterator: AsyncIterator[pb.AddRequest],
                         context: grpc.aio.ServicerContext) -> AsyncIterator[pb.AddResponse]:
        async for request in request_iterator:
            yield await self._add(request)

    async def _add(self, request: pb.AddRequest) -> pb.AddResponse:
        flat = bool(request.group_ledger_ids or request.entry_ids or request.payloads)
        if flat and request.ledgers:
            return _refused(request, pb.INVALID, "a request carries either ledgers or group columns, not both")
        batches = self._flat_batches(request) if flat else [
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
            return _refused(request, pb.TOO_LARGE, f"request carries {total_entries} entries, over "
                                                   f"batch_entries_max={cfg.batch_entries_max}")
        if total_bytes > cfg.batch_bytes_max:
            return _refused(request, pb.TOO_LARGE, f"request carries {total_bytes} payload bytes, over "
                                                   f"batch_bytes_max={cfg.batch_bytes_max}")
        results: list[tuple[list[Code], str] | None] = [None] * len(batches)
        unknown = self._needing_lookup(batches)
        if unknown:  # looked up concurrently: a request may open many ledgers at once
            refusals = await asyncio.gather(*(self._check_unknown_ledger(batches[i].ledger_id, batches[i].recovery)
                                              for i in unknown))
            for i, refused in zip(unknown, refusals, strict=True):
                if refused is not None:
                    results[i] = ([refused[0]] * len(batches[i].entry_ids), refused[1])
        todo = [i for i, result in enumerate(results) if result is None]
        if todo:
            written = await self._add_batch([batches[i] for i in todo] if len(todo) < len(batches) else batches,
                                            total_entries)
            for i, result in zip(todo, written, strict=True):
                results[i] = result
        if flat:
            return pb.AddResponse(request_id=request.request_id, group_count=len(batches), refused_groups=[
                pb.GroupResult(group=i, codes=result[0], message=result[1])
                for i, result in enumerate(results) if result is not None and any(result[0])])
        return pb.AddResponse(request_id=request.request_id, results=[
            pb.LedgerAddResult(ledger_id=batch.ledger_id, codes=result[0], message=result[1])
            for batch, result in zip(batches, results, strict=True) if result is not None])

    @staticmethod
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

    async def _add_batch(self, batches: list[LedgerBatch], total_entries: int) -> list[tuple[list[Code], str]]:
        storage = self.storage
        while True:
            try:
                return storage.add_batch(batches)
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
        """The batches of ledgers this bookie holds no state for that may have existed before it started."""
        registration = self.registration
        if registration is None:
            return []
        born_after = registration.new_ledgers_from
        if born_after is None:
            born_after = 1 << 63
        not_open = self._not_open
        known = self.storage.ledger_state
        # Cheapest tests first: in the common case every ledger is newer than the start, or known.
        return [i for i, b in enumerate(batches)
                if (b.ledger_id < born_after or b.ledger_id in not_open) and b.ledger_id >= 0
                and known(b.ledger_id) is None]

    async def _check_unknown_ledger(self, ledger_id: int, recovery: bool) -> tuple[Code, str] | None:
        """A ledger this bookie holds no state for that existed before it started (it may have forgotten it
        with the unsynced tail of an unclean stop) is looked up in etcd before an add is accepted: a ledger
        that etcd says is being recovered or is closed must never take an add from its old writer here,
        whatever this bookie remembers. Ledgers created after the start (id >= new_ledgers_from) cannot have
        been forgotten and skip the lookup."""
        assert self.registration is not None
        if ledger_id not in self._not_open:
            try:
                meta = await self.registration.ledger_metadata(ledger_id)
            except MetadataUnavailableError as e:
                return pb.INTERNAL, f"cannot check ledger {ledger_id} in etcd before its first add here: {e}"
            if meta is None:
                return pb.NO_SUCH_LEDGER, f"ledger {ledger_id} does not exist in the cluster metadata"
            if self.registration.bookie_id not in {b for _, bookies in meta.ensembles for b in bookies}:
                return pb.INVALID, f"bookie {self.registration.bookie_id} is not in ledger {ledger_id}'s ensembles"
            if meta.state == "OPEN":
                return None
            self._not_open.add(ledger_id)
        if recovery:
            return None
        return pb.FENCED, f"ledger {ledger_id} is being recovered or is closed (etcd): adds from its writer are refused"

    async def ReadEntries(self, request: pb.ReadRequest, context: grpc.aio.ServicerContext) -> pb.ReadResponse:
        cfg = self.config
        state = self.storage.ledger_state(request.ledger_id)
        max_entries = min(request.max_entries or cfg.read_entries_max, cfg.read_entries_max)
        max_bytes = min(request.max_bytes or cfg.read_bytes_max, cfg.read_bytes_max)
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
            ids = range(first, min(last, first + max_entries - 1) + 1)  # type: ignore[assignment]
            stop_on_failure = True
        if state is None:
            code = pb.UNKNOWN if self.storage.tail_maybe_lost else pb.NO_SUCH_LEDGER
            return pb.ReadResponse(ledger_id=request.ledger_id, error=code,
                                   error_message=f"ledger {request.ledger_id} is not known to this bookie")
        entries: list[tuple[int, int, bytes, str]] = []
        size = 0
        for entry_id in ids:
            if len(entries) >= max_entries:
                break
            try:
                payload = self.storage.read_entry(request.ledger_id, entry_id)
            except StorageError as e:
                entries.append((entry_id, e.code, b"", e.message))
                if stop_on_failure:
                    break
                continue
            if entries and size + len(payload) > max_bytes:
                break
            size += len(payload)
            entries.append((entry_id, pb.OK, payload, ""))
        # Pre-encoded: upb serializes many large payloads far below memory speed (see octavo.client.wire).
        return encode_read_response(pb.ReadResponse(ledger_id=request.ledger_id,  # type: ignore[return-value]
                                                    last_add_confirmed=state.last_add_confirmed), entries)

    async def ReadLastAddConfirmed(self, request: pb.ReadLacRequest,
                                   context: grpc.aio.ServicerContext) -> pb.ReadLacResponse:
        try:
            if request.fence:
                loop = asyncio.get_running_loop()
                info = await loop.run_in_executor(None, self.storage.fence, request.ledger_id, request.master_key)
            else:
                info = self.storage.read_lac(request.ledger_id)
        except StorageError as e:
            return pb.ReadLacResponse(code=e.code, message=e.message, last_add_confirmed=-1, last_entry_id=-1)
        return pb.ReadLacResponse(code=pb.OK, last_add_confirmed=info.last_add_confirmed,
                                  last_entry_id=info.last_entry_id, fenced=info.fenced,
                                  maybe_lost_tail=info.maybe_lost_tail)

    async def WriteClose(self, request: pb.WriteCloseRequest,
                         context: grpc.aio.ServicerContext) -> pb.WriteCloseResponse:
        try:
            self.storage.write_close(request.ledger_id, request.master_key)
        except StorageError as e:
            return pb.WriteCloseResponse(code=e.code, message=e.message)
        return pb.WriteCloseResponse(code=pb.OK)


def _refused(request: pb.AddRequest, code: Code, message: str) -> pb.AddResponse:
    """A request refused as a whole: nothing of it was written."""
    return pb.AddResponse(request_id=request.request_id, error=code, error_message=message)


def _run_pb(report: CompactionReport) -> pb.CompactionRun:
    return pb.CompactionRun(kind=report.kind, finished_unix_ms=report.finished_unix_ms, duration_s=report.duration_s,
                            logs_compacted=report.logs_compacted, compaction_logs=report.compaction_logs,
                            entries_copied=report.entries_copied, bytes_copied=report.bytes_copied,
                            bytes_reclaimed=report.bytes_reclaimed, corrupt_records=report.corrupt_records,
                            stopped=report.stopped, error=report.error)


def _progress_pb(p: CompactionProgress) -> pb.CompactionUpdate:
    return pb.CompactionUpdate(kind=p.kind, logs_total=p.logs_total, logs_done=p.logs_done, bytes_total=p.bytes_total,
                               bytes_done=p.bytes_done)


# A compaction started by hand streams its progress at most this often.
PROGRESS_INTERVAL_S = 0.2


class BookieAdminService(pb_grpc.BookieAdminServicer):
    def __init__(self, node: BookieServer) -> None:
        self.node = node

    @property
    def storage(self) -> Storage:
        assert self.node.storage is not None
        return self.node.storage

    async def RunGc(self, request: pb.RunGcRequest, context: grpc.aio.ServicerContext) -> pb.RunGcResponse:
        if self.node.registration is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "garbage collection needs cluster membership (--etcd): a standalone bookie cannot "
                                "tell which ledgers were deleted")
        try:
            report = await self.node.collect_garbage()
        except MetadataUnavailableError as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"garbage collection needs etcd: {e}")
        return pb.RunGcResponse(ledgers_dropped=report.ledgers_dropped, logs_checked=report.logs_checked,
                                logs_deleted=report.logs_deleted, bytes_reclaimed=report.bytes_reclaimed,
                                duration_s=report.duration_s)

    def _mode(self) -> pb.ModeStatus:
        monitor = self.node.disk
        assert monitor is not None
        return pb.ModeStatus(mode=pb.MODE_READ_ONLY if monitor.read_only else pb.MODE_WRITABLE,
                             reason=monitor.reason(), forced_read_only=monitor.forced)

    async def SetReadOnly(self, request: pb.SetReadOnlyRequest, context: grpc.aio.ServicerContext) -> pb.ModeStatus:
        await self.node.set_forced_read_only(request.read_only)
        return self._mode()

    def _compaction_state(self) -> pb.CompactionState:
        comp = self.node.compactor
        assert comp is not None
        cfg = self.storage.config
        progress = comp.progress
        state = pb.CompactionState(
            enabled=comp.enabled, suspended=comp.suspended, window_until_unix_ms=comp.window_until_ms,
            blocked_reason=comp.blocked_reason(), running=progress is not None,
            running_kind=progress.kind if progress else "", running_bytes_done=progress.bytes_done if progress else 0,
            running_bytes_total=progress.bytes_total if progress else 0,
            minor_threshold=cfg.compaction_minor_threshold, major_threshold=cfg.compaction_major_threshold,
            rate_bytes_per_s=cfg.compaction_rate_bytes_per_s)
        if comp.last is not None:
            state.last_run.CopyFrom(_run_pb(comp.last))
        return state

    async def SetCompactionWindow(self, request: pb.SetCompactionWindowRequest,
                                  context: grpc.aio.ServicerContext) -> pb.CompactionState:
        if request.until_unix_ms < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"until_unix_ms must be >= 0 (0 clears the window), got {request.until_unix_ms}")
        now_ms = int(time.time() * 1000)
        if 0 < request.until_unix_ms <= now_ms:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the window would end at {request.until_unix_ms} ms, which is past (now {now_ms}): "
                                "that turns scheduled compaction off; suspend compaction for that instead")
        assert self.node.compactor is not None
        await asyncio.get_running_loop().run_in_executor(None, self.node.compactor.set_window, request.until_unix_ms)
        return self._compaction_state()

    async def SuspendCompaction(self, request: pb.SuspendCompactionRequest,
                                context: grpc.aio.ServicerContext) -> pb.CompactionState:
        assert self.node.compactor is not None
        await asyncio.get_running_loop().run_in_executor(None, self.node.compactor.set_suspended, request.suspend)
        return self._compaction_state()

    async def RunCompaction(self, request: pb.RunCompactionRequest,
                            context: grpc.aio.ServicerContext) -> AsyncIterator[pb.CompactionUpdate]:
        comp = self.node.compactor
        assert comp is not None
        if comp.suspended:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "compaction is suspended: resume it first (`octavo bookie compaction resume`)")
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[pb.CompactionUpdate] = asyncio.Queue()
        last_sent = [0.0]

        def on_progress(p: CompactionProgress) -> None:  # on the compaction thread
            now = time.monotonic()
            if now - last_sent[0] >= PROGRESS_INTERVAL_S or p.logs_done == p.logs_total:
                last_sent[0] = now
                loop.call_soon_threadsafe(updates.put_nowait, _progress_pb(p))

        cancel = threading.Event()
        kind = MAJOR if request.major else MINOR
        run = loop.run_in_executor(None, functools.partial(comp.run, kind, on_progress, True, cancel))
        try:
            while not run.done():
                getter = asyncio.ensure_future(updates.get())
                waiting: list[asyncio.Future[Any]] = [getter, run]
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            report = await run
        finally:
            cancel.set()  # the caller went away: stop at the next safe point (no effect once finished)
        yield pb.CompactionUpdate(kind=kind, done=True, report=_run_pb(report))

    async def GetStatus(self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext) -> pb.BookieStatus:
        node = self.node
        storage = self.storage
        st = storage.status()
        cfg = storage.config
        rec = st["recovery"]
        gc = storage.last_gc
        monitor = node.disk
        assert monitor is not None
        loop = asyncio.get_running_loop()
        usages = await loop.run_in_executor(None, lambda: [monitor.measure(p) for p in monitor.directories])
        live_bytes, total_bytes = await loop.run_in_executor(None, storage.disk_bytes)
        mode = self._mode()
        reg = node.registration
        status = pb.BookieStatus(
            bookie_id=node.bookie_id, instance_id=st["instance_id"],
            cluster=cfg.cluster if cfg.etcd else "", registered=bool(reg and reg.registered),
            address=node.advertised, version=VERSION, mode=mode.mode, mode_reason=mode.reason,
            forced_read_only=mode.forced_read_only,
            directories=[pb.DirectoryUsage(path=u.path, total_bytes=u.total_bytes, used_bytes=u.used_bytes,
                                           free_bytes=u.free_bytes, usage_ratio=u.ratio) for u in usages],
            disk_warn_ratio=cfg.disk_warn_ratio, disk_readonly_ratio=cfg.disk_readonly_ratio,
            disk_writable_ratio=cfg.disk_writable_ratio,
            recovery_point_log_id=st["recovery_point_log_id"], active_log_id=st["active_log_id"],
            entry_log_count=len(st["entry_logs"]),
            write_cache=pb.WriteCacheUsage(entries=st["write_cache_entries"],
                                           entries_max=st["write_cache_entries_max"],
                                           estimated_bytes=st["write_cache_bytes_estimate"]),
            ledger_count=st["ledger_count"], fsync_policy=cfg.fsync_policy,
            unclean_restart_count=st["unclean_restart_count"],
            last_unclean_restart_unix_ms=st["last_unclean_restart_unix_ms"],
            last_start_was_unclean=st["last_start_was_unclean"], tail_maybe_lost=st["tail_maybe_lost"],
            gc_last_run_unix_ms=gc.finished_unix_ms if gc else 0, gc_ledgers_dropped=gc.ledgers_dropped if gc else 0,
            gc_logs_deleted=gc.logs_deleted if gc else 0, gc_bytes_reclaimed=gc.bytes_reclaimed if gc else 0,
            gc_duration_s=gc.duration_s if gc else 0.0,
            recovery_logs_scanned=rec.logs_scanned,
            recovery_records_replayed=rec.records_replayed, recovery_bytes_truncated=rec.bytes_truncated,
            started_unix_ms=storage.started_unix_ms, compaction=self._compaction_state(),
            log_live_bytes=live_bytes, log_total_bytes=total_bytes,
        )
        if reg is not None:
            status.registration_refreshed_unix_ms = int(reg.refreshed_unix_s * 1000)
            status.registration_ttl_s = reg.ttl_s
            status.registration_error = reg.last_error
            status.registration_failing_since_unix_ms = int(reg.failing_since_unix_s * 1000)
        if request.include_entry_logs:
            status.entry_logs.extend(pb.EntryLogInfo(log_id=i, size_bytes=size, state=state)
                                     for i, size, state in st["entry_logs"])
        return status


class Malformed:
    """What the safe deserializer yields for bytes that are not a valid request: the handler turns it into an
    INVALID_ARGUMENT status (grpc's own decoding failure would surface as UNKNOWN)."""

    def __init__(self, type_name: str, error: Exception) -> None:
        self.message = f"malformed {type_name}: {error}"


def _safe_parser(message_type: Any) -> Any:
    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError as e:
            return Malformed(message_type.DESCRIPTOR.full_name, e)

    return parse


def _serialize(message: Any) -> bytes:
    """Responses may come pre-encoded (bytes) from a handler that encodes its payloads itself."""
    return message if isinstance(message, bytes) else message.SerializeToString()  # type: ignore[no-any-return]


def _unary(behavior: Any, request_type: Any, response_type: Any) -> Any:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await behavior(request, context)

    return grpc.unary_unary_rpc_method_handler(handle, request_deserializer=_safe_parser(request_type),
                                               response_serializer=_serialize)


def _stream(behavior: Any, request_type: Any, response_type: Any) -> Any:
    async def handle(request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async def checked() -> AsyncIterator[Any]:
            async for request in request_iterator:
                if isinstance(request, Malformed):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                yield request

        async for response in behavior(checked(), context):
            yield response

    return grpc.stream_stream_rpc_method_handler(handle, request_deserializer=_safe_parser(request_type),
                                                 response_serializer=response_type.SerializeToString)


def _unary_stream(behavior: Any, request_type: Any, response_type: Any) -> Any:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        async for response in behavior(request, context):
            yield response

    return grpc.unary_stream_rpc_method_handler(handle, request_deserializer=_safe_parser(request_type),
                                                response_serializer=response_type.SerializeToString)


def bookie_handler(service: BookieService) -> Any:
    return grpc.method_handlers_generic_handler("octavo.v1.Bookie", {
        "AddEntries": _stream(service.AddEntries, pb.AddRequest, pb.AddResponse),
        "ReadEntries": _unary(service.ReadEntries, pb.ReadRequest, pb.ReadResponse),
        "ReadLastAddConfirmed": _unary(service.ReadLastAddConfirmed, pb.ReadLacRequest, pb.ReadLacResponse),
        "WriteClose": _unary(service.WriteClose, pb.WriteCloseRequest, pb.WriteCloseResponse),
    })


def admin_handler(service: BookieAdminService) -> Any:
    return grpc.method_handlers_generic_handler("octavo.v1.BookieAdmin", {
        "GetStatus": _unary(service.GetStatus, pb.GetStatusRequest, pb.BookieStatus),
        "RunGc": _unary(service.RunGc, pb.RunGcRequest, pb.RunGcResponse),
        "SetReadOnly": _unary(service.SetReadOnly, pb.SetReadOnlyRequest, pb.ModeStatus),
        "RunCompaction": _unary_stream(service.RunCompaction, pb.RunCompactionRequest, pb.CompactionUpdate),
        "SetCompactionWindow": _unary(service.SetCompactionWindow, pb.SetCompactionWindowRequest, pb.CompactionState),
        "SuspendCompaction": _unary(service.SuspendCompaction, pb.SuspendCompactionRequest, pb.CompactionState),
    })


def grpc_options(config: NodeConfig) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", config.batch_bytes_max + MESSAGE_OVERHEAD_BYTES),
        ("grpc.max_send_message_length", config.read_bytes_max + MESSAGE_OVERHEAD_BYTES),
        ("grpc.so_reuseport", 0),
    ]


class BookieServer:
    """A running bookie: storage opened (recovery done), gRPC serving. Use start() / stop()."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config.validate()
        self.storage: Storage | None = None
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        self.port = 0
        self.bookie_id = ""
        self.registration: Registration | None = None
        self.repair: TailRepair | None = None
        self._repair_task: asyncio.Task[None] | None = None
        self._space_task: asyncio.Task[None] | None = None
        self._disk_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self.ledgers_dropped_by_watch = 0
        self.disk: DiskMonitor | None = None
        self.compactor: Compactor | None = None
        self.advertised = ""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        # The port first: a port in use must fail the start before anything is created in the data directory.
        server = grpc.aio.server(options=grpc_options(self.config))
        address = f"{self.config.host}:{self.config.port}"
        try:
            self.port = server.add_insecure_port(address)
        except RuntimeError as e:
            raise StorageError(pb.INTERNAL, f"cannot listen on {address} (in use, or not an address of this "
                                            f"host): {e}") from e
        if self.port == 0:
            raise StorageError(pb.INTERNAL, f"cannot listen on {address} (in use, or not an address of this host)")
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = [pb.DESCRIPTOR.services_by_name[n].full_name for n in ("Bookie", "BookieAdmin")]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        self.storage = await loop.run_in_executor(None, Storage.open, self.config)
        advertised = self.config.advertised_address or f"{self.config.host}:{self.port}"
        self.advertised = advertised
        self.bookie_id = self.config.bookie_id or advertised
        self.disk = DiskMonitor(self.storage)
        await loop.run_in_executor(None, self.disk.check)  # register in the right set from the start
        self.compactor = Compactor(self.storage)
        if self.config.etcd:
            self.registration = Registration(self.storage, self.bookie_id, advertised)
            self.registration.disk_usage_ratio = max((u.ratio for u in self.disk.usages), default=0.0)
            await self.registration.check_cookie()  # before serving anything from this disk
            await self.registration.read_ledger_counter()
        server.add_generic_rpc_handlers((bookie_handler(BookieService(self.storage, self.registration)),))
        server.add_generic_rpc_handlers((admin_handler(BookieAdminService(self)),))
        await server.start()
        self.server = server
        for name in ["", *names]:
            await self._set_health(name, health_pb2.HealthCheckResponse.SERVING)
        if self.registration is not None:
            await self.registration.start()
            self._watch_task = asyncio.create_task(self._watch_deletions(), name="octavo-watch")
            if self.storage.tail_maybe_lost and self.config.tail_repair:
                self.repair = TailRepair(self.storage, self.bookie_id)
                self._repair_task = asyncio.create_task(self.repair.run(), name="octavo-tail-repair")
        self._space_task = asyncio.create_task(self._space_loop(), name="octavo-space")
        self._disk_task = asyncio.create_task(self._disk_loop(), name="octavo-disk")
        log.info("bookie %s serving on %s:%d (data dir %s, recovery %.2fs, %d logs replayed)",
                 self.bookie_id, self.config.host, self.port, self.storage.data_dir,
                 time.monotonic() - t0, self.storage.recovery.logs_scanned)

    async def _space_loop(self) -> None:
        """GC (in a cluster) every gc_interval_ms, then a scheduled compaction pass when one is due and
        allowed. Both keep running when the disk is past the high mark: that is how space comes back."""
        interval_s = min(self.config.gc_interval_ms, self.config.compaction_minor_interval_ms) / 1000
        next_gc = time.monotonic() + self.config.gc_interval_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval_s)
            if self.registration is not None and time.monotonic() >= next_gc:
                next_gc = time.monotonic() + self.config.gc_interval_ms / 1000
                try:
                    await self.collect_garbage()
                except MetadataUnavailableError as e:  # expected while etcd is down: one line, no traceback
                    log.warning("garbage collection skipped, retrying at the next interval: %s", e)
                except Exception:  # GC goes on next time; it never takes the bookie down
                    log.exception("garbage collection failed; retrying at the next interval")
            compactor = self.compactor
            assert compactor is not None
            kind = compactor.due()
            if kind is None:
                continue
            blocked = compactor.blocked_reason()
            if blocked:
                log.info("scheduled %s compaction skipped: %s", kind, blocked)
                compactor.last_minor_monotonic = time.monotonic()
                if kind == MAJOR:
                    compactor.last_major_monotonic = time.monotonic()
                continue
            await loop.run_in_executor(None, compactor.run, kind)

    async def _watch_deletions(self) -> None:
        """Drop ledgers as soon as etcd deletes them (their logs go at the next GC pass). A broken watch is
        opened again after a pause; deletions in the gap are found by the periodic full scan of GC."""
        assert self.registration is not None and self.storage is not None
        registration, storage = self.registration, self.storage
        layout = registration.store.layout
        while True:
            try:
                async for keys in registration.etcd.watch_deletes(layout.ledgers):
                    ids = [layout.ledger_id_of(k) for k in keys]
                    known = [lid for lid in ids if storage.ledger_state(lid) is not None]
                    if known:
                        await self._drop_deleted(known)
                        self.ledgers_dropped_by_watch += len(known)
            except MetadataUnavailableError as e:
                log.warning("watch on deleted ledgers broke (%s); watching again in 1s", e)
            except (ValueError, OSError, StorageError) as e:
                log.error("dropping deleted ledgers failed (%s); the next GC pass retries", e)
            await asyncio.sleep(1.0)

    async def _drop_deleted(self, ledger_ids: list[int]) -> None:
        """Forget ledgers etcd deleted. The lookup mark rises first, so an add processed after the drop is
        checked in etcd and refused (NO_SUCH_LEDGER) rather than bringing the ledger back to life here."""
        assert self.registration is not None and self.storage is not None
        self.registration.forget_ledgers(ledger_ids)
        await asyncio.get_running_loop().run_in_executor(None, self.storage.drop_ledgers, ledger_ids)

    async def _disk_loop(self) -> None:
        interval_s = self.config.disk_check_interval_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval_s)
            monitor = self.disk
            assert monitor is not None
            try:
                changed = await loop.run_in_executor(None, monitor.check)
            except OSError as e:
                log.error("disk check failed: %s", e)
                continue
            if self.registration is not None:
                self.registration.disk_usage_ratio = max((u.ratio for u in monitor.usages), default=0.0)
                if changed:
                    await self._update_registration()

    async def _update_registration(self) -> None:
        if self.registration is None:
            return
        try:
            await self.registration.update_mode()
        except MetadataUnavailableError as e:  # the keepalive loop registers in the right set when it can
            log.warning("cannot move the registration to the %s set yet: %s",
                        "read-only" if self.disk and self.disk.read_only else "writable", e)

    async def set_forced_read_only(self, forced: bool) -> None:
        assert self.disk is not None
        changed = await asyncio.get_running_loop().run_in_executor(None, self.disk.set_forced, forced)
        log.warning("forced read-only %s by an administrator", "set" if forced else "released")
        if not forced:
            await asyncio.get_running_loop().run_in_executor(None, self.disk.check)
            changed = True
        if changed:
            await self._update_registration()

    async def collect_garbage(self) -> GcReport:
        """One GC pass: drop the ledgers etcd no longer has (each confirmed by a direct read, so a ledger
        created after the listing is never taken for deleted), then delete logs with nothing alive."""
        assert self.storage is not None and self.registration is not None
        storage, registration = self.storage, self.registration
        in_etcd = set(await registration.store.list_ledgers())
        candidates = sorted(storage.ledger_ids() - in_etcd)
        gone = [lid for lid in candidates if await registration.ledger_metadata(lid) is None]
        if gone:
            await self._drop_deleted(gone)
        report = await asyncio.get_running_loop().run_in_executor(None, storage.collect_garbage)
        report.ledgers_dropped = len(gone)
        return report

    async def _set_health(self, name: str, status: int) -> None:
        result = self.health.set(name, status)
        if asyncio.iscoroutine(result):
            await result

    async def stop(self) -> None:
        """Graceful: leave the cluster (writers stop choosing this bookie), report NOT_SERVING, finish in-flight
        calls (bounded grace), then close storage cleanly."""
        if self.compactor is not None:
            self.compactor.stop()  # a running pass stops at its next safe point
        for task in (self._repair_task, self._space_task, self._disk_task, self._watch_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._repair_task = self._space_task = self._disk_task = self._watch_task = None
        if self.registration is not None:
            await self.registration.stop()
            self.registration = None
        if self.server is not None:
            await self._set_health("", health_pb2.HealthCheckResponse.NOT_SERVING)
            await self.server.stop(SHUTDOWN_GRACE_S)
            self.server = None
        if self.storage is not None:
            storage, self.storage = self.storage, None
            # Wait for a compaction or GC pass still in its thread to reach its safe point.
            await asyncio.get_running_loop().run_in_executor(None, storage.space_lock.acquire)
            await asyncio.get_running_loop().run_in_executor(None, storage.close)
            log.info("bookie stopped cleanly: everything synced, nothing to replay at the next start")


async def serve(config: NodeConfig, ready_file: str | None = None) -> None:
    """Run a bookie until SIGTERM or SIGINT, then stop it gracefully."""
    node = BookieServer(config)
    try:
        await node.start()
    except BaseException:
        await node.stop()
        raise
    # Startup objects (modules, descriptors, the ledger table) live as long as the process: moved out of the
    # collector's reach, a full collection no longer walks them and stalls every add on this bookie.
    gc.collect()
    gc.freeze()
    if ready_file:
        tmp = ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{config.host}:{node.port}\n")
        os.replace(tmp, ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal received: stopping")
    await node.stop()
