"""The bookie process: storage opened (recovery done), the data and admin planes served over gRPC with health
checking and reflection, cluster membership, and the background loops (GC and compaction, disk watermarks,
deletion watch, tail repair); then a graceful stop. The planes are in dataplane.py and adminplane.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2
from opentelemetry.sdk.trace import TracerProvider

from octavo.meta.errors import EtcdCompactedError, MetadataUnavailableError
from octavo.meta.keyrange import WatchPosition
from octavo.meta.tls import ReloadingServerCredentials, TlsFiles
from octavo.node.adminauth import AdminAuthorizer
from octavo.node.adminplane import BookieAdminService, admin_handler
from octavo.node.autorecovery import AutoRecovery
from octavo.node.bookiemetrics import BookieMetrics
from octavo.node.compaction import Compactor
from octavo.node.compaction_plan import MAJOR
from octavo.node.config import NodeConfig
from octavo.node.damagerepair import DamageControl
from octavo.node.dataplane import BookieService, bookie_handler
from octavo.node.disk import DiskMonitor
from octavo.node.errors import StorageError
from octavo.node.grpc_services import health_handler, reflection_handler
from octavo.node.registration import Registration
from octavo.node.repair import TailRepair
from octavo.node.rpc import limit_grpc_servicer_errors
from octavo.node.storage import GcReport, Storage
from octavo.node.synclost import exit_sync_lost
from octavo.telemetry import Sampling, ServerTls, Telemetry, make_tracer_provider
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

# Room on top of the batch limit for protobuf framing and the master keys.
MESSAGE_OVERHEAD_BYTES = 1024 * 1024
SHUTDOWN_GRACE_S = 5.0


def grpc_options(config: NodeConfig) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", config.batch_bytes_max + MESSAGE_OVERHEAD_BYTES),
        ("grpc.max_send_message_length", config.read_bytes_max + MESSAGE_OVERHEAD_BYTES),
        ("grpc.so_reuseport", 0),
    ]


class BookieServer:
    """A running bookie: storage opened (recovery done), gRPC serving. Use start() / stop()."""

    def __init__(self, config: NodeConfig, tracer_provider: TracerProvider | None = None) -> None:
        """`tracer_provider`: where spans go (tests pass one with an in-memory exporter); by default spans are
        exported over OTLP when otlp_endpoint is set, and not made at all otherwise."""
        self.config = config.validate()
        self.service: BookieService | None = None
        self.telemetry: Telemetry | None = None
        self.metrics_port = -1
        self.serving = False  # what the gRPC health service says for "" (and /healthz on the metrics port)
        self.metrics_address = ""
        self._tracer_provider = tracer_provider
        self._own_tracer_provider = False
        self.tls_credentials: ReloadingServerCredentials | None = None
        self.storage: Storage | None = None
        self.server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.bookie_id = ""
        self.registration: Registration | None = None
        self.repair: TailRepair | None = None
        self._repair_task: asyncio.Task[None] | None = None
        self._space_task: asyncio.Task[None] | None = None
        self._disk_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self.autorecovery: AutoRecovery | None = None
        self.space_wake = asyncio.Event()  # set when a compaction window opens: the space loop looks at once
        self._autorecovery_task: asyncio.Task[None] | None = None
        self.ledgers_dropped_by_watch = 0
        self.watch_drops = 0  # drops of ledgers the watch saw deleted (each one synced index transaction)
        self.gc_ledgers_dropped_total = 0
        self.disk: DiskMonitor | None = None
        self.compactor: Compactor | None = None
        self.damage_control: DamageControl | None = None  # scrub and damage repair (damagerepair.py)
        self.advertised = ""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        # The port first: a port in use must fail the start before anything is created in the data directory.
        server = grpc.aio.server(options=grpc_options(self.config))
        address = f"{self.config.host}:{self.config.port}"
        tls = self.config_tls()
        try:
            if tls.enabled:
                self.tls_credentials = ReloadingServerCredentials(tls.check(), self.config.tls_client_auth)
                self.port = server.add_secure_port(address, self.tls_credentials.credentials)
            else:
                self.port = server.add_insecure_port(address)
        except RuntimeError as e:
            raise StorageError(pb.INTERNAL, f"cannot listen on {address} (in use, or not an address of this "
                                            f"host): {e}") from e
        if self.port == 0:
            raise StorageError(pb.INTERNAL, f"cannot listen on {address} (in use, or not an address of this host)")
        names = [pb.DESCRIPTOR.services_by_name[n].full_name for n in ("Bookie", "BookieAdmin")]
        # Through our own handlers: a request that does not parse gets INVALID_ARGUMENT and one rate-limited line.
        limit_grpc_servicer_errors()
        server.add_generic_rpc_handlers((health_handler(self.health),
                                         reflection_handler([*names, health.SERVICE_NAME])))
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
        self.service = BookieService(self.storage, self.registration)
        await self._start_telemetry(self.service)
        server.add_generic_rpc_handlers((bookie_handler(self.service),))
        authorizer = AdminAuthorizer(self.config.admin_identities.split(","), self.config.admin_token_file)
        server.add_generic_rpc_handlers((admin_handler(BookieAdminService(self), authorizer),))
        await server.start()
        self.server = server
        for name in ["", *names]:
            await self._set_health(name, health_pb2.HealthCheckResponse.SERVING)
        self.serving = True
        if self.registration is not None:
            await self.registration.start()
            self._watch_task = asyncio.create_task(self._watch_deletions(), name="octavo-watch")
            if self.config.autorecovery_enabled:
                storage = self.storage
                self.autorecovery = AutoRecovery(self.config, self.bookie_id, self.registration,
                                                 lambda: not storage.read_only_reason)
                self._autorecovery_task = asyncio.create_task(self.autorecovery.run(), name="octavo-autorecovery")
            if self.storage.tail_maybe_lost and self.config.tail_repair:
                self.repair = TailRepair(self.storage, self.bookie_id)
                self._repair_task = asyncio.create_task(self.repair.run(), name="octavo-tail-repair")
        self.damage_control = DamageControl(self.storage, self.compactor, self.bookie_id)
        self.damage_control.start()
        self._space_task = asyncio.create_task(self._space_loop(), name="octavo-space")
        self._disk_task = asyncio.create_task(self._disk_loop(), name="octavo-disk")
        log.info("bookie %s serving on %s:%d%s (data dir %s, recovery %.2fs, %d logs replayed)",
                 self.bookie_id, self.config.host, self.port,
                 f" with TLS (client certificates: {self.config.tls_client_auth})" if self.tls_credentials else "",
                 self.storage.data_dir,
                 time.monotonic() - t0, self.storage.recovery.logs_scanned)

    def config_tls(self) -> TlsFiles:
        cfg = self.config
        return TlsFiles(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_ca_file)

    async def _start_telemetry(self, service: BookieService) -> None:
        """Metrics (with a /metrics endpoint when metrics_port is not -1, pushed when otlp_endpoint is set) and
        tracing (when a tracer provider was given or otlp_endpoint is set)."""
        cfg = self.config
        attributes = {"octavo.bookie_id": self.bookie_id, "octavo.cluster": cfg.cluster}
        if cfg.metrics_port >= 0 or cfg.otlp_endpoint:
            self.telemetry = Telemetry("octavo-bookie", attributes, cfg.otlp_endpoint)
            metrics = BookieMetrics(self, self.telemetry.meter("octavo.bookie"), service.stats)
            self.telemetry.before_collect.append(metrics.fresh)
            if cfg.metrics_port >= 0:
                tls = ServerTls(cfg.tls_cert_file, cfg.tls_key_file) if cfg.metrics_tls else None
                self.metrics_port = await self.telemetry.serve(cfg.host, cfg.metrics_port, lambda: self.serving, tls)
                host = self.advertised.rsplit(":", 1)[0] if cfg.host in ("0.0.0.0", "::", "") else cfg.host
                self.metrics_address = f"{host}:{self.metrics_port}"
        if self._tracer_provider is None and cfg.otlp_endpoint:
            self._tracer_provider = make_tracer_provider("octavo-bookie", cfg.otlp_endpoint, attributes=attributes)
            self._own_tracer_provider = True
        if self._tracer_provider is not None:
            service.tracer = self._tracer_provider.get_tracer("octavo.bookie")
            service.sampling = Sampling(cfg.trace_sample_ratio)

    def tail_waiter_count(self) -> int:
        return self.service.tail_waiters.count if self.service is not None else 0

    async def _space_loop(self) -> None:
        """GC (in a cluster) every gc_interval_ms, then a scheduled compaction pass when one is due and
        allowed. Both keep running when the disk is past the high mark: that is how space comes back."""
        interval_s = min(self.config.gc_interval_ms, self.config.compaction_minor_interval_ms) / 1000
        next_gc = time.monotonic() + self.config.gc_interval_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            # Woken early when a compaction window opens. asyncio.timeout, not wait_for: in Python 3.11 wait_for
            # wraps the wait in a task of its own at every pass.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self.space_wake.wait()
            self.space_wake.clear()
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
                    compactor.major_skipped = True
                continue
            await loop.run_in_executor(None, compactor.run, kind)

    async def _watch_deletions(self) -> None:
        """Drop ledgers as soon as etcd deletes them (their logs go at the next GC pass). A broken watch is
        opened again after a pause where it was, so no delete in the gap is missed, unless etcd's history of the
        gap was compacted meanwhile (the auditor compacts it: etcdcompaction.py): then the watch starts from
        now and a GC pass at once finds the ledgers deleted in the gap by a full scan."""
        assert self.registration is not None
        registration = self.registration
        layout = registration.store.layout
        pending: set[int] = set()
        arrived = asyncio.Event()
        dropper = asyncio.create_task(self._drop_watched(pending, arrived), name="octavo-watch-drops")
        position = WatchPosition()
        try:
            while True:
                try:
                    async for keys in registration.etcd.watch_deletes(layout.ledgers, position):
                        deleted = [layout.ledger_id_of(k) for k in keys]
                        if self.service is not None and self.service.trust is not None:
                            self.service.trust.forget(deleted)  # also those this bookie holds nothing of
                        pending.update(deleted)
                        arrived.set()
                except EtcdCompactedError as e:
                    log.warning("watch on deleted ledgers: %s; watching from now, and a GC pass looks for the "
                                "ledgers deleted meanwhile", e)
                    if self.service is not None and self.service.trust is not None:
                        self.service.trust.forget_all()  # a delete in the gap may be of one it remembers
                    try:
                        position.revision = await registration.etcd.revision()  # the new watch starts here
                        await self.collect_garbage()  # so the scan covers every delete before it
                        continue
                    except Exception as scan_error:  # the watch goes on; the periodic GC pass looks again
                        log.warning("the GC pass after a compacted watch failed (%s); the next one looks", scan_error)
                except MetadataUnavailableError as e:
                    log.warning("watch on deleted ledgers broke (%s); watching again in 1s", e)
                except ValueError as e:
                    log.error("watch on deleted ledgers: %s; watching again in 1s", e)
                await asyncio.sleep(1.0)
        finally:
            dropper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dropper

    async def _drop_watched(self, pending: set[int], arrived: asyncio.Event) -> None:
        """Drop what the watch saw deleted, everything that arrived meanwhile in one go: a burst of deletes (one
        etcd event each) costs one synced index transaction per drop, not one per ledger."""
        assert self.storage is not None
        storage = self.storage
        while True:
            await arrived.wait()
            arrived.clear()
            known = sorted(lid for lid in pending if storage.ledger_state(lid) is not None)
            pending.clear()
            if not known:
                continue
            try:
                await self._drop_deleted(known)
                self.ledgers_dropped_by_watch += len(known)
                self.watch_drops += 1
            except (ValueError, OSError, StorageError) as e:
                log.error("dropping deleted ledgers failed (%s); the next GC pass retries", e)

    async def _drop_deleted(self, ledger_ids: list[int]) -> None:
        """Forget ledgers etcd deleted. An add or fence processed after the drop meets a ledger this bookie holds
        nothing of, is checked in etcd and refused (NO_SUCH_LEDGER) rather than bringing the ledger back."""
        assert self.registration is not None and self.storage is not None
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

    async def set_forced_read_only(self, forced: bool, reason: str = "", threshold_ratio: float = 0.0) -> None:
        assert self.disk is not None
        changed = await asyncio.get_running_loop().run_in_executor(None, self.disk.set_forced, forced, reason,
                                                                   threshold_ratio)
        log.warning("forced read-only %s by %s", "set" if forced else "released", reason[:120] or "an administrator")
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
        # The cluster's ledger ids a page at a time, each page struck off the ledgers this bookie knows: memory
        # holds this bookie's ledgers, never the whole cluster's.
        store = registration.store
        candidates = storage.ledger_ids()
        async for page in store.ledger_pages(keys_only=True):
            candidates.difference_update(store.layout.ledger_id_of(kv.key) for kv in page)
        # Each candidate is confirmed by a read after the listing (a ledger created meanwhile is never taken for
        # deleted), many per etcd transaction.
        ordered = sorted(candidates)
        existing = await store.ledgers_existing(ordered)
        gone = [lid for lid in ordered if lid not in existing]
        if gone:
            await self._drop_deleted(gone)
        report = await asyncio.get_running_loop().run_in_executor(None, storage.collect_garbage)
        report.ledgers_dropped = len(gone)
        self.gc_ledgers_dropped_total += len(gone)
        return report

    async def _set_health(self, name: str, status: int) -> None:
        result = self.health.set(name, status)
        if asyncio.iscoroutine(result):
            await result

    async def drain(self, deadline: float) -> None:
        """Controlled shutdown (drain.py): tell the writers, move to the read-only set, and wait until the add
        streams have ended (the writers moved) or the loop time reaches `deadline`."""
        if self.service is None or self.server is None:
            return
        t0 = asyncio.get_running_loop().time()
        self.service.begin_drain()
        if self.registration is not None:
            self.registration.draining = True
            with contextlib.suppress(TimeoutError):  # etcd slow: the drain goes on, the flag still moves writers
                await asyncio.wait_for(self._update_registration(),
                                       max(0.0, deadline - asyncio.get_running_loop().time()))
        drain = self.service.drain
        if await drain.wait(deadline):
            log.info("drained in %.2fs: every add stream ended (%d idle ones ended by the bookie)",
                     asyncio.get_running_loop().time() - t0, drain.streams_ended)
        else:
            log.warning("grace period over with %d add streams still busy (a writer ignoring the drain, or "
                        "with no other bookie to move to): they are cancelled", len(drain.streams))

    async def stop(self, deadline: float | None = None) -> None:
        """Graceful: leave the cluster (writers stop choosing this bookie), report NOT_SERVING, finish in-flight
        calls (bounded grace: until `deadline`, loop time, else SHUTDOWN_GRACE_S from now), then close storage
        cleanly."""
        grace_s = SHUTDOWN_GRACE_S if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
        if self.compactor is not None:
            self.compactor.stop()  # a running pass stops at its next safe point
        if self.damage_control is not None:
            await self.damage_control.stop()  # a running scrub pass stops at its next read
        for task in (self._repair_task, self._space_task, self._disk_task, self._watch_task, self._autorecovery_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._repair_task = self._space_task = self._disk_task = self._watch_task = self._autorecovery_task = None
        if self.autorecovery is not None:
            await self.autorecovery.stop()
        if self.registration is not None:
            await self.registration.stop()
            self.registration = None
        self.serving = False
        if self.server is not None:
            await self._set_health("", health_pb2.HealthCheckResponse.NOT_SERVING)
            await self.server.stop(grace_s)
            self.server = None
        if self.telemetry is not None:
            await self.telemetry.shutdown()
            self.telemetry = None
        if self._own_tracer_provider and self._tracer_provider is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._tracer_provider.shutdown)
            self._tracer_provider = None
        if self.storage is not None:
            storage, self.storage = self.storage, None
            # Wait for a compaction or GC pass still in its thread to reach its safe point.
            await asyncio.get_running_loop().run_in_executor(None, storage.space_lock.acquire)
            await asyncio.get_running_loop().run_in_executor(None, storage.close)
            log.info("bookie stopped cleanly: everything synced, nothing to replay at the next start")


def _tag_log_records(field: str, value: str) -> None:
    """Every log record of this process carries `field` (the JSON log format writes it out)."""
    class Tag(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if not hasattr(record, field):
                setattr(record, field, value)
            return True

    for handler in logging.getLogger().handlers:
        handler.addFilter(Tag())


async def serve(config: NodeConfig, ready_file: str | None = None) -> None:
    """Run a bookie until SIGTERM or SIGINT, then stop it gracefully."""
    node = BookieServer(config)
    try:
        await node.start()
    except BaseException:
        await node.stop()
        raise
    _tag_log_records("bookie_id", node.bookie_id)
    if node.storage is not None:  # crash-only after a failed sync (synclost.py): also if it failed during start
        node.storage.on_sync_lost = exit_sync_lost
        if node.storage.sync_failed_reason:
            exit_sync_lost(node.storage.sync_failed_reason)
    # Startup objects (modules, descriptors, the ledger table) live as long as the process: moved out of the
    # collector's reach, a full collection no longer walks them and stalls every add on this bookie.
    gc.collect()
    gc.freeze()
    if ready_file:
        tmp = ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{config.host}:{node.port}\n")
            if node.metrics_port >= 0:
                f.write(f"metrics={config.host}:{node.metrics_port}\n")
        os.replace(tmp, ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal received: draining, then stopping (grace period %gs)", SHUTDOWN_GRACE_S)
    deadline = loop.time() + SHUTDOWN_GRACE_S
    await node.drain(deadline)
    await node.stop(deadline)
