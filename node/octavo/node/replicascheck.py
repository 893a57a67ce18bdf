"""The replicas check (BookKeeper's auditorReplicasCheckInterval) and the restoring of the copies it finds missing.

The lost-bookie path (autorecovery.py, `underreplicated/` marks) only acts when a bookie is gone. An entry can also
be missing on a bookie that is alive: the last entries of a segment acknowledged by the ack quorum while the copy
to a bookie that was stopping was still in flight, or a copy a bookie lost. Nothing else notices those.

The auditor, every replicas_check_interval_s (0: off), walks every ledger segment whose end is known (every
segment of a closed ledger, the sealed ones of an open ledger) and asks every registered bookie which of the
ledger's entries it stores (ListEntries: no bytes read), at most CHECK_CALLS_PER_S calls a second. Then:
- an entry missing on a registered bookie of its write set is a missing copy: the ledger gets a mark under
  `replicas-missing/<ledger id>` (layout.py) naming each bookie and its missing entry ranges (merged by CAS with a
  mark already there; at most MARKS_PER_PASS_MAX ledgers marked per pass);
- a copy on a registered bookie outside its segment's ensemble (a writer's in-flight adds to a bookie it had just
  replaced) is an extra copy: counted, as collectable (no reader asks that bookie for it);
- a bookie that is not registered is the lost-bookie path's; one answering UNKNOWN (unclean restart, not yet
  checked) is skipped this pass.

Every writable bookie's worker, each tick, takes such a mark under the ledger's replication lock (the key the
lost-bookie workers use, so the two never work on one ledger at once), reads the named entries from the other
bookies of their write sets, writes them to the named bookie with recovery adds (an entry already there with the
same bytes is fine), and deletes the mark only if nobody changed it meanwhile. A copy that no other bookie can
give is left in the mark and tried again after RETRY_DELAY_S.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from octavo.client import Client
from octavo.client.reader import ReadHandle
from octavo.client.replication import RateLimiter, ranges, write_copies
from octavo.meta.errors import OctavoError
from octavo.meta.etcd import Txn
from octavo.meta.ledger_metadata import CLOSED, LedgerMetadata, MetadataError, write_set
from octavo.meta.metadata import id_pages
from octavo.meta.retry import CasRetry
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

# ListEntries calls per second of a check pass (one per ledger and registered bookie).
CHECK_CALLS_PER_S = 200
# Ledgers marked per pass at most: the rest are found again by the next pass.
MARKS_PER_PASS_MAX = 10_000
# Entry ranges kept per bookie in one mark (a mark is one etcd value).
MARK_RANGES_MAX = 1_000
MARK_CAS_ATTEMPTS_MAX = 20
# Entries read and written back per round by a worker.
RESTORE_ENTRIES_MAX = 500
# A mark whose restore failed or left copies is tried again after this.
RETRY_DELAY_S = 30.0


@dataclass(frozen=True)
class ReplicasMark:
    """Copies missing on live bookies: bookie -> inclusive (first, last) entry ranges."""

    ledger_id: int
    missing: Mapping[str, tuple[tuple[int, int], ...]]
    marked_unix_ms: int
    revision: int = 0

    def encode(self) -> bytes:
        return json.dumps({"ledger_id": self.ledger_id, "marked_unix_ms": self.marked_unix_ms,
                           "missing": {b: [list(r) for r in rs] for b, rs in sorted(self.missing.items())}},
                          sort_keys=True).encode()

    @staticmethod
    def decode(value: bytes, revision: int) -> ReplicasMark:
        d = json.loads(value)
        return ReplicasMark(int(d["ledger_id"]), {str(b): tuple((int(a), int(z)) for a, z in rs)
                                                  for b, rs in d["missing"].items()},
                            int(d["marked_unix_ms"]), revision)

    def entries(self, bookie_id: str) -> list[int]:
        return [e for a, z in self.missing.get(bookie_id, ()) for e in range(a, z + 1)]


def sealed_segments(meta: LedgerMetadata) -> list[tuple[int, int, tuple[str, ...]]]:
    """(first, last, bookies) of each non-empty segment whose end is known: every one of a closed ledger, all but
    the last of an open one (its writer, or a recovery open, settles that one)."""
    ends = [first - 1 for first, _ in meta.ensembles[1:]] + [meta.last_entry_id if meta.state == CLOSED else -2]
    return [(first, last, bookies) for (first, bookies), last in zip(meta.ensembles, ends, strict=True)
            if last >= first]


def find_missing(meta: LedgerMetadata, held: Mapping[str, set[int]]) -> tuple[dict[str, list[int]], int]:
    """Pure: the entries missing on each bookie of their write set that answered (`held`: bookie -> the ledger's
    entries it stores), and how many copies sit on answering bookies outside their segment's ensemble."""
    missing: dict[str, list[int]] = {}
    extra = 0
    for first, last, bookies in sealed_segments(meta):
        for entry in range(first, last + 1):
            for position in write_set(entry, meta.ensemble_size, meta.write_quorum):
                bookie = bookies[position]
                stored = held.get(bookie)
                if stored is not None and entry not in stored:
                    missing.setdefault(bookie, []).append(entry)
        outside = [b for b in held if b not in bookies]
        extra += sum(1 for b in outside for e in held[b] if first <= e <= last)
    return missing, extra


