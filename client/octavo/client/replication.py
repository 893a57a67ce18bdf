"""Re-replication: give back to a ledger the copies a gone bookie held (BookKeeper's ReplicationWorker, on etcd).

For a ledger and a set of bookies that are gone (dead for good, or being decommissioned), each ensemble segment
that names one of them gets a replacement bookie: the entries the gone bookie should hold there (its position's
share of each write set, striping included) are read from the surviving replicas (each bookie checks a
record's checksum before it answers) and written to the replacement with recovery adds, in batches of at most
`batch_bytes_max` and at most `rate` bytes per second; then one etcd CAS names the replacement in every segment
that was copied. The replacement is chosen by the writers' rules (placement.py: writable, registered, not in the
segment) and, among those, by a hash of (ledger, segment, gone bookie), so a worker that starts over after a
crash picks the same bookie and its copies are idempotent (the same entry with the same bytes is accepted
again, without a second copy).

- A CAS that loses to a concurrent change of the ledger (a writer's ensemble change, a close, a delete,
  another worker) re-reads the ledger and decides again; it never overwrites.
- Entries that no surviving replica holds are reported as lost, by ledger, bookie and entry range; the
  segments with lost entries are not changed in etcd (nothing is papered over) and the outcome says so.
- The last segment of an OPEN ledger belongs to its writer, which replaces a failed bookie itself; it is left
  alone unless `recover_open` is set (the caller's grace period for the writer is over): then the ledger is
  recovery-opened (fenced and closed, as a reader would) and its last segment is handled like the others.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from octavo.client.bookie_client import BookieClient
from octavo.client.client import Client
from octavo.client.placement import CONNECTING, READY, UNREGISTERED, replacement_choice
from octavo.client.reader import ReadHandle
from octavo.client.recovery import recover_ledger
from octavo.meta.errors import NoSuchLedgerError, NotEnoughBookiesError, OctavoError
from octavo.meta.ledger_metadata import CLOSED, LedgerMetadata, write_set
from octavo.meta.retry import CasRetry
from octavo.meta.underreplication import DECOMMISSION_BY, UnderReplication
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

# Entries read from the survivors per step (then written in batches of at most batch_bytes_max).
REPLICATION_READ_ENTRIES = 1_000
REPLICATION_CAS_ATTEMPTS_MAX = 10

# Outcomes
REPLICATED = "replicated"        # every segment that named a gone bookie names a replacement now
NOTHING_TO_DO = "nothing-to-do"  # no segment names a gone bookie (any more)
DELETED = "deleted"              # the ledger was deleted
LOST = "lost"                    # some entries exist on no surviving replica: those segments were not changed
OPEN_SEGMENT_LEFT = "open-segment-left"  # the rest is done; the open ledger's last segment is its writer's
# Some copies could not be read now (a registered replica did not answer): those segments were not changed, the
# others were; not lost, tried again later.
UNANSWERED = "unanswered"


class ReplicationError(OctavoError):
    """Re-replication could not go on (a replacement refused a copy, the CAS kept losing)."""


@dataclass(frozen=True)
class LostEntries:
    ledger_id: int
    bookie: str  # the gone bookie whose copies are missing
    first: int
    last: int

    def __str__(self) -> str:
        return f"{self.span()} exist on no surviving replica"

    def span(self) -> str:
        entries = f"entry {self.first}" if self.first == self.last else f"entries {self.first}-{self.last}"
        return f"ledger {self.ledger_id}: {entries} (the copies on {self.bookie})"


@dataclass
class LedgerReplication:
    """What re-replicating one ledger did."""

    ledger_id: int
    outcome: str = NOTHING_TO_DO
    replaced: list[tuple[int, str, str]] = field(default_factory=list)  # (segment's first entry, gone, new)
    entries_copied: int = 0
    bytes_copied: int = 0
    lost: list[LostEntries] = field(default_factory=list)
    # Entries no replica gave while a registered one could not be asked (UNANSWERED): not lost, tried again.
    unanswered: list[LostEntries] = field(default_factory=list)


class RateLimiter:
    """At most `bytes_per_s` on average (0: unlimited), in bursts of up to one second's worth."""

    def __init__(self, bytes_per_s: int) -> None:
        self.bytes_per_s = bytes_per_s
        self._allowance = float(bytes_per_s)
        self._at = 0.0

    async def acquire(self, n: int) -> None:
        if self.bytes_per_s <= 0:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._at:
            self._allowance = min(float(self.bytes_per_s), self._allowance + (now - self._at) * self.bytes_per_s)
        self._at = now
        self._allowance -= n
        if self._allowance < 0:
            await asyncio.sleep(-self._allowance / self.bytes_per_s)


