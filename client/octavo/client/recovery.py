"""Recovery open (BookKeeper's ledger recovery, BP-32): take a ledger over from a writer that may still be
alive, find its true last entry, and close it.

1. CAS the ledger to IN_RECOVERY in etcd (a ledger already IN_RECOVERY is recovered again: concurrent
   recoveries converge, see 6).
2. Fence: a fenced LAC read to every bookie of the last ensemble. Each fences the ledger (adds from the old
   writer fail from then on), syncs the fence, and rotates its log. Wait until every write quorum has
   (Qw - Qa) + 1 fenced bookies: then no ack quorum of the old writer can complete any more.
3. LAC = the highest LAC answered; every entry up to it is acknowledged.
4. Read forward from LAC + 1: an entry found on any bookie of its write set is re-replicated to the whole
   write set with recovery adds (they pass the fence) and needs Qa of them to succeed.
5. Stop at the first entry that (Qw - Qa) + 1 bookies of its write set say they do not have. A bookie whose
   unclean restart may have lost its tail (it answers UNKNOWN, or maybe_lost_tail) never counts as a "do not
   have": one bookie's lost tail can never make recovery close short of an acknowledged entry. If the
   answers cannot decide, recovery fails (RecoveryError) and closes nothing.
6. CAS to CLOSED with the last entry. If another recovery closed it first, its result stands.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from octavo.client.errors import BookieUnavailableError, RecoveryError, WrongPasswordError
from octavo.client.ledger_metadata import CLOSED, IN_RECOVERY, LedgerMetadata, write_set
from octavo.v1 import bookie_pb2 as pb

if TYPE_CHECKING:
    from octavo.client.client import Client

log = logging.getLogger(__name__)

RECOVERY_CAS_ATTEMPTS_MAX = 20


def fence_coverage_ok(meta: LedgerMetadata, fenced: set[str]) -> bool:
    """Every write quorum of the last ensemble has at least (Qw - Qa) + 1 fenced bookies."""
    ensemble = meta.last_ensemble
    need = meta.write_quorum - meta.ack_quorum + 1
    for start in range(meta.ensemble_size):
        quorum = {ensemble[p] for p in write_set(start, meta.ensemble_size, meta.write_quorum)}
        if len(quorum & fenced) < need:
            return False
    return True


async def recover_ledger(client: Client, ledger_id: int, master_key: bytes) -> LedgerMetadata:
    store = client.metadata_store
    meta, revision = await store.read_ledger(ledger_id)
    for _ in range(RECOVERY_CAS_ATTEMPTS_MAX):
        if meta.state == CLOSED:
            return meta
        if meta.state == IN_RECOVERY:
            break
        marked = meta.with_state(IN_RECOVERY)
        new_revision = await store.update_ledger(marked, revision)
        if new_revision is not None:
            meta, revision = marked, new_revision
            break
        meta, revision = await store.read_ledger(ledger_id)
    else:
        raise RecoveryError(f"ledger {ledger_id}: could not mark it IN_RECOVERY (metadata kept changing)")

    lac, suspect = await _fence(client, meta, master_key)
    last = await _read_forward(client, meta, master_key, lac, suspect)
    for _ in range(RECOVERY_CAS_ATTEMPTS_MAX):
        closed = meta.with_state(CLOSED, last_entry_id=last, length=-1)
        if await store.update_ledger(closed, revision) is not None:
            log.info("ledger %d recovered and closed at entry %d", ledger_id, last)
            return closed
        meta, revision = await store.read_ledger(ledger_id)
        if meta.state == CLOSED:
            if meta.last_entry_id != last:
                log.error("ledger %d: another recovery closed it at %d, this one found %d", ledger_id,
                          meta.last_entry_id, last)
            return meta
    raise RecoveryError(f"ledger {ledger_id}: could not close it (metadata kept changing)")


async def _fence(client: Client, meta: LedgerMetadata, master_key: bytes) -> tuple[int, set[str]]:
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
        if answer.code != pb.OK:
            continue
        fenced.add(bookie)
        lac = max(lac, answer.last_add_confirmed)
        if answer.maybe_lost_tail:
            suspect.add(bookie)
    if not fence_coverage_ok(meta, fenced):
        raise RecoveryError(f"ledger {meta.ledger_id}: only {sorted(fenced)} of {list(meta.last_ensemble)} could be "
                            f"fenced; every write quorum needs {meta.write_quorum - meta.ack_quorum + 1}")
    return lac, suspect


async def _fence_one(client: Client, bookie: str, ledger_id: int, master_key: bytes) -> Any:
    try:
        return await client.bookie_client(bookie).read_lac(ledger_id, fence=True, master_key=master_key,
                                                          timeout_s=client.options.read_timeout_s)
    except BookieUnavailableError as e:
        log.info("ledger %d: fencing bookie %s failed: %s", ledger_id, bookie, e)
        return None


async def _read_forward(client: Client, meta: LedgerMetadata, master_key: bytes, lac: int,
                        suspect: set[str]) -> int:
    """Find and re-replicate the entries after the LAC; returns the last entry id."""
    need_negative = meta.write_quorum - meta.ack_quorum + 1
    entry = lac + 1
    while True:
        bookies = meta.write_set_bookies(entry)
        answers = await asyncio.gather(*(_read_one(client, b, meta.ledger_id, entry) for b in bookies))
        payload = next((a.payload for a in answers if a is not None and a.code == pb.OK), None)
        if payload is not None:
            await _replicate(client, meta, master_key, entry, payload, bookies)
            entry += 1
            continue
        negatives = sum(1 for b, a in zip(bookies, answers, strict=True)
                        if a is not None and a.code in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER) and b not in suspect)
        if negatives >= need_negative:
            return entry - 1
        raise RecoveryError(
            f"ledger {meta.ledger_id}: cannot tell whether entry {entry} exists: {negatives} bookies of "
            f"{bookies} said it does not, {need_negative} must (others were unreachable or may have lost their tail)")


async def _read_one(client: Client, bookie: str, ledger_id: int, entry: int) -> Any:
    try:
        response = await client.bookie_client(bookie).read(ledger_id, [entry],
                                                           timeout_s=client.options.read_timeout_s)
    except BookieUnavailableError:
        return None
    if response.error:
        return pb.ReadEntry(entry_id=entry, code=response.error, message=response.error_message)
    return response.entries[0] if response.entries else None


async def _replicate(client: Client, meta: LedgerMetadata, master_key: bytes, entry: int, payload: bytes,
                     bookies: list[str]) -> None:
    async def one(bookie: str) -> bool:
        try:
            codes = await client.bookie_client(bookie).add(meta.ledger_id, master_key, [entry], [payload],
                                                           entry - 1, recovery=True)
        except BookieUnavailableError:
            return False
        return codes == [pb.OK]

    oks = await asyncio.gather(*(one(b) for b in bookies))
    if sum(oks) < meta.ack_quorum:
        raise RecoveryError(f"ledger {meta.ledger_id}: entry {entry} could be re-replicated to only {sum(oks)} of "
                            f"{bookies}; {meta.ack_quorum} needed")

