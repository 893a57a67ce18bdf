"""The roll predicate (octavo.node.rolling) as a table: no files."""

from __future__ import annotations

import pytest

from octavo.node.rolling import ActiveLog, Why, should_roll

HEADER = 32


@pytest.mark.parametrize(("size", "entries", "age", "why", "kw", "rolls"), [
    (HEADER, 0, 99.0, Why.AGE, {"roll_interval_s": 1.0}, False),           # no record: never rolls
    (HEADER, 0, 0.0, Why.ASKED, {}, False),
    (HEADER, 0, 0.0, Why.SIZE, {"add_bytes": 10**9, "log_size_bytes_max": 1}, False),
    (1000, 10, 0.0, Why.SIZE, {"add_bytes": 100, "log_size_bytes_max": 1100, "write_cache_entries_max": 100}, False),
    (1000, 10, 0.0, Why.SIZE, {"add_bytes": 101, "log_size_bytes_max": 1100, "write_cache_entries_max": 100}, True),
    (1000, 40, 0.0, Why.CACHE, {"add_entries": 10, "log_size_bytes_max": 10**6, "write_cache_entries_max": 100},
     False),
    (1000, 40, 0.0, Why.CACHE, {"add_entries": 11, "log_size_bytes_max": 10**6, "write_cache_entries_max": 100},
     True),
    (1000, 1, 0.99, Why.AGE, {"roll_interval_s": 1.0}, False),
    (1000, 1, 1.0, Why.AGE, {"roll_interval_s": 1.0}, True),
    (1000, 1, 0.0, Why.CLOSE, {"min_bytes": 1000}, False),                  # too small for a close to roll
    (1001, 1, 0.0, Why.CLOSE, {"min_bytes": 1000}, True),
    (HEADER + 1, 1, 0.0, Why.ASKED, {}, True),
])
def test_should_roll(size: int, entries: int, age: float, why: Why, kw: dict[str, float], rolls: bool) -> None:
    assert should_roll(ActiveLog(size, HEADER, entries, age), why, **kw) is rolls  # type: ignore[arg-type]
