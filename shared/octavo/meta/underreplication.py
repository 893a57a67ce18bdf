"""Under-replication marks in etcd: which ledgers have copies missing, and who is restoring them.

One key per ledger, `underreplicated/<ledger id>`, names the bookies whose copies are missing and when the
ledger was first marked. Whoever finds a bookie gone (the auditor, `octavo cluster recover`, a decommission)
marks every ledger with a segment on it; marking merges with an existing mark by CAS, never overwriting one.
A replication worker takes a ledger's lock, `replication-locks/<ledger id>`, created on the worker's lease
(so a worker that dies releases it when its lease expires), re-replicates the ledger, then deletes the mark,
only if nobody changed it meanwhile (a bookie added to it is still to do), and releases the lock.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass

from octavo.meta.etcd import EtcdClient, KeyValue, Txn
from octavo.meta.layout import Layout
from octavo.meta.metadata import id_pages
from octavo.meta.retry import CasRetry

MARK_CAS_ATTEMPTS_MAX = 20
# Marks made by a decommission name a bookie that is still registered (it serves reads while its copies move):
# workers must not take its registration for a sign that it came back.
DECOMMISSION_BY = "decommission"
# Marks made by a bookie that holds damaged copies it cannot repair in place (its disk is full, writes fail,
# octavo.node.damage) name that bookie while it is registered, for the same reason.
DAMAGE_BY = "damage"


@dataclass(frozen=True)
class Mark:
    ledger_id: int
    missing: tuple[str, ...]   # bookies whose copies are missing, sorted
    marked_unix_ms: int        # when the ledger was first marked
    by: str                    # who marked it first (an auditor's bookie id, "cli", ...)
    revision: int = 0          # the key's mod revision when read

    @property
    def by_decommission(self) -> bool:
        return self.by.startswith(DECOMMISSION_BY)

    @property
    def names_live_bookies(self) -> bool:
        """The bookies it names may be registered and still have to be replaced (decommission, damage)."""
        return self.by_decommission or self.by.startswith(DAMAGE_BY)

    def encode(self) -> bytes:
        return json.dumps({"ledger_id": self.ledger_id, "missing": list(self.missing),
                           "marked_unix_ms": self.marked_unix_ms, "by": self.by}, sort_keys=True).encode()

    @staticmethod
    def decode(value: bytes, revision: int) -> Mark:
        d = json.loads(value)
        return Mark(int(d["ledger_id"]), tuple(sorted(d["missing"])), int(d["marked_unix_ms"]), str(d["by"]),
                    revision)


@dataclass(frozen=True)
class Taken:
    """What taking a ledger's replication lock found."""

    locked: bool              # this worker holds the lock now
    mark: Mark | None         # the ledger's mark (None: gone, nothing to do)
    ledger: KeyValue | None   # the ledger's metadata key as read in the same transaction (None: deleted)