@dataclass
class _Segment:
    index: int
    first: int
    last: int  # inclusive; last < first for an empty segment
    bookies: tuple[str, ...]


def segments_to_replicate(meta: LedgerMetadata, gone: Collection[str], include_open_tail: bool
                          ) -> tuple[list[_Segment], bool]:
    """The segments naming a gone bookie, and whether an open ledger's last segment was left out."""
    ends = [first - 1 for first, _ in meta.ensembles[1:]] + [meta.last_entry_id if meta.state == CLOSED else -2]
    out: list[_Segment] = []
    left_open_tail = False
    for index, ((first, bookies), last) in enumerate(zip(meta.ensembles, ends, strict=True)):
        if not any(b in gone for b in bookies):
            continue
        if last == -2:  # the last segment of a ledger that is not closed
            if not include_open_tail:
                left_open_tail = True
                continue
            raise ValueError("an open ledger's last segment has no end: recovery-open the ledger first")
        out.append(_Segment(index, first, last, bookies))
    return out, left_open_tail


def entries_of(segment: _Segment, position: int, ensemble_size: int, write_quorum: int) -> list[int]:
    """The entries of a segment that the bookie at `position` holds (its share of each write set)."""
    return [e for e in range(segment.first, segment.last + 1)
            if position in write_set(e, ensemble_size, write_quorum)]


