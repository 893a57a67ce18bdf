"""A simulated bookie: the real storage engine on SimIO, the real data plane (BookieService) served on the
simulated network, the real registration, deletion watch, GC and compaction loop (BookieServer's own), tail
repair after an unclean restart, and the flusher's rounds driven on the loop instead of its thread.

What BookieServer.start does besides, and this leaves out: the gRPC server (the network serves the data
plane's handlers instead), health and reflection, the admin plane, TLS, telemetry. The disk monitor runs on the
simulated disk (SimDiskMonitor).

A process crash cancels every task of the bookie's node and drops its files without a sync (the page cache
survives: the next start replays the unsynced tail). A machine crash also rewrites the data directory to what
a power cut leaves (SimIO.power_loss) and gives the machine a new boot id.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
from collections.abc import Callable
from typing import Any

from octavo.node.autorecovery import AutoRecovery
from octavo.node.compaction import Compactor
from octavo.node.config import NodeConfig
from octavo.node.dataplane import BookieService, bookie_handler
from octavo.node.disk import DirUsage, DiskMonitor
from octavo.node.files import INDEX_DIR
from octavo.node.flusher import Flusher
from octavo.node.registration import Registration
from octavo.node.repair import TailRepair
from octavo.node.server import BookieServer
from octavo.node.simio import SimIO
from octavo.node.startup import BOOT_ID_ENV
from octavo.node.storage import Storage
from octavo.node.synclost import SyncLostError

log = logging.getLogger(__name__)

CLUSTER = "sim"
BOOKIE_PORT = 3181
# The settings a simulated bookie runs with, scaled to a run of seconds of virtual time: small logs that roll
# and flush often, a short registration lease, GC every few seconds, a small index map.
SIM_SETTINGS: dict[str, Any] = {
    "registration_ttl_s": 3,
    "gc_interval_ms": 2_000,
    "log_size_bytes_max": 96 * 1024,
    "batch_bytes_max": 32 * 1024,
    "read_bytes_max": 64 * 1024,
    "entry_size_bytes_max": 16 * 1024,
    "log_roll_interval_ms": 1_000,
    "log_rotate_on_close_bytes_min": 4 * 1024,
    "index_map_size_bytes": 64 * 1024 * 1024,
    "lost_bookie_delay_s": 2.0,
    "autorecovery_idle_interval_s": 5.0,
    "audit_interval_s": 2.0,
    "open_ledger_grace_s": 5.0,
    "replicas_check_interval_s": 2.0,
    "compaction_minor_interval_ms": 3_000,
    "compaction_major_interval_ms": 6_000,
    "metrics_port": -1,
    # The disk monitor (SimDiskMonitor): what the data directory holds against this capacity, checked every
    # second; read-only at 95% (or when an add hits ENOSPC), writable again below 85% (the product's marks).
    "disk_capacity_bytes": 256 * 1024 * 1024,
    "disk_check_interval_ms": 1_000,
}


class FaultyIO(SimIO):
    """SimIO with disk faults switched on and off by the run: a full disk (writes fail with ENOSPC) and a failing
    disk (writes and syncs fail with EIO). Reads keep working in both."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.full = False
        self.failing = False

    def _write_fault(self) -> None:
        if self.failing:
            raise OSError(errno.EIO, "simulated disk error")
        if self.full:
            raise OSError(errno.ENOSPC, "simulated full disk")

    def write_at_end(self, fd: int, data: bytes | memoryview) -> None:
        self._write_fault()
        super().write_at_end(fd, data)

    def write_parts(self, fd: int, parts: list[bytes] | list[bytes | memoryview], total_bytes: int) -> None:
        self._write_fault()
        super().write_parts(fd, parts, total_bytes)

    def fsync(self, fd: int) -> None:
        if self.failing:
            raise OSError(errno.EIO, "simulated disk error")
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        if self.failing:
            raise OSError(errno.EIO, "simulated disk error")
        super().fdatasync(fd)


class SimDiskMonitor(DiskMonitor):
    """The bookie's disk monitor on the simulated disk: while the run's disk_full fault lasts the disk reads as
    full (used = capacity), otherwise as what the data directory holds against disk_capacity_bytes. So a full
    disk turns the bookie read-only (at the first add that hits ENOSPC, or the next check) and it becomes
    writable again once the fault is over and the usage is below the writable mark."""

    def __init__(self, storage: Storage, io: FaultyIO) -> None:
        super().__init__(storage)
        self.io = io

    def measure(self, path: str) -> DirUsage:
        usage = super().measure(path)
        if self.io.full:
            return DirUsage(path, usage.total_bytes, usage.total_bytes, 0)
        return usage


