"""Compaction's decisions, pure (no IO, no clock: times come in as parameters): which logs a pass rewrites and
in which groups, whether a scheduled pass is due or blocked, and why a running pass must stop. compaction.py
carries them out; node/tests/test_compaction_plan.py checks them as tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MINOR = "minor"
MAJOR = "major"


@dataclass(frozen=True)
class LogUsage:
    """A flushed log's accounting: its size and how many of its record bytes belong to live ledgers."""

    log_id: int
    live_bytes: int
    total_bytes: int
    any_live: bool  # some ledger in it is alive (a log with none is GC's to delete, not compaction's)


Source = tuple[int, int, int]  # (log id, live bytes, total bytes)


def plan(logs: Iterable[LogUsage], threshold: float, log_size_bytes_max: int, sources_max: int) -> list[list[Source]]:
    """Logs whose live share is below `threshold`, lowest share first, packed into groups whose live bytes
    fit one log (`log_size_bytes_max`; a single larger log still makes a group of its own) and that have at
    most `sources_max` sources. Logs with nothing alive are left out: GC deletes them."""
    candidates = sorted((u.live_bytes / u.total_bytes, u.log_id, u.live_bytes, u.total_bytes)
                        for u in logs if u.total_bytes > 0 and u.any_live
                        and u.live_bytes / u.total_bytes < threshold)
    groups: list[list[Source]] = []
    current: list[Source] = []
    size = 0
    for _, log_id, live_bytes, total in candidates:
        if current and (size + live_bytes > log_size_bytes_max or len(current) >= sources_max):
            groups.append(current)
            current, size = [], 0
        current.append((log_id, live_bytes, total))
        size += live_bytes
    if current:
        groups.append(current)
    return groups


def due(now_s: float, last_major_s: float, last_minor_s: float, major_interval_ms: int,
        minor_interval_ms: int) -> str | None:
    """The kind of scheduled pass due at `now_s` (monotonic seconds), major first; None if neither is."""
    if now_s - last_major_s >= major_interval_ms / 1000:
        return MAJOR
    if now_s - last_minor_s >= minor_interval_ms / 1000:
        return MINOR
    return None


def window_closed(now_unix_ms: int, window_until_ms: int) -> bool:
    """A window (0: none, always open) closes at its end."""
    return bool(window_until_ms) and now_unix_ms >= window_until_ms


def blocked_reason(enabled: bool, suspended: bool, window_until_ms: int, now_unix_ms: int) -> str:
    """Why a scheduled pass may not start now (empty: it may)."""
    if not enabled:
        return "compaction is disabled (compaction_enabled=false)"
    if suspended:
        return "compaction is suspended by an administrator"
    if window_closed(now_unix_ms, window_until_ms):
        return "the compaction window closed"
    return ""


@dataclass(frozen=True)
class PassState:
    """What a running pass checks at each safe point."""

    stopping: bool           # the bookie is stopping
    cancelled: bool          # the caller of a pass started by hand went away
    suspended: bool
    manual: bool             # started by hand: the window does not apply
    now_s: float             # monotonic
    deadline_s: float        # monotonic: start + compaction_run_time_ms_max
    now_unix_ms: int
    window_until_ms: int
    run_time_ms_max: int


def why_stop(state: PassState) -> str:
    """Why a running pass must stop at this safe point (empty: go on), in order of precedence."""
    if state.stopping:
        return "the bookie is stopping"
    if state.cancelled:
        return "cancelled"
    if state.now_s >= state.deadline_s:
        return f"run time limit reached (compaction_run_time_ms_max={state.run_time_ms_max})"
    if state.suspended:
        return "suspended by an administrator"
    if not state.manual and window_closed(state.now_unix_ms, state.window_until_ms):
        return "the compaction window closed"
    return ""
