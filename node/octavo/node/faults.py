"""Named fault points: places where a test can make the bookie die with SIGKILL, to test crash recovery, or
(FLUSH_LOG_SYNC_FAILS) make an fsync fail with EIO, to test what a failing disk does to a real process.

Off unless the environment variable OCTAVO_FAULT_POINTS names them (comma-separated `name` or `name@N` to die
on the N-th hit). Production processes never set it; `hit()` then costs one set lookup.
"""

from __future__ import annotations

from octavo.meta.faultpoints import FaultPoints

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
# An IO point (`fail_io`): the flusher's fsync of a rolled log fails with EIO, at the N-th and every later one,
# instead of being made; the process is not killed (synclost.py says what the bookie does then).
FLUSH_LOG_SYNC_FAILS = "flush.log_sync_fails"
KNOWN_POINTS = frozenset({
    FLUSH_AFTER_LOG_SYNC, FLUSH_AFTER_INDEX_COMMIT, FLUSH_AFTER_RECOVERY_POINT, ADD_AFTER_WRITE,
    FENCE_AFTER_PERSIST, *COMPACTION_POINTS, AUDITOR_AFTER_MARK, FLUSH_LOG_SYNC_FAILS,
})


_points = FaultPoints(KNOWN_POINTS, FAULT_POINTS_ENV, "fault point")
hit = _points.hit
fail_io = _points.fail_io
