"""What a bookie checks in etcd before it acts on a ledger it holds nothing of (docs/architecture.md, "What a
bookie takes on faith"): the ledger exists, the master key is the one etcd records, and an add from its writer
finds it OPEN with this bookie in its ensembles.

Ledgers etcd said were not open are remembered (bounded, NOT_OPEN_LEDGERS_MAX), so a stream of late adds to a
closed ledger costs etcd one read. A deleted ledger is forgotten: when the deletion watch sees it go (server.py),
and when a lookup finds etcd without it, so an add to it is refused NO_SUCH_LEDGER, not FENCED.

When etcd cannot be asked, the answer is UNAVAILABLE: the refusal is about this moment, not about the ledger or
this bookie, and the writer sends the add to this bookie again (client/octavo/client/refusals.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from octavo.meta.errors import MetadataUnavailableError
from octavo.meta.ledger_metadata import LedgerMetadata
from octavo.node.errors import Code
from octavo.node.lookups import LedgerLookups
from octavo.v1 import bookie_pb2 as pb

# Ledgers remembered as not open: 8 bytes of id and ~100 of dict slot each.
NOT_OPEN_LEDGERS_MAX = 100_000


def unavailable(ledger_id: int, error: MetadataUnavailableError) -> tuple[Code, str]:
    return pb.UNAVAILABLE, (f"ledger metadata cannot be checked: etcd unavailable ({error}); this bookie takes "
                            f"nothing for ledger {ledger_id} until it can: retry")


class LedgerTrust:
    def __init__(self, lookups: LedgerLookups, bookie_id: str, not_open_max: int = NOT_OPEN_LEDGERS_MAX) -> None:
        if not_open_max < 1:
            raise ValueError(f"not_open_max must be at least 1, got {not_open_max}")
        self.lookups = lookups
        self.bookie_id = bookie_id
        self.not_open_max = not_open_max
        # Ledgers etcd says are not open (IN_RECOVERY or CLOSED), with the master key etcd records (b"": none):
        # adds without the recovery flag are refused, recovery adds need that key. The oldest is forgotten
        # first past not_open_max (a forgotten one is looked up again).
        self._not_open: dict[int, bytes] = {}

    def forget(self, ledger_ids: Iterable[int]) -> None:
        """Ledgers etcd deleted: the next contact looks them up again (and finds them gone)."""
        for ledger_id in ledger_ids:
            self._not_open.pop(ledger_id, None)

    def forget_all(self) -> None:
        """Deletes may have been missed (the watch's history was compacted): look every ledger up again."""
        self._not_open.clear()

    async def exists(self, ledger_id: int) -> bool:
        """Whether etcd has the ledger. MetadataUnavailableError if etcd cannot be asked."""
        found = await self.lookups.get(ledger_id) is not None
        if not found:
            self._not_open.pop(ledger_id, None)
        return found

    async def first_contact(self, ledger_id: int, master_key: bytes) -> tuple[Code, str] | LedgerMetadata:
        """A ledger this bookie holds no state for, as etcd has it, before anything is bound to its id here: the
        refusal if etcd does not have it (never created, or deleted) or records another master key, else its
        metadata. A bookie takes nothing on faith for an id the cluster did not create: an id squatted with
        another key would refuse the real writer's adds and the recovery open's fence."""
        if ledger_id < 0:
            return pb.INVALID, f"ledger id must be non-negative, got {ledger_id}"
        try:
            meta = await self.lookups.get(ledger_id)
        except MetadataUnavailableError as e:
            return unavailable(ledger_id, e)
        if meta is None:
            self._not_open.pop(ledger_id, None)
            return pb.NO_SUCH_LEDGER, f"ledger {ledger_id} does not exist in the cluster metadata"
        # Metadata written before master_key_hex existed has none: its key cannot be checked here.
        if meta.master_key_hex and bytes.fromhex(meta.master_key_hex) != master_key:
            return pb.UNAUTHORIZED, f"wrong master key for ledger {ledger_id} (not the one etcd records for it)"
        return meta

    async def first_add(self, ledger_id: int, master_key: bytes, recovery: bool) -> tuple[Code, str] | None:
        """The first add here to a ledger: etcd must have it with this master key (first_contact); an add from
        its writer needs it OPEN in etcd (a ledger being recovered or closed never takes one, whatever this
        bookie remembers or forgot) and this bookie in its ensembles. A recovery add (a recovery open
        re-replicating a tail, or a re-replication copy to a replacement, made BEFORE the CAS that names it)
        needs only the key. Returns the refusal, None to go on."""
        expected = self._not_open.get(ledger_id)
        if expected is None:
            found = await self.first_contact(ledger_id, master_key)
            if isinstance(found, tuple):
                return found
            if recovery:
                return None
            if self.bookie_id not in {b for _, bookies in found.ensembles for b in bookies}:
                return pb.INVALID, f"bookie {self.bookie_id} is not in ledger {ledger_id}'s ensembles"
            if found.state == "OPEN":
                return None
            self._not_open[ledger_id] = bytes.fromhex(found.master_key_hex) if found.master_key_hex else b""
            if len(self._not_open) > self.not_open_max:
                del self._not_open[next(iter(self._not_open))]
        elif expected and expected != master_key:
            return pb.UNAUTHORIZED, f"wrong master key for ledger {ledger_id} (not the one etcd records for it)"
        if recovery:
            return None
        return pb.FENCED, f"ledger {ledger_id} is being recovered or is closed (etcd): adds from its writer are refused"
