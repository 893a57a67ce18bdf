"""A failed fsync of an entry log is sticky: PostgreSQL's answer to "fsyncgate", adapted (docs/durability.md).

After a writeback error Linux may drop the dirty pages and mark them clean, and it reports the error once per
open file description: a second fsync of the same log can succeed although its bytes never reached the disk.
So the first failed fsync/fdatasync of an entry log or of the logs directory (by the flusher, or a failed round
of the group sync under fsync_policy=batch) is final for this process:

1. the node state records, synced, that the tail after the recovery point may be lost (`SYNC_LOST_KEY`), so
   the next start comes up with tail_maybe_lost (honest "unknown" answers, fenced LAC reads that say so, tail
   repair from the peers) whatever the boot id says; startup.load_identity reads and clears it;
2. the recovery point never moves past that log again in this process (FlushStep refuses every later flush,
   and a close does not checkpoint: Storage.close abandons instead, leaving the running marker);
3. adds are refused (read-only, the reason naming the log and the error) and the process exits with
   `EXIT_SYNC_LOST` (crash-only, like PostgreSQL's PANIC).

Why exit rather than stay up read-only: staying up keeps the lost bytes lost until a human restarts the
bookie, and meanwhile its write cache and index still claim them. A restart by Kubernetes (or systemd) comes
at once: it replays every log after the recovery point, cuts each at its first record whose checksum fails
(the pages the kernel dropped), comes up with tail_maybe_lost and copies back from its peers what it lost.
Every acknowledged entry stays readable from its other replicas throughout, and no human is needed. If the
disk is really gone, the restart fails to start and the bookie stays down, which the self-healing treats
like any lost bookie. If the marker itself cannot be written (step 1 fails), steps 2 and 3 still happen.
"""

from __future__ import annotations

import logging
import os
import sys

from octavo.node.checkpoint import CheckpointError, read_node_state, write_node_state
from octavo.node.errors import StorageError
from octavo.node.fileio import FileIO
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

# The node state's key that says "a sync failed in the last run: the tail after the recovery point may be lost";
# its value is the reason (which log, which error).
SYNC_LOST_KEY = "sync_lost"
# The exit code of a bookie that stopped because a sync failed (`octavo node` exits with it; 1 and 2 are taken).
EXIT_SYNC_LOST = 3


class SyncLostError(StorageError):
    """A sync of an entry log (or of the logs directory) failed in this process: nothing is flushed again."""

    def __init__(self, reason: str) -> None:
        super().__init__(pb.INTERNAL, reason)


def record_sync_lost(io: FileIO, data_dir: str, reason: str) -> str:
    """Write `reason` under SYNC_LOST_KEY into the node state, durably (write, fsync, rename, fsync the
    directory). Returns "" once it is durable, else why it could not be written (the disk may be gone)."""
    try:
        state = read_node_state(io, data_dir)
        if state is None:
            return "the node state file is missing"
        if state.extra.get(SYNC_LOST_KEY) == reason:
            return ""
        state.extra[SYNC_LOST_KEY] = reason
        write_node_state(io, data_dir, state)
    except (OSError, CheckpointError) as e:
        return f"{type(e).__name__}: {e}"
    return ""


def exit_sync_lost(reason: str) -> None:
    """The process's answer to a lost sync (server.serve installs it): say why on stderr and exit at once with
    EXIT_SYNC_LOST, without a clean close (which would flush and checkpoint past the failed log)."""
    log.critical("stopping: %s", reason, extra={"event": "sync_lost"})
    for handler in logging.getLogger().handlers:
        handler.flush()
    print(f"octavo node: {reason}; exiting with code {EXIT_SYNC_LOST} so that a restart replays the entry logs "
          "after the recovery point and copies back from the peers what the disk lost", file=sys.stderr,
          flush=True)
    os._exit(EXIT_SYNC_LOST)