class UnderReplication:
    def __init__(self, etcd: EtcdClient, layout: Layout) -> None:
        self.etcd = etcd
        self.layout = layout

    async def mark(self, ledger_id: int, missing: Collection[str], by: str) -> bool:
        """Mark a ledger as missing the copies of `missing` (merged with an existing mark). True if this call
        wrote the mark, False if an existing mark already named them all."""
        key = self.layout.underreplicated_ledger(ledger_id)
        retry = CasRetry(f"ledger {ledger_id}: marking it under-replicated", MARK_CAS_ATTEMPTS_MAX)
        while True:
            current = await self.get(ledger_id)
            if current is not None and set(missing) <= set(current.missing):
                return False
            mark = Mark(ledger_id, tuple(sorted({*missing, *(current.missing if current else ())})),
                        current.marked_unix_ms if current else int(time.time() * 1000),
                        current.by if current else by)
            ok, _ = await self.etcd.txn(Txn().mod_revision_is(key, current.revision if current else 0)
                                        .put(key, mark.encode()))
            if ok:
                return True
            await retry.lost(f"another mark (read at revision {current.revision if current else 0}, naming "
                             f"{', '.join(current.missing) if current else 'nothing'})")

    async def mark_new(self, ledger_id: int, missing: Collection[str], by: str) -> bool:
        """mark(), in one etcd round trip when the ledger has no mark yet: the case of every ledger of a bookie
        just lost (the auditor marks tens of thousands); a ledger already marked is merged by mark()."""
        mark = Mark(ledger_id, tuple(sorted(set(missing))), int(time.time() * 1000), by)
        if await self.etcd.cas_put(self.layout.underreplicated_ledger(ledger_id), mark.encode(), 0):
            return True
        return await self.mark(ledger_id, missing, by)

    async def get(self, ledger_id: int) -> Mark | None:
        kv = await self.etcd.get(self.layout.underreplicated_ledger(ledger_id))
        return Mark.decode(kv.value, kv.mod_revision) if kv is not None else None

    async def marks(self) -> AsyncIterator[Mark]:
        """Every mark, in ledger-id order, read a page at a time."""
        prefix = self.layout.underreplicated
        async for page in id_pages(self.etcd, prefix, self.layout.underreplicated_ledger,
                                   lambda key: self.layout.ledger_id_under(prefix, key)):
            for kv in page:
                yield Mark.decode(kv.value, kv.mod_revision)

    async def unmark(self, mark: Mark) -> bool:
        """Delete a mark if it is still the one read (True); False if it changed (more to do) or is gone."""
        return await self.etcd.cas_delete(self.layout.underreplicated_ledger(mark.ledger_id), mark.revision)

    async def lock(self, ledger_id: int, lease_id: int, owner: str) -> bool:
        """Take the ledger's replication lock on `lease_id`; False if another worker holds it."""
        key = self.layout.replication_lock(ledger_id)
        ok, _ = await self.etcd.txn(Txn().mod_revision_is(key, 0).put(key, owner.encode(), lease=lease_id))
        return ok

    async def unlock(self, ledger_id: int) -> None:
        await self.etcd.delete(self.layout.replication_lock(ledger_id))

    async def take(self, ledger_id: int, lease_id: int, owner: str) -> Taken:
        """Take the ledger's replication lock on `lease_id` and read its mark and its metadata's key, in one
        transaction: a worker healing thousands of small ledgers pays one etcd round trip here, not four (check,
        lock, mark, metadata). Not taken (another worker holds the lock): nothing is read."""
        lock, mark = self.layout.replication_lock(ledger_id), self.layout.underreplicated_ledger(ledger_id)
        ok, resp = await self.etcd.txn(Txn().mod_revision_is(lock, 0).put(lock, owner.encode(), lease=lease_id)
                                       .get(mark).get(self.layout.ledger(ledger_id)))
        if not ok:
            return Taken(False, None, None)
        marks, ledgers = resp.responses[1].response_range.kvs, resp.responses[2].response_range.kvs
        return Taken(True, Mark.decode(marks[0].value, marks[0].mod_revision) if marks else None,
                     KeyValue(bytes(ledgers[0].key), bytes(ledgers[0].value), int(ledgers[0].mod_revision),
                              int(ledgers[0].create_revision), int(ledgers[0].lease)) if ledgers else None)

    async def finish(self, mark: Mark) -> bool:
        """Release the ledger's lock and delete its mark if it is still the one read, in one transaction.
        True if the mark was deleted; False if it changed (more to do: it stays) or is gone."""
        lock, key = self.layout.replication_lock(mark.ledger_id), self.layout.underreplicated_ledger(mark.ledger_id)
        ok, _ = await self.etcd.txn(Txn().mod_revision_is(key, mark.revision).delete(key).delete(lock)
                                    .delete_on_failure(lock))
        return ok

    async def lock_owner(self, ledger_id: int) -> str | None:
        kv = await self.etcd.get(self.layout.replication_lock(ledger_id))
        return kv.value.decode() if kv is not None else None