class SimBookie:
    def __init__(self, name: str, root_dir: str, settings: dict[str, Any] | None = None) -> None:
        self.name = name
        self.address = f"{name}:{BOOKIE_PORT}"
        self.data_dir = os.path.join(root_dir, name)
        self.settings = {**SIM_SETTINGS, **(settings or {})}
        self.boot = 1
        os.makedirs(self.data_dir, exist_ok=True)
        # The machine's disk: one SimIO for as long as the machine runs (a process crash keeps what it knows
        # was synced), a new one after a power cut.
        self.io = FaultyIO(self.data_dir)
        self.server: BookieServer | None = None
        self.running = False
        self.starts = 0
        self.tasks: list[asyncio.Task[None]] = []  # the background loops started here (the node owns them all)
        # The process exits after a failed sync (synclost.py: the real one exits with EXIT_SYNC_LOST): called with
        # the reason; the fault injector crashes it and restarts it soon, as Kubernetes would.
        self.on_exit: Callable[[str], None] | None = None
        self._config: NodeConfig | None = None

    @property
    def storage(self) -> Storage | None:
        return self.server.storage if self.server is not None else None

    def config(self, etcd_address: str) -> NodeConfig:
        """The bookie's settings, validated at its first start (every restart runs with the same ones)."""
        if self._config is None or self._config.etcd != etcd_address:
            self._config = NodeConfig(data_dir=self.data_dir, etcd=etcd_address, cluster=CLUSTER,
                                      bookie_id=self.name, advertised_address=self.address, **self.settings).validate()
        return self._config

    async def start(self, network: Any, etcd_address: str) -> None:
        """Open the storage (recovery runs), check the cookie, serve, register, start the background loops.
        Runs on the bookie's node (its tasks are the bookie's)."""
        config = self.config(etcd_address)
        loop = asyncio.get_running_loop()
        os.environ[BOOT_ID_ENV] = f"{self.name}-boot-{self.boot}"
        storage = Storage.open(config, self.io, start_flusher=False, clock=loop.time)
        server = self.server = BookieServer(config)
        server.storage, server.bookie_id, server.advertised = storage, self.name, self.address
        server.disk = SimDiskMonitor(storage, self.io)
        server.disk.check()  # register in the right set from the start, as BookieServer.start does
        server.compactor = Compactor(storage)
        registration = server.registration = Registration(storage, self.name, self.address)
        try:
            await registration.check_cookie()
        except BaseException:
            storage.abandon()
            raise
        server.service = BookieService(storage, registration)
        network.serve(self.name, self.address, [bookie_handler(server.service)])
        self.running = True
        self.starts += 1
        await registration.start()
        self.tasks = [loop.create_task(self._flush_loop(storage), name="sim-flusher")]
        server._watch_task = loop.create_task(server._watch_deletions(), name="octavo-watch")
        server._space_task = loop.create_task(server._space_loop(), name="octavo-space")
        server._disk_task = loop.create_task(server._disk_loop(), name="octavo-disk")
        if config.autorecovery_enabled:
            server.autorecovery = AutoRecovery(config, self.name, registration, lambda: not storage.read_only_reason)
            self.tasks.append(loop.create_task(server.autorecovery.run(), name="octavo-autorecovery"))
        if storage.tail_maybe_lost and config.tail_repair:
            server.repair = TailRepair(storage, self.name)
            self.tasks.append(loop.create_task(server.repair.run(), name="octavo-tail-repair"))

    async def _flush_loop(self, storage: Storage) -> None:
        """The flusher thread's rounds (Flusher._run), on the loop: woken by a roll, or asleep until the active log
        is due to roll by age (Flusher.wait_s); a failed round is retried next tick, except a failed sync
        (SyncLostError), after which the process exits (on_exit)."""
        flusher = Flusher(storage)
        rolled = asyncio.Event()
        storage.wake_on_roll(rolled.set)  # the roll runs on the loop's thread too (executor calls run inline)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(flusher.wait_s()):
                    await rolled.wait()
            rolled.clear()
            try:
                flusher.step()
                storage.set_flush_error("")
            except SyncLostError as e:  # as the thread does: never retried; the process exits
                storage.set_flush_error(f"{type(e).__name__}: {e}")
                if self.on_exit is not None:
                    self.on_exit(e.message)
                return
            except Exception as e:  # as the thread does: keep flushing
                storage.set_flush_error(f"{type(e).__name__}: {e}")

    def crash_process(self) -> None:
        """The process dies: files closed without a sync (what was written stays, as in the page cache). The
        caller cancels the node's tasks and takes it off the network."""
        self.running = False
        storage = self.storage
        if storage is not None:
            with contextlib.suppress(Exception):
                storage.abandon()
        self.server = None

    def crash_machine(self, rng: random.Random) -> dict[str, str]:
        """The machine loses power: the process dies and only what was synced survives (plus a random part of
        the rest, torn); the next boot has a new boot id."""
        io = self.io
        self.crash_process()
        self.boot += 1
        report = io.power_loss(rng)
        self.io = FaultyIO(self.data_dir)
        self.io.settle((os.path.join(self.data_dir, INDEX_DIR),))
        return report
