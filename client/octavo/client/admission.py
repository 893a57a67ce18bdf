"""Whether a write handle takes entries now: one rule for every way in (append, append_many, append_nowait and
send, and the queue of SyncWriteHandle's producer threads). Pure: the handle's state comes in as arguments.

In order: a handle that failed refuses with its error (LedgerFencedError, ...); one that is closing with
LedgerClosedError; an entry that is not bytes-like is a TypeError naming it; one over the ensemble's
entry_size_bytes_max an EntryTooLargeError naming who sets that limit. Those refusals come before anything is
appended. Then the in-flight budget (`has_room`): the entries fit if `used_bytes` + their size is within
inflight_bytes_max, or if they are one entry and nothing is in flight (an entry larger than the whole budget
still goes, alone). If not, the caller waits for room (append, send, a blocking producer) or refuses with
BufferFullError (append_nowait, a producer with block=False).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from octavo.client.arguments import check_bytes
from octavo.client.placement import Registration
from octavo.meta.errors import EntryTooLargeError, LedgerClosedError, OctavoError


def ensemble_entry_limit(client_limit: int, ensemble: Sequence[str], registrations: Mapping[str, Registration]
                         ) -> tuple[int, str]:
    """The largest entry every bookie of `ensemble` takes, and who sets it: the client's entry_size_bytes_max
    (`client_limit`), or the bookie with the smallest registered entry_size_bytes_max (0: not said)."""
    limit, by = client_limit, "the client"
    for bookie_id in ensemble:
        info = registrations.get(bookie_id)
        if info is not None and 0 < info.entry_size_bytes_max < limit:
            limit, by = info.entry_size_bytes_max, f"bookie {bookie_id}"
    return limit, by


def closed_error(ledger_id: int) -> LedgerClosedError:
    """The refusal of a handle that is closing."""
    return LedgerClosedError(f"ledger {ledger_id} is closed to appends")


def refusal(error: OctavoError | None, closing: bool, ledger_id: int) -> OctavoError | None:
    """The handle's own refusal, whatever the entries (as `admit` checks it first): its error if it failed,
    LedgerClosedError if it is closing; None if it takes appends."""
    if error is not None:
        return error
    if closing:
        return closed_error(ledger_id)
    return None


def has_room(used_bytes: int, size: int, inflight_bytes_max: int, count: int = 1) -> bool:
    """The budget rule: `count` entries of `size` bytes in all fit beside `used_bytes` in flight (or queued). One
    entry always fits an empty budget, even one larger than the whole budget; several must fit within it."""
    return used_bytes + size <= inflight_bytes_max or (not used_bytes and count == 1)


def admit(entries: list[Any], single: bool, error: OctavoError | None, closing: bool, ledger_id: int,
          entry_limit: int, entry_limit_by: str, used_bytes: int, inflight_bytes_max: int) -> tuple[int, bool]:
    """Check `entries` (one or more; converted to bytes in place) for a handle in the given state: raises the
    refusal, else returns (their total size in bytes, whether the budget has room for them now). `single`: the
    one entry of an append (named `data` in errors), else `entries[k]`. `entry_limit_by` says who sets
    `entry_limit` ("the client", or "bookie b1"); `used_bytes` is what is in flight (and queued) already."""
    if error is not None:  # refusal's rule, written out (as has_room's below)
        raise error
    if closing:
        raise closed_error(ledger_id)
    if len(entries) == 1:
        if type(entries[0]) is not bytes:
            entries[0] = check_bytes("data" if single else "entries[0]", entries[0])
        size = largest = len(entries[0])
    else:
        if len(set(map(type, entries))) != 1 or type(entries[0]) is not bytes:  # set(map()) keeps the check in C
            for k, data in enumerate(entries):
                if type(data) is not bytes:
                    entries[k] = check_bytes(f"entries[{k}]", data)
        largest = max(map(len, entries), default=0)
        size = sum(map(len, entries))
    if largest > entry_limit:
        raise EntryTooLargeError(f"entry of {largest} bytes is over {entry_limit_by}'s "
                                 f"entry_size_bytes_max={entry_limit}")
    # has_room's rule, written out: admit runs once per record of append_nowait (test_admission checks they agree)
    return size, used_bytes + size <= inflight_bytes_max or (not used_bytes and len(entries) == 1)
