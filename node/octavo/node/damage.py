"""Damage found on this bookie by its own checks (scrub.py, compaction.py), kept until the repair task
(damagerepair.py) publishes it as damage marks in etcd (octavo.meta.damage). No IO.
"""

from __future__ import annotations

import threading

# Damaged entries noted and not yet published, at most (beyond: dropped and counted; the next scrub finds them
# again).
FINDINGS_ENTRIES_MAX = 100_000


class DamageFindings:
    """Damaged entries found on this bookie (by its scrub, its compaction), per ledger with the first finder and
    reason, waiting to be published to etcd. Thread-safe: scrub and compaction run in executor threads."""

    def __init__(self, limit: int = FINDINGS_ENTRIES_MAX) -> None:
        self._lock = threading.Lock()
        self._found: dict[int, tuple[str, str, set[int]]] = {}
        self._count = 0
        self.limit = limit
        self.dropped = 0
        self.noted = 0

    def note(self, ledger_id: int, entry_id: int, reason: str, finder: str) -> None:
        with self._lock:
            _, _, entries = self._found.setdefault(ledger_id, (reason, finder, set()))
            if entry_id in entries:
                return
            if self._count >= self.limit:
                self.dropped += 1
                return
            entries.add(entry_id)
            self._count += 1
            self.noted += 1

    def take(self) -> dict[int, tuple[str, str, set[int]]]:
        with self._lock:
            found, self._found, self._count = self._found, {}, 0
        return found

    def give_back(self, found: dict[int, tuple[str, str, set[int]]]) -> None:
        """Publishing failed: keep them for the next pass (within the limit)."""
        for ledger_id, (reason, finder, entries) in found.items():
            for e in entries:
                self.note(ledger_id, e, reason, finder)
