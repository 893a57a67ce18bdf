"""The recovery point (Kafka's recoveryPoint): every entry log with an id below it is fsynced and fully covered by
the synced index. It only moves forward: a point moved back would make a restart replay logs the index already
covers, and a bug that computes one must stop the flush rather than be written to disk."""

from __future__ import annotations

from dataclasses import dataclass

from octavo.node.invariants import check


@dataclass(frozen=True)
class RecoveryPoint:
    """Every entry log with an id below `log_id` is fsynced and fully covered by the synced index.

    Restart scans only logs with ids >= log_id. It advances only after the flusher has fsynced a rolled log
    and then synced the index entries that cover it, never before: otherwise a power loss could leave the
    index pointing into bytes that never reached the disk.
    """

    log_id: int


def moved_forward(current: RecoveryPoint, new: RecoveryPoint) -> RecoveryPoint:
    """`new`, checked not to be behind `current` (InvariantError otherwise)."""
    check(new.log_id >= current.log_id,
          f"the recovery point only moves forward: asked to move from log {current.log_id} back to {new.log_id}")
    return new
