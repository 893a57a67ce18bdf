"""The storage engine's status and gauges: a part of `Storage` (storage.py) in a file of its own, reading the
engine's state under its lock (what the admin plane's status and the metrics' scrapes show)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from octavo.node.checkpoint import NodeState
from octavo.node.config import NodeConfig
from octavo.node.entrylog import CACHE_ENTRY_BYTES_ESTIMATE, FLUSHED
from octavo.node.fileio import FileIO
from octavo.node.files import parse_log_file_name
from octavo.node.index import Index
from octavo.node.ledgers import LedgerTable
from octavo.node.record import LOG_HEADER_BYTES
from octavo.node.startup import RecoveryReport
from octavo.node.writecache import WriteCache


@dataclass(frozen=True)
class StorageGauges:
    entry_log_bytes: int       # every entry log and compaction log of this bookie, flushed or not
    entry_log_count: int
    unflushed_bytes: int       # bytes after the recovery point: what a restart replays, a power loss may lose
    pending_flushes: int       # rolled logs waiting for the flusher
    write_cache_entries: int
    write_cache_bytes: int     # an estimate: entries x CACHE_ENTRY_BYTES_ESTIMATE
    ledgers: int
    fenced_ledgers: int


class _Engine(Protocol):
    """What the status reads of the engine (Storage has each)."""

    _lock: threading.Lock
    _cache: WriteCache
    _table: LedgerTable
    io: FileIO
    logs_dir: str
    config: NodeConfig
    node_state: NodeState | None
    recovery: RecoveryReport
    tail_maybe_lost: bool
    last_flush_error: str
    clock: Callable[[], float]

    @property
    def index(self) -> Index: ...


class StorageStatus:
    def gauges(self: _Engine) -> StorageGauges:
        """What the metrics read at each scrape: cheap (no disk access but the index's log accounting)."""
        with self._lock:
            unflushed = self._cache.logs()
            unflushed_bytes = sum(entry_log.size for entry_log in unflushed)
            cache_entries = self._cache.entries
            rolled = len(self._cache.rolled)
        flushed = self.index.log_metas()
        states = self._table.view.values()
        return StorageGauges(
            entry_log_bytes=unflushed_bytes + sum(m.total_bytes for m in flushed.values()),
            entry_log_count=len(unflushed) + len(flushed), unflushed_bytes=unflushed_bytes,
            pending_flushes=rolled, write_cache_entries=cache_entries,
            write_cache_bytes=cache_entries * CACHE_ENTRY_BYTES_ESTIMATE, ledgers=len(states),
            fenced_ledgers=sum(1 for state in states if state.fenced))

    def active_log_age_s(self: _Engine) -> float | None:
        """How old the active log's first unflushed record is (by the engine's clock); None while it holds none
        (the flusher sleeps until the age roll is due: flusher.py)."""
        with self._lock:
            active = self._cache.active
            if active is None or active.size <= LOG_HEADER_BYTES:
                return None
            return self.clock() - active.first_write_monotonic

    def status(self: _Engine) -> dict[str, Any]:
        with self._lock:
            logs = [(entry_log.log_id, entry_log.size, entry_log.state) for entry_log in self._cache.logs()]
            active = self._cache.active
            active_id = active.log_id if active is not None else -1
            cache_entries = self._cache.entries
        live = {i for i, _, _ in logs}
        for name in self.io.listdir(self.logs_dir):
            log_id = parse_log_file_name(name)
            if log_id is not None and log_id not in live:
                try:
                    logs.append((log_id, self.io.file_size(os.path.join(self.logs_dir, name)), FLUSHED))
                except FileNotFoundError:
                    continue
        logs.sort()
        assert self.node_state is not None
        return {
            "instance_id": self.node_state.instance_id,
            "recovery_point_log_id": self._cache.recovery_point.log_id,
            "active_log_id": active_id,
            "entry_logs": logs,
            "write_cache_entries": cache_entries,
            "write_cache_entries_max": self.config.write_cache_entries_max,
            "write_cache_bytes_estimate": cache_entries * CACHE_ENTRY_BYTES_ESTIMATE,
            "ledger_count": len(self._table),
            "unclean_restart_count": self.node_state.unclean_restart_count,
            "last_unclean_restart_unix_ms": self.node_state.last_unclean_restart_unix_ms,
            "last_start_was_unclean": self.recovery.unclean,
            "tail_maybe_lost": self.tail_maybe_lost,
            "recovery": self.recovery,
            "last_flush_error": self.last_flush_error,
        }
