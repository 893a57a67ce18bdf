"""What a bookie's refusal of an add means for the write handle. Pure: a result code in, an error (or None) out.

A refusal of the entry itself (TOO_LARGE, INVALID) or of the writer (UNAUTHORIZED: wrong master key;
PERMISSION_DENIED; NO_SUCH_LEDGER: the ledger was deleted) would be the same on any bookie, so it fails the handle
with a typed error carrying the bookie's message and never changes the ensemble. A refusal for the bookie's own
state (READ_ONLY, INTERNAL, ...) is answered by an ensemble change (None here). UNAVAILABLE is about this moment,
not about the bookie (it cannot check the ledger's metadata in etcd now): the same bookie gets the adds again
(resends.py). FENCED fails the handle unless only an acknowledged entry's late copy was refused (no loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import NamedTuple

from octavo.meta.errors import (
    EntryRefusedError,
    EntryTooLargeError,
    LedgerFencedError,
    NoSuchLedgerError,
    OctavoError,
    PermissionDeniedError,
    WrongPasswordError,
)
from octavo.v1 import bookie_pb2 as pb


class Action(Enum):
    STORED = "stored"    # nothing refused that matters: the answer's marks count
    FAIL = "fail"        # fail the handle with the error
    RESEND = "resend"    # send the bookie its adds again after a pause (resends.py)
    REPLACE = "replace"  # an ensemble change replaces the bookie


class Judgement(NamedTuple):
    action: Action
    error: OctavoError | None = None
    reason: str = ""


def judge(ledger_id: int, bookie_id: str, entry_ids: Sequence[int], codes: Sequence[int], message: str,
          last_add_confirmed: int) -> Judgement:
    """What a write handle does with a bookie's refusal of a group of adds (a code per entry)."""
    refused = ""
    resend = True
    for eid, code in zip(entry_ids, codes, strict=False):
        if code == pb.OK:
            continue
        if code == pb.FENCED:
            if eid <= last_add_confirmed:
                continue  # a late copy of an acknowledged entry, refused after the close: nothing is lost
            return Judgement(Action.FAIL, LedgerFencedError(
                f"ledger {ledger_id} was fenced by a recovery open: no more appends can be acknowledged"))
        error = refusal_error(ledger_id, bookie_id, eid, code, message)
        if error is not None:
            return Judgement(Action.FAIL, error)
        resend = resend and code == pb.UNAVAILABLE
        refused = f"{pb.ResultCode.Name(code)}: {message}"  # type: ignore[arg-type]
    if not refused:
        return Judgement(Action.STORED)
    return Judgement(Action.RESEND if resend else Action.REPLACE, reason=f"refused adds: {refused}")


def refusal_error(ledger_id: int, bookie_id: str, entry_id: int, code: int, message: str) -> OctavoError | None:
    """The error for a refusal that any bookie would give (the entry, the key, a deleted ledger); None for one
    about the bookie's own state or the moment (judge says which)."""
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
