"""What the operator does to a cluster's bookies, decided by one pure function.

`decide(now, policy, shape, bookies, memory) -> Decision`: from the time, the CompactionPolicy, the cluster's
shape, what each bookie reported through BookieAdmin and what the operator remembers from its last decisions
(kept in the BookieCluster's status, so a restarted operator carries on), the actions to take now. No clock, no
IO: the tests run it over clocks, windows, time zones and usage sequences exhaustively.

The rules, in order:
1. Disk watermarks, with hysteresis. A bookie at or above `read_only_ratio` is forced read-only; one the
   operator forced is released at or below `writable_ratio`, never in between (no flapping). Never below the
   writable bookies a new ledger needs (`shape.min_writable`): a bookie that would take the cluster below is
   left writable and reported as disk pressure instead (the bookie still protects its own disk at its own,
   higher, watermark). A bookie forced read-only by someone else is not released by the operator.
2. Compaction windows. While a window of the policy is open, up to `max_concurrent_bookies` bookies at a time
   get a compaction window until its end (fullest first); a bookie that has compacted, or that had nothing to
   compact (`SLOT_IDLE_S` without a pass), gives its slot to the next; each bookie compacts once per window.
   Outside windows every bookie's window is closed, but with `outside_window = compact` a bookie past
   `warn_ratio` gets an emergency window of `EMERGENCY_WINDOW_S` (one per `EMERGENCY_WINDOW_S` at most).
   A policy without windows leaves compaction to each bookie's own schedule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from octavo.operator.windows import Window, next_window, open_until

OUTSIDE_WAIT = "wait"
OUTSIDE_COMPACT = "compact"
OUTSIDE_WINDOW_CHOICES = (OUTSIDE_WAIT, OUTSIDE_COMPACT)

# A bookie given a window that neither starts nor finishes a pass within this gives its slot to the next one (it
# had nothing worth compacting). Bookies start a pass within seconds of a window opening.
SLOT_IDLE_S = 120
# An emergency window (outside_window = compact) lasts this long; the next one for the same bookie may open
# this long after it ends.
EMERGENCY_WINDOW_S = 3600

# A closed window is set as this time (the epoch's first millisecond), not as the operator's `now`: a bookie
# whose clock runs behind the operator's would otherwise see the window open a little longer.
CLOSED_UNIX_MS = 1

OPEN_WINDOW = "OpenCompactionWindow"
CLOSE_WINDOW = "CloseCompactionWindow"
FORCE_READ_ONLY = "ForceReadOnly"
RELEASE_READ_ONLY = "ReleaseReadOnly"


class PolicyError(ValueError):
    """A policy that cannot be applied; the message says what to change."""


@dataclass(frozen=True)
class Watermarks:
    warn_ratio: float = 0.75
    read_only_ratio: float = 0.90
    writable_ratio: float = 0.80

    def __post_init__(self) -> None:
        if not 0 < self.writable_ratio < self.read_only_ratio <= 1:
            raise PolicyError(f"watermarks must satisfy 0 < writableRatio < readOnlyRatio <= 1, got writableRatio "
                              f"{self.writable_ratio} and readOnlyRatio {self.read_only_ratio}")
        if not 0 < self.warn_ratio <= self.read_only_ratio:
            raise PolicyError(f"warnRatio {self.warn_ratio} must be in (0, readOnlyRatio {self.read_only_ratio}]")


@dataclass(frozen=True)
class Policy:
    windows: tuple[Window, ...] = ()
    max_concurrent_bookies: int = 1
    watermarks: Watermarks = field(default_factory=Watermarks)
    outside_window: str = OUTSIDE_WAIT

    def __post_init__(self) -> None:
        if self.max_concurrent_bookies < 1:
            raise PolicyError(f"maxConcurrentBookies must be >= 1, got {self.max_concurrent_bookies}")
        if self.outside_window not in OUTSIDE_WINDOW_CHOICES:
            raise PolicyError(f"outsideWindow must be one of {', '.join(OUTSIDE_WINDOW_CHOICES)}, got "
                              f"{self.outside_window!r}")


@dataclass(frozen=True)
class Shape:
    replicas: int
    min_writable: int  # writable bookies a new ledger needs: the largest ensemble the cluster's writers use


@dataclass(frozen=True)
class Observed:
    """One bookie as its BookieAdmin status showed it (reachable False: it did not answer)."""

    bookie_id: str
    reachable: bool = True
    writable: bool = True
    forced_read_only: bool = False
    disk_usage_ratio: float = 0.0
    compacting: bool = False
    window_until_unix_ms: int = 0         # 0: no window set (the bookie compacts on its own schedule)
    last_compaction_unix_ms: int = 0      # when its last pass finished
    scrub_last_pass_unix_ms: int = 0      # when its last scrub pass finished (0: none yet)
    damaged_entries: int = 0              # entries of damage marks naming it that still fail there


@dataclass(frozen=True)
class Memory:
    """What the operator remembers between decisions (stored in the BookieCluster's status)."""

    forced_by_operator: frozenset[str] = frozenset()
    window_opened_unix_ms: Mapping[str, int] = field(default_factory=dict)   # this stretch's slots
    compacted_in_stretch: Mapping[str, int] = field(default_factory=dict)    # bookie -> the stretch's start
    emergency_opened_unix_ms: Mapping[str, int] = field(default_factory=dict)
    # Each slot's bookie's last pass (the bookie's clock) when the slot opened: a later one means it compacted
    # (compared with the bookie's own times, never the operator's: their clocks may differ).
    last_run_at_open_unix_ms: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    kind: str
    bookie_id: str
    until_unix_ms: int = 0
    reason: str = ""
    threshold_ratio: float = 0.0  # FORCE_READ_ONLY: the readOnlyRatio it was forced at (the bookie shows it)


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    memory: Memory
    window: tuple[datetime, datetime] | None        # the stretch open now
    next_window: tuple[datetime, datetime] | None
    disk_pressure: tuple[str, ...]                  # one message per bookie past warn_ratio or left writable
    compacting_slots: tuple[str, ...]               # bookies holding a window slot after the actions


def unix_ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def decide(now: datetime, policy: Policy, shape: Shape, bookies: Sequence[Observed], memory: Memory) -> Decision:
    known = {b.bookie_id for b in bookies}
    reachable = sorted((b for b in bookies if b.reachable), key=lambda b: b.bookie_id)
    actions: list[Action] = []
    forced, pressure = _watermarks(policy.watermarks, shape, reachable, memory, known, actions)
    stretch = open_until(policy.windows, now) if policy.windows else None
    upcoming = next_window(policy.windows, now) if policy.windows else None
    if not policy.windows:
        slots: list[str] = []
        memory = Memory(forced_by_operator=frozenset(forced))
    elif stretch is not None:
        memory, slots = _in_window(now, policy, reachable, memory, stretch, actions)
        memory = replace(memory, forced_by_operator=frozenset(forced))
    else:
        memory, slots = _outside_window(now, policy, reachable, memory, actions)
        memory = replace(memory, forced_by_operator=frozenset(forced))
    return Decision(tuple(actions), memory, stretch, upcoming, tuple(pressure), tuple(slots))


def _watermarks(wm: Watermarks, shape: Shape, reachable: list[Observed], memory: Memory, known: set[str],
                actions: list[Action]) -> tuple[set[str], list[str]]:
    # A bookie the operator forced that shows no force any more was released by someone else (or lost the
    # state): forget it; it is decided afresh below.
    forced = {b for b in memory.forced_by_operator if b in known}
    forced -= {b.bookie_id for b in reachable if not b.forced_read_only}
    writable = sum(1 for b in reachable if b.writable)
    for b in reachable:
        if b.bookie_id in forced and b.disk_usage_ratio <= wm.writable_ratio:
            actions.append(Action(RELEASE_READ_ONLY, b.bookie_id, reason=(
                f"disk usage {b.disk_usage_ratio:.1%} is at or below writableRatio {wm.writable_ratio:.0%}")))
            forced.discard(b.bookie_id)
            writable += 0 if b.writable else 1
    pressure: list[str] = []
    held_back: set[str] = set()
    candidates = sorted((b for b in reachable if not b.forced_read_only and b.disk_usage_ratio >= wm.read_only_ratio),
                        key=lambda b: (-b.disk_usage_ratio, b.bookie_id))
    for b in candidates:
        if b.writable and writable - 1 < shape.min_writable:
            pressure.append(
                f"bookie {b.bookie_id} is {b.disk_usage_ratio:.1%} full (readOnlyRatio {wm.read_only_ratio:.0%}) "
                f"but stays writable: forcing it read-only would leave {writable - 1} writable bookies and a new "
                f"ledger needs {shape.min_writable}")
            held_back.add(b.bookie_id)
            continue
        actions.append(Action(FORCE_READ_ONLY, b.bookie_id, threshold_ratio=wm.read_only_ratio, reason=(
            f"disk usage {b.disk_usage_ratio:.1%} reached readOnlyRatio {wm.read_only_ratio:.0%}")))
        forced.add(b.bookie_id)
        writable -= 1 if b.writable else 0
    for b in reachable:
        if b.disk_usage_ratio >= wm.warn_ratio and b.bookie_id not in held_back:
            pressure.append(f"bookie {b.bookie_id} is {b.disk_usage_ratio:.1%} full (warnRatio {wm.warn_ratio:.0%})")
    return forced, pressure


def _in_window(now: datetime, policy: Policy, reachable: list[Observed], memory: Memory,
               stretch: tuple[datetime, datetime], actions: list[Action]) -> tuple[Memory, list[str]]:
    now_ms = unix_ms(now)
    start_ms, until_ms = unix_ms(stretch[0]), unix_ms(stretch[1])
    opened = {b: t for b, t in memory.window_opened_unix_ms.items() if t >= start_ms}
    last_at_open = {b: t for b, t in memory.last_run_at_open_unix_ms.items() if b in opened}
    compacted = {b: s for b, s in memory.compacted_in_stretch.items() if s == start_ms}
    by_id = {b.bookie_id: b for b in reachable}
    holding: list[str] = []
    for bookie_id, opened_ms in sorted(opened.items()):
        b = by_id.get(bookie_id)
        if b is None:  # unreachable or gone: its slot goes to the next bookie; it may have its turn later
            del opened[bookie_id]
            continue
        before = last_at_open.get(bookie_id)
        finished = b.last_compaction_unix_ms > before if before is not None else b.last_compaction_unix_ms >= opened_ms
        idle = now_ms - opened_ms >= SLOT_IDLE_S * 1000
        if not b.compacting and (finished or idle):
            actions.append(Action(CLOSE_WINDOW, bookie_id, CLOSED_UNIX_MS, reason=(
                "compacted in this window" if finished else f"nothing to compact ({SLOT_IDLE_S}s without a pass)")))
            compacted[bookie_id] = start_ms
            del opened[bookie_id]
            last_at_open.pop(bookie_id, None)
            continue
        holding.append(bookie_id)
        if b.window_until_unix_ms != until_ms:
            actions.append(Action(OPEN_WINDOW, bookie_id, until_ms, reason="the window's end moved"))
    waiting = sorted((b for b in reachable if b.bookie_id not in opened and b.bookie_id not in compacted),
                     key=lambda b: (-b.disk_usage_ratio, b.bookie_id))
    for b in waiting[:max(0, policy.max_concurrent_bookies - len(holding))]:
        actions.append(Action(OPEN_WINDOW, b.bookie_id, until_ms, reason=(
            f"compaction window open until {stretch[1].isoformat()}")))
        opened[b.bookie_id] = now_ms
        last_at_open[b.bookie_id] = b.last_compaction_unix_ms
        holding.append(b.bookie_id)
    # Bookies not holding a slot keep a closed window (a window set by hand, or left from an emergency).
    closing = {a.bookie_id for a in actions if a.kind == CLOSE_WINDOW}
    for b in reachable:
        if b.bookie_id not in opened and b.bookie_id not in closing and (
                b.window_until_unix_ms == 0 or b.window_until_unix_ms > now_ms):
            actions.append(Action(CLOSE_WINDOW, b.bookie_id, CLOSED_UNIX_MS, reason="waiting for a compaction slot"
                                  if b.bookie_id not in compacted else "compacted in this window"))
    return Memory(window_opened_unix_ms=opened, compacted_in_stretch=compacted,
                  last_run_at_open_unix_ms=last_at_open), sorted(holding)


def _outside_window(now: datetime, policy: Policy, reachable: list[Observed], memory: Memory,
                    actions: list[Action]) -> tuple[Memory, list[str]]:
    now_ms = unix_ms(now)
    span_ms = EMERGENCY_WINDOW_S * 1000
    emergency = {b: t for b, t in memory.emergency_opened_unix_ms.items() if now_ms - t < 2 * span_ms}
    active = {b for b, t in emergency.items() if now_ms - t < span_ms}
    if policy.outside_window == OUTSIDE_COMPACT:
        over = sorted((b for b in reachable if b.disk_usage_ratio >= policy.watermarks.warn_ratio
                       and b.bookie_id not in emergency), key=lambda b: (-b.disk_usage_ratio, b.bookie_id))
        for b in over[:max(0, policy.max_concurrent_bookies - len(active))]:
            actions.append(Action(OPEN_WINDOW, b.bookie_id, now_ms + span_ms, reason=(
                f"emergency compaction outside the windows: disk usage {b.disk_usage_ratio:.1%} reached warnRatio "
                f"{policy.watermarks.warn_ratio:.0%}")))
            emergency[b.bookie_id] = now_ms
            active.add(b.bookie_id)
    for b in reachable:
        if b.bookie_id in active:
            continue
        if b.window_until_unix_ms == 0 or b.window_until_unix_ms > now_ms:
            actions.append(Action(CLOSE_WINDOW, b.bookie_id, CLOSED_UNIX_MS, reason="outside the compaction windows"))
    return Memory(emergency_opened_unix_ms=emergency), sorted(active)
