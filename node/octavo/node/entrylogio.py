"""Entry-log files made and opened for the engine (entrylog.EntryLog tracks them in memory)."""

from __future__ import annotations

import os

from octavo.node.entrylog import ACTIVE, EntryLog, LogState
from octavo.node.fileio import FileIO
from octavo.node.files import log_file_name
from octavo.node.record import LOG_HEADER_BYTES, encode_log_header


def create_entry_log(io: FileIO, logs_dir: str, log_id: int) -> EntryLog:
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
    return EntryLog(log_id, path, fd, LOG_HEADER_BYTES, ACTIVE)


def open_entry_log(io: FileIO, logs_dir: str, log_id: int, state: LogState) -> EntryLog:
    """An existing log (startup: the logs after the recovery point), its end as it is found."""
    path = os.path.join(logs_dir, log_file_name(log_id))
    fd = io.open_append(path, create=False)
    size = io.seek_end(fd)
    return EntryLog(log_id, path, fd, size, state)
