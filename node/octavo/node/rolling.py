"""When the active entry log rolls (pure, one predicate; Kafka's "should we roll?"). The engine asks it before
an add, on the roll interval, and when a ledger in the active log is fenced or write-closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Why(StrEnum):
    SIZE = "size"            # the add would take the log past log_size_bytes_max
    CACHE = "cache"          # the log alone would hold half of write_cache_entries_max entries
    AGE = "age"              # its oldest unsynced record is older than log_roll_interval_ms
    CLOSE = "close"          # a ledger in it was fenced or write-closed (seed 003), and it is big enough
    ASKED = "asked"          # a roll asked for by hand (tests, tools)


@dataclass(frozen=True)
class ActiveLog:
    size_bytes: int
    header_bytes: int
    cache_entries: int
    unsynced_age_s: float    # since its first record was written


def should_roll(log: ActiveLog, why: Why, *, add_bytes: int = 0, add_entries: int = 0, log_size_bytes_max: int = 0,
                write_cache_entries_max: int = 0, roll_interval_s: float = 0.0, min_bytes: int = 0) -> bool:
    """Whether the active log rolls, for the given reason. A log holding no record never rolls."""
    if log.size_bytes <= log.header_bytes:
        return False
    if why is Why.SIZE or why is Why.CACHE:
        return (log.size_bytes + add_bytes > log_size_bytes_max
                or log.cache_entries + add_entries > write_cache_entries_max // 2)
    if why is Why.AGE:
        return log.unsynced_age_s >= roll_interval_s
    return log.size_bytes > min_bytes  # Why.CLOSE, Why.ASKED