def ranges(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted ids as (first, last) runs of consecutive ids."""
    out: list[tuple[int, int]] = []
    for e in ids:
        if out and out[-1][1] == e - 1:
            out[-1] = (out[-1][0], e)
        else:
            out.append((e, e))
    return out


class Replicator:
    """Re-replicates ledgers through one client; one instance may serve many ledgers (one rate limit)."""

    def __init__(self, client: Client, rate_bytes_per_s: int = 0, batch_bytes_max: int = 4 << 20) -> None:
        self.client = client
        self.rate = RateLimiter(rate_bytes_per_s)
        self.batch_bytes_max = batch_bytes_max

    async def replicate(self, ledger_id: int, gone: Collection[str], recover_open: bool = False,
                        first_read: tuple[LedgerMetadata, int] | None = None) -> LedgerReplication:
        """`first_read`: the ledger's metadata and its mod revision, as the caller just read them from etcd (the
        first pass uses them instead of reading again; a CAS lost to a newer change reads afresh)."""
        report = LedgerReplication(ledger_id)
        gone = set(gone)
        store = self.client.metadata_store
        retry = CasRetry(f"ledger {ledger_id}: re-replication", REPLICATION_CAS_ATTEMPTS_MAX,
                         error=ReplicationError)
        for _ in range(REPLICATION_CAS_ATTEMPTS_MAX):
            if first_read is not None:
                (meta, revision), first_read = first_read, None
            else:
                try:
                    meta, revision = await store.read_ledger(ledger_id)
                except NoSuchLedgerError:
                    report.outcome = DELETED
                    return report
            if recover_open and meta.state != CLOSED and any(b in gone for b in meta.last_ensemble):
                log.info("ledger %d: still open with gone bookie(s) %s in its last segment after the grace "
                         "period: recovery-opening it", ledger_id, sorted(gone & set(meta.last_ensemble)))
                if not meta.master_key_hex:
                    raise ReplicationError(f"ledger {ledger_id}: its metadata has no master key to recover it with")
                await recover_ledger(self.client, ledger_id, bytes.fromhex(meta.master_key_hex))
                continue
            segments, left_open_tail = segments_to_replicate(meta, gone, include_open_tail=False)
            if not segments:
                report.outcome = OPEN_SEGMENT_LEFT if left_open_tail else (
                    REPLICATED if report.replaced else NOTHING_TO_DO)
                return report
            replacements: dict[tuple[int, str], str] = {}
            lost_here: list[LostEntries] = []
            report.unanswered = []
            for segment in segments:
                for old in [b for b in segment.bookies if b in gone]:
                    new = await self._choose(meta, segment, old, gone)
                    missing, unanswered = await self._copy(meta, segment, old, new, report)
                    lost_here += [LostEntries(ledger_id, old, a, b) for a, b in ranges(missing)]
                    report.unanswered += [LostEntries(ledger_id, old, a, b) for a, b in ranges(unanswered)]
                    if not missing and not unanswered:
                        replacements[(segment.index, old)] = new
            for doubtful in report.unanswered:
                log.warning("%s could not be read now: a registered replica did not answer; not lost, the segment "
                            "is tried again later", doubtful.span())
            if lost_here:
                for lost in lost_here:
                    log.error("LOST: %s", lost)
                report.lost = lost_here
            if replacements:
                changed = _with_replacements(meta, replacements)
                new_revision = await store.update_ledger(changed, revision)
                if new_revision is None:
                    log.info("ledger %d changed while it was re-replicated: reading it again", ledger_id)
                    report.lost = []
                    # Copies made are idempotent; the next pass re-decides on the new metadata.
                    await retry.lost(f"another change of the ledger's metadata (it was at revision {revision})")
                    continue
                for (index, old), new in sorted(replacements.items()):
                    report.replaced.append((meta.ensembles[index][0], old, new))
                    log.info("ledger %d: segment from entry %d re-replicated from %s to %s", ledger_id,
                             meta.ensembles[index][0], old, new)
            if lost_here:
                report.outcome = LOST
                return report
            report.outcome = UNANSWERED if report.unanswered else OPEN_SEGMENT_LEFT if left_open_tail else REPLICATED
            return report
        raise ReplicationError(f"ledger {ledger_id}: re-replication kept losing its CAS to other changes")

    async def _choose(self, meta: LedgerMetadata, segment: _Segment, old: str, gone: set[str]) -> str:
        # The client's registrations, read again once they are bookie_list_ttl_s old: not per ledger (a lost
        # bookie's thousands of small ledgers would each pay etcd round trips for the same list). A bookie
        # that left since is refused by the copy's add, and the ledger is retried.
        registered = {b: info for b, info in (await self.client.bookies()).items() if b not in gone}

        def state(bookie_id: str) -> str:
            try:
                return READY if self.client.bookie_client(bookie_id).reachable() else CONNECTING
            except OctavoError:
                return UNREGISTERED

        choice = replacement_choice(old, segment.bookies, registered, {}, 0.0, 0.0, 0, state)
        candidates = choice.ready or choice.waiting
        if not candidates:
            raise NotEnoughBookiesError(
                f"ledger {meta.ledger_id}: no bookie can take {old}'s place in the segment from entry "
                f"{segment.first}: " + ("; ".join(f"{b} {why}" for b, why in sorted(choice.unusable.items()))
                                        or "no other bookie is registered"))

        def rank(bookie_id: str) -> bytes:  # stable per (ledger, segment, gone bookie): a rerun picks the same
            return hashlib.sha256(f"{meta.ledger_id}/{segment.first}/{old}/{bookie_id}".encode()).digest()

        return min(candidates, key=rank)

    async def _copy(self, meta: LedgerMetadata, segment: _Segment, old: str, new: str,
                    report: LedgerReplication) -> tuple[list[int], list[int]]:
        """Copy `old`'s share of the segment to `new`. Returns the entries no surviving replica gave: those every
        replica asked denied (lost), and those a registered replica could not be asked about (unanswered)."""
        ids = entries_of(segment, segment.bookies.index(old), meta.ensemble_size, meta.write_quorum)
        if not ids:
            return [], []
        if not meta.master_key_hex:
            raise ReplicationError(f"ledger {meta.ledger_id}: its metadata has no master key to write copies with")
        key = bytes.fromhex(meta.master_key_hex)
        reader = ReadHandle(self.client, meta, segment.last)
        missing: list[int] = []
        doubtful: list[int] = []
        target = self.client.bookie_client(new)
        # The old bookie is read too while it is registered (a decommissioned one still serves); a lost one is
        # not asked at all, so each entry is read in one round from a survivor.
        exclude = frozenset() if old in self.client.registrations else frozenset({old})
        for start in range(0, len(ids), REPLICATION_READ_ENTRIES):
            chunk = ids[start:start + REPLICATION_READ_ENTRIES]
            unanswered: set[int] = set()
            found, _ = await reader.read_available(chunk, exclude=exclude, unanswered=unanswered)
            doubtful += [e for e in chunk if e not in found and e in unanswered]
            missing += [e for e in chunk if e not in found and e not in unanswered]
            batch: list[int] = []
            size = 0
            for e in [e for e in chunk if e in found]:
                if batch and size + len(found[e]) > self.batch_bytes_max:
                    await self._write(target, meta, key, batch, found, segment.last, size, report)
                    batch, size = [], 0
                batch.append(e)
                size += len(found[e])
            if batch:
                await self._write(target, meta, key, batch, found, segment.last, size, report)
        return missing, doubtful

    async def _write(self, target: BookieClient, meta: LedgerMetadata, key: bytes, ids: list[int],
                     found: dict[int, bytes], lac: int, size: int, report: LedgerReplication) -> None:
        await self.rate.acquire(size)
        await write_copies(target, meta.ledger_id, key, ids, found, lac)
        report.entries_copied += len(ids)
        report.bytes_copied += size


async def write_copies(target: BookieClient, ledger_id: int, key: bytes, ids: list[int], found: dict[int, bytes],
                       lac: int) -> None:
    """Write copies of entries read from other replicas to `target` (recovery adds: allowed through a fence; an
    entry already there with the same bytes is fine). ReplicationError names the first refused entry."""
    codes = await target.add(ledger_id, key, ids, [found[e] for e in ids], lac, recovery=True)
    refused = [(e, c) for e, c in zip(ids, codes, strict=True) if c != pb.OK]
    if refused:
        e, code = refused[0]
        raise ReplicationError(f"ledger {ledger_id}: bookie {target.bookie_id} refused the copy of entry {e}: "
                               f"{pb.ResultCode.Name(code)}")  # type: ignore[arg-type]


def _with_replacements(meta: LedgerMetadata, replacements: dict[tuple[int, str], str]) -> LedgerMetadata:
    ensembles = list(meta.ensembles)
    for (index, old), new in replacements.items():
        first, bookies = ensembles[index]
        ensembles[index] = (first, tuple(new if b == old else b for b in bookies))
    return meta.with_ensembles(tuple(ensembles))



# -- a whole bookie ------------------------------------------------------------------------------------------

# The lease that holds a worker's ledger locks: refreshed every third of it while the worker lives.
REPLICATION_LEASE_TTL_S = 15
# `cluster recover` and decommission wait this long at most for ledgers another worker is re-replicating
# (polling every BUSY_POLL_S) before reporting them busy.
RECOVER_BUSY_WAIT_S = 300.0
BUSY_POLL_S = 0.5


@dataclass
class BookieRecovery:
    """What moving one bookie's copies elsewhere did (or, in a dry run, would do)."""

    bookie_id: str
    ledgers: list[int] = field(default_factory=list)        # ledgers with a segment naming it, when it began
    replicated: list[int] = field(default_factory=list)
    left_open: list[int] = field(default_factory=list)      # open ledgers whose last segment names it
    busy: list[int] = field(default_factory=list)           # locked by another worker
    lost: list[LostEntries] = field(default_factory=list)
    retry: list[int] = field(default_factory=list)          # some copies could not be read now (UNANSWERED)
    entries_copied: int = 0
    bytes_copied: int = 0
    segments_to_move: int = 0                               # dry run: segments that would get a new bookie
    retired: bool = False                                   # decommission: its identity removed from etcd

    @property
    def done(self) -> bool:
        return not (self.left_open or self.busy or self.lost or self.retry)


