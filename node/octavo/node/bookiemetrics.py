"""The bookie's metrics (docs/operations.md lists each with its unit and what to alert on).

The data plane counts requests, entries and bytes in plain integers (requeststats.py): an OpenTelemetry counter
call costs 3-6 us, an integer add a few ns. Observable instruments read those integers, and the storage,
disk, compaction, GC and self-healing state, when a scrape (or an OTLP export) collects. The add and read
latencies and the flush duration are histograms recorded once per request or per flushed log, never per
entry. Every instrument is a row of INSTRUMENTS (name, kind, unit, help, label, reading); BookieMetrics registers
them in one loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from octavo.node.requeststats import RequestStats

if TYPE_CHECKING:
    from octavo.node.autorecovery import AutoRecovery
    from octavo.node.compaction import Compactor
    from octavo.node.damagerepair import DamageControl
    from octavo.node.disk import DiskMonitor
    from octavo.node.registration import Registration
    from octavo.node.replicascheck import ReplicasState
    from octavo.node.scrub import Scrubber
    from octavo.node.storage import Storage, StorageGauges

MODES = ("writable", "read_only")
GAUGES_AGE_S_MAX = 1.0

COUNTER, UP_DOWN, GAUGE = "counter", "up_down_counter", "gauge"  # observable instruments, by how they change
# What a row's reading gives at a collection: one value, values by its label, or None (nothing to report).
Reading = float | int | Mapping[str, float | int] | None


@dataclass(frozen=True)
class Instrument:
    name: str
    kind: str     # COUNTER, UP_DOWN or GAUGE
    unit: str     # UCUM, as OpenTelemetry takes it ("" for a plain number)
    help: str     # the description: /metrics's HELP line
    read: Callable[[BookieMetrics], Reading]
    label: str = ""  # the label key when `read` gives values by label


# The histograms (recorded as things happen, not read at collection): name, unit, help.
ADD_LATENCY = ("octavo.bookie.add.latency", "s",
               "time a bookie took to store one add request (all its entries), from receipt to answer")
READ_LATENCY = ("octavo.bookie.read.latency", "s", "time a bookie took to answer one read request")
FLUSH_DURATION = ("octavo.bookie.flush.duration", "s",
                  "time to flush one rolled entry log (fsync, index commit, recovery point)")


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


def _recovery(m: BookieMetrics, value: Callable[[AutoRecovery], int | float]) -> int | float | None:
    """A figure of the self-healing loops (autorecovery.py); None on a bookie that runs none."""
    recovery = m.node.autorecovery
    return None if recovery is None else value(recovery)


def _auditor(m: BookieMetrics, value: Callable[[AutoRecovery], int | float]) -> int | float | None:
    """A figure only the auditor reports, once it has counted the marks."""
    recovery = m.node.autorecovery
    if recovery is None or not recovery.auditor.is_auditor or recovery.auditor.underreplicated_ledgers < 0:
        return None
    return value(recovery)


def _replicas(m: BookieMetrics, value: Callable[[ReplicasState], int], auditor_pass: bool) -> int | None:
    """A figure of the replicas check (replicascheck.ReplicasState); with `auditor_pass`, only from the auditor
    once it has made a pass."""
    recovery = m.node.autorecovery
    if recovery is None or (auditor_pass and not (recovery.auditor.is_auditor
                                                  and recovery.replicas.state.last_pass_unix_ms)):
        return None
    return value(recovery.replicas.state)


def _compaction(m: BookieMetrics, value: Callable[[Compactor], int]) -> int | None:
    compactor = m.node.compactor
    return None if compactor is None else value(compactor)


def _scrub(m: BookieMetrics, value: Callable[[Scrubber], int]) -> int | None:
    control = m.node.damage_control
    return None if control is None else value(control.scrubber)


def _repair(m: BookieMetrics, name: str) -> int | None:
    control = m.node.damage_control
    if control is None:
        return None
    return int(getattr(control.repair.stats, name)) if control.repair is not None else 0


def _mode(m: BookieMetrics) -> Mapping[str, int]:
    disk, storage = m.node.disk, m.node.storage
    read_only = bool((disk is not None and disk.read_only) or (storage is not None and storage.read_only_reason))
    return {mode: int(read_only == (mode == "read_only")) for mode in MODES}


def _window_open(m: BookieMetrics) -> int | None:
    compactor = m.node.compactor
    return None if compactor is None else int(compactor.window_until_ms > time.time() * 1000)


def _oldest_mark(recovery: AutoRecovery) -> float:
    oldest = recovery.auditor.oldest_mark_unix_ms
    return max(0.0, time.time() - oldest / 1000) if oldest else 0.0


def _unclean(m: BookieMetrics) -> int | None:
    storage = m.node.storage
    state = storage.node_state if storage is not None else None
    return state.unclean_restart_count if state is not None else None


def _registered(m: BookieMetrics) -> int:
    registration = m.node.registration
    return int(registration is not None and registration.registered)


def _sorted(values: Mapping[str, int]) -> Mapping[str, int]:
    return dict(sorted(values.items()))


INSTRUMENTS: tuple[Instrument, ...] = (
    Instrument("octavo.bookie.add.requests", COUNTER, "{request}", "add requests answered",
               lambda m: m.stats.add_requests),
    Instrument("octavo.bookie.add.entries", COUNTER, "{entry}", "entries stored by adds",
               lambda m: m.stats.add_entries),
    Instrument("octavo.bookie.add.bytes", COUNTER, "By", "payload bytes stored by adds",
               lambda m: m.stats.add_bytes),
    Instrument("octavo.bookie.add.refused", COUNTER, "{entry}",
               "entries refused, by result code (READ_ONLY, FENCED, TOO_LARGE, ...)",
               lambda m: _sorted(m.stats.add_refused), "code"),
    Instrument("octavo.bookie.write_closes", COUNTER, "{ledger}",
               "advisory write-closes done (unary, or carried on the add stream)", lambda m: m.stats.write_closes),
    Instrument("octavo.bookie.read.requests", COUNTER, "{request}",
               "read requests answered (ranges, lists and tailing reads)", lambda m: m.stats.read_requests),
    Instrument("octavo.bookie.read.entries", COUNTER, "{entry}", "entries returned by reads",
               lambda m: m.stats.read_entries),
    Instrument("octavo.bookie.read.bytes", COUNTER, "By", "payload bytes returned by reads",
               lambda m: m.stats.read_bytes),
    Instrument("octavo.bookie.read.errors", COUNTER, "{request}",
               "read requests answered with an error, by result code", lambda m: _sorted(m.stats.read_errors), "code"),
    Instrument("octavo.bookie.read.tail_requests", COUNTER, "{request}", "tailing reads (long polls) answered",
               lambda m: m.stats.tail_requests),
    Instrument("octavo.bookie.read.tail_waiters", UP_DOWN, "{request}", "tailing reads held now",
               lambda m: m.node.tail_waiter_count()),
    Instrument("octavo.bookie.fences", COUNTER, "{request}", "fence requests (recovery opens) answered",
               lambda m: m.stats.fences),

    Instrument("octavo.bookie.mode", GAUGE, "", "1 for the mode the bookie is in, 0 for the other", _mode, "mode"),
    Instrument("octavo.bookie.disk.usage_ratio", GAUGE, "1",
               "share of each data directory's filesystem (or disk_capacity_bytes) in use",
               lambda m: {u.path: u.ratio for u in (m.node.disk.usages if m.node.disk else [])}, "data_dir"),
    Instrument("octavo.bookie.disk.readonly_ratio", GAUGE, "1",
               "the disk_readonly_ratio setting: past it the bookie turns read-only",
               lambda m: m.storage.config.disk_readonly_ratio),
    Instrument("octavo.bookie.disk.warn_ratio", GAUGE, "1", "the disk_warn_ratio setting",
               lambda m: m.storage.config.disk_warn_ratio),
    Instrument("octavo.bookie.entry_log.bytes", UP_DOWN, "By", "bytes in the bookie's entry logs, flushed or not",
               lambda m: m.gauges().entry_log_bytes),
    Instrument("octavo.bookie.entry_log.count", UP_DOWN, "{log}", "entry logs on disk",
               lambda m: m.gauges().entry_log_count),
    Instrument("octavo.bookie.recovery_point.lag", UP_DOWN, "By",
               "bytes written after the recovery point: what a restart replays and a power loss may take (the "
               "replicas hold them)", lambda m: m.gauges().unflushed_bytes),
    Instrument("octavo.bookie.flush.pending_logs", UP_DOWN, "{log}", "rolled entry logs waiting to be flushed",
               lambda m: m.gauges().pending_flushes),
    Instrument("octavo.bookie.flush.logs", COUNTER, "{log}", "entry logs flushed", lambda m: m.storage.flushes),
    Instrument("octavo.bookie.write_cache.entries", UP_DOWN, "{entry}",
               "entries in logs not flushed yet (indexed in memory)", lambda m: m.gauges().write_cache_entries),
    Instrument("octavo.bookie.write_cache.bytes", UP_DOWN, "By", "memory the write cache's index takes (an estimate)",
               lambda m: m.gauges().write_cache_bytes),
    Instrument("octavo.bookie.write_cache.entries_max", GAUGE, "{entry}",
               "the write_cache_entries_max setting: at it adds wait for the flusher",
               lambda m: m.storage.config.write_cache_entries_max),
    Instrument("octavo.bookie.ledgers", UP_DOWN, "{ledger}", "ledgers this bookie holds entries or state of",
               lambda m: m.gauges().ledgers),
    Instrument("octavo.bookie.fenced_ledgers", UP_DOWN, "{ledger}",
               "ledgers fenced on this bookie (recovered or being recovered)", lambda m: m.gauges().fenced_ledgers),
    Instrument("octavo.bookie.unclean_restarts", COUNTER, "{restart}",
               "starts that found the previous stop unclean (over the data directory's life)", _unclean),

    Instrument("octavo.bookie.compaction.passes", COUNTER, "{pass}", "compaction passes run, by kind (minor, major)",
               lambda m: _sorted(m.node.compactor.passes) if m.node.compactor else {}, "kind"),
    Instrument("octavo.bookie.compaction.bytes_copied", COUNTER, "By",
               "live bytes compaction copied into compaction logs",
               lambda m: _compaction(m, lambda c: c.bytes_copied_total)),
    Instrument("octavo.bookie.compaction.bytes_reclaimed", COUNTER, "By", "disk bytes compaction gave back",
               lambda m: _compaction(m, lambda c: c.bytes_reclaimed_total)),
    Instrument("octavo.bookie.compaction.running", UP_DOWN, "", "1 while a compaction pass runs",
               lambda m: _compaction(m, lambda c: int(c.progress is not None))),
    Instrument("octavo.bookie.compaction.window_open", GAUGE, "",
               "1 while an operator's compaction window is open on this bookie", _window_open),
    Instrument("octavo.bookie.gc.runs", COUNTER, "{pass}", "garbage-collection passes", lambda m: m.storage.gc_runs),
    Instrument("octavo.bookie.gc.logs_deleted", COUNTER, "{log}", "entry logs deleted by GC (nothing alive in them)",
               lambda m: m.storage.gc_logs_deleted_total),
    Instrument("octavo.bookie.gc.bytes_reclaimed", COUNTER, "By", "disk bytes GC gave back",
               lambda m: m.storage.gc_bytes_reclaimed_total),
    Instrument("octavo.bookie.gc.ledgers_dropped", COUNTER, "{ledger}", "ledgers dropped because etcd deleted them",
               lambda m: m.node.gc_ledgers_dropped_total + m.node.ledgers_dropped_by_watch),

    # The scrub and the repair of damaged copies (scrub.py, damagerepair.py).
    Instrument("octavo.bookie.scrub.passes", COUNTER, "{pass}",
               "scrub passes run (every flushed record's checksum verified)", lambda m: _scrub(m, lambda s: s.passes)),
    Instrument("octavo.bookie.scrub.bytes", COUNTER, "By", "bytes of records the scrub read and verified",
               lambda m: _scrub(m, lambda s: s.bytes_verified)),
    Instrument("octavo.bookie.scrub.records", COUNTER, "{record}", "records the scrub verified",
               lambda m: _scrub(m, lambda s: s.records_verified)),
    Instrument("octavo.bookie.scrub.damaged", COUNTER, "{record}",
               "records the scrub found damaged (checksum, truncated or missing log)",
               lambda m: _scrub(m, lambda s: s.damaged_records)),
    Instrument("octavo.bookie.scrub.running", UP_DOWN, "", "1 while a scrub pass runs",
               lambda m: _scrub(m, lambda s: int(s.running))),
    Instrument("octavo.bookie.scrub.damage_open", UP_DOWN, "{entry}",
               "entries named by damage marks for this bookie that still fail here",
               lambda m: _repair(m, "entries_damaged")),
    Instrument("octavo.bookie.scrub.repaired", COUNTER, "{entry}",
               "damaged entries written back in place from a good replica", lambda m: _repair(m, "entries_repaired")),
    Instrument("octavo.bookie.scrub.refuted", COUNTER, "{entry}",
               "entries a damage mark named that read back good here (nothing written)",
               lambda m: _repair(m, "entries_refuted")),

    Instrument("octavo.bookie.auditor", GAUGE, "", "1 on the bookie that is the cluster's auditor now (sum over "
               "bookies: 1)", lambda m: _recovery(m, lambda r: int(r.auditor.is_auditor))),
    Instrument("octavo.bookie.underreplicated_ledgers", UP_DOWN, "{ledger}",
               "ledgers marked under-replicated (reported by the auditor only)",
               lambda m: _auditor(m, lambda r: r.auditor.underreplicated_ledgers)),
    Instrument("octavo.bookie.underreplicated.oldest_age", GAUGE, "s",
               "age of the oldest under-replication mark (reported by the auditor only; 0: none)",
               lambda m: _auditor(m, _oldest_mark)),
    Instrument("octavo.bookie.replicas_check.missing_entries", GAUGE, "{entry}",
               "entries the last replicas check found with a copy missing on a live bookie of their write set "
               "(reported by the auditor after a pass)", lambda m: _replicas(m, lambda r: r.missing_entries, True)),
    Instrument("octavo.bookie.replicas_check.extra_copies", GAUGE, "{entry}",
               "copies the last replicas check found on bookies outside their segment's ensemble, collectable "
               "(reported by the auditor after a pass)", lambda m: _replicas(m, lambda r: r.extra_copies, True)),
    Instrument("octavo.bookie.replicas_check.restored", COUNTER, "{entry}",
               "missing copies this bookie's worker wrote back to a live bookie",
               lambda m: _replicas(m, lambda r: r.entries_restored, False)),
    Instrument("octavo.bookie.etcd.compactions", COUNTER, "{compaction}",
               "compactions of etcd's history this bookie made as the auditor",
               lambda m: _recovery(m, lambda r: r.etcd_compaction.compactions)),
    Instrument("octavo.bookie.etcd.compacted_revision", GAUGE, "",
               "the etcd revision this bookie last compacted etcd to (0: none yet)",
               lambda m: _recovery(m, lambda r: r.etcd_compaction.compacted_revision)),
    Instrument("octavo.bookie.datasets.checkpoints", COUNTER, "{checkpoint}",
               "dataset logs this bookie folded into checkpoints as the auditor",
               lambda m: _recovery(m, lambda r: r.dataset_maintenance.checkpoints)),
    Instrument("octavo.bookie.datasets.merges", COUNTER, "{ledger}",
               "merged ledgers this bookie's dataset maintenance swapped in (each replaces a run of small ledgers)",
               lambda m: _recovery(m, lambda r: r.dataset_maintenance.merges)),
    Instrument("octavo.bookie.datasets.ledgers_merged", COUNTER, "{ledger}",
               "small dataset ledgers replaced by merged ones",
               lambda m: _recovery(m, lambda r: r.dataset_maintenance.ledgers_merged)),
    Instrument("octavo.bookie.datasets.bytes_merged", COUNTER, "By", "payload bytes copied into merged dataset ledgers",
               lambda m: _recovery(m, lambda r: r.dataset_maintenance.bytes_merged)),
    Instrument("octavo.bookie.datasets.orphans_deleted", COUNTER, "{ledger}",
               "dataset ledgers no version needed, deleted by orphan collection",
               lambda m: _recovery(m, lambda r: r.dataset_maintenance.orphans_deleted)),
    Instrument("octavo.bookie.datasets.maintenance_failures", COUNTER, "{failure}",
               "datasets whose maintenance step failed (logged; retried next interval)",
               lambda m: _recovery(m, lambda r: r.dataset_maintenance.failures)),
    Instrument("octavo.bookie.replication.bytes", COUNTER, "By",
               "bytes this bookie's replication workers copied to new bookies",
               lambda m: _recovery(m, lambda r: r.worker.bytes_copied)),
    Instrument("octavo.bookie.replication.entries", COUNTER, "{entry}", "entries copied by re-replication",
               lambda m: _recovery(m, lambda r: r.worker.entries_copied)),
    Instrument("octavo.bookie.replication.ledgers", COUNTER, "{ledger}", "ledgers re-replicated",
               lambda m: _recovery(m, lambda r: r.worker.ledgers_replicated)),
    Instrument("octavo.bookie.replication.in_progress", UP_DOWN, "{ledger}",
               "ledgers being re-replicated by this bookie now",
               lambda m: _recovery(m, lambda r: len(r.worker.in_progress))),
    Instrument("octavo.bookie.registered", GAUGE, "", "1 while the bookie's registration lease in etcd is fresh",
               _registered),
    Instrument("octavo.bookie.start_time", GAUGE, "s", "when the bookie started (Unix time)",
               lambda m: m.storage.started_unix_ms / 1000),
)


def _observe(instrument: Instrument, metrics: BookieMetrics) -> Callable[[CallbackOptions], Iterable[Observation]]:
    """The callback for one row: its reading as observations (none for None; one per label value)."""
    read, label = instrument.read, instrument.label

    def observe(_: CallbackOptions) -> Iterable[Observation]:
        reading = read(metrics)
        if reading is None:
            return []
        if isinstance(reading, Mapping):
            return [Observation(v, {label: k}) for k, v in reading.items()]
        return [Observation(reading)]
    return observe


class BookieMetrics:
    """Registers every bookie instrument on `meter` (INSTRUMENTS and the histograms), reading `node` (a started
    bookie) and `stats` (the data plane's counts)."""

    node: MetricsContext
    stats: RequestStats
    storage: Storage

    def __init__(self, node: MetricsContext, meter: Meter, stats: RequestStats) -> None:
        self.node = node
        self.stats = stats
        storage = node.storage
        if storage is None:
            raise ValueError("the bookie's metrics need its storage opened first")
        self.storage = storage
        self._gauges = storage.gauges()
        self._gauges_at = 0.0
        stats.add_latency, stats.read_latency, flush = (
            meter.create_histogram(name, unit=unit, description=help_)
            for name, unit, help_ in (ADD_LATENCY, READ_LATENCY, FLUSH_DURATION))
        storage.observe_flushes(flush.record)
        create = {COUNTER: meter.create_observable_counter, UP_DOWN: meter.create_observable_up_down_counter,
                  GAUGE: meter.create_observable_gauge}
        for instrument in INSTRUMENTS:
            create[instrument.kind](instrument.name, [_observe(instrument, self)], unit=instrument.unit,
                                    description=instrument.help)

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
