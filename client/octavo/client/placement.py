"""Where a write handle's failed bookie goes: the choice of a replacement, pure (no IO, no clock; the time and
each bookie's connection state come in as arguments), so client/tests/test_placement.py can drive it as a table.

A registered bookie is, for replacing `failed` in the last ensemble:
- unusable: the failed bookie itself, a bookie already in the ensemble, a read-only one, one whose
  entry_size_bytes_max is below a pending entry;
- in quarantine: it failed this handle less than bookie_quarantine_s ago (BookKeeper quarantines failing
  bookies the same way). It is a fallback: taken only when nothing else is usable and it is reachable again;
- waiting: otherwise usable, but its connection is down and retrying (a bookie restarting, or gone with its
  registration not expired yet): the change waits a little for it rather than fail the ledger;
- ready: everything else (connected, or not tried yet).

`choose_replacement` makes the choice from that sorting: a ready bookie if there is one, else a quarantined one
that is reachable again, else none and the reason (the caller waits, or fails the ledger with it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# Connection states, as the caller reports them.
READY = "ready"            # connected
IDLE = "idle"              # never tried: connects on first use
CONNECTING = "connecting"  # down and retrying with backoff
UNREGISTERED = "unregistered"


class Registration(Protocol):
    """What the choice reads of a bookie's registration (octavo.meta.metadata.BookieInfo has it)."""

    @property
    def readonly(self) -> bool: ...

    @property
    def entry_size_bytes_max(self) -> int: ...


@dataclass
class Choice:
    ready: list[str] = field(default_factory=list)
    fallback: list[str] = field(default_factory=list)  # quarantined: only if `ready` is empty
    waiting: list[str] = field(default_factory=list)   # usable once connected
    unusable: dict[str, str] = field(default_factory=dict)  # every bookie not in `ready`, and why


def replacement_choice(failed: str, ensemble: Sequence[str], registered: Mapping[str, Registration],
                       quarantine: Mapping[str, float], now: float, quarantine_s: float, largest_entry: int,
                       connection_state: Callable[[str], str]) -> Choice:
    """Sort the registered bookies for replacing `failed`. `quarantine` maps a bookie to when it failed this
    handle (the same clock as `now`); `largest_entry` is the largest pending entry's size."""
    choice = Choice()
    for bookie_id, info in sorted(registered.items()):
        if bookie_id == failed:
            choice.unusable[bookie_id] = "is the one that failed (its registration has not expired yet)"
            continue
        if bookie_id in ensemble:
            choice.unusable[bookie_id] = "is already in the ensemble"
            continue
        if info.readonly:
            choice.unusable[bookie_id] = "is read-only"
            continue
        if 0 < info.entry_size_bytes_max < largest_entry:
            choice.unusable[bookie_id] = (f"takes entries up to entry_size_bytes_max={info.entry_size_bytes_max}, "
                                          f"below a pending entry of {largest_entry} bytes")
            continue
        failed_at = quarantine.get(bookie_id)
        state = connection_state(bookie_id)
        if failed_at is not None and now - failed_at < quarantine_s:
            choice.fallback.append(bookie_id)
            choice.unusable[bookie_id] = (f"failed on this ledger {now - failed_at:.1f}s ago (quarantined for "
                                          f"bookie_quarantine_s={quarantine_s:g}) and is "
                                          + ("reachable again" if state == READY else "not reachable"))
            continue
        if state in (READY, IDLE):
            choice.ready.append(bookie_id)
        elif state == CONNECTING:
            choice.waiting.append(bookie_id)
            choice.unusable[bookie_id] = "is registered but not reachable (its connection is retrying)"
        else:
            choice.unusable[bookie_id] = "is no longer registered"
    return choice


@dataclass(frozen=True)
class Replacement:
    bookie: str | None  # the bookie to take the failed one's place; None: no bookie can, now
    fallback: bool      # `bookie` was quarantined: nothing else was usable and it is reachable again
    reason: str         # why each other registered bookie could not be used ("" when a ready one was chosen)
    choice: Choice      # the sorting the choice was made from


def choose_replacement(failed: str, ensemble: Sequence[str], registered: Mapping[str, Registration],
                       quarantine: Mapping[str, float], now: float, quarantine_s: float, largest_entry: int,
                       connection_state: Callable[[str], str], pick: Callable[[Sequence[str]], str]) -> Replacement:
    """The replacement for `failed` (arguments as replacement_choice's): `pick` of the ready bookies, else `pick` of
    the quarantined ones that are reachable (READY) again, else none, with the reason naming every registered
    bookie and why it could not be used. `pick` chooses among candidates (random.choice spreads the load; a test
    passes a fixed rule)."""
    choice = replacement_choice(failed, ensemble, registered, quarantine, now, quarantine_s, largest_entry,
                                connection_state)
    if choice.ready:
        return Replacement(pick(choice.ready), False, "", choice)
    reason = "; ".join(f"{b} {why}" for b, why in sorted(choice.unusable.items())) or "no bookie is registered"
    reachable = [b for b in choice.fallback if connection_state(b) == READY]
    if reachable:
        return Replacement(pick(reachable), True, reason, choice)
    return Replacement(None, False, reason, choice)
