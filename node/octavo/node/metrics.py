"""The bookie's metrics (docs/operations.md lists each with its unit and what to alert on).

The data plane counts requests, entries and bytes in plain integers (requeststats.py): an OpenTelemetry counter
call costs 3-6 us, an integer add a few ns. Observable instruments read those integers, and the storage,
disk, compaction, GC and self-healing state, when a scrape (or an OTLP export) collects. The add and read
latencies and the flush duration are histograms recorded once per request or per flushed log, never per
entry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from octavo.node.requeststats import RequestStats

if TYPE_CHECKING:
    from octavo.node.autorecovery import AutoRecovery, WorkerState
    from octavo.node.compaction import Compactor
    from octavo.node.damagerepair import DamageControl
    from octavo.node.datasetmaintenance import DatasetMaintenance
    from octavo.node.disk import DiskMonitor
    from octavo.node.etcdcompaction import EtcdCompaction
    from octavo.node.registration import Registration
    from octavo.node.storage import Storage, StorageGauges

MODES = ("writable", "read_only")
GAUGES_AGE_S_MAX = 1.0


class MetricsContext(Protocol):
    """What the bookie's metrics read of a running bookie (the bookie server implements it): each part
    is None until the bookie has started it."""

    @property
    def storage(self) -> Storage | None: ...

    @property
    def disk(self) -> DiskMonitor | None: ...

    @property
    def compactor(self) -> Compactor | None: ...

    @property
    def damage_control(self) -> DamageControl | None: ...

    @property
    def autorecovery(self) -> AutoRecovery | None: ...

    @property
    def registration(self) -> Registration | None: ...

    @property
    def gc_ledgers_dropped_total(self) -> int: ...

    @property
    def ledgers_dropped_by_watch(self) -> int: ...

    def tail_waiter_count(self) -> int: ...


def _one(value: Callable[[], float | int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    return lambda _: [Observation(value())]


def _by(values: Callable[[], dict[str, int]], key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    return lambda _: [Observation(v, {key: k}) for k, v in sorted(values().items())]


class BookieMetrics:
    """Registers every bookie instrument on `meter`, reading `node` (a started bookie)."""

    def __init__(self, node: MetricsContext, meter: Meter, stats: RequestStats) -> None:
        self.node = node
        storage = node.storage
        assert storage is not None
        self._gauges = storage.gauges()
        self._gauges_at = 0.0
        m = meter
        stats.add_latency = m.create_histogram(
            "octavo.bookie.add.latency", unit="s",
            description="time a bookie took to store one add request (all its entries), from receipt to answer")
        stats.read_latency = m.create_histogram(
            "octavo.bookie.read.latency", unit="s", description="time a bookie took to answer one read request")
        flush = m.create_histogram("octavo.bookie.flush.duration", unit="s",
                                   description="time to flush one rolled entry log (fsync, index commit, "
                                               "recovery point)")
        storage.observe_flushes(flush.record)

        counter, gauge, updown = m.create_observable_counter, m.create_observable_gauge, \
            m.create_observable_up_down_counter
        counter("octavo.bookie.add.requests", [_one(lambda: stats.add_requests)], unit="{request}",
                description="add requests answered")
        counter("octavo.bookie.add.entries", [_one(lambda: stats.add_entries)], unit="{entry}",
                description="entries stored by adds")
        counter("octavo.bookie.add.bytes", [_one(lambda: stats.add_bytes)], unit="By",
                description="payload bytes stored by adds")
        counter("octavo.bookie.add.refused", [_by(lambda: stats.add_refused, "code")], unit="{entry}",
                description="entries refused, by result code (READ_ONLY, FENCED, TOO_LARGE, ...)")
        counter("octavo.bookie.write_closes", [_one(lambda: stats.write_closes)], unit="{ledger}",
                description="advisory write-closes done (unary, or carried on the add stream)")
        counter("octavo.bookie.read.requests", [_one(lambda: stats.read_requests)], unit="{request}",
                description="read requests answered (ranges, lists and tailing reads)")
        counter("octavo.bookie.read.entries", [_one(lambda: stats.read_entries)], unit="{entry}",
                description="entries returned by reads")
        counter("octavo.bookie.read.bytes", [_one(lambda: stats.read_bytes)], unit="By",
                description="payload bytes returned by reads")
        counter("octavo.bookie.read.errors", [_by(lambda: stats.read_errors, "code")], unit="{request}",
                description="read requests answered with an error, by result code")
        counter("octavo.bookie.read.tail_requests", [_one(lambda: stats.tail_requests)], unit="{request}",
                description="tailing reads (long polls) answered")
        updown("octavo.bookie.read.tail_waiters", [_one(lambda: node.tail_waiter_count())], unit="{request}",
               description="tailing reads held now")
        counter("octavo.bookie.fences", [_one(lambda: stats.fences)], unit="{request}",
                description="fence requests (recovery opens) answered")

        gauge("octavo.bookie.mode", [self._mode], description="1 for the mode the bookie is in, 0 for the other")
        gauge("octavo.bookie.disk.usage_ratio", [self._disk_usage], unit="1",
              description="share of each data directory's filesystem (or disk_capacity_bytes) in use")
        gauge("octavo.bookie.disk.readonly_ratio", [_one(lambda: storage.config.disk_readonly_ratio)], unit="1",
              description="the disk_readonly_ratio setting: past it the bookie turns read-only")
        gauge("octavo.bookie.disk.warn_ratio", [_one(lambda: storage.config.disk_warn_ratio)], unit="1",
              description="the disk_warn_ratio setting")
        updown("octavo.bookie.entry_log.bytes", [_one(lambda: self.gauges().entry_log_bytes)], unit="By",
               description="bytes in the bookie's entry logs, flushed or not")
        updown("octavo.bookie.entry_log.count", [_one(lambda: self.gauges().entry_log_count)], unit="{log}",
               description="entry logs on disk")
        updown("octavo.bookie.recovery_point.lag", [_one(lambda: self.gauges().unflushed_bytes)], unit="By",
               description="bytes written after the recovery point: what a restart replays and a power loss "
                           "may take (the replicas hold them)")
        updown("octavo.bookie.flush.pending_logs", [_one(lambda: self.gauges().pending_flushes)], unit="{log}",
               description="rolled entry logs waiting to be flushed")
        counter("octavo.bookie.flush.logs", [_one(lambda: storage.flushes)], unit="{log}",
                description="entry logs flushed")
        updown("octavo.bookie.write_cache.entries", [_one(lambda: self.gauges().write_cache_entries)],
               unit="{entry}", description="entries in logs not flushed yet (indexed in memory)")
        updown("octavo.bookie.write_cache.bytes", [_one(lambda: self.gauges().write_cache_bytes)], unit="By",
               description="memory the write cache's index takes (an estimate)")
        gauge("octavo.bookie.write_cache.entries_max", [_one(lambda: storage.config.write_cache_entries_max)],
              unit="{entry}", description="the write_cache_entries_max setting: at it adds wait for the flusher")
        updown("octavo.bookie.ledgers", [_one(lambda: self.gauges().ledgers)], unit="{ledger}",
               description="ledgers this bookie holds entries or state of")
        updown("octavo.bookie.fenced_ledgers", [_one(lambda: self.gauges().fenced_ledgers)], unit="{ledger}",
               description="ledgers fenced on this bookie (recovered or being recovered)")
        counter("octavo.bookie.unclean_restarts", [self._unclean], unit="{restart}",
                description="starts that found the previous stop unclean (over the data directory's life)")

        counter("octavo.bookie.compaction.passes", [self._compaction_passes], unit="{pass}",
                description="compaction passes run, by kind (minor, major)")
        counter("octavo.bookie.compaction.bytes_copied", [_one(lambda: self._compactor().bytes_copied_total)],
                unit="By", description="live bytes compaction copied into compaction logs")
        counter("octavo.bookie.compaction.bytes_reclaimed",
                [_one(lambda: self._compactor().bytes_reclaimed_total)], unit="By",
                description="disk bytes compaction gave back")
        updown("octavo.bookie.compaction.running", [_one(lambda: int(self._compactor().progress is not None))],
               description="1 while a compaction pass runs")
        gauge("octavo.bookie.compaction.window_open", [self._window_open],
              description="1 while an operator's compaction window is open on this bookie")
        counter("octavo.bookie.gc.runs", [_one(lambda: storage.gc_runs)], unit="{pass}",
                description="garbage-collection passes")
        counter("octavo.bookie.gc.logs_deleted", [_one(lambda: storage.gc_logs_deleted_total)], unit="{log}",
                description="entry logs deleted by GC (nothing alive in them)")
        counter("octavo.bookie.gc.bytes_reclaimed", [_one(lambda: storage.gc_bytes_reclaimed_total)], unit="By",
                description="disk bytes GC gave back")
        counter("octavo.bookie.gc.ledgers_dropped",
                [_one(lambda: node.gc_ledgers_dropped_total + node.ledgers_dropped_by_watch)], unit="{ledger}",
                description="ledgers dropped because etcd deleted them")

        # The scrub and the repair of damaged copies (scrub.py, damagerepair.py).
        counter("octavo.bookie.scrub.passes", [_one(lambda: self._scrub().scrubber.passes)], unit="{pass}",
                description="scrub passes run (every flushed record's checksum verified)")
        counter("octavo.bookie.scrub.bytes", [_one(lambda: self._scrub().scrubber.bytes_verified)], unit="By",
                description="bytes of records the scrub read and verified")
        counter("octavo.bookie.scrub.records", [_one(lambda: self._scrub().scrubber.records_verified)],
                unit="{record}", description="records the scrub verified")
        counter("octavo.bookie.scrub.damaged", [_one(lambda: self._scrub().scrubber.damaged_records)],
                unit="{record}", description="records the scrub found damaged (checksum, truncated or missing log)")
        updown("octavo.bookie.scrub.running", [_one(lambda: int(self._scrub().scrubber.running))],
               description="1 while a scrub pass runs")
        updown("octavo.bookie.scrub.damage_open", [_one(lambda: self._repair_stat("entries_damaged"))],
               unit="{entry}", description="entries named by damage marks for this bookie that still fail here")
        counter("octavo.bookie.scrub.repaired", [_one(lambda: self._repair_stat("entries_repaired"))],
                unit="{entry}", description="damaged entries written back in place from a good replica")
        counter("octavo.bookie.scrub.refuted", [_one(lambda: self._repair_stat("entries_refuted"))],
                unit="{entry}", description="entries a damage mark named that read back good here (nothing written)")

        gauge("octavo.bookie.auditor", [self._auditor],
              description="1 on the bookie that is the cluster's auditor now (sum over bookies: 1)")
        updown("octavo.bookie.underreplicated_ledgers", [self._underreplicated], unit="{ledger}",
               description="ledgers marked under-replicated (reported by the auditor only)")
        gauge("octavo.bookie.underreplicated.oldest_age", [self._oldest_mark], unit="s",
              description="age of the oldest under-replication mark (reported by the auditor only; 0: none)")
        gauge("octavo.bookie.replicas_check.missing_entries", [self._replicas(lambda r: r.missing_entries, True)],
              unit="{entry}", description="entries the last replicas check found with a copy missing on a live "
                                          "bookie of their write set (reported by the auditor after a pass)")
        gauge("octavo.bookie.replicas_check.extra_copies", [self._replicas(lambda r: r.extra_copies, True)],
              unit="{entry}", description="copies the last replicas check found on bookies outside their "
                                          "segment's ensemble, collectable (reported by the auditor after a pass)")
        counter("octavo.bookie.replicas_check.restored", [self._replicas(lambda r: r.entries_restored, False)],
                unit="{entry}", description="missing copies this bookie's worker wrote back to a live bookie")
        counter("octavo.bookie.etcd.compactions", [self._etcd_compaction(lambda c: c.compactions)],
                unit="{compaction}", description="compactions of etcd's history this bookie made as the auditor")
        gauge("octavo.bookie.etcd.compacted_revision", [self._etcd_compaction(lambda c: c.compacted_revision)],
              description="the etcd revision this bookie last compacted etcd to (0: none yet)")
        counter("octavo.bookie.datasets.checkpoints", [self._datasets(lambda d: d.checkpoints)],
                unit="{checkpoint}", description="dataset logs this bookie folded into checkpoints as the auditor")
        counter("octavo.bookie.datasets.merges", [self._datasets(lambda d: d.merges)], unit="{ledger}",
                description="merged ledgers this bookie's dataset maintenance swapped in (each replaces a run of "
                            "small ledgers)")
        counter("octavo.bookie.datasets.ledgers_merged", [self._datasets(lambda d: d.ledgers_merged)],
                unit="{ledger}", description="small dataset ledgers replaced by merged ones")
        counter("octavo.bookie.datasets.bytes_merged", [self._datasets(lambda d: d.bytes_merged)], unit="By",
                description="payload bytes copied into merged dataset ledgers")
        counter("octavo.bookie.datasets.orphans_deleted", [self._datasets(lambda d: d.orphans_deleted)],
                unit="{ledger}", description="dataset ledgers no version needed, deleted by orphan collection")
        counter("octavo.bookie.datasets.maintenance_failures", [self._datasets(lambda d: d.failures)],
                unit="{failure}", description="datasets whose maintenance step failed (logged; retried next interval)")
        counter("octavo.bookie.replication.bytes", [self._replication(lambda w: w.bytes_copied)], unit="By",
                description="bytes this bookie's replication workers copied to new bookies")
        counter("octavo.bookie.replication.entries", [self._replication(lambda w: w.entries_copied)],
                unit="{entry}", description="entries copied by re-replication")
        counter("octavo.bookie.replication.ledgers", [self._replication(lambda w: w.ledgers_replicated)],
                unit="{ledger}", description="ledgers re-replicated")
        updown("octavo.bookie.replication.in_progress", [self._replication(lambda w: len(w.in_progress))],
               unit="{ledger}", description="ledgers being re-replicated by this bookie now")
        gauge("octavo.bookie.registered", [_one(self._registered)],
              description="1 while the bookie's registration lease in etcd is fresh")
        gauge("octavo.bookie.start_time", [_one(lambda: storage.started_unix_ms / 1000)], unit="s",
              description="when the bookie started (Unix time)")

    def fresh(self) -> None:
        """A collection starts: the next gauges() takes a new snapshot."""
        self._gauges_at = float("-inf")

    def gauges(self) -> StorageGauges:
        """The storage gauges, one snapshot shared by the callbacks of one collection (a scrape calls fresh()
        first; an OTLP export takes a snapshot at most GAUGES_AGE_S_MAX old)."""
        now = time.monotonic()
        if now - self._gauges_at > GAUGES_AGE_S_MAX:
            storage = self.node.storage
            if storage is not None:
                self._gauges = storage.gauges()
            self._gauges_at = now
        return self._gauges

    def _scrub(self) -> DamageControl:
        control = self.node.damage_control
        assert control is not None
        return control

    def _repair_stat(self, name: str) -> int:
        repair = self._scrub().repair
        return int(getattr(repair.stats, name)) if repair is not None else 0

    def _compactor(self) -> Compactor:
        compactor = self.node.compactor
        assert compactor is not None
        return compactor

    def _mode(self, _: CallbackOptions) -> Iterable[Observation]:
        disk = self.node.disk
        storage = self.node.storage
        read_only = bool((disk is not None and disk.read_only) or (storage is not None and storage.read_only_reason))
        return [Observation(int(read_only == (mode == "read_only")), {"mode": mode}) for mode in MODES]

    def _disk_usage(self, _: CallbackOptions) -> Iterable[Observation]:
        disk = self.node.disk
        return [Observation(u.ratio, {"data_dir": u.path}) for u in (disk.usages if disk else [])]

    def _unclean(self, _: CallbackOptions) -> Iterable[Observation]:
        storage = self.node.storage
        state = storage.node_state if storage is not None else None
        return [Observation(state.unclean_restart_count)] if state is not None else []

    def _compaction_passes(self, _: CallbackOptions) -> Iterable[Observation]:
        compactor = self.node.compactor
        return [Observation(n, {"kind": kind}) for kind, n in sorted(compactor.passes.items())] if compactor else []

    def _window_open(self, _: CallbackOptions) -> Iterable[Observation]:
        compactor = self.node.compactor
        if compactor is None:
            return []
        return [Observation(int(compactor.window_until_ms > time.time() * 1000))]

    def _auditor(self, _: CallbackOptions) -> Iterable[Observation]:
        recovery = self.node.autorecovery
        return [Observation(int(recovery.auditor.is_auditor))] if recovery is not None else []

    def _underreplicated(self, _: CallbackOptions) -> Iterable[Observation]:
        recovery = self.node.autorecovery
        if recovery is None or not recovery.auditor.is_auditor or recovery.auditor.underreplicated_ledgers < 0:
            return []
        return [Observation(recovery.auditor.underreplicated_ledgers)]

    def _oldest_mark(self, _: CallbackOptions) -> Iterable[Observation]:
        recovery = self.node.autorecovery
        if recovery is None or not recovery.auditor.is_auditor or recovery.auditor.underreplicated_ledgers < 0:
            return []
        oldest = recovery.auditor.oldest_mark_unix_ms
        return [Observation(max(0.0, time.time() - oldest / 1000) if oldest else 0.0)]

    def _replication(self, value: Callable[[WorkerState], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            recovery = self.node.autorecovery
            return [Observation(value(recovery.worker))] if recovery is not None else []
        return observe

    def _etcd_compaction(self, value: Callable[[EtcdCompaction], int]) -> Callable[[CallbackOptions],
                                                                               Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            recovery = self.node.autorecovery
            return [Observation(value(recovery.etcd_compaction))] if recovery is not None else []
        return observe

    def _datasets(self, value: Callable[[DatasetMaintenance], int]) -> Callable[[CallbackOptions],
                                                                           Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            recovery = self.node.autorecovery
            return [Observation(value(recovery.dataset_maintenance))] if recovery is not None else []
        return observe

    def _replicas(self, value: Callable[[Any], int], auditor_pass: bool) -> Callable[[CallbackOptions],
                                                                                  Iterable[Observation]]:
        """A figure of the replicas check (replicascheck.ReplicasState); with `auditor_pass`, only from the
        auditor once it has made a pass."""
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            recovery = self.node.autorecovery
            if recovery is None or (auditor_pass and not (recovery.auditor.is_auditor
                                                          and recovery.replicas.state.last_pass_unix_ms)):
                return []
            return [Observation(value(recovery.replicas.state))]
        return observe

    def _registered(self) -> int:
        registration = self.node.registration
        return int(registration is not None and registration.registered)
