"""Recovery open (BookKeeper's ledger recovery, BP-32): take a ledger over from a writer that may still be
alive, find its true last entry, and close it.

1. CAS the ledger to IN_RECOVERY in etcd (a ledger already IN_RECOVERY is recovered again: concurrent
   recoveries converge, see 6).
2. Fence: a fenced LAC read to every bookie of the last ensemble. Each fences the ledger (adds from the old
   writer fail from then on), syncs the fence, and rolls its log. Wait until every write quorum has
   (Qw - Qa) + 1 fenced bookies: then no ack quorum of the old writer can complete any more.
3. LAC = the highest LAC answered; every entry up to it is acknowledged.
4. Read forward from LAC + 1, in windows of ids that start small and double while every id is found
   (RecoveryWindow): an entry found on any bookie of its write set is re-replicated to the whole
   write set with recovery adds (they pass the fence) and needs Qa of them to succeed. A bookie of the last
   ensemble that cannot be reached when an entry falls short of Qa (with Qw = Qa, one lost bookie is enough) is
   replaced, as BookKeeper's recovery changes the ensemble: a registered bookie outside the ensemble
   (placement.choose_replacement) gets the recovered entries whose write set now holds it, and the close in 6
   writes a new last segment from LAC + 1 with it. Reads and their verdicts keep the fenced ensemble.
5. Stop at the first entry that (Qw - Qa) + 1 bookies of its write set say they do not have. A bookie whose
   unclean restart may have lost its tail (it answers UNKNOWN, or tail_maybe_lost) never counts as a "do not
   have": one bookie's lost tail can never make recovery close short of an acknowledged entry. If the
   answers cannot decide, recovery fails (RecoveryError) and closes nothing.
6. CAS to CLOSED with the last entry. If another recovery closed it first, its result stands.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from octavo.client.context import ClientContext
from octavo.client.ensemble_change import replacement_now
from octavo.client.quorums import Answer, EntryAnswers, Verdict, fence_coverage_ok, recovery_verdict
from octavo.meta.errors import BookieUnavailableError, PermissionDeniedError, RecoveryError, WrongPasswordError
from octavo.meta.ledger_metadata import CLOSED, IN_RECOVERY, LENGTH_UNKNOWN, OPEN, LedgerMetadata
from octavo.meta.retry import CasRetry
from octavo.v1 import bookie_pb2 as pb

log = logging.getLogger(__name__)

RECOVERY_CAS_ATTEMPTS_MAX = 20

# How many ids past the LAC one read of recovery asks each bookie of their write sets for. Most tails are empty
# or a few entries (the adds in flight when the writer stopped), and every id past the end still costs each
# bookie of its write set a NO_SUCH_ENTRY answer (each id needs one from each bookie: recovery_verdict), so the
# first window is small; a window whose every id was found hints at a long tail, so the next one doubles, up to
# the maximum: a tail of n entries takes about log2(n / first) round trips more than whole maximum windows.
RECOVERY_WINDOW_FIRST_ENTRIES = 16
RECOVERY_WINDOW_ENTRIES_MAX = 1000


@dataclasses.dataclass(frozen=True)
class RecoveryWindow:
    """The window of recovery's reads forward: `first_entries` ids first, doubled after a window whose every
    id was found, never more than `entries_max` (1 <= first_entries <= entries_max)."""

    first_entries: int = RECOVERY_WINDOW_FIRST_ENTRIES
    entries_max: int = RECOVERY_WINDOW_ENTRIES_MAX

    def __post_init__(self) -> None:
        if not 1 <= self.first_entries <= self.entries_max:
            raise ValueError(f"a recovery window needs 1 <= first_entries <= entries_max, got {self.first_entries} "
                             f"and {self.entries_max}")

    def next_entries(self, window_entries: int, all_found: bool) -> int:
        """The size of the window after one of `window_entries` ids: doubled (at most entries_max) when every
        id was found; else the same (a window that ended neither found everything nor the end: a read limit
        cut a reply short, and the next window asks again from the first id it did not get)."""
        if not self.first_entries <= window_entries <= self.entries_max:
            raise ValueError(f"window of {window_entries} ids outside [{self.first_entries}, {self.entries_max}]")
        return min(window_entries * 2, self.entries_max) if all_found else window_entries


DEFAULT_WINDOW = RecoveryWindow()


async def recover_ledger(client: ClientContext, ledger_id: int, master_key: bytes,
                         window: RecoveryWindow = DEFAULT_WINDOW) -> LedgerMetadata:
    """Recover and close the ledger (the steps in the module's docstring); `window`: how many ids past the LAC
    each read asks for (a benchmark sets it to compare sizes)."""
    store = client.metadata_store
    meta, revision = await store.read_ledger(ledger_id)
    retry = CasRetry(f"ledger {ledger_id}: marking it IN_RECOVERY", RECOVERY_CAS_ATTEMPTS_MAX, error=RecoveryError)
    while meta.state == OPEN:
        marked = meta.with_state(IN_RECOVERY)
        new_revision = await store.update_ledger(marked, revision)
        if new_revision is not None:
            meta, revision = marked, new_revision
            break
        meta, revision = await store.read_ledger(ledger_id)
        await retry.lost(f"revision {revision} ({meta.state}, {len(meta.ensembles)} segments)")
    if meta.state == CLOSED:
        return meta

    fenced_meta = meta
    lac, suspect = await _fence(client, meta, master_key)
    last, found_bytes, meta = await _read_forward(client, meta, master_key, lac, suspect, window)
    # Recovery reads only the entries past the LAC: it knows the length only when that was all of them.
    length = found_bytes if lac < 0 else LENGTH_UNKNOWN
    retry = CasRetry(f"ledger {ledger_id}: closing it after recovery", RECOVERY_CAS_ATTEMPTS_MAX,
                     error=RecoveryError)
    while True:
        closed = meta.with_state(CLOSED, last_entry_id=last, length=length)
        if await store.update_ledger(closed, revision) is not None:
            log.info("ledger %d recovered and closed at entry %d", ledger_id, last,
                     extra={"event": "ledger_recovered", "ledger_id": ledger_id})
            return closed
        current, revision = await store.read_ledger(ledger_id)
        if current.state == CLOSED:
            if current.last_entry_id != last:
                log.error("ledger %d: another recovery closed it at %d, this one found %d", ledger_id,
                          current.last_entry_id, last)
            return current
        if meta.ensembles == fenced_meta.ensembles:
            meta = current
        elif current.ensembles == fenced_meta.ensembles:  # keep the segment with the replacement
            meta = dataclasses.replace(current, ensembles=meta.ensembles)
        else:
            raise RecoveryError(f"ledger {ledger_id}: its ensembles changed in etcd while this recovery replaced "
                                "a bookie: recover it again")
        await retry.lost(f"revision {revision} ({meta.state}, {len(meta.ensembles)} segments)")


async def _fence(client: ClientContext, meta: LedgerMetadata, master_key: bytes) -> tuple[int, set[str]]:
    """Fence the last ensemble; returns (the highest LAC, bookies that may have lost their tail)."""
    answers = await asyncio.gather(*(
        _fence_one(client, bookie, meta.ledger_id, master_key) for bookie in meta.last_ensemble))
    fenced: set[str] = set()
    suspect: set[str] = set()
    lac = meta.ensembles[-1][0] - 1  # entries before the last segment were acknowledged before it began
    for bookie, answer in zip(meta.last_ensemble, answers, strict=True):
        if answer is None:
            continue
        if answer.code == pb.UNAUTHORIZED:
            raise WrongPasswordError(f"bookie {bookie} refused the master key of ledger {meta.ledger_id}")
        if answer.code == pb.PERMISSION_DENIED:
            raise PermissionDeniedError(f"bookie {bookie} refused ledger {meta.ledger_id} to this client: "
                                        f"{answer.message}")
        if answer.code != pb.OK:
            continue
        fenced.add(bookie)
        lac = max(lac, answer.last_add_confirmed)
        if answer.tail_maybe_lost:
            suspect.add(bookie)
    if not fence_coverage_ok(meta.last_ensemble, meta.write_quorum, meta.ack_quorum, fenced):
        raise RecoveryError(f"ledger {meta.ledger_id}: only {sorted(fenced)} of {list(meta.last_ensemble)} could be "
                            f"fenced; every write quorum needs {meta.write_quorum - meta.ack_quorum + 1}")
    return lac, suspect


async def _with_moved_retry(client: ClientContext, bookie: str, call: Any) -> Any:
    """Run call(bookie client); if it fails because the bookie restarted at another address, once more there."""
    try:
        return await call(client.bookie_client(bookie))
    except BookieUnavailableError:
        if not await client.moved(bookie):
            raise
        return await call(client.bookie_client(bookie))


async def _fence_one(client: ClientContext, bookie: str, ledger_id: int, master_key: bytes) -> Any:
    try:
        return await _with_moved_retry(client, bookie, lambda c: c.read_lac(
            ledger_id, fence=True, master_key=master_key, timeout_s=client.options.read_timeout_s))
    except BookieUnavailableError as e:
        log.info("ledger %d: fencing bookie %s failed: %s", ledger_id, bookie, e)
        return None


async def _read_forward(client: ClientContext, meta: LedgerMetadata, master_key: bytes, lac: int,
                        suspect: set[str], window: RecoveryWindow) -> tuple[int, int, LedgerMetadata]:
    """Find and re-replicate the entries after the LAC, a window of ids at a time (one read request and one
    recovery add per bookie per window; the window grows while every id of it is found, see RecoveryWindow);
    returns the last entry id, the payload bytes found, and the metadata to close with (`meta`, or with a new
    last segment from LAC + 1 if a bookie was replaced)."""
    need_negative = meta.write_quorum - meta.ack_quorum + 1
    entry = lac + 1
    found_bytes = 0
    written = meta  # the ensembles the recovered entries are written to
    window_entries = window.first_entries
    while True:
        ids = list(range(entry, entry + window_entries))
        answers = await _read_window(client, meta, ids)
        found: list[tuple[int, bytes]] = []
        decided_last: int | None = None
        for e in ids:
            bookies = meta.write_set_bookies(e)
            replies = [answers.get((b, e), _UNREACHABLE) for b in bookies]
            said = EntryAnswers(tuple(map(_answer, replies)), tuple(b in suspect for b in bookies))
            verdict = recovery_verdict(said, meta.write_quorum, meta.ack_quorum)
            if verdict is Verdict.FOUND:
                found.append((e, next(r.payload for r in replies if _answer(r) is Answer.HAS)))
                continue
            if verdict is Verdict.RETRY:
                break  # a read limit cut a reply short: continue from this entry in the next window
            if verdict is Verdict.END:
                decided_last = e - 1
                break
            denials = sum(1 for a, s in zip(said.answers, said.suspect, strict=True) if a is Answer.HAS_NOT and not s)
            raise RecoveryError(
                f"ledger {meta.ledger_id}: cannot tell whether entry {e} exists: {denials} bookies of {bookies} "
                f"said it does not, {need_negative} must (others were unreachable or may have lost their tail)")
        if found:
            written = await _replicate(client, written, master_key, found, lac)
            found_bytes += sum(len(payload) for _, payload in found)
        if decided_last is not None:
            return decided_last, found_bytes, written
        window_entries = window.next_entries(window_entries, all_found=len(found) == len(ids))
        entry = found[-1][0] + 1 if found else entry


_UNREACHABLE: Any = object()
_NOT_RETURNED: Any = object()


def _answer(reply: Any) -> Answer:
    if reply is _UNREACHABLE:
        return Answer.UNKNOWN
    if reply is _NOT_RETURNED:
        return Answer.CUT_SHORT
    if reply.code == pb.OK:
        return Answer.HAS
    if reply.code in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER):
        return Answer.HAS_NOT
    return Answer.UNKNOWN


async def _read_window(client: ClientContext, meta: LedgerMetadata, ids: list[int]) -> dict[tuple[str, int], Any]:
    per_bookie: dict[str, list[int]] = {}
    for e in ids:
        for bookie in meta.write_set_bookies(e):
            per_bookie.setdefault(bookie, []).append(e)

    async def one(bookie: str, entries: list[int]) -> dict[tuple[str, int], Any]:
        try:
            response = await _with_moved_retry(client, bookie, lambda c: c.read(
                meta.ledger_id, entries, timeout_s=client.options.read_timeout_s))
        except BookieUnavailableError:
            return {}
        if response.error:
            reply = pb.ReadEntry(code=response.error, message=response.error_message)
            return {(bookie, e): reply for e in entries}
        got: dict[tuple[str, int], Any] = {(bookie, e): _NOT_RETURNED for e in entries}
        got.update({(bookie, item.entry_id): item for item in response.entries})
        return got

    answers: dict[tuple[str, int], Any] = {}
    for part in await asyncio.gather(*(one(b, es) for b, es in per_bookie.items())):
        answers.update(part)
    return answers


async def _replicate(client: ClientContext, meta: LedgerMetadata, master_key: bytes, found: list[tuple[int, bytes]],
                     lac: int) -> LedgerMetadata:
    """Recovery adds of the found entries to their whole write set; each entry needs Qa of them to succeed. A
    bookie that cannot be reached is replaced while an entry falls short; returns the ensembles written to."""
    stored, unreachable = await _recovery_adds(client, meta, master_key, found, lac)
    replacements = 0  # at most one per bookie of the ensemble, and one more (a replacement may be lost too)
    while True:
        short = [e for e, _ in found if len(stored.get(e, set()) & set(meta.write_set_bookies(e))) < meta.ack_quorum]
        if not short:
            return meta
        lost = [b for b in meta.last_ensemble if b in unreachable and b in meta.write_set_bookies(short[0])]
        if not lost or replacements > len(meta.last_ensemble):
            raise RecoveryError(f"ledger {meta.ledger_id}: entry {short[0]} could be re-replicated to fewer than "
                                f"{meta.ack_quorum} bookies of {meta.write_set_bookies(short[0])}")
        replacements += 1
        meta, replacement = await _replaced(client, meta, lost[0], lac, max(len(p) for _, p in found))
        more, gone = await _recovery_adds(client, meta, master_key,
                                          [(e, p) for e, p in found if replacement in meta.write_set_bookies(e)],
                                          lac, only=replacement)
        for e, bookies in more.items():
            stored.setdefault(e, set()).update(bookies)
        unreachable |= gone


async def _recovery_adds(client: ClientContext, meta: LedgerMetadata, master_key: bytes,
                         found: list[tuple[int, bytes]], lac: int, only: str | None = None
                         ) -> tuple[dict[int, set[str]], set[str]]:
    """Recovery adds of `found` to their write sets (or to bookie `only` of them): which bookies stored each
    entry, and which bookies could not be reached."""
    per_bookie: dict[str, list[tuple[int, bytes]]] = {}
    for e, payload in found:
        for bookie in meta.write_set_bookies(e):
            if only is None or bookie == only:
                per_bookie.setdefault(bookie, []).append((e, payload))

    async def one(bookie: str, entries: list[tuple[int, bytes]]) -> list[int] | None:
        try:
            codes = await _with_moved_retry(client, bookie, lambda c: c.add(
                meta.ledger_id, master_key, [e for e, _ in entries], [p for _, p in entries], lac, recovery=True))
        except BookieUnavailableError:
            return None
        return [e for (e, _), code in zip(entries, codes, strict=True) if code == pb.OK]

    stored: dict[int, set[str]] = {}
    unreachable: set[str] = set()
    bookies = list(per_bookie)
    for bookie, done in zip(bookies, await asyncio.gather(*(one(b, per_bookie[b]) for b in bookies)), strict=True):
        if done is None:
            unreachable.add(bookie)
            continue
        for e in done:
            stored.setdefault(e, set()).add(bookie)
    return stored, unreachable


async def _replaced(client: ClientContext, meta: LedgerMetadata, lost: str, lac: int, largest_entry: int
                    ) -> tuple[LedgerMetadata, str]:
    """`meta` with a last segment from LAC + 1 in which a registered bookie takes unreachable `lost`'s place (not
    written to etcd: the close writes it, after the replacement got its entries)."""
    choice = await replacement_now(client, meta.last_ensemble, lost, largest_entry)
    if choice.bookie is None:
        raise RecoveryError(f"ledger {meta.ledger_id}: bookie {lost} cannot be reached and no bookie can replace "
                            f"it: {choice.reason}")
    bookies = tuple(choice.bookie if b == lost else b for b in meta.last_ensemble)
    first = lac + 1  # never before the last segment's first entry: the fenced LAC is at least the one before it
    kept = meta.ensembles[:-1] if first == meta.ensembles[-1][0] else meta.ensembles
    log.info("ledger %d: recovery replaces unreachable bookie %s by %s from entry %d", meta.ledger_id, lost,
             choice.bookie, first, extra={"event": "ensemble_change", "ledger_id": meta.ledger_id,
                                          "from_bookie": lost, "to_bookie": choice.bookie})
    # Not LedgerMetadata.with_segment, which refuses a ledger that is not OPEN: only a recovery that fenced the
    # last ensemble may change the ensemble of a ledger IN_RECOVERY, and it writes this in its closing CAS.
    return dataclasses.replace(meta, ensembles=(*kept, (first, bookies))), choice.bookie
