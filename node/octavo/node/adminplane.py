"""The admin plane: the BookieAdmin service (status, GC, read-only mode, compaction controls)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from octavo.meta.errors import MetadataUnavailableError
from octavo.node.adminauth import AdminAuthorizer
from octavo.node.compaction import CompactionProgress, CompactionReport, Compactor
from octavo.node.compaction_plan import MAJOR, MINOR
from octavo.node.damagerepair import scrub_state
from octavo.node.disk import forced_problem
from octavo.node.rpc import bad_requests, unary, unary_stream
from octavo.node.scrub import ScrubPass
from octavo.node.storage import Storage
from octavo.v1 import bookie_pb2 as pb
from octavo.v1 import bookie_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from octavo.node.autorecovery import AutoRecovery
    from octavo.node.damagerepair import DamageControl
    from octavo.node.disk import DiskMonitor
    from octavo.node.gc import GcReport
    from octavo.node.registration import Registration


VERSION = "0.1.0"


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
# Progress updates waiting for a slow caller; past this the oldest are dropped (progress is a snapshot).
PROGRESS_UPDATES_QUEUED_MAX = 16


class AdminContext(Protocol):
    """What the admin plane reads and asks of a running bookie (the bookie server implements it): each
    part is None until the bookie has started it."""

    @property
    def storage(self) -> Storage | None: ...

    @property
    def registration(self) -> Registration | None: ...

    @property
    def disk(self) -> DiskMonitor | None: ...

    @property
    def compactor(self) -> Compactor | None: ...

    @property
    def autorecovery(self) -> AutoRecovery | None: ...

    @property
    def damage_control(self) -> DamageControl | None: ...

    @property
    def bookie_id(self) -> str: ...

    @property
    def advertised(self) -> str: ...

    @property
    def metrics_address(self) -> str: ...

    @property
    def space_wake(self) -> asyncio.Event: ...  # set when a compaction window opens

    async def collect_garbage(self) -> GcReport: ...

    async def set_forced_read_only(self, forced: bool, reason: str = "", threshold_ratio: float = 0.0) -> None: ...


class BookieAdminService(pb_grpc.BookieAdminServicer):
    def __init__(self, node: AdminContext) -> None:
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
                             reason=monitor.reason(), forced_read_only=monitor.forced,
                             forced_reason=monitor.forced_reason, forced_threshold_ratio=monitor.forced_threshold_ratio)

    async def SetReadOnly(self, request: pb.SetReadOnlyRequest, context: grpc.aio.ServicerContext) -> pb.ModeStatus:
        problem = forced_problem(request.reason, request.threshold_ratio)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"SetReadOnly: {problem}")
        await self.node.set_forced_read_only(request.read_only, request.reason, request.threshold_ratio)
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
        assert self.node.compactor is not None
        # A time already past closes the window (the operator does that between windows); 0 clears it.
        opened = await asyncio.get_running_loop().run_in_executor(None, self.node.compactor.set_window,
                                                                  request.until_unix_ms)
        if opened:
            self.node.space_wake.set()
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
        updates: asyncio.Queue[pb.CompactionUpdate] = asyncio.Queue(maxsize=PROGRESS_UPDATES_QUEUED_MAX)
        last_sent = [0.0]

        def queue(update: pb.CompactionUpdate) -> None:  # on the loop: a caller that does not read loses the oldest
            if updates.full():
                updates.get_nowait()
            updates.put_nowait(update)

        def on_progress(p: CompactionProgress) -> None:  # on the compaction thread
            now = time.monotonic()
            if now - last_sent[0] >= PROGRESS_INTERVAL_S or p.logs_done == p.logs_total:
                last_sent[0] = now
                loop.call_soon_threadsafe(queue, _progress_pb(p))

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

    def _autorecovery_state(self) -> pb.AutorecoveryState:
        cfg = self.storage.config
        ar = self.node.autorecovery
        state = pb.AutorecoveryState(enabled=ar is not None, lost_bookie_delay_s=cfg.lost_bookie_delay_s,
                                     open_ledger_grace_s=cfg.open_ledger_grace_s)
        if ar is None:
            return state
        now_mono, now_unix = time.monotonic(), time.time()
        state.is_auditor = ar.auditor.is_auditor
        for bookie_id, since in ar.auditor.missing_since.items():
            state.missing_since_unix_ms[bookie_id] = int((now_unix - (now_mono - since)) * 1000)
        state.marked_lost.extend(sorted(ar.auditor.marked_lost))
        state.last_full_audit_unix_ms = ar.auditor.last_full_audit_unix_ms
        state.ledgers_marked = ar.auditor.ledgers_marked
        state.replicating_ledgers.extend(sorted(ar.worker.in_progress))
        state.ledgers_replicated = ar.worker.ledgers_replicated
        state.entries_copied = ar.worker.entries_copied
        state.bytes_copied = ar.worker.bytes_copied
        replicas = ar.replicas.state  # replicascheck.py
        state.replicas_check_interval_s = cfg.replicas_check_interval_s
        state.replicas_check_last_unix_ms = replicas.last_pass_unix_ms
        state.replicas_missing_entries = replicas.missing_entries
        state.replicas_extra_copies = replicas.extra_copies
        state.replicas_ledgers_marked = replicas.ledgers_marked
        state.replicas_entries_restored = replicas.entries_restored
        state.last_error = ar.worker.last_error
        state.lost.extend(ar.worker.lost)
        return state

    def _scrub_state(self, report: ScrubPass | None = None) -> pb.ScrubState:
        control = self.node.damage_control
        assert control is not None
        return scrub_state(control, self.storage.config, report)

    async def RunScrub(self, request: pb.RunScrubRequest, context: grpc.aio.ServicerContext) -> pb.ScrubState:
        control = self.node.damage_control
        assert control is not None
        try:
            report = await control.scrub_now()
        except ValueError as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return self._scrub_state(report)

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
            forced_read_only=mode.forced_read_only, forced_reason=mode.forced_reason,
            forced_threshold_ratio=mode.forced_threshold_ratio,
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
            log_live_bytes=live_bytes, log_total_bytes=total_bytes, metrics_address=node.metrics_address,
        )
        if reg is not None:
            status.registration_refreshed_unix_ms = int(reg.refreshed_unix_s * 1000)
            status.registration_ttl_s = reg.ttl_s
            status.registration_error = reg.last_error
            status.registration_failing_since_unix_ms = int(reg.failing_since_unix_s * 1000)
        status.autorecovery.CopyFrom(self._autorecovery_state())
        status.scrub.CopyFrom(self._scrub_state())
        if request.include_entry_logs:
            status.entry_logs.extend(pb.EntryLogInfo(log_id=i, size_bytes=size, state=state)
                                     for i, size, state in st["entry_logs"])
        return status


def admin_handler(service: BookieAdminService, authorizer: AdminAuthorizer | None = None) -> Any:
    """Every admin method, behind `authorizer` when it is enforced (adminauth.py)."""
    def guarded(behavior: Any, streaming: bool = False) -> Any:
        if authorizer is None or not authorizer.enforced:
            return behavior

        async def check(context: grpc.aio.ServicerContext) -> None:
            refused = authorizer.check(context)
            if refused is not None:
                # Rate-limited: an unauthenticated peer could otherwise write a line per call.
                bad_requests.warning("admin_refused", f"admin call refused: {refused[1]}", event="admin_refused")
                await context.abort(*refused)

        if streaming:
            async def stream_call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                await check(context)
                async for item in behavior(request, context):
                    yield item
            return stream_call

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(context)
            return await behavior(request, context)
        return call

    return grpc.method_handlers_generic_handler("octavo.v1.BookieAdmin", {
        "GetStatus": unary(guarded(service.GetStatus), pb.GetStatusRequest, pb.BookieStatus),
        "RunGc": unary(guarded(service.RunGc), pb.RunGcRequest, pb.RunGcResponse),
        "SetReadOnly": unary(guarded(service.SetReadOnly), pb.SetReadOnlyRequest, pb.ModeStatus),
        "RunScrub": unary(guarded(service.RunScrub), pb.RunScrubRequest, pb.ScrubState),
        "RunCompaction": unary_stream(guarded(service.RunCompaction, streaming=True), pb.RunCompactionRequest,
                                      pb.CompactionUpdate),
        "SetCompactionWindow": unary(guarded(service.SetCompactionWindow), pb.SetCompactionWindowRequest,
                                     pb.CompactionState),
        "SuspendCompaction": unary(guarded(service.SuspendCompaction), pb.SuspendCompactionRequest,
                                   pb.CompactionState),
    })
