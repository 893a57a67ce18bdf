"""Reads: where an entry is (the write cache, else the durable index) and its checksum-verified payload.

Reads take no engine lock. An entry is always in an unflushed log's cache or in the index (the flush commits
the index before it drops the cache), and a log compaction deletes is replaced in the index first, so a read
that finds the file gone looks the entry up again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import crc32c

from octavo.node.entrylog import LOCATION_LENGTH_BITS, LOCATION_LENGTH_MASK
from octavo.node.errors import StorageError, no_such_entry, no_such_ledger
from octavo.node.index import Index
from octavo.node.ledgers import LedgerTable
from octavo.node.readfds import ReadFds
from octavo.node.record import RECORD_HEADER, RECORD_HEADER_BYTES, RecordFormatError, decode_record
from octavo.node.writecache import WriteCache
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

# One pread covers the records of a run that lie back to back in one log, up to this many bytes.
READ_RUN_BYTES_MAX = 4 * 1024 * 1024

# (entry id, code, payload, message): what read_many returns per entry; payload is empty unless code is OK.
ReadItem = tuple[int, int, "bytes | memoryview", str]


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
        # Told of every record a read answered CORRUPT (ledger id, entry id, message): the bookie notes it as
        # damage to repair (damagerepair.py). Checks of its own (verify, scrub) do not go through here.
        self.on_corrupt: Callable[[int, int, str], None] | None = None

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

    def read_many(self, ledger_id: int, ids: Iterable[int], max_entries: int, max_bytes: int,
                  stop_on_failure: bool, skip_missing: bool = False) -> list[ReadItem]:
        """Many entries of one ledger, checksum verified, with little Python per entry: every location looked
        up first (the write cache's dicts, then one index transaction for the rest), records that lie back to
        back in a log read with one pread per run, each record checked in place and its payload handed on as a
        view of the run. At most max_entries entries and max_bytes of payload (always at least one entry).

        A failed entry (missing, in doubt, corrupt) is listed with its code; stop_on_failure ends the answer
        there (a range read), otherwise the others are still read. skip_missing leaves entries this bookie does
        not hold out of the answer instead (a tailing read of a striped ledger)."""
        if ledger_id < 0:
            raise StorageError(pb.INVALID, f"ids must be non-negative, got ledger {ledger_id}")
        wanted: list[int] = []
        found: dict[int, tuple[int, int, int]] = {}
        logs = self._cache.logs()[::-1]  # newest first: a resent entry's newest copy wins
        caches: list[tuple[int, dict[int, int]]] = []
        for entry_log in logs:
            located = entry_log.cache.get(ledger_id)
            if located:
                caches.append((entry_log.log_id, located))
        for entry_id in ids:
            if entry_id < 0:
                raise StorageError(pb.INVALID, f"ids must be non-negative, got entry {entry_id}")
            wanted.append(entry_id)
            for log_id, located in caches:
                packed = located.get(entry_id)
                if packed is not None:
                    found[entry_id] = (log_id, packed >> LOCATION_LENGTH_BITS, packed & LOCATION_LENGTH_MASK)
                    break
            if len(wanted) >= max_entries:
                break
        rest = [e for e in wanted if e not in found]
        if rest:
            for entry_id, loc in zip(rest, self._index().get_many([(ledger_id, e) for e in rest]), strict=True):
                if loc is not None:
                    found[entry_id] = loc
        # Plan: the entries to answer, cut by the byte limit before anything is read.
        plan: list[tuple[int, tuple[int, int, int] | None]] = []
        size = 0
        for entry_id in wanted:
            loc = found.get(entry_id)
            if loc is None:
                if skip_missing:
                    continue
                plan.append((entry_id, None))
                if stop_on_failure:
                    break
                continue
            payload_bytes = loc[2] - RECORD_HEADER_BYTES
            if plan and size + payload_bytes > max_bytes:
                break
            size += payload_bytes
            plan.append((entry_id, loc))
        out: list[ReadItem] = []
        any_failed = False
        i = 0
        while i < len(plan):
            entry_id, loc = plan[i]
            if loc is None:
                out.append(self._missing_item(ledger_id, entry_id))
                i += 1
                if stop_on_failure:
                    break
                continue
            # A run: the following entries whose records follow this one's in the same log.
            log_id, start, length = loc
            end = start + length
            j = i + 1
            while j < len(plan):
                nxt = plan[j][1]
                if nxt is None or nxt[0] != log_id or nxt[1] != end or end - start + nxt[2] > READ_RUN_BYTES_MAX:
                    break
                end += nxt[2]
                j += 1
            failed = self._read_run(ledger_id, plan[i:j], log_id, start, end, out, stop_on_failure)
            i = j
            if failed:
                any_failed = True
                if stop_on_failure:
                    break
        if any_failed and self.on_corrupt is not None:  # only answers with a failed record pay for this
            for entry_id, code, _, message in out:
                if code == pb.CORRUPT:
                    self.on_corrupt(ledger_id, entry_id, message)
        return out

    def _missing_item(self, ledger_id: int, entry_id: int) -> ReadItem:
        if self._in_doubt():
            return (entry_id, pb.UNKNOWN, b"", f"entry {entry_id} of ledger {ledger_id} is not here, but this "
                                               "bookie restarted after a machine crash and may have lost it")
        if ledger_id not in self._ledgers:
            return (entry_id, pb.NO_SUCH_LEDGER, b"", f"ledger {ledger_id} is not known to this bookie")
        return (entry_id, pb.NO_SUCH_ENTRY, b"", f"entry {entry_id} of ledger {ledger_id} is not stored on this bookie")

    def _read_run(self, ledger_id: int, run: list[tuple[int, tuple[int, int, int] | None]], log_id: int,
                  start: int, end: int, out: list[ReadItem], stop_on_failure: bool) -> bool:
        """Read one run of back-to-back records and append its entries to `out`; True if one failed (with
        stop_on_failure the run's entries after it are left out, otherwise each is checked on its own)."""
        try:
            data = self.pread(log_id, end - start, start)
        except OSError:
            data = b""  # the log went (compaction) or the read failed: each entry is read on its own below
        if len(data) != end - start:
            failed = False
            for entry_id, _ in run:
                try:
                    out.append((entry_id, pb.OK, self.read_entry(ledger_id, entry_id), ""))
                except StorageError as e:
                    out.append((entry_id, e.code, b"", e.message))
                    failed = True
                    if stop_on_failure:
                        break
            return failed
        view = memoryview(data)
        unpack = RECORD_HEADER.unpack_from
        crc = crc32c.crc32c
        failed = False
        pos = 0
        for entry_id, loc in run:
            length = loc[2]  # type: ignore[index]
            record_crc, body_len, rec_ledger, rec_entry = unpack(view, pos)
            if (body_len + 8 != length or rec_ledger != ledger_id or rec_entry != entry_id
                    or crc(view[pos + 8:pos + length], crc(view[pos + 4:pos + 8])) != record_crc):
                log.error("entry %d of ledger %d in log %d at %d: bad record", entry_id, ledger_id, log_id,
                          start + pos)
                out.append((entry_id, pb.CORRUPT, b"", f"entry {entry_id} of ledger {ledger_id} is unreadable on "
                                                       f"this bookie (log {log_id} offset {start + pos})"))
                failed = True
                if stop_on_failure:
                    break
            else:
                out.append((entry_id, pb.OK, view[pos + RECORD_HEADER_BYTES:pos + length], ""))
            pos += length
        return failed

    def read_existing(self, ledger_id: int, entry_id: int) -> bytes | None:
        """The stored payload of an entry, None if this bookie does not hold it. Looks the location up
        directly: read_entry's UNKNOWN (a bookie in doubt after a reboot) is for readers, and must not stop
        the lost entry from being written back."""
        if self.locate(ledger_id, entry_id) is None:
            return None
        return self.read_entry(ledger_id, entry_id)

    def pread(self, log_id: int, length: int, offset: int) -> bytes:
        return self._read_fds.pread(log_id, length, offset, self._cache.unflushed_fd)
