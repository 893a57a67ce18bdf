"""One entry log on disk and the write cache of its entries while it is not yet flushed.

States: ACTIVE (appended to) -> ROLLED (full; waiting for the background flush) -> FLUSHED (fsynced, its
entries in the durable index, the recovery point past it). Only ACTIVE and ROLLED logs carry a cache.
"""

from __future__ import annotations

import os

from octavo.node.fileio import FileIO
from octavo.node.files import log_file_name
from octavo.node.record import LOG_HEADER_BYTES, encode_log_header

ACTIVE = "active"
ROLLED = "rolled"
FLUSHED = "flushed"

# A cached location packs (offset, record length) in one int: offset << 32 | length.
LOCATION_LENGTH_BITS = 32
LOCATION_LENGTH_MASK = (1 << LOCATION_LENGTH_BITS) - 1
# Rough memory cost of one cached entry (dict slot, int key, int value), for status reports only.
CACHE_ENTRY_BYTES_ESTIMATE = 120


class EntryLog:
    __slots__ = ("cache", "cache_entries", "fd", "first_write_monotonic", "log_id", "path", "size", "state")

    def __init__(self, log_id: int, path: str, fd: int, size: int, state: str) -> None:
        self.log_id = log_id
        self.path = path
        self.fd = fd
        self.size = size  # the end offset: the next record goes here
        self.state = state
        # ledger id -> entry id -> offset << 32 | record length; cleared once the log is flushed
        self.cache: dict[int, dict[int, int]] = {}
        self.cache_entries = 0
        self.first_write_monotonic = 0.0

    @classmethod
    def create(cls, io: FileIO, logs_dir: str, log_id: int) -> EntryLog:
        """A new, empty active log. Its directory entry is synced by the flusher before the recovery point
        moves past it; until then a power loss may take the file, which holds nothing durable yet."""
        path = os.path.join(logs_dir, log_file_name(log_id))
        fd = io.open_append(path, create=True)
        try:
            io.write_at_end(fd, encode_log_header(log_id))
        except OSError:
            io.close(fd)
            io.unlink(path)
            raise
        return cls(log_id, path, fd, LOG_HEADER_BYTES, ACTIVE)

    @classmethod
    def open_existing(cls, io: FileIO, logs_dir: str, log_id: int, state: str) -> EntryLog:
        path = os.path.join(logs_dir, log_file_name(log_id))
        fd = io.open_append(path, create=False)
        size = io.seek_end(fd)
        return cls(log_id, path, fd, size, state)

    def locate(self, ledger_id: int, entry_id: int) -> tuple[int, int, int] | None:
        entries = self.cache.get(ledger_id)
        if entries is None:
            return None
        loc = entries.get(entry_id)
        if loc is None:
            return None
        return self.log_id, loc >> LOCATION_LENGTH_BITS, loc & LOCATION_LENGTH_MASK