@dataclass
class ReplicasState:
    """What the replicas check and its restores did; reported by the admin API and `octavo cluster status`."""

    last_pass_unix_ms: int = 0
    missing_entries: int = 0   # found by the last pass
    extra_copies: int = 0      # found by the last pass
    ledgers_marked: int = 0    # by the last pass
    entries_restored: int = 0  # by this bookie's worker, since its start
    last_error: str = ""


@dataclass
class ReplicasCheck:
    """The auditor's periodic check and every writable bookie's restore of its marks (module docstring)."""

    interval_s: float
    rate_bytes_per_s: int
    state: ReplicasState = field(default_factory=ReplicasState)
    _next_pass: float = 0.0
    _retry_at: dict[int, float] = field(default_factory=dict)

    # -- the auditor ---------------------------------------------------------------------------------
    async def tick(self, client: Client, is_auditor: bool, now: float) -> None:
        """One pass when this bookie is the auditor and the interval has passed (the first one an interval after
        it became due: a restarting cluster is not checked at once)."""
        if not self.interval_s or not is_auditor:
            self._next_pass = 0.0
            return
        if not self._next_pass:
            self._next_pass = now + self.interval_s
        if now < self._next_pass:
            return
        self._next_pass = now + self.interval_s
        await self.check(client)

    def next_due(self, is_auditor: bool) -> float | None:
        """When `tick` has something to do (time.monotonic(); 0.0: at once), None while the role stays as it is."""
        if not self.interval_s or not is_auditor:
            return None
        return self._next_pass

    async def check(self, client: Client) -> ReplicasState:
        """One pass over every ledger (module docstring)."""
        t0 = time.monotonic()
        registered = sorted(await client.bookies(refresh=True))
        pace = _Pace(CHECK_CALLS_PER_S)
        missing_total = extra_total = marked = 0
        async for meta in client.iter_ledger_metadata():
            spans = sealed_segments(meta)
            if not spans:
                continue
            first, last = spans[0][0], spans[-1][1]
            held: dict[str, set[int]] = {}
            for bookie_id in registered:
                await pace.wait()
                stored = await _stored(client, bookie_id, meta.ledger_id, first, last)
                if stored is not None:
                    held[bookie_id] = stored
            missing, extra = find_missing(meta, held)
            extra_total += extra
            if not missing:
                continue
            missing_total += sum(map(len, missing.values()))
            log.warning("replicas check: ledger %d is missing %s", meta.ledger_id, "; ".join(
                f"{len(ids)} entries on {b} ({_words(ranges(ids))})" for b, ids in sorted(missing.items())))
            if marked < MARKS_PER_PASS_MAX:
                await mark(client, meta.ledger_id, {b: ranges(ids) for b, ids in missing.items()})
                marked += 1
        state = self.state
        state.last_pass_unix_ms = int(time.time() * 1000)
        state.missing_entries, state.extra_copies, state.ledgers_marked = missing_total, extra_total, marked
        log.info("replicas check in %.2fs: %d entries missing a copy (%d ledgers marked), %d copies outside their "
                 "ensembles", time.monotonic() - t0, missing_total, marked, extra_total)
        return state

    # -- the workers ---------------------------------------------------------------------------------
    def next_retry(self, after: float) -> float | None:
        """When the restore has a ledger to try again (time.monotonic()), the earliest after `after`; None: none."""
        return min((t for t in self._retry_at.values() if t > after), default=None)

    async def restore_tick(self, client: Client, lease_id: int, owner: str) -> None:
        """Restore the copies of every mark whose ledger lock this worker gets (module docstring)."""
        if not lease_id:
            return
        registered: Mapping[str, object] | None = None  # read at the first mark to work on (as the workers do)
        now = time.monotonic()
        async for current in marks(client):
            if self._retry_at.get(current.ledger_id, 0) > now:
                continue
            if registered is None:
                registered = await client.bookies(refresh=True)
            layout = client.metadata_store.layout
            lock = layout.replication_lock(current.ledger_id)
            key = layout.replicas_missing_ledger(current.ledger_id)
            ok, resp = await client.etcd.txn(Txn().mod_revision_is(lock, 0).put(lock, owner.encode(), lease=lease_id)
                                             .get(key).get(layout.ledger(current.ledger_id)))
            if not ok:
                continue  # another worker has the ledger
            finished = False
            try:
                kvs, ledgers = resp.responses[1].response_range.kvs, resp.responses[2].response_range.kvs
                if not kvs:
                    continue
                taken = ReplicasMark.decode(kvs[0].value, kvs[0].mod_revision)
                meta = LedgerMetadata.decode(ledgers[0].value) if ledgers else None
                left = await self._restore(client, taken, meta, registered) if meta is not None else {}
                if left:
                    self._retry_at[taken.ledger_id] = time.monotonic() + RETRY_DELAY_S
                    continue
                ok, _ = await client.etcd.txn(Txn().mod_revision_is(key, taken.revision).delete(key).delete(lock)
                                              .delete_on_failure(lock))
                finished = True
                self._retry_at.pop(taken.ledger_id, None)
            except (OctavoError, MetadataError) as e:
                self.state.last_error = f"ledger {current.ledger_id}: {e}"
                log.warning("restoring the copies ledger %d is missing failed (retrying in %.0fs): %s",
                            current.ledger_id, RETRY_DELAY_S, e)
                self._retry_at[current.ledger_id] = time.monotonic() + RETRY_DELAY_S
            finally:
                if not finished:
                    await client.etcd.delete(lock)

    async def _restore(self, client: Client, taken: ReplicasMark, meta: LedgerMetadata,
                       registered: Mapping[str, object]) -> dict[str, list[int]]:
        """Copy each bookie's missing entries back to it; returns what is left (entries no other bookie gave).
        A bookie no longer registered, or no longer in an entry's write set, is not this mark's to restore."""
        if not meta.master_key_hex:
            raise OctavoError(f"ledger {meta.ledger_id}: its metadata has no master key to write copies with")
        key = bytes.fromhex(meta.master_key_hex)
        lac = max((last for _, last, _ in sealed_segments(meta)), default=-1)
        rate = RateLimiter(self.rate_bytes_per_s)
        left: dict[str, list[int]] = {}
        for bookie_id in sorted(taken.missing):
            if bookie_id not in registered:
                log.info("ledger %d: %s is not registered; its copies are the lost-bookie path's", meta.ledger_id,
                         bookie_id)
                continue
            ids = [e for e in taken.entries(bookie_id) if e <= lac and bookie_id in meta.write_set_bookies(e)]
            target = client.bookie_client(bookie_id)
            reader = ReadHandle(client, meta, lac)
            for start in range(0, len(ids), RESTORE_ENTRIES_MAX):
                chunk = ids[start:start + RESTORE_ENTRIES_MAX]
                found, _ = await reader.read_available(chunk, exclude=frozenset({bookie_id}))
                left_here = [e for e in chunk if e not in found]
                if left_here:
                    left.setdefault(bookie_id, []).extend(left_here)
                got = [e for e in chunk if e in found]
                if not got:
                    continue
                await rate.acquire(sum(len(found[e]) for e in got))
                await write_copies(target, meta.ledger_id, key, got, found, lac)
                self.state.entries_restored += len(got)
            if ids:
                log.info("ledger %d: %d missing copies restored on %s", meta.ledger_id,
                         len(ids) - len(left.get(bookie_id, [])), bookie_id)
        return left


