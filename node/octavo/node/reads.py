"""Reads: where an entry is (the write cache, else the durable index) and its checksum-verified payload.

Reads take no engine lock. An entry is always in an unflushed log's cache or in the index (the flush commits
the index before it drops the cache), and a log compaction deletes is replaced in the index first, so a read
that finds the file gone looks the entry up again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from octavo.node.errors import StorageError, no_such_entry, no_such_ledger
from octavo.node.index import Index
from octavo.node.ledgers import LedgerTable
from octavo.node.readfds import ReadFds
from octavo.node.record import RecordFormatError, decode_record
from octavo.node.writecache import WriteCache
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)


class Reader:
    def __init__(self, cache: WriteCache, ledgers: LedgerTable, index: Callable[[], Index], read_fds: ReadFds,
                 in_doubt: Callable[[], bool]) -> None:
        self._cache = cache
        self._ledgers = ledgers
        self._index = index
        self._read_fds = read_fds
        # True when this bookie may have lost its unsynced tail (an unclean stop across a reboot): a missing
        # entry is then UNKNOWN, never NO_SUCH_ENTRY (BP-46).
        self._in_doubt = in_doubt

    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        """(log id, offset, record length), None if this bookie does not hold the entry."""
        found = self._cache.locate(ledger_id, entry_id)
        if found is not None:
            return found
        return self._index().get(ledger_id, entry_id)

    def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The payload of one entry, checksum verified. StorageError NO_SUCH_LEDGER / NO_SUCH_ENTRY / UNKNOWN /
        CORRUPT / INVALID."""
        if ledger_id < 0 or entry_id < 0:
            raise StorageError(pb.INVALID, f"ids must be non-negative, got ledger {ledger_id} entry {entry_id}")
        loc = self.locate(ledger_id, entry_id)
        if loc is None:
            if self._in_doubt():
                raise StorageError(pb.UNKNOWN, f"entry {entry_id} of ledger {ledger_id} is not here, but this "
                                               "bookie restarted after a machine crash and may have lost it")
            if ledger_id not in self._ledgers:
                raise no_such_ledger(ledger_id)
            raise no_such_entry(ledger_id, entry_id)
        log_id, offset, length = loc
        try:
            try:
                data = self.pread(log_id, length, offset)
            except FileNotFoundError:
                # Compaction deleted the log after we looked its location up; the index already points at
                # the copy (it is switched before the old log goes).
                loc = self.locate(ledger_id, entry_id)
                if loc is None or loc[0] == log_id:
                    raise
                log_id, offset, length = loc
                data = self.pread(log_id, length, offset)
            return decode_record(data, ledger_id, entry_id).payload
        except (RecordFormatError, OSError) as e:
            log.error("entry %d of ledger %d in log %d at %d: %s", entry_id, ledger_id, log_id, offset, e)
            raise StorageError(pb.CORRUPT, f"entry {entry_id} of ledger {ledger_id} is unreadable on this "
                                           f"bookie (log {log_id} offset {offset}): {e}") from e

    def read_existing(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The stored payload of an entry, None if this bookie does not hold it. Looks the location up
        directly: read_entry's UNKNOWN (a bookie in doubt after a reboot) is for readers, and must not stop
        the lost entry from being written back."""
        if self.locate(ledger_id, entry_id) is None:
            return None
        return self.read_entry(ledger_id, entry_id)

    def pread(self, log_id: int, length: int, offset: int) -> bytes:
        return self._read_fds.pread(log_id, length, offset, self._cache.unflushed_fd)
