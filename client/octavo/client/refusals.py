"""What a bookie's refusal of an add means for the write handle. Pure: a result code in, an error (or None) out.

A refusal of the entry itself (TOO_LARGE, INVALID) or of the writer (UNAUTHORIZED: wrong master key;
PERMISSION_DENIED; NO_SUCH_LEDGER: the ledger was deleted) would be the same on any bookie, so it fails the handle
with a typed error carrying the bookie's message and never changes the ensemble. A refusal for the bookie's own
state (READ_ONLY, INTERNAL, ...) is answered by an ensemble change (None here). FENCED is the handle's to judge
(an acknowledged entry's late copy is no loss).
"""

from __future__ import annotations

from octavo.meta.errors import (
    EntryRefusedError,
    EntryTooLargeError,
    NoSuchLedgerError,
    OctavoError,
    PermissionDeniedError,
    WrongPasswordError,
)
from octavo.v1 import bookie_pb2 as pb


def refusal_error(ledger_id: int, bookie_id: str, entry_id: int, code: int, message: str) -> OctavoError | None:
    """The error for a refusal that any bookie would give (the entry, the key, a deleted ledger); None for one
    about the bookie's own state, which an ensemble change answers."""
    if code == pb.UNAUTHORIZED:
        return WrongPasswordError(f"bookie {bookie_id} refused the master key of ledger {ledger_id}")
    if code == pb.PERMISSION_DENIED:
        return PermissionDeniedError(f"bookie {bookie_id} refused ledger {ledger_id} to this client: {message}")
    if code == pb.NO_SUCH_LEDGER:
        return NoSuchLedgerError(f"ledger {ledger_id} was deleted: bookie {bookie_id} refuses adds to it "
                                 f"({message})")
    if code == pb.TOO_LARGE:
        return EntryTooLargeError(f"bookie {bookie_id} refused entry {entry_id} of ledger {ledger_id}: "
                                  f"{message}; no later entry of this handle can be acknowledged")
    if code == pb.INVALID:
        return EntryRefusedError(f"bookie {bookie_id} refused entry {entry_id} of ledger {ledger_id}: {message}")
    return None
