"""Named fault points: places where a test can make the bookie die with SIGKILL, to test crash recovery.

Off unless the environment variable OCTAVO_FAULT_POINTS names them (comma-separated `name` or `name@N` to die
on the N-th hit). Production processes never set it; `hit()` then costs one set lookup.
"""

from __future__ import annotations

import os
import signal
import threading

FAULT_POINTS_ENV = "OCTAVO_FAULT_POINTS"

# Every point the code knows, so a test cannot name one that does not exist.
FLUSH_AFTER_LOG_SYNC = "flush.after_log_sync"
FLUSH_AFTER_INDEX_COMMIT = "flush.after_index_commit"
FLUSH_AFTER_RECOVERY_POINT = "flush.after_recovery_point"
ADD_AFTER_WRITE = "add.after_write"
FENCE_AFTER_PERSIST = "fence.after_persist"
# Compaction's phase boundaries (compaction.py): after a source log is copied (phase 1, the compaction log is
# still `.compacting`), after the copy is synced (still phase 1), after the rename that marks it complete
# (phase 2), after the index switch (phase 3), after the old logs are deleted (phase 4, before the rename).
COMPACTION_DURING_COPY = "compaction.during_copy"
COMPACTION_AFTER_COPY = "compaction.after_copy"
COMPACTION_AFTER_MARK_COMPLETE = "compaction.after_mark_complete"
COMPACTION_AFTER_INDEX_UPDATE = "compaction.after_index_update"
COMPACTION_AFTER_DELETE_SOURCES = "compaction.after_delete_sources"
COMPACTION_POINTS = (COMPACTION_DURING_COPY, COMPACTION_AFTER_COPY, COMPACTION_AFTER_MARK_COMPLETE,
                     COMPACTION_AFTER_INDEX_UPDATE, COMPACTION_AFTER_DELETE_SOURCES)
# The auditor (autorecovery.py), after each under-replication mark it writes for a lost bookie.
AUDITOR_AFTER_MARK = "auditor.after_mark"
KNOWN_POINTS = frozenset({
    FLUSH_AFTER_LOG_SYNC, FLUSH_AFTER_INDEX_COMMIT, FLUSH_AFTER_RECOVERY_POINT, ADD_AFTER_WRITE,
    FENCE_AFTER_PERSIST, *COMPACTION_POINTS, AUDITOR_AFTER_MARK,
})


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, nth = item.partition("@")
        if name not in KNOWN_POINTS:
            raise ValueError(f"unknown fault point {name!r}; known: {', '.join(sorted(KNOWN_POINTS))}")
        armed[name] = int(nth) if nth else 1
    return armed


_armed = _parse(os.environ.get(FAULT_POINTS_ENV, ""))
_hits: dict[str, int] = {}
_lock = threading.Lock()


def hit(name: str) -> None:
    """Die here with SIGKILL if this point is armed and this is the hit it waits for."""
    if not _armed or name not in _armed:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        if _hits[name] >= _armed[name]:
            os.kill(os.getpid(), signal.SIGKILL)
