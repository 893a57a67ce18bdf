"""Keeping datasets small to read and cheap to commit: the auditor maintains them (docs/spark.md).

A streaming query commits small ledgers all day, and every commit adds a record to its dataset's log in etcd.
Nobody is there to run `octavo dataset compact`, and the sink's writers live for one commit in a short-lived
Spark task, so the elected auditor does it, as it compacts etcd (etcdcompaction.py):

- every `dataset_maintenance_interval_s`, for each dataset: fold its log into a checkpoint once it holds
  CHECKPOINT_EVERY_COMMITS records (`DatasetStore.checkpoint`), then merge its runs of small ledgers into
  ledgers of `dataset_merge_target_bytes` (octavo.client.datasetmerge), copying at most
  `dataset_merge_budget_bytes` per interval over all datasets (what is left waits for the next interval, which
  starts its merges at the first dataset this one's budget did not reach: `merge_order`);
- every `dataset_orphan_interval_s`: delete the ledgers written for datasets that no version needs any more and
  that are older than `dataset_orphan_grace_s` (`collect_all_orphans`: one pass over the cluster's ledgers).

The decisions are pure (`due`, `budget_left`: times passed in, no IO); `DatasetMaintenance` is the thin IO around
them, called by the auditor when `next_due` says. The datasets and the merge come in as parameters (`DatasetPort`,
`Merge`), so this module needs nothing of the client library. One dataset's failure is logged in one bounded
line and the others go on. A bookie that becomes the auditor starts its clocks at once (a new auditor maintains
at its first tick: the work is idempotent, and a merge or checkpoint racing a former auditor's loses cleanly).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from octavo.meta.errors import MetadataUnavailableError

log = logging.getLogger(__name__)

# A failed dataset's error is logged cut to this many characters (one line, bounded).
ERROR_TEXT_CHARS_MAX = 300


class DatasetPort(Protocol):
    """What the maintenance needs of octavo.client.dataset.DatasetStore."""

    async def names(self) -> list[str]: ...

    async def checkpoint(self, name: str) -> int | None: ...

    async def collect_all_orphans(self, grace_s: float) -> dict[str, list[int]]: ...


class MergeOutcome(Protocol):
    merges: int
    ledgers_merged: int
    bytes_merged: int


# merge(dataset, target_bytes, budget_bytes): octavo.client.datasetmerge.merge_dataset with a client bound.
Merge = Callable[[str, int, int], Awaitable[MergeOutcome]]


def due(now_s: float, last_s: float | None, interval_s: float) -> bool:
    """Is a step with this interval due: on (interval > 0), and never run or run an interval ago."""
    if interval_s <= 0:
        return False
    return last_s is None or now_s - last_s >= interval_s


def budget_left(budget_bytes: int, spent_bytes: int) -> int:
    """Bytes the merges of this interval may still copy (never negative)."""
    if budget_bytes < 0 or spent_bytes < 0:
        raise ValueError(f"budget and spent bytes must be >= 0, got {budget_bytes} and {spent_bytes}")
    return max(0, budget_bytes - spent_bytes)


def merge_order(names: list[str], resume_from: str | None) -> list[str]:
    """The datasets in the order the merges of an interval take them: from `resume_from` (the first one the last
    interval's budget did not reach) round to the one before it, so a budget that runs out every interval
    still reaches every dataset in turn instead of spending itself on the first names for ever."""
    ordered = sorted(names)
    if resume_from is None:
        return ordered
    start = next((i for i, name in enumerate(ordered) if name >= resume_from), 0)
    return ordered[start:] + ordered[:start]


@dataclass
class DatasetMaintenanceSettings:
    interval_s: float
    merge_target_bytes: int
    merge_budget_bytes: int
    orphan_interval_s: float
    orphan_grace_s: float


class DatasetMaintenance:
    """The auditor's dataset maintenance: `tick` when `next_due` says, with the time passed in. The counters
    are this bookie's (metrics: octavo.bookie.datasets.*)."""

    def __init__(self, settings: DatasetMaintenanceSettings) -> None:
        if settings.interval_s < 0 or settings.orphan_interval_s < 0:
            raise ValueError(f"dataset maintenance intervals must be >= 0, got {settings}")
        self.settings = settings
        self.last_maintenance_s: float | None = None
        self.last_orphans_s: float | None = None
        self.checkpoints = 0
        self.merges = 0
        self.ledgers_merged = 0
        self.bytes_merged = 0
        self.orphans_deleted = 0
        self.failures = 0
        # The first dataset the last interval's merge budget did not reach: the next interval starts there.
        self.merge_resume_from: str | None = None

    def next_due(self, is_auditor: bool) -> float | None:
        """When `tick` has something to do (its clock; 0.0: at once), None while the role stays as it is."""
        if not is_auditor:
            return None
        s = self.settings
        steps = ((self.last_maintenance_s, s.interval_s), (self.last_orphans_s, s.orphan_interval_s))
        times = [0.0 if last is None else last + interval for last, interval in steps if interval > 0]
        return min(times, default=None)

    async def tick(self, datasets: DatasetPort, merge: Merge, is_auditor: bool, now_s: float) -> None:
        if not is_auditor:
            self.last_maintenance_s = self.last_orphans_s = None
            return
        s = self.settings
        if due(now_s, self.last_maintenance_s, s.interval_s):
            self.last_maintenance_s = now_s
            await self._maintain(datasets, merge)
        if due(now_s, self.last_orphans_s, s.orphan_interval_s):
            self.last_orphans_s = now_s
            deleted = await datasets.collect_all_orphans(s.orphan_grace_s)
            self.orphans_deleted += sum(len(ids) for ids in deleted.values())

    async def _maintain(self, datasets: DatasetPort, merge: Merge) -> None:
        spent = 0
        unreached: str | None = None
        for name in merge_order(await datasets.names(), self.merge_resume_from):
            try:
                if await datasets.checkpoint(name) is not None:
                    self.checkpoints += 1
                left = budget_left(self.settings.merge_budget_bytes, spent)
                if left <= 0:
                    unreached = unreached or name
                    continue
                outcome = await merge(name, self.settings.merge_target_bytes, left)
                spent += outcome.bytes_merged
                self.merges += outcome.merges
                self.ledgers_merged += outcome.ledgers_merged
                self.bytes_merged += outcome.bytes_merged
            except MetadataUnavailableError:
                raise  # etcd is away: the auditor's loop waits for it, the other datasets would fail the same way
            except Exception as e:  # one dataset's trouble must not stop the others'
                self.failures += 1
                text = " ".join(f"{type(e).__name__}: {e}".split())[:ERROR_TEXT_CHARS_MAX]
                log.warning("dataset maintenance of %s failed (next try in %gs): %s", name, self.settings.interval_s,
                            text)
        self.merge_resume_from = unreached
