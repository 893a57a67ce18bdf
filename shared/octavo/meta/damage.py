"""Damage marks in etcd: entries whose copy on one bookie fails its checksum or is gone (bit rot, a truncated
log), and who found them.

One key per (ledger, bookie), `damage/<ledger id>/<bookie id>`, holds the damaged entries as inclusive ranges,
the reason, who found them first and when. Finders (a reader that got CORRUPT from one replica while another
gave the entry, a bookie's scrub, compaction) merge their entries into the mark by CAS. The mark stays until
the damaged bookie itself has checked every entry in it: a damaged one is repaired in place from a good replica
and read back; one that reads back good (repaired already, or never damaged: a report proves nothing, tenants
can write to etcd) is dropped from the mark. Marks name live bookies by design, so nothing drops them because
the bookie is registered.

Ranges are kept bounded (DAMAGE_RANGES_MAX): past it the closest ranges are joined, which may name good
entries too; the bookie's check drops those.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from octavo.meta.etcd import EtcdClient, Txn
from octavo.meta.layout import Layout
from octavo.meta.retry import CasRetry

DAMAGE_CAS_ATTEMPTS_MAX = 20
# Ranges one mark holds at most; a reason at most this many characters.
DAMAGE_RANGES_MAX = 1000
DAMAGE_REASON_CHARS_MAX = 500

Ranges = tuple[tuple[int, int], ...]


def to_ranges(entries: Iterable[int], limit: int = DAMAGE_RANGES_MAX) -> Ranges:
    """Entry ids as sorted, disjoint, inclusive [first, last] ranges, at most `limit` of them (the closest
    neighbours joined first when there are more)."""
    out: list[list[int]] = []
    for e in sorted(set(entries)):
        if e < 0:
            raise ValueError(f"entry ids must be non-negative, got {e}")
        if out and e == out[-1][1] + 1:
            out[-1][1] = e
        else:
            out.append([e, e])
    while len(out) > limit:
        k = min(range(len(out) - 1), key=lambda i: out[i + 1][0] - out[i][1])
        out[k][1] = out[k + 1][1]
        del out[k + 1]
    return tuple((a, b) for a, b in out)


def entries_of(ranges: Ranges) -> list[int]:
    return [e for first, last in ranges for e in range(first, last + 1)]


def count_of(ranges: Ranges) -> int:
    return sum(last - first + 1 for first, last in ranges)


@dataclass(frozen=True)
class DamageMark:
    ledger_id: int
    bookie_id: str
    ranges: Ranges          # damaged entries, inclusive ranges
    reason: str             # what the first finder saw
    found_by: str           # who found it first ("reader", "scrub <bookie>", "compaction <bookie>", ...)
    marked_unix_ms: int     # when it was first marked
    revision: int = 0       # the key's mod revision when read

    @property
    def entries(self) -> int:
        return count_of(self.ranges)

    def encode(self) -> bytes:
        return json.dumps({"ledger_id": self.ledger_id, "bookie_id": self.bookie_id,
                           "ranges": [list(r) for r in self.ranges], "reason": self.reason,
                           "found_by": self.found_by, "marked_unix_ms": self.marked_unix_ms}, sort_keys=True).encode()

    @staticmethod
    def decode(value: bytes, revision: int) -> DamageMark:
        d = json.loads(value)
        return DamageMark(int(d["ledger_id"]), str(d["bookie_id"]),
                          to_ranges(e for first, last in d["ranges"] for e in range(int(first), int(last) + 1)),
                          str(d.get("reason", "")), str(d.get("found_by", "")), int(d.get("marked_unix_ms", 0)),
                          revision)

    def describe(self) -> str:
        shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in self.ranges[:5])
        more = f" (+{len(self.ranges) - 5} ranges)" if len(self.ranges) > 5 else ""
        return (f"ledger {self.ledger_id} on {self.bookie_id}: {self.entries} entries damaged [{shown}{more}], "
                f"{self.reason} (found by {self.found_by})")


class Damage:
    """The damage marks of one cluster."""

    def __init__(self, etcd: EtcdClient, layout: Layout) -> None:
        self.etcd = etcd
        self.layout = layout

    async def report(self, ledger_id: int, bookie_id: str, entries: Iterable[int], reason: str,
                     found_by: str) -> bool:
        """Merge `entries` into the ledger's mark for `bookie_id`. True if this call wrote, False if the mark
        already named them all."""
        wanted = set(entries)
        if not wanted:
            return False
        key = self.layout.damage_mark(ledger_id, bookie_id)
        retry = CasRetry(f"ledger {ledger_id}: marking its copies on {bookie_id} damaged", DAMAGE_CAS_ATTEMPTS_MAX)
        while True:
            current = await self.get(ledger_id, bookie_id)
            have = set(entries_of(current.ranges)) if current is not None else set()
            if wanted <= have:
                return False
            mark = DamageMark(ledger_id, bookie_id, to_ranges(have | wanted),
                              current.reason if current else reason[:DAMAGE_REASON_CHARS_MAX],
                              current.found_by if current else found_by,
                              current.marked_unix_ms if current else int(time.time() * 1000))
            if await self.etcd.cas_put(key, mark.encode(), current.revision if current else 0):
                return True
            await retry.lost(f"another mark (revision {current.revision if current else 0})")

    async def get(self, ledger_id: int, bookie_id: str) -> DamageMark | None:
        kv = await self.etcd.get(self.layout.damage_mark(ledger_id, bookie_id))
        return DamageMark.decode(kv.value, kv.mod_revision) if kv is not None else None

    async def marks(self) -> AsyncIterator[DamageMark]:
        """Every mark, in ledger-id order, a page at a time."""
        async for page in self.etcd.iter_prefix(self.layout.damage):
            for kv in page:
                yield DamageMark.decode(kv.value, kv.mod_revision)

    async def settle(self, mark: DamageMark, still_damaged: Iterable[int]) -> bool:
        """Replace the mark as read with the entries still damaged (deleted when none are): False if the mark
        changed meanwhile (a finder added entries: checked on the next pass)."""
        key = self.layout.damage_mark(mark.ledger_id, mark.bookie_id)
        left = to_ranges(still_damaged)
        if not left:
            return await self.etcd.cas_delete(key, mark.revision)
        if left == mark.ranges:
            return True
        ok, _ = await self.etcd.txn(Txn().mod_revision_is(key, mark.revision).put(key, DamageMark(
            mark.ledger_id, mark.bookie_id, left, mark.reason, mark.found_by, mark.marked_unix_ms).encode()))
        return bool(ok)
