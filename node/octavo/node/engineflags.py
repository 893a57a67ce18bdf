"""The engine's mode and health flags, each changed through a named method: the disk monitor sets the
read-only reason and takes the ENOSPC flag, the flusher reports its last error, tail repair clears
tail_maybe_lost, the metrics observe flush durations. Read as plain attributes (the add path reads
`read_only_reason` once per batch under the engine lock); `Storage` carries them (engine.Engine)."""

from __future__ import annotations

import errno
from collections.abc import Callable


class EngineFlags:
    def __init__(self) -> None:
        # Why adds are refused (the disk monitor sets it: disk.py); empty while the bookie is writable.
        self.read_only_reason = ""
        # An add failed with ENOSPC: the disk monitor turns the bookie read-only at its next check.
        self.disk_full_seen = False
        # True after an unclean stop across a reboot (or power loss): the unsynced tail may be gone, so "no
        # such entry" becomes UNKNOWN and fenced LAC reads say tail_maybe_lost (BookKeeper's BP-46).
        self.tail_maybe_lost = False
        self.last_flush_error = ""  # the flusher's last failure ("" after a flush round that went through)
        # Under fsync_policy=batch, a failed fdatasync of the active log (groupsync.py): no add is acknowledged
        # again until a restart, and the disk monitor keeps the bookie read-only so writers go elsewhere.
        self.sync_failed_reason = ""
        # Observability (metrics.py): called with each flush's duration in seconds, from the flusher's thread.
        self.on_flush: Callable[[float], None] | None = None
        # Called, under the engine lock, each time the active log rolls (a log queued for the flusher): wakes the
        # flusher (flusher.py), which otherwise sleeps until the active log is due to roll by age.
        self.on_roll: Callable[[], None] | None = None
        # What the process does once a sync failed for good (synclost.py): the server exits; None (tests, the
        # simulation's own handling) leaves the engine read-only with nothing flushed again.
        self.on_sync_lost: Callable[[str], None] | None = None

    def set_read_only_reason(self, reason: str) -> None:
        """Refuse adds (not recovery adds) with `reason`; "" makes the bookie writable again."""
        self.read_only_reason = reason

    def note_disk_full(self) -> None:
        """An add hit ENOSPC: refuse adds at once; the disk monitor decides at its next check when to release."""
        self.disk_full_seen = True
        self.read_only_reason = self.read_only_reason or "read-only: the disk is full (ENOSPC on an add)"

    def take_disk_full_seen(self) -> bool:
        """Whether an add hit ENOSPC since the last call (the flag is cleared)."""
        seen, self.disk_full_seen = self.disk_full_seen, False
        return seen

    def note_sync_failed(self, error: OSError) -> None:
        """A group sync failed (for good, until a restart): refuse adds at once; the disk monitor keeps the
        bookie in the read-only set from its next check. Not for the ESHUTDOWN of a close (it stops anyway)."""
        if error.errno == errno.ESHUTDOWN:
            return
        self.sync_failed_reason = self.sync_failed_reason or f"the entry log's fdatasync failed ({error}); restart " \
                                                             "the bookie"
        self.read_only_reason = self.read_only_reason or f"read-only: {self.sync_failed_reason}"

    def note_flush_sync_failed(self, reason: str) -> None:
        """The flusher's fsync of a rolled log (or of the logs directory) failed: sticky like a failed group sync
        (synclost.py): adds are refused at once and nothing is flushed again in this process."""
        self.sync_failed_reason = self.sync_failed_reason or reason
        self.read_only_reason = self.read_only_reason or f"read-only: {self.sync_failed_reason}"

    def set_flush_error(self, error: str) -> None:
        """The flusher's last round failed with `error` ("" when a round went through)."""
        self.last_flush_error = error

    def tail_repaired(self) -> None:
        """Tail repair copied back every entry this bookie may have lost: its "no such entry" is sure again."""
        self.tail_maybe_lost = False

    def observe_flushes(self, callback: Callable[[float], None] | None) -> None:
        """Call `callback` with each flush's duration in seconds (from the flusher's thread)."""
        self.on_flush = callback

    def wake_on_roll(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` (quick, no IO: it runs under the engine lock) each time a log is queued for flushing."""
        self.on_roll = callback