async def mark(client: Client, ledger_id: int, missing: Mapping[str, list[tuple[int, int]]]) -> None:
    """Mark copies missing (merged with a mark already there, by CAS)."""
    etcd, key = client.etcd, client.metadata_store.layout.replicas_missing_ledger(ledger_id)
    retry = CasRetry(f"ledger {ledger_id}: marking copies missing", MARK_CAS_ATTEMPTS_MAX)
    while True:
        kv = await etcd.get(key)
        current = ReplicasMark.decode(kv.value, kv.mod_revision) if kv is not None else None
        merged: dict[str, tuple[tuple[int, int], ...]] = {}
        for bookie_id in sorted({*missing, *(current.missing if current else {})}):
            ids = sorted({*(current.entries(bookie_id) if current else ()),
                          *(e for a, z in missing.get(bookie_id, ()) for e in range(a, z + 1))})
            merged[bookie_id] = tuple(ranges(ids)[:MARK_RANGES_MAX])
        value = ReplicasMark(ledger_id, merged, current.marked_unix_ms if current else int(time.time() * 1000))
        if await etcd.cas_put(key, value.encode(), current.revision if current else 0):
            return
        await retry.lost(f"another mark (read at revision {current.revision if current else 0})")


async def marks(client: Client) -> AsyncIterator[ReplicasMark]:
    """Every replicas-missing mark, in ledger-id order, a page at a time."""
    layout = client.metadata_store.layout
    prefix = layout.replicas_missing
    async for page in id_pages(client.etcd, prefix, layout.replicas_missing_ledger,
                               lambda key: layout.ledger_id_under(prefix, key)):
        for kv in page:
            yield ReplicasMark.decode(kv.value, kv.mod_revision)


