"""The disk policy of a bookie (pure): when it turns read-only and when writable again.

Hysteresis between two marks, so a bookie near its limit does not flap: read-only once the fullest data
directory reaches `readonly_ratio` (or an add hit ENOSPC), writable again only once every directory is below
`writable_ratio` (strictly lower, checked at startup); in between, it keeps its mode. A warning is due at
`warn_ratio`, once per crossing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Watermarks:
    warn_ratio: float
    readonly_ratio: float
    writable_ratio: float


def disk_full_next(full: bool, worst_ratio: float, enospc_seen: bool, marks: Watermarks) -> bool:
    """The next value of "read-only because the disk is full", from the current one, the fullest directory's
    usage ratio and whether an add hit ENOSPC since the last check."""
    if enospc_seen or worst_ratio >= marks.readonly_ratio:
        return True
    if worst_ratio < marks.writable_ratio:
        return False
    return full


def warning_due(ratio: float, warned: bool, marks: Watermarks) -> bool | None:
    """True: warn now (crossed the warn mark); False: forget the warning (back below it); None: no change."""
    if ratio >= marks.warn_ratio:
        return True if not warned else None
    return False if warned else None
