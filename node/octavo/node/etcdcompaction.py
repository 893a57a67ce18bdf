"""Keeping etcd's history bounded: the auditor compacts etcd.

etcd keeps every old revision of every key until a compaction drops the history before a revision: each ledger
created, closed and deleted leaves about 1.4 KB of old revisions behind (docs/benchmarks.md, "Churn"), so a
cluster that churns ledgers fills etcd's quota (2 GiB by default) and etcd then refuses every write. Octavo
compacts it the way Kubernetes' API server compacts its own etcd: every `etcd_compaction_interval_s` the
auditor notes etcd's current revision and compacts to the revision it noted one interval before. History of at
least one interval always stays, so a watch that broke can resume where it was unless it was away that long
(then it is cancelled with the compacted revision and its owner falls back to a full scan: server.py).

The decision is pure (`note_due`, `note`, `compaction_target`: times passed in, no IO); `EtcdCompaction` is the
thin IO around it, called by the auditor when `next_due` says. Only the elected auditor compacts: a bookie that
becomes the auditor starts with an empty memory, so a new auditor compacts one interval after it took over at
the earliest. A compaction to a revision already compacted (by an earlier auditor, or etcd's own
auto-compaction) is taken as done. Octavo never defragments: that blocks the member (docs/operations.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from octavo.meta.etcd import EtcdClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Noted:
    """etcd's revision as read at `at_s` (monotonic seconds)."""

    revision: int
    at_s: float


def note_due(now_s: float, noted: tuple[Noted, ...], interval_s: float) -> bool:
    """Is it time to note etcd's revision: compaction on, and nothing noted for an interval."""
    if interval_s <= 0:
        return False
    return not noted or now_s - noted[-1].at_s >= interval_s


def note(noted: tuple[Noted, ...], new: Noted) -> tuple[Noted, ...]:
    """The notes with `new` appended, oldest first. A revision lower than one noted means etcd was replaced
    (restored from a backup, a new cluster): what was noted of the old one is forgotten."""
    if noted and new.at_s < noted[-1].at_s:
        raise ValueError(f"notes must be taken in time order: {new.at_s} after {noted[-1].at_s}")
    if noted and new.revision < noted[-1].revision:
        return (new,)
    return (*noted, new)


def compaction_target(now_s: float, noted: tuple[Noted, ...], interval_s: float) -> tuple[int, tuple[Noted, ...]]:
    """(the revision to compact to, the notes still needed after it). The target is the newest revision noted
    at least `interval_s` ago (0: none is that old yet), so every revision of the last interval stays. The notes
    kept are those newer than the target's."""
    if interval_s <= 0:
        raise ValueError(f"compaction interval must be > 0, got {interval_s}")
    old_enough = [n for n in noted if now_s - n.at_s >= interval_s]
    if not old_enough:
        return 0, noted
    target = old_enough[-1]
    kept = tuple(n for n in noted if n.at_s > target.at_s)
    if any(n.revision < target.revision for n in kept):
        raise ValueError(f"notes out of revision order: {noted}")
    return target.revision, kept


class EtcdCompaction:
    """The auditor's compaction of etcd: `tick` when `next_due` says, with the time passed in."""

    def __init__(self, interval_s: float) -> None:
        if interval_s < 0:
            raise ValueError(f"etcd_compaction_interval_s must be >= 0, got {interval_s}")
        self.interval_s = interval_s
        self.noted: tuple[Noted, ...] = ()
        self.compacted_revision = 0  # the last revision this bookie compacted to (or found compacted)
        self.compactions = 0         # compactions this bookie made (metrics: octavo.bookie.etcd.compactions)

    def next_due(self, is_auditor: bool) -> float | None:
        """When `tick` has something to do (its clock; 0.0: at once), None while the role stays as it is."""
        if not is_auditor or self.interval_s <= 0:
            return None
        return self.noted[-1].at_s + self.interval_s if self.noted else 0.0

    async def tick(self, etcd: EtcdClient, is_auditor: bool, now_s: float) -> None:
        if not is_auditor:
            self.noted = ()  # if this bookie is the auditor again, it starts over: one interval at the earliest
            return
        if not note_due(now_s, self.noted, self.interval_s):
            return
        revision = await etcd.revision()
        if revision < self.compacted_revision:
            self.compacted_revision = 0  # a replaced etcd: its history starts over
        self.noted = note(self.noted, Noted(revision, now_s))
        target, self.noted = compaction_target(now_s, self.noted, self.interval_s)
        if target == 0 or target <= self.compacted_revision:
            return
        if await etcd.compact(target):
            self.compactions += 1
            log.info("etcd compacted to revision %d (its revision %gs ago; now %d)", target, self.interval_s,
                     revision)
        else:
            log.info("etcd's history up to revision %d was compacted already (by another compactor)", target)
        self.compacted_revision = target
