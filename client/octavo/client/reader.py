"""The read handle: catch-up reads in parallel batches, tailing reads that follow a writer, failover and
speculative reads.

Catch-up reads (read, read_batches) read a range in chunks of about read_batch_bytes, several chunks in flight
at once (at most read_ahead_bytes_max ahead of the consumer), and yield them in order. A chunk of a segment
whose bookies all hold every entry (ensemble size = write quorum, the usual shape) is split into contiguous
ranges, one per bookie, so the bookies share the work and each serves a range from its logs; otherwise each
entry is read from its write set's first replica. A bookie that has not answered after
speculative_read_delay_s gets a second request to the next replica for the same entries, and the first good
answer wins. Entries a replica could not give (missing, UNKNOWN, corrupt, unreachable) are tried on the next
replica; an entry no replica can give is a ReadError. An answer cut by the bookie's read limits is continued
on the same bookie.

Reads of an open ledger stop at its last-add-confirmed (LAC), as BookKeeper's do: every entry up to it was
acknowledged to the writer, so no recovery open can close the ledger before it. Entries past it that the
bookies already hold may be read only by asking for them with `unconfirmed=True` (BookKeeper's
readUnconfirmedEntries): a writer that crashes in the middle of an ensemble change can leave such an entry on a
bookie that is no longer in the ledger's last segment, and the recovery open that closes the ledger then ends
before it. An unconfirmed read can therefore return an entry that the closed ledger does not contain.

Tailing reads (tail, tail_batches) follow an open ledger: each round is one long poll (ReadTail) on one bookie
of the last ensemble, held until its LAC passes what the reader has, and answered with the entries it holds
up to that LAC (others, of a striped ledger, are read from their replicas). A bookie that fails, hangs or had
nothing new within the wait is left for the next bookie of the ensemble (as BookKeeper's long-poll reads
move on), so a stopped bookie delays a reader by one wait (tail_wait_ms) at most.
Only entries up to a LAC a bookie reported are ever yielded (a LAC comes from the writer and covers acknowledged
entries only).
A fenced or write-closed answer, or a round without progress, makes the reader look at the ledger's metadata
in etcd: a new ensemble is followed, a closed ledger is read to its last entry and the tail ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Any, NamedTuple

from octavo.client.arguments import check_bool, check_int
from octavo.client.context import ClientContext
from octavo.client.damage import report_damage
from octavo.meta.errors import BookieUnavailableError, MetadataUnavailableError, ReadError
from octavo.meta.ledger_metadata import LedgerMetadata
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

READ_CHUNK_ENTRIES = 1000
# Catch-up reads: the first chunk (entry sizes unknown yet), and the bounds of later ones.
FIRST_CHUNK_ENTRIES = 16
CHUNK_ENTRIES_MIN = 1
CHUNK_ENTRIES_MAX = 10_000
# Chunks in flight at once, whatever read_ahead_bytes_max allows: more only contend for the same CPUs.
CHUNKS_IN_FLIGHT_MAX = 8
# A chunk is split over several bookies in parts of at least this many entries.
SPLIT_ENTRIES_MIN = 8
# Tailing reads: entries asked of the one bookie that sends entries with its long-poll answer; the wait
# between rounds that found nothing to do (a recovery in progress, every bookie unreachable) grows to this.
TAIL_ENTRIES_MAX = 10_000
# A long poll not answered this long after its wait is taken for a hung bookie (at most read_timeout_s).
TAIL_HANG_SLACK_S = 1.0
TAIL_RETRY_S_MIN = 0.02
TAIL_RETRY_S_MAX = 1.0
# A tailing reader re-reads metadata and retries a read that failed (its ensemble may have changed) this often.
TAIL_READ_ATTEMPTS = 3


class Entry(NamedTuple):
    """One entry as read. A named tuple: a catch-up read makes one per entry, and a tuple is the cheapest
    immutable object Python can make."""

    ledger_id: int
    entry_id: int
    data: bytes


def _unreadable(entries: Sequence[int], why: str, errors: dict[int, str], unanswered: set[int] | None,
                may_hold: bool) -> None:
    """Note why `entries` could not be read from one bookie; `may_hold`: it could not say whether it holds
    them (unreachable while registered, or it refused the whole request), so not found is no proof of loss."""
    errors.update(dict.fromkeys(entries, why))
    if may_hold and unanswered is not None:
        unanswered.update(entries)


class ReadHandle:
    def __init__(self, client: ClientContext, metadata: LedgerMetadata, last_add_confirmed: int) -> None:
        self._client = client
        self.metadata = metadata
        self._lac = last_add_confirmed
        self._tail_bookie = ""  # the bookie a tailing read long-polls now
        # Entries some replica answered CORRUPT for, until another gives them: entry -> bookie -> message.
        self._corrupt: dict[int, dict[str, str]] = {}

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_entry_id(self) -> int:
        """The last entry readers may read: the closed ledger's last entry, or the LAC of an open one."""
        return self.metadata.last_entry_id if self.metadata.closed else self._lac

    async def read_last_add_confirmed(self) -> int:
        """The LAC of an open ledger (the last entry readers may read), and remember it as last_entry_id; a
        closed ledger's last entry.

        BookKeeper's rule: the highest LAC the last ensemble's bookies report, and at least the entry before
        the last segment (a segment starts after the writer's LAC of when it began). Every entry up to it was
        acknowledged, so every recovery open keeps it. The bookies' LAC lags the writer by one batch (it rides
        on the next add, or on a LAC-only add once the writer is idle), and a writer that died right after its
        last batch leaves it behind for good: those entries become readable when a recovery open closes the
        ledger. Entries past the LAC: read_unconfirmed_last_entry."""
        if self.metadata.closed:
            return self.metadata.last_entry_id
        ok = await self._read_lacs()
        lac = max([self._lac, self._segment_floor(), *(int(a.last_add_confirmed) for a in ok)])
        self._lac = lac
        return lac

    async def read_unconfirmed_last_entry(self) -> int:
        """Past the LAC of an open ledger, the last entry that it and every entry before it are held by Qa
        bookies of their write sets; the LAC if there is none; a closed ledger's last entry. Changes nothing
        the handle remembers: last_entry_id stays the LAC.

        UNCONFIRMED: such an entry was not acknowledged (or not yet known to be), and it may vanish. If the
        writer crashes in the middle of an ensemble change (after the new segment is in etcd, before its
        entries reach the replacement), an entry held only by the bookie it replaced is denied by the new
        segment and a recovery open closes the ledger before it. Read such entries with read(...,
        unconfirmed=True) only where that is acceptable (BookKeeper's readUnconfirmedEntries)."""
        if self.metadata.closed:
            return self.metadata.last_entry_id
        ok = await self._read_lacs()
        lac = max([self._lac, self._segment_floor(), *(int(a.last_add_confirmed) for a in ok)])
        stored = max((int(a.last_entry_id) for a in ok), default=-1)
        return await self._held_by_ack_quorum(lac, stored) if stored > lac else lac

    def _segment_floor(self) -> int:
        """Entries before the last segment were acknowledged before it began."""
        return self.metadata.ensembles[-1][0] - 1

    async def _read_lacs(self) -> list[Any]:
        """The OK answers of the last ensemble's bookies to a (non-fencing) LAC read; a bookie that cannot be
        reached (or is not registered) gives none."""
        async def one(bookie_id: str) -> Any:
            return await self._client.bookie_client(bookie_id).read_lac(self.ledger_id)

        answers = await asyncio.gather(*map(one, self.metadata.last_ensemble), return_exceptions=True)
        return [a for a in answers if not isinstance(a, BaseException) and a.code == pb.OK]

    async def _held_by_ack_quorum(self, lac: int, last: int) -> int:
        """The highest entry id in (lac, last] such that it and every entry before it past `lac` is held by
        Qa bookies of its write set (one read per bookie per window of entries); `lac` if none is."""
        meta = self.metadata
        for start in range(lac + 1, last + 1, READ_CHUNK_ENTRIES):
            ids = list(range(start, min(last, start + READ_CHUNK_ENTRIES - 1) + 1))
            per_bookie: dict[str, list[int]] = {}
            for e in ids:
                for bookie in meta.write_set_bookies(e):
                    per_bookie.setdefault(bookie, []).append(e)
            held: dict[int, int] = {}
            for entries in await asyncio.gather(*(self._held_on(b, es) for b, es in per_bookie.items())):
                for e in entries:
                    held[e] = held.get(e, 0) + 1
            for e in ids:
                if held.get(e, 0) < meta.ack_quorum:
                    return e - 1
        return last

    async def _held_on(self, bookie_id: str, entries: list[int]) -> list[int]:
        """The entries of `entries` that the bookie returns (a read limit may cut the answer: fewer, never more)."""
        try:
            response = await self._client.bookie_client(bookie_id).read(
                self.ledger_id, entries, timeout_s=self._client.options.read_timeout_s)
        except BookieUnavailableError:
            return []
        if response.error:
            return []
        return [item.entry_id for item in response.entries if item.code == pb.OK]

    def _check_range(self, first: int, last: int, unconfirmed: bool) -> None:
        if first < 0 or last < first:
            raise ValueError(f"invalid range [{first}, {last}]: need 0 <= first <= last")
        if unconfirmed and not self.metadata.closed:
            return
        if last > self.last_entry_id:
            what = ("the closed ledger's last entry" if self.metadata.closed else
                    "the open ledger's last-add-confirmed: entries past it may be read with unconfirmed=True, "
                    "and may vanish")
            raise ReadError(f"ledger {self.ledger_id}: entry {last} is past the last readable entry "
                            f"{self.last_entry_id} ({what})")

    async def read(self, first: int, last: int, *, unconfirmed: bool = False) -> AsyncIterator[Entry]:
        """Entries first..last inclusive, in order. `last` may not pass last_entry_id (the LAC of an open
        ledger) unless `unconfirmed` (see read_batches)."""
        async for batch in self.read_batches(first, last, unconfirmed=unconfirmed):
            for entry in batch:
                yield entry

    async def read_batches(self, first: int, last: int, *, unconfirmed: bool = False) -> AsyncIterator[list[Entry]]:
        """Entries first..last inclusive, in order, a list per chunk: chunks of about read_batch_bytes read
        from several bookies in parallel, up to read_ahead_bytes_max ahead of the consumer.

        `last` may not pass last_entry_id (ReadError). With `unconfirmed=True` an open ledger is read past its
        LAC, up to `last` (read_unconfirmed_last_entry tells how far the bookies hold entries): such entries are
        not acknowledged and may vanish, since a recovery open may close the ledger before them. An entry no
        bookie of its write set holds is a ReadError. A closed ledger is never read past its last entry."""
        first, last = check_int("first", first), check_int("last", last)
        self._check_range(first, last, check_bool("unconfirmed", unconfirmed))
        opts = self._client.options
        chunk = min(FIRST_CHUNK_ENTRIES, last - first + 1)
        entry_bytes = 0.0  # average payload size seen, 0 before the first chunk
        pending: deque[tuple[range, asyncio.Task[dict[int, bytes]], int]] = deque()
        ahead = 0  # estimated bytes of the chunks in flight
        start = first
        try:
            while start <= last or pending:
                while start <= last and (not pending or (
                        entry_bytes and len(pending) < CHUNKS_IN_FLIGHT_MAX
                        and ahead + chunk * entry_bytes <= opts.read_ahead_bytes_max)):
                    ids = range(start, min(last, start + chunk - 1) + 1)
                    estimate = int(len(ids) * entry_bytes)
                    pending.append((ids, asyncio.create_task(self._read_chunk(ids, spread=True)), estimate))
                    ahead += estimate
                    start = ids.stop
                ids, task, estimate = pending.popleft()
                found = await task
                ahead -= estimate
                size = sum(map(len, found.values()))
                # The chunk size follows the entries' size: about read_batch_bytes a chunk.
                entry_bytes = max(1.0, size / len(ids)) if not entry_bytes else \
                    0.8 * entry_bytes + 0.2 * max(1.0, size / len(ids))
                chunk = max(CHUNK_ENTRIES_MIN, min(CHUNK_ENTRIES_MAX, int(opts.read_batch_bytes / entry_bytes)))
                lid = self.ledger_id
                yield [Entry(lid, entry_id, found[entry_id]) for entry_id in ids]
        finally:
            tasks = [task for _, task, _ in pending]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def read_entries(self, ids: list[int], *, unconfirmed: bool = False) -> dict[int, bytes]:
        """The payloads of the given entries, each from its write set (failover and speculation as read());
        ReadError if one cannot be read from any replica. The ids may not pass last_entry_id unless
        `unconfirmed` (as read_batches)."""
        if ids:
            self._check_range(min(ids), max(ids), unconfirmed)
        found: dict[int, bytes] = {}
        for start in range(0, len(ids), READ_CHUNK_ENTRIES):
            found.update(await self._read_chunk(ids[start:start + READ_CHUNK_ENTRIES]))
        return found

    # -- tailing ---------------------------------------------------------------------------------------
    async def tail(self, from_entry: int = 0) -> AsyncIterator[Entry]:
        """Every entry from `from_entry` on, in order, each once, as the writer gets it acknowledged: entries
        already readable first, then each new one as the bookies learn its LAC. Ends after the last entry
        of the ledger once it is closed (by its writer or a recovery); a deleted ledger raises
        NoSuchLedgerError. Cancel the iteration (or break out of it) to stop following."""
        async for batch in self.tail_batches(from_entry):
            for entry in batch:
                yield entry

    async def tail_batches(self, from_entry: int = 0) -> AsyncIterator[list[Entry]]:
        """tail(), a list of entries at a time (what one LAC advance made readable, or a catch-up chunk)."""
        next_id = check_int("from_entry", from_entry, minimum=0)
        stash: dict[int, bytes] = {}  # entries a long-poll answer brought, not yet yielded
        quick_failures = 0
        while True:
            last = self.last_entry_id  # the LAC of an open ledger: a tail never yields an unconfirmed entry
            if next_id <= last:
                if last - next_id >= TAIL_ENTRIES_MAX and not stash:  # far behind: a catch-up read
                    async for batch in self._with_metadata_retry_batches(next_id, last):
                        yield batch
                else:
                    ids = range(next_id, last + 1)
                    missing = [e for e in ids if e not in stash]
                    if missing:
                        # Usually the answer's tail past its byte limit: a range, spread over the bookies.
                        contiguous = missing[-1] - missing[0] + 1 == len(missing)
                        stash.update(await self._read_following(
                            range(missing[0], missing[-1] + 1) if contiguous else missing))
                    yield [Entry(self.ledger_id, e, stash[e]) for e in ids]
                stash.clear()
                next_id = last + 1
                continue
            if self.metadata.closed:
                return
            started = asyncio.get_running_loop().time()
            progressed, look = await self._poll_tail(next_id - 1, stash)
            if progressed:
                quick_failures = 0
                if not look:
                    continue
            if look:
                await self._refresh_metadata()
            if progressed or self.metadata.closed:
                continue
            # A round that ended at once without progress (a bookie down, a fence with the close still to come):
            # the next bookie is tried at once, then the rounds slow down. A round that waited does not.
            if asyncio.get_running_loop().time() - started < self._client.options.tail_wait_ms / 2000:
                quick_failures += 1
                if quick_failures > 1:
                    await asyncio.sleep(min(TAIL_RETRY_S_MAX, TAIL_RETRY_S_MIN * 2 ** min(quick_failures, 10)))
            else:
                quick_failures = 0

    async def _poll_tail(self, previous: int, stash: dict[int, bytes]) -> tuple[bool, bool]:
        """One long poll (ReadTail) on one bookie of the last ensemble, the one the reader follows now.
        Returns (progress, look): progress when the LAC passed `previous`; look when the metadata should be
        read again (a fence, a write-close, a wait that ended without progress, a bookie that failed). A
        bookie that fails, hangs past the wait, or had nothing new is left for the next one of the ensemble,
        so a stopped or replaced bookie holds the reader up for one wait at most."""
        meta = self.metadata
        opts = self._client.options
        ensemble = meta.last_ensemble
        if self._tail_bookie not in ensemble:
            self._tail_bookie = meta.write_set_bookies(previous + 1)[0]
        bookie_id = self._tail_bookie
        wait_s = opts.tail_wait_ms / 1000
        try:
            answer = await self._client.bookie_client(bookie_id).read_tail(
                self.ledger_id, previous, opts.tail_wait_ms, TAIL_ENTRIES_MAX,
                timeout_s=wait_s + min(opts.read_timeout_s, TAIL_HANG_SLACK_S))
        except BookieUnavailableError as e:
            log.debug("ledger %d: tailing read on bookie %s failed: %s", self.ledger_id, bookie_id, e)
            await self._client.moved(bookie_id)
            self._next_tail_bookie(ensemble)
            return False, True
        if answer.error == pb.INVALID:
            raise ReadError(f"ledger {self.ledger_id}: bookie {bookie_id} refused the tailing read: "
                            f"{answer.error_message}")
        look = bool(answer.fenced or answer.write_closed)
        if answer.error or answer.last_add_confirmed <= previous:  # nothing new (or not known there, BUSY)
            self._next_tail_bookie(ensemble)
            return False, True
        lac = int(answer.last_add_confirmed)
        if lac > self._lac:
            self._lac = lac
        for item in answer.entries:
            if item.code == pb.OK and previous < item.entry_id <= lac:
                stash[item.entry_id] = item.payload
        return True, look

    def _next_tail_bookie(self, ensemble: tuple[str, ...]) -> None:
        k = ensemble.index(self._tail_bookie) if self._tail_bookie in ensemble else -1
        self._tail_bookie = ensemble[(k + 1) % len(ensemble)]

    async def _refresh_metadata(self) -> None:
        """Read the ledger's metadata again (a new ensemble, a close); an etcd outage is waited out by the
        caller's next round. NoSuchLedgerError when the ledger was deleted."""
        try:
            meta, _ = await self._client.metadata_store.read_ledger(self.ledger_id)
        except MetadataUnavailableError as e:
            log.info("ledger %d: tailing reader cannot read metadata: %s", self.ledger_id, e)
            return
        if meta.ensembles != self.metadata.ensembles:
            await self._client.bookies(refresh=True)
        self.metadata = meta

    async def _read_following(self, ids: Sequence[int]) -> dict[int, bytes]:
        """read_entries for a tailing reader: a failure may be a stale ensemble, so the metadata is read again
        and the read retried before the error is raised."""
        for attempt in range(TAIL_READ_ATTEMPTS):
            try:
                return await self._read_chunk(ids, spread=True)
            except ReadError:
                if attempt == TAIL_READ_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(TAIL_RETRY_S_MIN * 2 ** attempt)
                await self._refresh_metadata()
        raise AssertionError("unreachable")

    async def _with_metadata_retry_batches(self, first: int, last: int) -> AsyncIterator[list[Entry]]:
        next_id = first
        for attempt in range(TAIL_READ_ATTEMPTS):
            if next_id > last:
                return
            try:
                async for batch in self.read_batches(next_id, last):
                    yield batch
                    next_id = batch[-1].entry_id + 1
                return
            except ReadError:
                if attempt == TAIL_READ_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(TAIL_RETRY_S_MIN * 2 ** attempt)
                await self._refresh_metadata()

    async def _read_chunk(self, ids: Sequence[int], spread: bool = False) -> dict[int, bytes]:
        if self._client.tracing.sampling.enabled:
            with self._client.tracing.operation("octavo.read", **{
                    "octavo.ledger_id": self.ledger_id, "octavo.entries": len(ids)}):
                return await self._read_chunk_untraced(ids, spread)
        return await self._read_chunk_untraced(ids, spread)

    async def _read_chunk_untraced(self, ids: Sequence[int], spread: bool) -> dict[int, bytes]:
        found, errors = await self.read_available(ids, spread=spread)
        if len(found) < len(ids):
            missing = next(e for e in ids if e not in found)
            raise ReadError(f"ledger {self.ledger_id}: entry {missing} could not be read from any replica "
                            f"({errors.get(missing, 'no replica left')})")
        return found

    async def read_available(self, ids: Sequence[int], exclude: set[str] | frozenset[str] = frozenset(),
                             spread: bool = False, unanswered: set[int] | None = None
                             ) -> tuple[dict[int, bytes], dict[int, str]]:
        """Every entry of `ids` that some replica gives (bookies in `exclude` are not asked), and for each
        other entry the last error seen; `unanswered` gets those a registered replica could not be reached about
        (re-replication copies what exists, reports as lost what is denied, retries the unanswered).
        With `spread`, a range is first split over the bookies that all hold it (see the module doc). The
        bookies tried per entry are recorded only for entries a round did not find, so a read where every
        bookie answers costs no set per entry."""
        found: dict[int, bytes] = {}
        tried: dict[int, set[str]] = {}
        errors: dict[int, str] = {}
        groups = self._spread(ids, exclude) if spread else None
        remaining: Sequence[int] = ids
        while True:
            if groups is None:
                groups = self._group(remaining, tried, exclude)
                if not groups:
                    return found, {e: errors.get(e, "no replica left") for e in remaining}
            await self._read_groups(groups, tried, exclude, found, errors, unanswered)
            if self._corrupt:
                self._report_corrupt(found)
            if len(found) == len(ids):
                return found, {}
            remaining = [e for e in ids if e not in found]
            groups = None

    def _report_corrupt(self, found: dict[int, bytes]) -> None:
        """Read repair (damage.py): the copies that answered CORRUPT for entries another replica gave."""
        damaged: dict[str, list[int]] = {}
        reason = ""
        for entry in [e for e in self._corrupt if e in found]:
            for bookie_id, message in self._corrupt.pop(entry).items():
                damaged.setdefault(bookie_id, []).append(entry)
                reason = reason or message
        if damaged:
            store = self._client.metadata_store
            report_damage(store.etcd, store.layout, self.ledger_id, damaged, reason)

    def _spread(self, ids: Sequence[int], exclude: set[str] | frozenset[str]) -> dict[str, Sequence[int]] | None:
        """A range inside one segment whose bookies all hold every entry, split into one contiguous part per
        bookie (parts of at least SPLIT_ENTRIES_MIN entries; which bookie starts rotates with the range, so
        consecutive chunks start on different bookies). None when the range has another shape."""
        meta = self.metadata
        if not isinstance(ids, range) or ids.step != 1 or not ids or meta.ensemble_size != meta.write_quorum:
            return None
        segment = 0
        for k, (first, _) in enumerate(meta.ensembles):
            if first <= ids.start:
                segment = k
        if segment + 1 < len(meta.ensembles) and meta.ensembles[segment + 1][0] <= ids[-1]:
            return None
        ensemble = [b for b in meta.ensembles[segment][1] if b not in exclude]
        if not ensemble:
            return None
        parts = max(1, min(len(ensemble), len(ids) // SPLIT_ENTRIES_MIN))
        size = -(-len(ids) // parts)
        turn = ids.start // size
        return {ensemble[(k + turn) % len(ensemble)]: ids[k * size:(k + 1) * size] for k in range(parts)}

    def _group(self, entries: Sequence[int], tried: dict[int, set[str]],
               exclude: set[str] | frozenset[str]) -> dict[str, Sequence[int]]:
        """Each entry to the first bookie of its write set not tried for it yet."""
        groups: dict[str, list[int]] = {}
        for e in entries:
            done = tried.get(e, exclude)
            for bookie in self.metadata.write_set_bookies(e):
                if bookie not in done:
                    groups.setdefault(bookie, []).append(e)
                    break
        return groups  # type: ignore[return-value]

    async def _read_groups(self, groups: dict[str, Sequence[int]], tried: dict[int, set[str]],
                           exclude: set[str] | frozenset[str], found: dict[int, bytes],
                           errors: dict[int, str], unanswered: set[int] | None = None) -> None:
        asked: list[tuple[str, Sequence[int]]] = list(groups.items())
        tasks: dict[asyncio.Task[None], str] = {
            asyncio.create_task(self._read_from(bookie, entries, found, errors, unanswered)): bookie
            for bookie, entries in groups.items()}
        _, pending = await asyncio.wait(tasks, timeout=self._client.options.speculative_read_delay_s)
        if pending:
            # Speculative reads: the slow bookies' entries go to their next replica too.
            self._client.metrics.speculative_reads.add(len(pending))
            self._note_tried(asked, tried, exclude, found)
            asked = []
            slow = [e for task in pending for e in groups[tasks[task]] if e not in found]
            for bookie, entries in self._group(slow, tried, exclude).items():
                asked.append((bookie, entries))
                tasks[asyncio.create_task(self._read_from(bookie, entries, found, errors, unanswered))] = bookie
            await asyncio.wait(tasks)
        self._note_tried(asked, tried, exclude, found)

    @staticmethod
    def _note_tried(asked: list[tuple[str, Sequence[int]]], tried: dict[int, set[str]],
                    exclude: set[str] | frozenset[str], found: dict[int, bytes]) -> None:
        """Record which bookie each entry not found was asked of (the next round asks another)."""
        for bookie, entries in asked:
            for e in entries:
                if e not in found:
                    done = tried.get(e)
                    if done is None:
                        done = tried[e] = set(exclude)
                    done.add(bookie)

    async def _read_from(self, bookie_id: str, entries: Sequence[int], found: dict[int, bytes],
                         errors: dict[int, str], unanswered: set[int] | None = None) -> None:
        """Read `entries` from one bookie into `found`; an answer cut short by the bookie's read limits (its
        last entry OK, fewer than asked) is continued on the same bookie."""
        timeout_s = self._client.options.read_timeout_s
        latency = self._client.metrics.read_latency
        while entries:
            t0 = time.perf_counter()
            try:
                try:
                    response = await self._client.bookie_client(bookie_id).read(self.ledger_id, entries,
                                                                                timeout_s=timeout_s)
                except BookieUnavailableError:
                    if not await self._client.moved(bookie_id):
                        raise
                    response = await self._client.bookie_client(bookie_id).read(self.ledger_id, entries,
                                                                                timeout_s=timeout_s)
            except BookieUnavailableError as e:  # registered, it may hold them
                _unreadable(entries, str(e), errors, unanswered, bookie_id in self._client.registrations)
                return
            latency.record(time.perf_counter() - t0)
            if response.error:
                # An answer (UNKNOWN from a bookie that may have lost its tail, a refusal): not "may hold".
                _unreadable(entries, f"bookie {bookie_id}: {response.error_message}", errors, unanswered, False)
                return
            items = response.entries
            # Entries never change once written, so a copy from a speculative read may overwrite another.
            good = [(item.entry_id, item.payload) for item in items if not item.code]
            found.update(good)
            if len(good) < len(items):
                for item in items:
                    if item.code:
                        errors[item.entry_id] = f"bookie {bookie_id}: {item.message}"
                        if item.code == pb.CORRUPT:  # read repair: reported once another replica gives it
                            self._corrupt.setdefault(item.entry_id, {})[bookie_id] = item.message
            n = len(items)
            if not 0 < n < len(entries) or items[n - 1].code != pb.OK:
                return
            entries = entries[n:]

    async def close(self) -> None:
        """Nothing to release today; kept so read and write handles are used the same way."""

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
