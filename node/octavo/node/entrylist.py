"""ListEntries: which entries of a ledger a bookie stores, without reading their bytes (for the auditor's
replicas check, replicascheck.py)."""

from __future__ import annotations

from octavo.node.storage import Storage
from octavo.v1 import bookie_pb2 as pb

# Entry ids looked at by one ListEntries call; a longer range is answered in parts (next_entry_id).
LIST_ENTRIES_RANGE_MAX = 100_000


def list_entries(storage: Storage, request: pb.ListEntriesRequest) -> pb.ListEntriesResponse:
    """The entries of [first_entry_id, last_entry_id] stored here (index or a log's cache), at most
    LIST_ENTRIES_RANGE_MAX ids looked at."""
    ledger_id, first, last = request.ledger_id, request.first_entry_id, request.last_entry_id
    if ledger_id < 0 or first < 0 or last < first:
        return pb.ListEntriesResponse(error=pb.INVALID, next_entry_id=-1, error_message=(
            f"invalid range: ledger {ledger_id} entries [{first}, {last}]; ids must be non-negative and "
            "first <= last"))
    if storage.ledger_state(ledger_id) is None:
        code = pb.UNKNOWN if storage.tail_maybe_lost else pb.NO_SUCH_LEDGER
        return pb.ListEntriesResponse(error=code, next_entry_id=-1,
                                      error_message=f"ledger {ledger_id} is not known to this bookie")
    end = min(last, first + LIST_ENTRIES_RANGE_MAX - 1)
    has = storage.has_entry
    stored = [e for e in range(first, end + 1) if has(ledger_id, e)]
    return pb.ListEntriesResponse(entry_ids=stored, next_entry_id=end + 1 if end < last else -1)