async def _stored(client: Client, bookie_id: str, ledger_id: int, first: int, last: int) -> set[int] | None:
    """The entries of [first, last] the bookie stores; None when it cannot tell now (unreachable, UNKNOWN)."""
    stored: set[int] = set()
    try:
        bookie = client.bookie_client(bookie_id)
        while first <= last:
            resp = await bookie.list_entries(ledger_id, first, last)
            if resp.error == pb.NO_SUCH_LEDGER:
                return set()
            if resp.error:
                return None
            stored.update(resp.entry_ids)
            if resp.next_entry_id < 0:
                break
            first = resp.next_entry_id
    except OctavoError as e:
        log.info("replicas check: bookie %s cannot say what it holds of ledger %d: %s", bookie_id, ledger_id, e)
        return None
    return stored


def _words(runs: list[tuple[int, int]]) -> str:
    shown = ", ".join(f"{a}" if a == z else f"{a}-{z}" for a, z in runs[:5])
    return shown + (f" and {len(runs) - 5} more ranges" if len(runs) > 5 else "")


class _Pace:
    """At most `per_s` waits return per second."""

    def __init__(self, per_s: float) -> None:
        self.gap_s = 1.0 / per_s
        self.next = 0.0

    async def wait(self) -> None:
        now = time.monotonic()
        if self.next > now:
            await asyncio.sleep(self.next - now)
        self.next = max(now, self.next) + self.gap_s