async def ledgers_naming(client: Client, bookie_id: str) -> list[LedgerMetadata]:
    """Every ledger with a segment naming `bookie_id` (ledger metadata read a page at a time)."""
    return [meta async for meta in client.iter_ledger_metadata()
            if any(bookie_id in bookies for _, bookies in meta.ensembles)]


async def check_enough_bookies(client: Client, bookie_id: str, metas: list[LedgerMetadata]) -> None:
    """Refuse before anything moves if the other writable bookies cannot hold some ledger's ensemble."""
    others = sorted(b for b, info in (await client.bookies(refresh=True)).items()
                    if b != bookie_id and not info.readonly)
    for meta in metas:
        if len(others) < meta.ensemble_size:
            raise NotEnoughBookiesError(
                f"ledger {meta.ledger_id} needs an ensemble of {meta.ensemble_size} bookies (E{meta.ensemble_size}/"
                f"Qw{meta.write_quorum}/Qa{meta.ack_quorum}) without {bookie_id}, but only {len(others)} other "
                f"writable bookies are registered ({', '.join(others) or 'none'}): add bookies first")


async def recover_bookie(client: Client, bookie_id: str, replicator: Replicator, by: str = "cli",
                         dry_run: bool = False, recover_open: bool = False,
                         progress: Callable[[int, int, LedgerReplication | None], None] | None = None,
                         busy_wait_s: float = RECOVER_BUSY_WAIT_S) -> BookieRecovery:
    """Move every copy `bookie_id` holds to other bookies: mark each ledger naming it under-replicated, then
    re-replicate them one by one under a lease-bound lock, unmarking each one done. Safe to run again after an
    interruption (it starts from the marks and ledgers still naming the bookie), and next to other workers
    (a ledger locked by one is left to it and waited for, up to `busy_wait_s`; still locked then, it is
    reported busy). `recover_open` recovery-opens open ledgers whose last
    segment names the bookie (their writer is taken to be gone); without it they are left to their writer."""
    result = BookieRecovery(bookie_id)
    metas = await ledgers_naming(client, bookie_id)
    result.ledgers = [m.ledger_id for m in metas]
    if dry_run:
        for meta in metas:
            segments, left = segments_to_replicate(meta, {bookie_id}, include_open_tail=False)
            result.segments_to_move += len(segments)
            if left:
                result.left_open.append(meta.ledger_id)
        return result
    await check_enough_bookies(client, bookie_id, metas)
    marks = UnderReplication(client.etcd, client.metadata_store.layout)
    for meta in metas:
        await marks.mark(meta.ledger_id, [bookie_id], by)
    lease = await client.etcd.grant_lease(REPLICATION_LEASE_TTL_S)
    keeper = asyncio.create_task(_keep_lease(client, lease))
    try:
        for done, ledger_id in enumerate(result.ledgers, 1):
            report = await _replicate_marked(client, marks, replicator, ledger_id, lease, by, recover_open)
            _account(result, ledger_id, report)
            if progress is not None:
                progress(done, len(result.ledgers), report)
        # Ledgers another worker (a bookie's autorecovery) holds: wait for it to finish them, or take them over
        # once its lock is released with the mark still there.
        deadline = asyncio.get_running_loop().time() + busy_wait_s
        while result.busy and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(BUSY_POLL_S)
            busy, result.busy = result.busy, []
            for ledger_id in busy:
                try:
                    named = any(bookie_id in b for _, b in (await client.ledger_metadata(ledger_id)).ensembles)
                except NoSuchLedgerError:
                    named = False
                if not named:
                    result.replicated.append(ledger_id)  # done by the other worker (or deleted meanwhile)
                    continue
                report = await _replicate_marked(client, marks, replicator, ledger_id, lease, by, recover_open)
                _account(result, ledger_id, report)
    finally:
        keeper.cancel()
        await client.etcd.revoke_lease(lease, timeout_s=2.0)  # releases every lock still held
    return result


def _account(result: BookieRecovery, ledger_id: int, report: LedgerReplication | None) -> None:
    if report is None:
        result.busy.append(ledger_id)
        return
    result.entries_copied += report.entries_copied
    result.bytes_copied += report.bytes_copied
    result.lost += report.lost
    if report.outcome == OPEN_SEGMENT_LEFT:
        result.left_open.append(ledger_id)
    elif report.outcome == UNANSWERED:
        result.retry.append(ledger_id)
    elif report.outcome in (REPLICATED, NOTHING_TO_DO, DELETED):
        result.replicated.append(ledger_id)


async def _replicate_marked(client: Client, marks: UnderReplication, replicator: Replicator, ledger_id: int,
                            lease: int, owner: str, recover_open: bool) -> LedgerReplication | None:
    """Re-replicate one marked ledger under its lock; None if another worker holds the lock."""
    if not await marks.lock(ledger_id, lease, owner):
        return None
    try:
        mark = await marks.get(ledger_id)
        gone = set(mark.missing) if mark is not None else set()
        if not gone:
            return LedgerReplication(ledger_id)
        report = await replicator.replicate(ledger_id, gone, recover_open=recover_open)
        if report.outcome in (REPLICATED, NOTHING_TO_DO, DELETED) and mark is not None:
            await marks.unmark(mark)  # a mark changed meanwhile (another bookie lost) stays for the next pass
        return report
    finally:
        await marks.unlock(ledger_id)


async def _keep_lease(client: Client, lease: int) -> None:
    while True:
        await asyncio.sleep(REPLICATION_LEASE_TTL_S / 3)
        try:
            await client.etcd.keep_alive_once(lease)
        except OctavoError as e:
            log.warning("could not refresh the replication lease: %s", e)


# How often a decommission looks again for ledgers still naming the bookie (open ledgers whose writers have
# yet to move off it).
DECOMMISSION_POLL_S = 1.0


async def decommission_bookie(client: Client, bookie_id: str, replicator: Replicator, wait_s: float,
                              recover_open: bool = False,
                              progress: Callable[[int, int, LedgerReplication | None], None] | None = None
                              ) -> BookieRecovery:
    """Move every copy off a live bookie (forced read-only by the caller first, so writers leave it at their
    next add and nothing new lands on it), then retire its identity so it cannot rejoin. Its own copies are
    read too, so entries with a single other copy are safe. Open ledgers whose last segment names it wait for
    their writers to move off, up to `wait_s` (or are recovery-opened with `recover_open`). Resumable: a
    second run starts from what still names the bookie."""
    total = BookieRecovery(bookie_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    seen: set[int] = set()
    while True:
        run = await recover_bookie(client, bookie_id, replicator, by=f"{DECOMMISSION_BY} of {bookie_id}",
                                   recover_open=recover_open, progress=progress)
        seen.update(run.ledgers)
        total.replicated += [lid for lid in run.replicated if lid not in total.replicated]
        total.entries_copied += run.entries_copied
        total.bytes_copied += run.bytes_copied
        total.lost += run.lost
        if run.lost:
            break
        remaining = [m.ledger_id for m in await ledgers_naming(client, bookie_id)]
        if not remaining:
            await client.metadata_store.retire_bookie(bookie_id)
            total.retired = True
            break
        if loop.time() >= deadline:
            total.retry = [lid for lid in remaining if lid in run.retry]
            total.left_open = [lid for lid in remaining if lid not in run.retry]
            break
        await asyncio.sleep(DECOMMISSION_POLL_S)
    total.ledgers = sorted(seen)
    return total
